"""Leader leases: only the holder of a lease runs the loops it guards (scheduling, reconciling)."""

from __future__ import annotations

from sqlalchemy import or_

from controlplane.store import queries as q
from controlplane.store.writer import Writer


class LeaseStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    def acquire(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the lease; True while `holder` holds it."""
        now = self.w.clock()
        with self.w.tx() as c:
            c.execute(self.db.upsert(q.LEASES, {"name": name, "holder": holder, "expires_at": now + ttl_s}, ["name"],
                                     where=or_(q.LEASES.c.holder == holder, q.LEASES.c.expires_at < now)))
            rows = self.db.run(c, q.LEASE_HOLDER, {"name": name})
            return bool(rows) and rows[0]["holder"] == holder

    def release(self, name: str, holder: str) -> None:
        with self.w.tx() as c:
            self.db.run(c, q.RELEASE_LEASE, {"name": name, "holder": holder})
