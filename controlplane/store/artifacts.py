"""Artifact metadata (the bytes live in the object store): read here, registered with the end of
the attempt that produced them (`AttemptTx.end`)."""

from __future__ import annotations

from controlplane.ids import AttemptRef
from controlplane.store import queries as q
from controlplane.store.db import Database
from controlplane.store.rows import ArtifactRow


class ArtifactStore:
    def __init__(self, db: Database):
        self.db = db

    def of(self, task_id: str) -> list[ArtifactRow]:
        """The artifacts of every attempt of the task, by name."""
        return [ArtifactRow.from_row(r) for r in self.db.fetch(q.ARTIFACTS, {"task_id": task_id})]

    def of_attempt(self, ref: AttemptRef) -> list[ArtifactRow]:
        """The artifacts of one attempt, by name."""
        rows = self.db.fetch(q.ATTEMPT_ARTIFACTS, {"task_id": ref.task_id, "attempt": ref.number})
        return [ArtifactRow.from_row(r) for r in rows]
