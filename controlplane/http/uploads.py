"""The local object store's upload route: what a caller sends to an upload's signed link.

    PUT /uploads/{store}/{key}?expires=&size=&signature=

The link names one key under `uploads/` and the exact size it may receive, and is signed by the
store's `LinkSigner` (HMAC-SHA256, expiring): anything else is 403 and nothing is written.
Without `Content-Range` the body is the whole object. With `Content-Range: bytes a-b/size` it is
one chunk, written at offset `a` of the upload's partial file (any offset up to what is already
there: a chunk cut off is simply sent again); `Content-Range: bytes */size` with no body asks how
much is there. Every answer says `received_bytes`; the object appears (immutably, all at once)
when the last byte arrives. The body streams to disk through a 1 MiB buffer, written off the
event loop.
"""

from __future__ import annotations

import asyncio
import os
import re
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio.to_thread
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from controlplane.objectstore.base import CHUNK, ObjectExists, UnsafeKey
from controlplane.objectstore.local import LocalObjectStore

if TYPE_CHECKING:
    from controlplane.objectstore.registry import ObjectStores

_RANGE = re.compile(r"bytes (?:(\d+)-(\d+)|\*)/(\d+)$")


def _answer(status: int, received: int, message: str | None = None) -> JSONResponse:
    body: dict[str, object] = {"received_bytes": received}
    if message:
        body["error"] = message
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


def upload_routes(object_stores: ObjectStores, pending: Callable[[str], bool]) -> list[Route]:
    """The route, for the local stores of `object_stores`; `pending(upload_id)` says whether an
    upload still takes bytes (a discarded or completed one does not, whatever its link says)."""
    # One writer per upload at a time (in this process); a lock lives while someone holds it.
    locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    async def put(request: Request) -> Response:
        objects = object_stores.local(request.path_params["store"])
        key = request.path_params["key"]
        q = request.query_params
        signer = objects.signer if objects is not None else None
        size = signer.verify_put(key, q.get("expires", ""), q.get("size", ""), q.get("signature", "")) \
            if signer is not None else None
        if objects is None or size is None or not key.startswith("uploads/"):
            return JSONResponse({"error": "invalid or expired upload link"}, status_code=403)
        try:
            dest = objects.path_of(key)
        except UnsafeKey:
            return JSONResponse({"error": "invalid or expired upload link"}, status_code=403)
        header = request.headers.get("content-range")
        if header is None:
            start, end = 0, size - 1
        else:
            m = _RANGE.match(header.strip())
            if m is None or int(m.group(3)) != size:
                return _answer(400, objects.received(key), f"Content-Range must be 'bytes a-b/{size}' or 'bytes */{size}'")
            if m.group(1) is None:  # how much is there?
                return _answer(200, objects.received(key))
            start, end = int(m.group(1)), int(m.group(2))
        if not 0 <= start <= end < size and not (size == 0 and header is None):
            return _answer(416, objects.received(key), "the range is outside the upload's size")
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) != (end - start + 1 if size else 0)):
            return _answer(400, objects.received(key), "Content-Length must be the length of the range")
        if not await anyio.to_thread.run_sync(pending, key.split("/")[1]):
            return JSONResponse({"error": "this upload takes no more bytes"}, status_code=409)
        lock = locks.get(key)
        if lock is None:
            locks[key] = lock = asyncio.Lock()
        async with lock:
            return await _write(request, objects, key, dest, start, end, size)

    async def _write(request: Request, objects: LocalObjectStore, key: str, dest: Path, start: int, end: int,
                     size: int) -> Response:
        if await anyio.to_thread.run_sync(dest.is_file):
            return _answer(409, size, "this upload has all its bytes already")
        part = objects.partial_of(key)
        have = await anyio.to_thread.run_sync(objects.received, key)
        if start > have:
            return _answer(416, have, f"send from byte {have} on")
        part.parent.mkdir(parents=True, exist_ok=True)
        fd = await anyio.to_thread.run_sync(lambda: os.open(part, os.O_RDWR | os.O_CREAT, 0o600))
        f = os.fdopen(fd, "r+b")
        expected = end - start + 1 if size else 0
        written = 0
        try:
            await anyio.to_thread.run_sync(lambda: (f.truncate(start), f.seek(start)))
            buf = bytearray()
            try:
                async for chunk in request.stream():
                    if written + len(buf) + len(chunk) > expected:
                        return _answer(400, start, "the body is longer than its range")
                    buf += chunk
                    if len(buf) >= CHUNK:
                        data, buf = bytes(buf), bytearray()
                        await anyio.to_thread.run_sync(f.write, data)
                        written += len(data)
            except ClientDisconnect:  # what arrived stays: the caller resumes from there
                await anyio.to_thread.run_sync(f.write, bytes(buf))
                return _answer(400, start + written + len(buf), "the body ended early")
            if buf:
                await anyio.to_thread.run_sync(f.write, bytes(buf))
                written += len(buf)
            await anyio.to_thread.run_sync(f.flush)
        finally:
            f.close()
        received = start + written
        if received == size:
            try:
                await anyio.to_thread.run_sync(objects.publish_partial, key)
            except ObjectExists:
                return _answer(409, size, "this upload has all its bytes already")
            return _answer(201, size)
        return _answer(200, received)

    return [Route("/uploads/{store}/{key:path}", put, methods=["PUT"])]
