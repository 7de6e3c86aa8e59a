"""Leader leases and their fencing: only the holder of a lease runs the loops it guards
(scheduling, reconciling), and its writes that must not happen twice carry a fence.

Why fencing, and not only `FOR UPDATE SKIP LOCKED` claims with per-job conditional updates: those
keep two live schedulers from claiming one task, but not a leader that was paused (a stopped
process, a long GC, a frozen VM) after it committed a launch intent and before it called the
provider. Its successor sees the intent without a handle, looks for the job, finds none and
launches; the old leader wakes and launches too, for it created the intent. So each takeover bumps
the lease's `epoch`, and the leader's claims, its last check before a provider call and its
record of a launch run `check` in their transaction: the lease must still be this holder's, in
this epoch, for a while yet. On PostgreSQL the check locks the lease row FOR SHARE, so no takeover
can commit until the fenced transaction has; SQLite serialises writers anyway.

What a fence cannot stop: a provider call is not a database write. A leader that passed its last
check and is then paused for longer than the lease had left may still launch once it wakes (the
check asks for `margin_s` of lease to spare to make that window small). The successor's
`provider.find(job_name)` came before that late launch, so it cannot keep it single; the provider
has to. The local provider does: a job's runner claims the job before anything else and a second
runner exits at once, so the late launcher adopts its successor's runner (`controlplane_providers.local`). The
clouds name a job's run themselves (a Batch job id, a Cloud Run or Container Apps execution
name), so there that window stays open: a leader stalled longer than `margin_s` between its check
and its request can start a second job of one attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import case, or_
from sqlalchemy.engine import Connection

from controlplane.store import queries as q
from controlplane.store.writer import Writer


@dataclass(frozen=True)
class Fence:
    """A leader's claim to act: the lease `name`, held by `holder` since it became `epoch`."""

    name: str
    holder: str
    epoch: int


class Fenced(Exception):
    """The lease moved on (expired, taken over, or about to expire): the write was not made."""


class LeaseStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db
        self.fence_stmt = self.db.for_share(q.LEASE_FENCE)

    def acquire(self, name: str, holder: str, ttl_s: float) -> int | None:
        """Take or renew the lease: its epoch while `holder` holds it, else None. Taking it from
        another holder (or for the first time) bumps the epoch; renewing keeps it."""
        now = self.w.clock()
        L = q.LEASES
        with self.w.tx() as c:
            c.execute(self.db.upsert(L, {"name": name, "holder": holder, "expires_at": now + ttl_s, "epoch": 1},
                                     ["name"], where=or_(L.c.holder == holder, L.c.expires_at < now),
                                     set_={"epoch": case((L.c.holder == holder, L.c.epoch), else_=L.c.epoch + 1)}))
            rows = self.db.rows(c, q.LEASE_HOLDER, {"name": name})
            return int(rows[0]["epoch"]) if rows and rows[0]["holder"] == holder else None

    def check(self, c: Connection, fence: Fence, margin_s: float = 0.0) -> None:
        """Inside a write transaction: raise `Fenced` unless `fence` still holds, with `margin_s`
        of its lease to spare."""
        rows = self.db.rows(c, self.fence_stmt, {"name": fence.name, "holder": fence.holder, "epoch": fence.epoch,
                                                "until": self.w.clock() + margin_s})
        if not rows:
            raise Fenced(f"lease {fence.name} epoch {fence.epoch} no longer held by {fence.holder}")

    def holds(self, fence: Fence, margin_s: float = 0.0) -> bool:
        """`check` in a transaction of its own (the last look before a provider call)."""
        try:
            with self.w.tx() as c:
                self.check(c, fence, margin_s)
            return True
        except Fenced:
            return False

    def release(self, name: str, holder: str) -> None:
        with self.w.tx() as c:
            self.db.run(c, q.RELEASE_LEASE, {"_name": name, "_holder": holder})
