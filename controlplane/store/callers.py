"""Callers: operators' limits per caller (`caller_limits`) and the streaming waits open now
(`caller_streams`). Persistence only: what the limits are and when they apply is
`controlplane.limits`'s, and whether one more stream may open is its guard's
(`controlplane.guards.OpenStreams`)."""

from __future__ import annotations

import secrets
from typing import Any

from controlplane.store import queries as q
from controlplane.store.counts import Counts, Guard
from controlplane.store.rows import CallerLimitsRow
from controlplane.store.writer import Writer

LIMIT_COLUMNS = ("submits_per_minute", "submits_per_day", "tasks_in_flight", "streams")


class CallerStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    # ---- overrides ------------------------------------------------------------------------------
    def overrides(self) -> list[CallerLimitsRow]:
        with self.db.read() as c:
            return [CallerLimitsRow.from_row(dict(r._mapping)) for r in c.execute(q.CALLER_LIMITS)]

    def set_override(self, owner: str, values: dict[str, int | None]) -> CallerLimitsRow:
        """Set some of a caller's limits (None: back to the default, -1: unlimited); the others
        stay as they were."""
        unknown = set(values) - set(LIMIT_COLUMNS)
        if unknown:
            raise ValueError(f"unknown limits: {', '.join(sorted(unknown))}")
        with self.w.tx() as c:
            row: dict[str, Any] = {k: None for k in LIMIT_COLUMNS}
            found = self.db.rows(c, q.CALLER_LIMITS_OF, {"owner": owner})
            if found:
                row.update({k: found[0][k] for k in LIMIT_COLUMNS})
            row.update(values)
            row.update(owner=owner, updated_at=self.w.clock())
            c.execute(self.db.upsert(q.CALLER_LIMITS_T, row, ["owner"]))
            return CallerLimitsRow.from_row(row)

    def clear_override(self, owner: str) -> bool:
        with self.w.tx() as c:
            return self.db.run(c, q.DELETE_CALLER_LIMITS, {"owner": owner}) == 1

    # ---- streams --------------------------------------------------------------------------------
    def open_stream(self, owner: str, task_id: str, hold_s: float, guard: Guard[str]) -> str:
        """Open a streaming wait of `owner` once `guard` passes (with its locks held, its expired
        streams gone); its id, to close it with. Raises the guard's `Refused`, having opened
        nothing. A stream's row frees itself after `hold_s` should nobody close it (a server that
        died)."""
        now = self.w.clock()
        with self.w.tx() as c:
            self.db.lock(c, *guard.locks(owner))
            self.db.run(c, q.DELETE_EXPIRED_STREAMS, {"owner": owner, "now": now})
            guard.check(Counts(self.db, c, now), owner)
            stream_id = "str_" + secrets.token_hex(12)
            self.db.run(c, q.INSERT_STREAM, {"stream_id": stream_id, "owner": owner, "task_id": task_id,
                                             "started_at": now, "expires_at": now + hold_s})
            return stream_id

    def renew_stream(self, stream_id: str, hold_s: float) -> None:
        with self.w.tx() as c:
            self.db.run(c, q.RENEW_STREAM, {"_sid": stream_id, "_exp": self.w.clock() + hold_s})

    def close_stream(self, stream_id: str) -> None:
        with self.w.tx() as c:
            self.db.run(c, q.DELETE_STREAM, {"stream_id": stream_id})

    def open_streams(self, owner: str) -> int:
        rows = self.db.fetch(q.OPEN_STREAMS, {"owner": owner, "lim": 1_000_000})
        return sum(1 for r in rows if r["expires_at"] > self.w.clock())
