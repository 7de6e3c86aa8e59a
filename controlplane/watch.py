"""`controlplane tasks watch`: a live table of the caller's newest tasks, with progress bars
(rich's Live), refreshed from `list_tasks` over one MCP session.

`table(tasks)` renders one frame from a `list_tasks` page, `watch()` keeps it up to date. The
server is asked once per interval, whatever the number of tasks (one page of `list_tasks`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
from rich.console import Console
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from controlplane.states import FINAL

STYLE = {"succeeded": "green", "failed": "red", "timed_out": "red", "cancelled": "dim", "expired": "dim",
         "running": "cyan", "queued": "yellow", "scheduled": "yellow"}


def percent_of(task: dict[str, Any]) -> float:
    if task["state"] == "succeeded":
        return 100.0
    return float(task.get("percent") or 0.0)


def table(tasks: list[dict[str, Any]], *, at: float | None = None) -> Table:
    """One frame: task id, tool, state, a progress bar and its percent, when submitted."""
    out = Table(box=None, pad_edge=False, title=time.strftime("%H:%M:%S", time.localtime(at or time.time())),
                title_justify="left")
    for name in ("task_id", "tool", "state", "progress", "%", "submitted"):
        out.add_column(name, no_wrap=True, overflow="ignore")
    for t in tasks:
        pct = percent_of(t)
        out.add_row(t["task_id"], t["tool_name"], Text(t["state"], style=STYLE.get(t["state"], "")),
                    ProgressBar(total=100, completed=pct, width=24), f"{pct:5.1f}", t["submitted_at"])
    if not tasks:
        out.add_row("(no tasks)", "", "", "", "", "")
    return out


async def watch(url: str, token: str | None, args: dict[str, Any], console: Console, *, interval: float = 1.0,
                until_done: bool = False, frames: int | None = None) -> list[dict[str, Any]]:
    """Keep the table up to date until interrupted (or, with `until_done`, until every task shown
    has ended; `frames`: at most this many refreshes). Returns the last page's tasks."""
    from fastmcp import Client

    tasks: list[dict[str, Any]] = []
    shown = 0
    async with Client(url, auth=token) as client:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                res = await client.call_tool("list_tasks", args, raise_on_error=False)
                page = res.structured_content or json.loads(res.content[0].text)
                if res.is_error:
                    raise RuntimeError(f"{page.get('code')}: {page.get('message')}")
                tasks = page["tasks"]
                live.update(table(tasks), refresh=True)
                shown += 1
                if (until_done and all(t["state"] in FINAL for t in tasks)) or (frames is not None and shown >= frames):
                    return tasks
                await anyio.sleep(interval)
