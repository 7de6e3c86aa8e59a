"""The object-store interface, key hygiene and the per-task layout.

Keys are relative POSIX paths. Anything that could escape a prefix (`..`, absolute paths,
backslashes, control characters, empty segments) is refused with `UnsafeKey`, both when the
control plane builds a key and when a runner hands one over.
"""

from __future__ import annotations

import hashlib
import importlib
import mimetypes
import re
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO

from controlplane.ids import AttemptRef

CHUNK = 1024 * 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME = 255


class UnsafeKey(ValueError):
    pass


class ObjectExists(Exception):
    """Objects are immutable: a second write under the same key is refused."""


class UploadIncomplete(Exception):
    """An upload's bytes are not all in the store yet (parts or a range missing)."""


@dataclass(frozen=True)
class SignedRequest:
    """One HTTP request a holder of no credentials may make: `method` to `url`, sending `headers`
    (those the signature covers or the backend needs, e.g. Azure's `x-ms-blob-type`)."""

    method: str
    url: str
    headers: dict[str, str]

    def as_dict(self) -> dict[str, object]:
        return {"method": self.method, "url": self.url, "headers": dict(self.headers)}


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size_bytes: int
    sha256: str | None = None
    content_type: str | None = None


def check_key(key: str) -> str:
    if not key or len(key) > 1024:
        raise UnsafeKey("empty or overlong key")
    if key.startswith("/") or "\\" in key or _CONTROL.search(key):
        raise UnsafeKey("absolute path, backslash or control character in key")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeKey("empty, '.' or '..' path segment in key")
    return key


def safe_artifact_name(name: object) -> str:
    """An artifact name as a job reports it: one relative path of safe segments.

    Refuses traversal, absolute paths, control characters and hidden segments instead of
    silently rewriting them, so that what the agent sees is what the tool wrote."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise UnsafeKey("artifact name must be 1 to 255 characters")
    check_key(name)
    if any(p.startswith(".") for p in name.split("/")):
        raise UnsafeKey("artifact name segments must not start with '.'")
    return name


def guess_content_type(name: str) -> str:
    ctype, _ = mimetypes.guess_type(name)
    return ctype or "application/octet-stream"


# ---- layout of one task in the store ---------------------------------------------------------
def upload_key(upload_id: str, name: str) -> str:
    """`uploads/<upload id>/<name>`: one upload's object (its name made safe)."""
    return f"{upload_prefix(upload_id)}{safe_artifact_name(name)}"


def upload_prefix(upload_id: str) -> str:
    return check_key(f"uploads/{upload_id}") + "/"


def task_prefix(task_id: str) -> str:
    return check_key(f"tasks/{task_id}") + "/"


def attempt_prefix(ref: AttemptRef) -> str:
    """`tasks/<task id>/attempts/<attempt>/`, then `shards/<shard>/` for a shard."""
    shard = "" if ref.shard is None else f"shards/{int(ref.shard)}/"
    return f"{task_prefix(ref.task_id)}attempts/{int(ref.number)}/{shard}"


def inputs_key(ref: AttemptRef) -> str:
    return attempt_prefix(ref) + "inputs.json"


def input_files_key(ref: AttemptRef) -> str:
    """The attempt's file inputs (`controlplane.references`): field -> where the bytes are."""
    return attempt_prefix(ref) + "input_files.json"


def result_key(ref: AttemptRef) -> str:
    return attempt_prefix(ref) + "result.json"


def events_prefix(ref: AttemptRef) -> str:
    return attempt_prefix(ref) + "events/"


def events_key(ref: AttemptRef, first_seq: int) -> str:
    return f"{events_prefix(ref)}{first_seq:012d}.jsonl"


def artifact_key(ref: AttemptRef, name: str) -> str:
    return attempt_prefix(ref) + "artifacts/" + safe_artifact_name(name)


class HashingReader:
    """Wraps a binary stream and computes size and sha256 of what passes through."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self.sha = hashlib.sha256()
        self.size = 0

    def read(self, n: int = -1) -> bytes:
        b = self._raw.read(n)
        self.sha.update(b)
        self.size += len(b)
        return b


class ObjectStore(ABC):
    """Blob storage behind one interface. Writes are immutable unless `overwrite=True`.

    `url` names the store (scheme, bucket or container, prefix) and is recorded with every
    artifact, so that a link can be signed by the store that holds it. Keys passed to the
    methods are relative to the store's prefix.
    """

    url: str
    # The longest lifetime this backend's signed links can have (SigV4 and GCS V4: 7 days).
    max_url_ttl_s: int = 7 * 24 * 3600
    # Whether `signed_url` is local computation only. A backend that may call out to sign (GCS
    # through IAM signBlob, Azure for a user delegation key) says False, and a get_task_result
    # with its artifacts leaves the event loop for a worker thread.
    signs_locally: bool = False
    # Whether `signed_put` works: a job without storage credentials can only use such a store.
    signs_uploads: bool = False

    @abstractmethod
    def put_stream(
        self, key: str, stream: BinaryIO, *, content_type: str | None = None, overwrite: bool = False
    ) -> ObjectInfo:
        """Stream `stream` into `key` without holding it in memory; returns size and sha256."""

    def put_bytes(self, key: str, data: bytes, *, content_type: str | None = None, overwrite: bool = False) -> ObjectInfo:
        import io

        return self.put_stream(key, io.BytesIO(data), content_type=content_type, overwrite=overwrite)

    def put_file(self, key: str, path: str, *, content_type: str | None = None, overwrite: bool = False) -> ObjectInfo:
        with open(path, "rb") as f:
            return self.put_stream(key, f, content_type=content_type, overwrite=overwrite)

    @abstractmethod
    def open(self, key: str) -> BinaryIO:
        """Open an object for streaming reads; FileNotFoundError if absent."""

    def get_bytes(self, key: str) -> bytes:
        with self.open(key) as f:
            return f.read()

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None: ...

    @abstractmethod
    def list(self, prefix: str) -> Iterator[str]:
        """Keys under `prefix`, in lexical order."""

    @abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Delete every object under `prefix`; idempotent (deleting nothing is fine)."""

    @abstractmethod
    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        """A URL that downloads exactly this object until `expires_in` seconds from now."""

    def signed_put(self, key: str, *, expires_in: int) -> SignedRequest:
        """A request that uploads exactly this object (once: a second upload is refused where the
        backend can enforce it) until `expires_in` seconds from now. The cloud stores sign one;
        the local store cannot (jobs that write to it run beside it, with its path)."""
        raise NotImplementedError(f"the {self.url.split(':', 1)[0]}:// store cannot sign uploads")

    # ---- uploads a caller sends (`controlplane.service.uploads`) ------------------------------
    def upload_plan(self, key: str, *, size_bytes: int, content_type: str, expires_in: int,
                    session: str | None, single_max: int) -> tuple[dict[str, Any], str | None]:
        """How a caller with no credentials sends `size_bytes` to `key`: a plan (one signed PUT up
        to `single_max` bytes, else this store's resumable form, saying what the store already
        holds) and the store's session to keep for the next call (an S3 multipart id), which
        `session` hands back when the plan is asked again. May call out: off the event loop."""
        raise NotImplementedError(f"the {self.url.split(':', 1)[0]}:// store cannot take uploads")

    def finish_upload(self, key: str, session: str | None, size_bytes: int, content_type: str) -> None:
        """Make what was sent under `session` the object `key` (an S3 multipart upload completed);
        UploadIncomplete if bytes are missing. Nothing to do for a single PUT."""
        return None

    def abort_upload(self, key: str, session: str | None) -> None:
        """Drop what an unfinished upload left (parts, a partial file); idempotent."""
        return None


def split_store_url(url: str) -> tuple[str, str, str]:
    """`scheme://location/prefix` -> (scheme, location, prefix without slashes at its ends)."""
    if "://" not in url:
        raise ValueError(f"object store URL '{url}' has no scheme (file://, s3://, gs://, az://)")
    scheme, rest = url.split("://", 1)
    location, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    if prefix:
        check_key(prefix)
    return scheme, location, prefix


def join_key(prefix: str, key: str) -> str:
    check_key(key)
    return f"{prefix}/{key}" if prefix else key


def content_disposition(filename: str) -> str:
    """`attachment; filename="..."` with anything that could break the header replaced."""
    safe = "".join(c if c.isprintable() and c not in '"\\;' else "_" for c in filename)[:MAX_NAME] or "download"
    return f'attachment; filename="{safe}"'


def open_store(url: str) -> ObjectStore:
    """The store a URL names: file:///dir, s3://bucket/prefix, gs://bucket/prefix,
    az://account/container/prefix. A cloud SDK is imported only when its scheme is used."""
    scheme = url.split("://", 1)[0] if "://" in url else ""
    backends = {"file": ("local", "LocalObjectStore", None), "s3": ("s3", "S3ObjectStore", "aws"),
                "gs": ("gcs", "GcsObjectStore", "gcp"), "az": ("azure_blob", "AzureBlobObjectStore", "azure")}
    if scheme not in backends:
        raise ValueError(f"unsupported object store URL scheme '{scheme}' (file://, s3://, gs://, az://)")
    module, cls, extra = backends[scheme]
    try:
        backend = importlib.import_module(f"controlplane.objectstore.{module}")
    except ImportError as e:
        raise ValueError(f"the {scheme}:// object store needs its SDK ({e.name}): "
                         f"pip install 'mcp-controlplane[{extra}]'") from None
    store: ObjectStore = getattr(backend, cls).from_url(url)
    return store
