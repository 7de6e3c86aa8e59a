"""The sweeps a claim meets (`JobStore.claim_for_launch`): how many more shards of each may take a
slot (its `max_parallel` less its shards holding one), and which were stopped. Read once per claim
from the shards holding the class's slots (`SWEEPS_BUSY`), and for a sweep first met among the
queued tasks, its row; counted down as the claim takes shards."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any, Literal

from sqlalchemy.engine import Connection

from controlplane import sweeps
from controlplane.store import sweep_queries as sq
from controlplane.store.db import Database

MAX_PASSES = 8  # a claim's passes over the queue, each leaving out the sweeps the last one filled


class SweepSlots:
    def __init__(self) -> None:
        self.room: dict[str, int] = {}  # sweep -> shards it may still start (sweeps with max_parallel)
        self.stopped: dict[str, str] = {}  # sweep -> why it stopped
        self.known: set[str] = set()

    @classmethod
    def read(cls, db: Database, c: Connection, resource_class: str) -> SweepSlots:
        slots = cls()
        for r in db.rows(c, sq.SWEEPS_BUSY, {"rc": resource_class}):
            slots._know(r["sweep_id"], r["max_parallel"], r["stopped_at"], r["stop_reason"], int(r["busy"]))
        return slots

    def learn(self, db: Database, c: Connection, sweep_ids: Iterable[str]) -> None:
        """The limits of the sweeps not met yet, none of whose shards holds a slot."""
        new = sorted(set(sweep_ids) - self.known)
        if new:
            for r in c.execute(sq.sweep_limits(new)).mappings():
                self._know(r["sweep_id"], r["max_parallel"], r["stopped_at"], r["stop_reason"], 0)

    def _know(self, sweep_id: str, max_parallel: int | None, stopped_at: float | None, why: str | None,
              busy: int) -> None:
        self.known.add(sweep_id)
        if max_parallel is not None:
            self.room[sweep_id] = max_parallel - busy
        if stopped_at is not None:
            self.stopped[sweep_id] = why or "was stopped"

    def full(self) -> list[str]:
        """The sweeps that may start no more shards now."""
        return sorted(s for s, n in self.room.items() if n <= 0)

    def take(self, sweep_id: str | None) -> Literal["take", "skip", "stopped"]:
        """Whether a queued task may take a slot (counted if so): a task of its own always."""
        if sweep_id is None:
            return "take"
        if sweep_id in self.stopped:
            return "stopped"
        room = self.room.get(sweep_id)
        if room is None:
            return "take"
        if room <= 0:
            return "skip"
        self.room[sweep_id] = room - 1
        return "take"

    def give_back(self, sweep_id: str | None) -> None:
        """A task `take` counted was left queued after all (no placement took it): its slot is
        the sweep's again."""
        if sweep_id is not None and sweep_id in self.room:
            self.room[sweep_id] += 1

    def cancel_values(self, sweep_id: str) -> dict[str, Any]:
        """The values of a stopped sweep's shard cancelled instead of claimed."""
        why = self.stopped[sweep_id]
        return {"cancel_requested": True, "cancel_reason": why[:500],
                "error_json": json.dumps(sweeps.stopped_error(sweep_id, why))}
