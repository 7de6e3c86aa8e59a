"""Artifact metadata (the bytes live in the object store): read here, registered with the end of
the attempt that produced them (`AttemptTx.end`)."""

from __future__ import annotations

from controlplane.store import queries as q
from controlplane.store.db import Database
from controlplane.store.rows import ArtifactRow


class ArtifactStore:
    def __init__(self, db: Database):
        self.db = db

    def of(self, task_id: str, attempt: int | None = None) -> list[ArtifactRow]:
        """The task's artifacts by name (of one attempt, or of all)."""
        if attempt is None:
            rows = self.db.fetch(q.ARTIFACTS, {"task_id": task_id})
        else:
            rows = self.db.fetch(q.ATTEMPT_ARTIFACTS, {"task_id": task_id, "attempt": attempt})
        return [ArtifactRow.from_row(r) for r in rows]
