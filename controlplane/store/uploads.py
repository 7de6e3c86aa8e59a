"""Uploads: the rows of files callers bring (`uploads`). Persistence only: what a plan is, when
an upload is verified and when it may go are `controlplane.service.uploads`' and
`controlplane.retention`'s decisions."""

from __future__ import annotations

from dataclasses import asdict

from controlplane.store import queries as q
from controlplane.store.rows import UploadRow
from controlplane.store.writer import Writer


class UploadStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    def add(self, row: UploadRow) -> UploadRow:
        with self.w.tx() as c:
            self.db.run(c, q.INSERT_UPLOAD, asdict(row))
        return row

    def get(self, upload_id: str) -> UploadRow | None:
        rows = self.db.fetch(q.GET_UPLOAD, {"upload_id": upload_id})
        return UploadRow.from_row(rows[0]) if rows else None

    def takes_bytes(self, upload_id: str) -> bool:
        """Whether the upload exists, is pending and has not expired."""
        row = self.get(upload_id)
        return row is not None and row.state == "pending" and row.expires_at > self.w.clock()

    def pending(self, owner: str, name: str, size_bytes: int, sha256: str, now: float) -> UploadRow | None:
        """The newest unexpired pending upload of `owner` for this very file, if any."""
        rows = self.db.fetch(q.PENDING_UPLOAD, {"owner": owner, "name": name, "size_bytes": size_bytes,
                                                "sha256": sha256, "now": now})
        return UploadRow.from_row(rows[0]) if rows else None

    def set_session(self, upload_id: str, session: str | None) -> None:
        with self.w.tx() as c:
            self.db.run(c, q.SET_UPLOAD_SESSION, {"_id": upload_id, "_session": session})

    def complete(self, upload_id: str) -> UploadRow | None:
        """pending -> complete (once); the row as it is afterwards (None: gone)."""
        with self.w.tx() as c:
            self.db.run(c, q.COMPLETE_UPLOAD, {"_id": upload_id, "_now": self.w.clock()})
        return self.get(upload_id)

    def delete(self, upload_id: str) -> bool:
        with self.w.tx() as c:
            return self.db.run(c, q.DELETE_UPLOAD, {"upload_id": upload_id}) == 1

    def due(self, now: float, limit: int) -> list[UploadRow]:
        """Uploads expired by `now`, oldest expiry first."""
        return [UploadRow.from_row(r) for r in self.db.fetch(q.DUE_UPLOADS, {"now": now, "lim": limit})]
