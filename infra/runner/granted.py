"""`GrantedStore`: the object store of a job that holds no storage credential.

With `CONTROLPLANE_STORE_ACCESS=grants` the runner never opens the bucket with a cloud identity:
every read and write is a plain HTTP request to a URL the control plane signed for one key of
this attempt (`POST .../grants`, rules in `controlplane.objectstore.grants`), made here with
urllib. A grant is asked for when it is first needed and kept until shortly before it expires.

The fallback path still works when the callback is down: at start, while the control plane
answers, `prefetch` asks for `result.json` and a pool of spill keys (`events/spill-NNNN.jsonl`)
that last the task's whole run. A spilled chunk goes to the key the reporter names (by its first
seq) if a grant for it can be had, and otherwise to the next unused pool key; the control plane
reads every chunk under `events/` and orders events by the seq inside each line, so the name of a
chunk does not matter. Artifacts are named only when the tool ends, so they need the control plane
then; a grant that cannot be had leaves the artifact out, with a warning in the task's log.

Single requests only: a signed PUT uploads at most 5 GiB on S3 (5000 MiB on Azure).
"""

from __future__ import annotations

import io
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from controlplane.ids import AttemptRef
from controlplane.objectstore.base import (
    HashingReader,
    ObjectExists,
    ObjectInfo,
    ObjectStore,
    UnsafeKey,
    attempt_prefix,
)

Ask = Callable[..., "dict[str, dict[str, Any]] | None"]  # (names, *, ahead) -> grants by name
POOL = 16  # spill keys granted ahead: a spill happens at most every 50,000 events or at the end
SLACK_S = 60.0  # a grant this close to its end is asked for again


class NoGrant(OSError):
    """The control plane could not be asked for a grant (unreachable, or it refused)."""


class GrantedStore(ObjectStore):
    granted = True  # reads and writes only through signed URLs (no stat, no list)

    def __init__(self, url: str, ref: AttemptRef, ask: Ask, *, pool: int = POOL, timeout_s: float = 60):
        self.url = url
        self.prefix = attempt_prefix(ref)
        self._ask = ask
        self._pool_size = pool
        self._timeout = timeout_s
        self._grants: dict[str, tuple[dict[str, Any], float]] = {}  # name -> (grant, good until, monotonic)
        self._pool: list[str] = []  # spill names granted ahead and not used yet
        self._lock = threading.Lock()

    # ---- grants -------------------------------------------------------------------------------
    def prefetch(self) -> bool:
        """Ask, ahead, for what the fallback path writes; False if the control plane did not answer."""
        spill = [f"events/spill-{i:04d}.jsonl" for i in range(self._pool_size)]
        got = self._fetch(["result.json", *spill], ahead=True)
        with self._lock:
            self._pool = [n for n in spill if n in got]
        return bool(got)

    def _fetch(self, names: list[str], *, ahead: bool = False) -> dict[str, dict[str, Any]]:
        return self._fetch_answer(self._ask(names, ahead=ahead) or {})

    def _fetch_answer(self, answer: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        out = {}
        for name, grant in answer.items():
            if isinstance(grant, dict) and isinstance(grant.get("url"), str):
                out[name] = grant
        with self._lock:
            for name, grant in out.items():
                self._grants[name] = (grant, now + float(grant.get("expires_in", 0)))
        return out

    def _grant(self, name: str) -> tuple[str, dict[str, Any]]:
        """A live grant for `name`, or for a spill key in its stead; NoGrant if none can be had."""
        with self._lock:
            held = self._grants.get(name)
        if held is not None and held[1] - SLACK_S > time.monotonic():
            return name, held[0]
        got = self._fetch([name]).get(name)
        if got is not None:
            return name, got
        if name.startswith("events/"):
            with self._lock:
                if self._pool:
                    slot = self._pool.pop(0)
                    return slot, self._grants[slot][0]
        raise NoGrant(f"no grant for {name}: the control plane could not be asked")

    def _name(self, key: str) -> str:
        if not key.startswith(self.prefix):
            raise UnsafeKey("a job's store holds only its own attempt's keys")
        return key[len(self.prefix):]

    # ---- the store ----------------------------------------------------------------------------
    def put_stream(self, key: str, stream: BinaryIO, *, content_type: str | None = None,
                   overwrite: bool = False) -> ObjectInfo:
        name = self._name(key)
        try:
            size = os.fstat(stream.fileno()).st_size - stream.tell()
        except (AttributeError, OSError, io.UnsupportedOperation):
            data = stream.read()  # not a file: small (the runner passes files and bytes)
            stream, size = io.BytesIO(data), len(data)
        start = stream.tell() if getattr(stream, "seekable", lambda: False)() else None
        for retry in (False, True):
            slot, grant = self._grant(name)
            body = HashingReader(stream)
            headers = {**grant.get("headers", {}), "Content-Type": content_type or "application/octet-stream",
                       "Content-Length": str(size)}
            req = urllib.request.Request(grant["url"], data=body, method=grant.get("method", "PUT"), headers=headers)
            try:
                with urllib.request.urlopen(req, timeout=self._timeout) as resp:
                    resp.read()
                break
            except urllib.error.HTTPError as e:
                if e.code in (409, 412):  # S3 and GCS say 412, Azure 409 BlobAlreadyExists
                    raise ObjectExists(key) from None
                # 403: the grant died early (on S3 with the session that signed it): ask again, once
                if e.code != 403 or retry or start is None or not self._forget(slot):
                    raise OSError(f"upload of {name} refused ({e.code})") from None
                stream.seek(start)
        return ObjectInfo(key=key, size_bytes=body.size, sha256=body.sha.hexdigest(), content_type=content_type)

    def _forget(self, name: str) -> bool:
        with self._lock:
            return self._grants.pop(name, None) is not None

    def open(self, key: str) -> BinaryIO:
        return self._get(self._name(key), key)

    def _get(self, name: str, key: str) -> BinaryIO:
        _, grant = self._grant(name)
        try:
            stream: BinaryIO = urllib.request.urlopen(
                urllib.request.Request(grant["url"], headers=grant.get("headers", {})), timeout=self._timeout)
            return stream
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise FileNotFoundError(key) from None
            raise OSError(f"download of {name} refused ({e.code})") from None

    def input_files(self) -> BinaryIO | None:
        """The attempt's `input_files.json`, or None when the control plane says the task has no
        file inputs (it grants no such name then); NoGrant if it could not be asked."""
        answer = self._ask(["input_files.json"], ahead=False)
        if answer is None:
            raise NoGrant("no grant for input_files.json: the control plane could not be asked")
        if "input_files.json" not in answer:
            return None
        self._fetch_answer(answer)
        return self._get("input_files.json", "input_files.json")

    def open_input(self, field: str) -> BinaryIO:
        """The file the task's input `field` refers to, through a GET the control plane signs."""
        return self._get(f"inputs/{field}", field)

    def stat(self, key: str) -> ObjectInfo | None:
        raise NotImplementedError("a job's granted store only reads and writes")

    def list(self, prefix: str) -> Iterator[str]:
        raise NotImplementedError("a job's granted store only reads and writes")

    def delete_prefix(self, prefix: str) -> int:
        raise NotImplementedError("a job's granted store only reads and writes")

    def signed_url(self, key: str, *, expires_in: int, filename: str) -> str:
        raise NotImplementedError("a job's granted store only reads and writes")
