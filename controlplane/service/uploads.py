"""Uploads: files a caller brings (`create_upload`, `complete_upload`), and their answers.

An upload belongs to its caller: another caller's answers NOT_FOUND exactly as a missing one.
Its bytes go straight to the default object store under `uploads/<upload id>/<name>`, by a plan
the store signs (`ObjectStore.upload_plan`); the control plane never relays them, except on the
local store, whose signed PUT route is the control plane's own (`controlplane.http.uploads`).
Asking again for the same file (same caller, name, size and sha256) while it is pending answers
the same upload with a fresh plan that says what the store already holds: that is how an
interrupted upload resumes. `complete_upload` reads the object back (streamed, constant memory,
in a worker thread) and keeps it only if its size and sha256 are those promised.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from typing import Any

from controlplane import api, identity
from controlplane.api import iso
from controlplane.errors import ControlPlaneError, ErrorCode, invalid, not_found
from controlplane.objectstore.base import (
    CHUNK,
    ObjectStore,
    UnsafeKey,
    UploadIncomplete,
    guess_content_type,
    safe_artifact_name,
    upload_key,
    upload_prefix,
)
from controlplane.objectstore.registry import ObjectStores
from controlplane.service.answers import Answer
from controlplane.settings import Settings
from controlplane.store import Store
from controlplane.store.rows import UploadRow

log = logging.getLogger("controlplane.uploads")


class UploadAnswer(Answer):
    upload_id: str
    state: str  # "pending" | "complete"
    name: str
    size_bytes: int
    sha256: str
    content_type: str
    expires_at: str
    resumed: bool  # an upload of the same file asked for before: the plan says what is there
    plan: dict[str, Any] | None  # where and how to send the bytes (None once complete)
    reference: str  # upload://<upload id>


class CompletedUpload(Answer):
    upload_id: str
    state: str
    name: str
    size_bytes: int
    sha256: str
    content_type: str
    expires_at: str
    completed_at: str | None
    reference: str


def reference(upload_id: str) -> str:
    return f"upload://{upload_id}"


class Uploads:
    def __init__(self, settings: Settings, store: Store, object_stores: ObjectStores):
        self.settings = settings
        self.store = store
        self.object_stores = object_stores

    def create(self, caller: str, req: api.CreateUpload) -> UploadAnswer:
        try:
            safe_artifact_name(req.name)
        except UnsafeKey as e:
            raise invalid(f"name: {e}") from None
        now = self.store.writer.clock()
        row = self.store.uploads.pending(str(caller), req.name, req.size_bytes, req.sha256, now)
        resumed = row is not None
        if row is None:
            upload_id = "upl_" + secrets.token_hex(12)
            row = self.store.uploads.add(UploadRow(
                upload_id=upload_id, owner=str(caller), team=identity.team_for_new_task(caller), name=req.name,
                size_bytes=req.size_bytes, sha256=req.sha256,
                content_type=req.content_type or guess_content_type(req.name),
                store_url=self.object_stores.default.url, storage_key=upload_key(upload_id, req.name), session=None,
                state="pending", created_at=now, expires_at=now + self.settings.upload_ttl_s, completed_at=None))
        objects = self.object_stores.get(row.store_url)
        ttl = max(60, min(self.settings.upload_url_ttl_s, int(row.expires_at - now), objects.max_url_ttl_s))
        try:
            plan, session = objects.upload_plan(row.storage_key, size_bytes=row.size_bytes,
                                                content_type=row.content_type, expires_in=ttl, session=row.session,
                                                single_max=self.settings.upload_single_max_bytes)
        except NotImplementedError:
            raise ControlPlaneError(ErrorCode.CAPABILITY_MISSING, "this server's object store cannot take "
                                    "uploads yet") from None
        if session != row.session:
            self.store.uploads.set_session(row.upload_id, session)
        plan["expires_in"] = ttl
        return UploadAnswer(upload_id=row.upload_id, state=row.state, name=row.name, size_bytes=row.size_bytes,
                            sha256=row.sha256, content_type=row.content_type, expires_at=iso(row.expires_at) or "",
                            resumed=resumed, plan=plan, reference=reference(row.upload_id))

    def complete(self, caller: str, req: api.CompleteUpload) -> CompletedUpload:
        row = self.store.uploads.get(req.upload_id)
        if row is None or row.owner != caller or row.expires_at <= self.store.writer.clock():
            raise not_found("upload")
        if row.state == "pending":
            objects = self.object_stores.get(row.store_url)
            try:
                objects.finish_upload(row.storage_key, row.session, row.size_bytes, row.content_type)
            except UploadIncomplete:
                raise ControlPlaneError(ErrorCode.UPLOAD_INCOMPLETE, "the upload has not received all its bytes",
                                        "send the rest: create_upload with the same file answers what is "
                                        "there") from None
            size, sha = measure(objects, row.storage_key)
            if (size, sha) != (row.size_bytes, row.sha256):
                self.discard(row)
                what = "size" if size != row.size_bytes else "sha256"
                raise ControlPlaneError(ErrorCode.UPLOAD_MISMATCH, f"the bytes received do not match the "
                                        f"upload's {what}; they were deleted",
                                        "create_upload again and send the file as it is", expected=row.sha256
                                        if what == "sha256" else row.size_bytes,
                                        received=sha if what == "sha256" else size)
            row = self.store.uploads.complete(row.upload_id) or row
        return CompletedUpload(upload_id=row.upload_id, state=row.state, name=row.name, size_bytes=row.size_bytes,
                               sha256=row.sha256, content_type=row.content_type,
                               expires_at=iso(row.expires_at) or "", completed_at=iso(row.completed_at),
                               reference=reference(row.upload_id))

    def discard(self, row: UploadRow) -> None:
        """The upload, its object and whatever its store kept of it, gone."""
        objects = self.object_stores.get(row.store_url)
        objects.abort_upload(row.storage_key, row.session)
        objects.delete_prefix(upload_prefix(row.upload_id))
        self.store.uploads.delete(row.upload_id)


def measure(objects: ObjectStore, key: str) -> tuple[int, str]:
    """Size and sha256 of a stored object, streamed through a fixed buffer."""
    sha, size = hashlib.sha256(), 0
    with objects.open(key) as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return size, sha.hexdigest()
