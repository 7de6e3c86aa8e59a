"""`controlplane get artifact://TASK_ID/NAME [-o FILE]`: download one artifact of a task.

The artifact's link comes from `get_task_result`; its bytes stream to `FILE.part` in 1 MiB pieces
with a progress bar (constant memory) and become FILE only once their size and sha256 are those
the server reported. Run it again after an interruption: a `.part` file left over is hashed and
continued with an HTTP Range request (started afresh if the server ignores the range).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.cli.common import err
from controlplane.cli.tasks import DEFAULT_URL, TokenOpt, UrlOpt, _call
from controlplane.cli.uploads import PIECE, _progress

PREFIX = "artifact://"


def parse(ref: str) -> tuple[str, str]:
    """(task id, artifact name) of `artifact://<task id>/<name>`."""
    task_id, _, name = ref.removeprefix(PREFIX).partition("/")
    if not ref.startswith(PREFIX) or not task_id or not name:
        err.print(f"[red]expected artifact://TASK_ID/NAME[/], not {ref!r}")
        raise typer.Exit(2)
    return task_id, name


def get(ref: Annotated[str, typer.Argument(help="artifact://TASK_ID/NAME")],
        output: Annotated[Path | None, typer.Option("--output", "-o", help="Where to write it (default: the "
                                                    "artifact's file name, here)")] = None,
        url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Download an artifact of one of your tasks, checked against its sha256; run it again to resume."""
    import httpx

    task_id, name = parse(ref)
    result = _call(url, token, "get_task_result", {"task_id": task_id})
    art: dict[str, Any] | None = next((a for a in result.get("artifacts") or [] if a.get("name") == name), None)
    if art is None:
        err.print(f"[red]NOT_FOUND[/]: task {task_id} has no artifact {name!r}")
        raise typer.Exit(1)
    out = output or Path(Path(name).name)
    if out.exists():
        err.print(f"[red]{out} exists[/]: pass --output to write elsewhere")
        raise typer.Exit(1)
    part = out.with_name(out.name + ".part")
    size, sha = int(art["size_bytes"]), hashlib.sha256()
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    with _progress() as progress:
        bar = progress.add_task(f"downloading {name}", total=size)
        if have:
            with open(part, "rb") as f:
                while chunk := f.read(PIECE):
                    sha.update(chunk)
            progress.update(bar, completed=have)
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with httpx.stream("GET", art["download_url"], headers=headers, timeout=60, follow_redirects=True) as r:
                r.raise_for_status()
                if have and r.status_code != 206:  # the range was not honoured: start afresh
                    have, sha = 0, hashlib.sha256()
                    progress.update(bar, completed=0)
                elif have:
                    err.print(f"resuming at byte {have}")
                with open(part, "ab" if have else "wb") as f:
                    for chunk in r.iter_bytes(PIECE):
                        f.write(chunk)
                        sha.update(chunk)
                        progress.advance(bar, len(chunk))
        except httpx.HTTPError as e:
            err.print(f"[red]download interrupted[/] ({type(e).__name__}); run the same command again to resume")
            raise typer.Exit(1) from None
    got = part.stat().st_size
    if got != size or sha.hexdigest() != art["sha256"]:
        part.unlink()
        err.print(f"[red]the bytes received are not the artifact[/] ({got} bytes, sha256 {sha.hexdigest()}); "
                  "they were deleted: run the command again")
        raise typer.Exit(1)
    os.replace(part, out)
    print(out)
