"""The local object store: a directory, plus HMAC-signed links served by the control plane.

Writes go to a temporary file in the same directory and are published with `link()`, which
fails if the object exists: objects are immutable and never seen half-written. Every key is
resolved under the root and refused if it would land outside it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO
from urllib.parse import quote, unquote, urlencode, urlparse

from controlplane.objectstore.base import (
    CHUNK,
    ObjectExists,
    ObjectInfo,
    ObjectStore,
    UnsafeKey,
    UploadIncomplete,
    check_key,
)

PARTIAL = ".upload-partial-"  # an upload's bytes so far, beside where its object will be


class LinkSigner:
    """Signs and checks the download links of one local store: HMAC-SHA256 over the store id,
    the key, the expiry and the filename. The control plane serves `/objects/<store id>/<key>`
    only with a valid, unexpired signature."""

    def __init__(self, key: bytes, store_id: str, base_url: str | None = None):
        self._key = hashlib.sha256(b"controlplane/object-links\n" + key).digest()
        self.store_id = store_id
        self.base_url = base_url

    def _sign(self, method: str, key: str, expires: int, detail: str | int) -> str:
        """The HMAC of a link: its method, the store, the key, the expiry and the one more thing
        the link fixes (a download's filename, an upload's size)."""
        msg = f"{method}\n{self.store_id}\n{key}\n{expires}\n{detail}".encode()
        return hmac.new(self._key, msg, hashlib.sha256).hexdigest()

    def _url(self, route: str, method: str, key: str, expires_in: int, name: str, detail: str | int) -> str:
        if not self.base_url:
            raise RuntimeError("the control plane's public URL is not known yet")
        expires = int(time.time()) + int(expires_in)
        query = urlencode({"expires": expires, name: detail, "signature": self._sign(method, key, expires, detail)})
        return f"{self.base_url.rstrip('/')}/{route}/{self.store_id}/{quote(key)}?{query}"

    def _genuine(self, method: str, key: str, expires: int, detail: str | int, signature: str,
                 now: float | None = None) -> bool:
        good = hmac.compare_digest(self._sign(method, key, expires, detail), signature or "")
        return good and expires >= (now if now is not None else time.time())

    # A download's link: GET of `key` (`/objects/<store id>/<key>`), saved as `filename`.
    def signature(self, key: str, expires: int, filename: str) -> str:
        return self._sign("GET", key, expires, filename)

    def url(self, key: str, *, expires_in: int, filename: str) -> str:
        return self._url("objects", "GET", key, expires_in, "filename", filename)

    def verify(self, key: str, expires: str, filename: str, signature: str, now: float | None = None) -> bool:
        try:
            exp = int(expires)
        except (TypeError, ValueError):
            return False
        return self._genuine("GET", key, exp, filename, signature, now)

    # An upload's link: PUT of exactly `size` bytes to `key` (`/uploads/<store id>/<key>`).
    def put_url(self, key: str, *, expires_in: int, size: int) -> str:
        return self._url("uploads", "PUT", key, expires_in, "size", size)

    def verify_put(self, key: str, expires: str, size: str, signature: str) -> int | None:
        """The size the link allows if it is genuine and unexpired, else None."""
        try:
            exp, n = int(expires), int(size)
        except (TypeError, ValueError):
            return None
        return n if self._genuine("PUT", key, exp, n, signature) else None


def store_id(url: str) -> str:
    """A short, stable name for a store in link paths (it does not reveal the directory)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class LocalObjectStore(ObjectStore):
    signs_locally = True  # an HMAC of the link: no call out

    def __init__(self, root: Path, signer: LinkSigner | None = None):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.url = self.root.as_uri()
        self.signer = signer

    @classmethod
    def from_url(cls, url: str) -> LocalObjectStore:
        return cls(Path(unquote(urlparse(url).path)))

    def path_of(self, key: str) -> Path:
        check_key(key)
        p = (self.root / key).resolve()
        if p != self.root and self.root not in p.parents:
            raise UnsafeKey("key resolves outside the store")
        return p

    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str | None = None, overwrite: bool = False) -> ObjectInfo:
        dest = self.path_of(key)
        if not overwrite and dest.exists():
            raise ObjectExists(key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        sha = hashlib.sha256()
        size = 0
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".upload-")
        try:
            with os.fdopen(fd, "wb") as out:
                while chunk := stream.read(CHUNK):
                    sha.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if overwrite:
                os.replace(tmp, dest)
            else:
                try:
                    os.link(tmp, dest)
                except FileExistsError:
                    raise ObjectExists(key) from None
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return ObjectInfo(key=key, size_bytes=size, sha256=sha.hexdigest(), content_type=content_type)

    def open(self, key: str) -> BinaryIO:
        return open(self.path_of(key), "rb")

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self.path_of(key).stat()
        except FileNotFoundError:
            return None
        return ObjectInfo(key=key, size_bytes=st.st_size)

    def list(self, prefix: str) -> Iterator[str]:
        base = self.path_of(prefix.rstrip("/")) if prefix.strip("/") else self.root
        if not base.is_dir():
            return iter(())
        keys = []
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                if not f.startswith(".upload-"):
                    keys.append(Path(dirpath, f).relative_to(self.root).as_posix())
        return iter(sorted(keys))

    def delete_prefix(self, prefix: str) -> int:
        base = self.path_of(prefix.rstrip("/"))
        if not base.exists():
            return 0
        n = sum(len(files) for _d, _s, files in os.walk(base)) if base.is_dir() else 1
        if base.is_dir():
            shutil.rmtree(base)
        else:
            base.unlink(missing_ok=True)
        return n

    def file_url(self, key: str) -> str:
        """The object as a `file://` URL: for a caller on this machine, with no server needed."""
        return self.path_of(key).as_uri()

    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        if self.signer is None:
            raise RuntimeError("this local store has no link signer")
        check_key(key)
        return self.signer.url(key, expires_in=expires_in, filename=filename)

    # ---- uploads: sent to the control plane's PUT route (`controlplane.http.uploads`) ----------
    def partial_of(self, key: str) -> Path:
        dest = self.path_of(key)
        return dest.with_name(PARTIAL + dest.name)

    def received(self, key: str) -> int:
        """How many bytes of an upload to `key` the store holds (all of them once published)."""
        for p in (self.path_of(key), self.partial_of(key)):
            try:
                return p.stat().st_size
            except FileNotFoundError:
                continue
        return 0

    def publish_partial(self, key: str) -> None:
        """The finished partial file becomes the object (ObjectExists if it already is one)."""
        part, dest = self.partial_of(key), self.path_of(key)
        with open(part, "rb") as f:
            os.fsync(f.fileno())
        try:
            os.link(part, dest)
        except FileExistsError:
            raise ObjectExists(key) from None
        finally:
            part.unlink(missing_ok=True)

    def upload_plan(self, key: str, *, size_bytes: int, content_type: str, expires_in: int,
                    session: str | None, single_max: int) -> tuple[dict[str, Any], str | None]:
        """A signed PUT to the control plane; past `single_max`, the same URL taking
        `Content-Range` chunks of `chunk_bytes`, from `received_bytes` on."""
        if self.signer is None:
            raise RuntimeError("this local store has no link signer")
        url = self.signer.put_url(check_key(key), expires_in=expires_in, size=size_bytes)
        plan: dict[str, Any] = {"form": "single", "method": "PUT", "url": url, "headers": {"Content-Type": content_type}}
        if size_bytes > single_max:
            plan.update(form="content_range", chunk_bytes=single_max, received_bytes=self.received(key))
        return plan, None

    def finish_upload(self, key: str, session: str | None, size_bytes: int, content_type: str) -> None:
        if not self.path_of(key).is_file():
            raise UploadIncomplete(key)

    def abort_upload(self, key: str, session: str | None) -> None:
        self.partial_of(key).unlink(missing_ok=True)
