"""`controlplane put FILE`: upload a file to a running server and print its reference.

The file is hashed (streamed), `create_upload` answers a plan, the bytes go where the plan says
(one PUT, `Content-Range` chunks to the local store or a GCS resumable session, S3 parts or Azure blocks) straight from the file in 1 MiB
pieces with a progress bar, and `complete_upload` has the server verify them. Memory stays
constant whatever the file's size. Run it again after an interruption: the server answers the
same upload and what it already holds, and only the rest is sent.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from controlplane.cli.common import err
from controlplane.cli.tasks import DEFAULT_URL, TokenOpt, UrlOpt, _call

PIECE = 1024 * 1024
TRIES = 5  # sends of one request before giving up (waiting 1, 2, 4, 8 s between)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=err, transient=False)


def file_sha256(path: Path, advance: Callable[[int], None]) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(PIECE):
            sha.update(chunk)
            advance(len(chunk))
    return sha.hexdigest()


def _pieces(path: Path, start: int, length: int, advance: Callable[[int], None]) -> Iterator[bytes]:
    """`length` bytes of the file from `start`, a piece at a time."""
    with open(path, "rb") as f:
        f.seek(start)
        left = length
        while left > 0:
            chunk = f.read(min(PIECE, left))
            if not chunk:
                raise OSError("the file got shorter while it was being sent")
            left -= len(chunk)
            advance(len(chunk))
            yield chunk


class Sender:
    """Sends one file's bytes by a plan, retrying a failed request with backoff."""

    def __init__(self, path: Path, size: int, plan: dict[str, Any], progress: Progress, bar: Any):
        import httpx

        self.path, self.size, self.plan = path, size, plan
        self.http = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0))
        self.progress, self.bar = progress, bar

    def advance(self, n: int) -> None:
        self.progress.advance(self.bar, n)

    def put(self, url: str, headers: dict[str, str], start: int, length: int) -> Any:
        """One PUT of the file's bytes [start, start+length); the response, raised for status."""
        import httpx

        for attempt in range(TRIES):
            sent_before = self.progress.tasks[self.bar].completed
            try:
                r = self.http.put(url, headers={**headers, "Content-Length": str(length)},
                                  content=_pieces(self.path, start, length, self.advance))
                if r.status_code == 308:  # GCS: a chunk of a resumable upload taken, more to come
                    return r
                if r.status_code < 500 and r.status_code not in (408, 429):
                    r.raise_for_status()  # refused (a bad or expired link): no retry helps
                    return r
            except httpx.TransportError:
                pass
            self.progress.update(self.bar, completed=sent_before)
            if attempt + 1 < TRIES:
                time.sleep(2**attempt)
        raise OSError(f"sending bytes {start}-{start + length - 1} failed {TRIES} times")

    def send(self) -> None:
        plan, form = self.plan, self.plan.get("form")
        headers = dict(plan.get("headers") or {})
        if form == "single":
            self.put(plan["url"], headers, 0, self.size)
        elif form in ("content_range", "gcs_resumable"):
            at, step = int(plan.get("received_bytes") or 0), int(plan["chunk_bytes"])
            self.progress.update(self.bar, completed=at)
            while at < self.size:
                n = min(step, self.size - at)
                rng = {"Content-Range": f"bytes {at}-{at + n - 1}/{self.size}"}
                self.put(plan["url"], {**headers, **rng}, at, n)
                at += n
        elif form in ("s3_multipart", "azure_blocks"):
            part_size, done = int(plan["part_size"]), set(plan.get("parts_done") or [])
            self.progress.update(self.bar, completed=sum(min(part_size, self.size - (n - 1) * part_size)
                                                         for n in done))
            for part in plan["parts"]:
                start = (int(part["part_number"]) - 1) * part_size
                self.put(part["url"], {}, start, min(part_size, self.size - start))
        else:
            raise OSError(f"this server answered an upload plan this command does not know ({form})")


def put(file: Annotated[Path, typer.Argument(help="The file to upload", exists=True, dir_okay=False,
                                             readable=True)],
        name: Annotated[str | None, typer.Option("--name", help="Its name on the server (default: the "
                                                 "file's)")] = None,
        content_type: Annotated[str | None, typer.Option("--content-type", help="Its media type (default: "
                                                         "guessed from the name)")] = None,
        url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Upload FILE to the server and print its reference (upload://upl_...). Run it again to
    resume an interrupted upload."""
    size = os.path.getsize(file)
    with _progress() as progress:
        bar = progress.add_task("hashing", total=size)
        sha = file_sha256(file, lambda n: progress.advance(bar, n))
        progress.update(bar, visible=False)
    args: dict[str, Any] = {"name": name or file.name, "size_bytes": size, "sha256": sha}
    if content_type:
        args["content_type"] = content_type
    upload = _call(url, token, "create_upload", args)
    plan = upload.get("plan")
    if upload.get("state") == "pending" and plan is not None:
        if upload.get("resumed"):
            err.print(f"resuming {upload['upload_id']}" + (
                f": {plan['received_bytes']} bytes already there" if plan.get("received_bytes") else
                f": {len(plan['parts_done'])} parts already there" if plan.get("parts_done") else ""))
        with _progress() as progress:
            bar = progress.add_task(f"uploading {args['name']}", total=size)
            sender = Sender(file, size, plan, progress, bar)
            try:
                sender.send()
            except Exception as e:  # noqa: BLE001 - the user sees why, briefly, and may run it again
                err.print(f"[red]upload interrupted[/] ({type(e).__name__}: {e}); run the same command again "
                          "to resume")
                raise typer.Exit(1) from None
    done = _call(url, token, "complete_upload", {"upload_id": upload["upload_id"]})
    print(done["reference"])
