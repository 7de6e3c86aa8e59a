"""Google Cloud Storage through google-cloud-storage: `gs://bucket/prefix`.

Credentials come from Application Default Credentials (the job's service account on Cloud
Run); `STORAGE_EMULATOR_HOST` points the client at an emulator. Writes stream through a
resumable upload in 8 MiB chunks with `ifGenerationMatch=0` (GCS refuses a second write of the
same name atomically; the store also checks first, for emulators that do not enforce it).

Links are V4 signed URLs, at most 7 days. They are signed with a service-account key when
`CONTROLPLANE_GCS_SIGNING_KEY_FILE` names one, and otherwise through IAM signBlob with the
runtime identity (Cloud Run's metadata credentials carry no private key), which needs the
identity to hold roles/iam.serviceAccountTokenCreator on itself.
"""

from __future__ import annotations

import datetime
import hashlib
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from google.api_core import exceptions as gexc
from google.cloud import storage

from controlplane.objectstore.base import (
    CHUNK,
    ObjectExists,
    ObjectInfo,
    ObjectStore,
    check_key,
    content_disposition,
    join_key,
    split_store_url,
)

UPLOAD_CHUNK = 8 * CHUNK  # a multiple of 256 KiB, as resumable uploads require


class GcsObjectStore(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None, signing_key_file: str | None = None):
        self.bucket_name = bucket
        self.prefix = prefix
        self.url = f"gs://{bucket}/{prefix}".rstrip("/")
        self.emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if client is None:
            if self.emulator:
                from google.auth.credentials import AnonymousCredentials

                client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "controlplane"),
                                        credentials=AnonymousCredentials())
            else:
                client = storage.Client()
        self.client = client
        self.bucket = client.bucket(bucket)
        self.signing_key_file = signing_key_file or os.environ.get("CONTROLPLANE_GCS_SIGNING_KEY_FILE")
        self._signer: Any = None

    @classmethod
    def from_url(cls, url: str) -> GcsObjectStore:
        _, bucket, prefix = split_store_url(url)
        return cls(bucket, prefix)

    def _blob(self, key: str) -> Any:
        return self.bucket.blob(join_key(self.prefix, key))

    # ---- writes -------------------------------------------------------------------------------
    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str | None = None,
                   overwrite: bool = False) -> ObjectInfo:
        blob = self._blob(key)
        if not overwrite and blob.exists():
            raise ObjectExists(key)
        cond: dict[str, Any] = {} if overwrite else {"if_generation_match": 0}
        sha = hashlib.sha256()
        size = 0
        try:
            with blob.open("wb", chunk_size=UPLOAD_CHUNK, content_type=content_type or "application/octet-stream",
                           ignore_flush=True, **cond) as out:
                while chunk := stream.read(CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
        except gexc.PreconditionFailed:
            raise ObjectExists(key) from None
        return ObjectInfo(key=key, size_bytes=size, sha256=sha.hexdigest(), content_type=content_type)

    # ---- reads --------------------------------------------------------------------------------
    def open(self, key: str) -> BinaryIO:
        blob = self._blob(key)
        try:
            blob.reload()
        except gexc.NotFound:
            raise FileNotFoundError(key) from None
        return blob.open("rb", chunk_size=UPLOAD_CHUNK)

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._blob(key).download_as_bytes()
        except gexc.NotFound:
            raise FileNotFoundError(key) from None

    def stat(self, key: str) -> ObjectInfo | None:
        blob = self.bucket.get_blob(join_key(self.prefix, key))
        if blob is None:
            return None
        return ObjectInfo(key=key, size_bytes=int(blob.size or 0), content_type=blob.content_type)

    def list(self, prefix: str) -> Iterator[str]:
        full = join_key(self.prefix, prefix.rstrip("/")) + "/" if prefix.strip("/") else (
            f"{self.prefix}/" if self.prefix else "")
        cut = len(self.prefix) + 1 if self.prefix else 0
        names = sorted(b.name for b in self.client.list_blobs(self.bucket_name, prefix=full))
        return iter([n[cut:] for n in names])

    def delete_prefix(self, prefix: str) -> int:
        n = 0
        for key in list(self.list(prefix)):
            try:
                self._blob(key).delete()
                n += 1
            except gexc.NotFound:
                pass  # deleted already: deletion is idempotent
        return n

    # ---- links --------------------------------------------------------------------------------
    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        check_key(key)
        kwargs: dict[str, Any] = {
            "version": "v4",
            "method": "GET",
            "expiration": datetime.timedelta(seconds=min(int(expires_in), self.max_url_ttl_s)),
            "response_disposition": content_disposition(filename),
        }
        if self.emulator:
            kwargs["api_access_endpoint"] = self.emulator.rstrip("/")
        kwargs.update(self._signing_kwargs())
        return self._blob(key).generate_signed_url(**kwargs)

    def _signing_kwargs(self) -> dict[str, Any]:
        if self.signing_key_file:
            if self._signer is None:
                from google.oauth2 import service_account

                self._signer = service_account.Credentials.from_service_account_file(self.signing_key_file)
            return {"credentials": self._signer}
        creds = self.client._credentials
        if hasattr(creds, "sign_bytes") and getattr(creds, "signer", None) is not None:
            return {"credentials": creds}  # a service-account key: signs locally
        # Runtime identity without a key (Cloud Run): sign through IAM signBlob.
        import google.auth.transport.requests

        if not creds.valid:
            creds.refresh(google.auth.transport.requests.Request())
        return {"service_account_email": creds.service_account_email, "access_token": creds.token}
