"""`controlplane tasks watch`: a live table of the caller's newest tasks, with progress bars
(rich's Live), refreshed from `list_tasks` over one MCP session.

`table(tasks)` renders one frame from a `list_tasks` page, `watch()` keeps it up to date. The
server is asked once per interval, whatever the number of tasks or sweeps (one page of
`list_tasks` with `whole_sweeps`): a sweep's shards are one row, so the tasks submitted before a
big sweep stay on the page; its bar is the sweep's progress (get_sweep_status') and its `shards`
column what has ended, runs and failed.
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

from controlplane.states import FINAL, TaskState

STYLE = {"succeeded": "green", "failed": "red", "timed_out": "red", "cancelled": "dim", "expired": "dim",
         "running": "cyan", "queued": "yellow", "scheduled": "yellow", "waiting": "blue"}


def percent_of(task: dict[str, Any]) -> float:
    if task["state"] == "succeeded":
        return 100.0
    return float(task.get("percent") or 0.0)


# Every state fits this wide: a state is never cut.
STATE_WIDTH = max(len(state) for state in TaskState)
BAR_WIDTH = 24
GAP = 2  # between columns


def table(tasks: list[dict[str, Any]], *, at: float | None = None, width: int = 200) -> Table:
    """One frame at most `width` columns wide: task id, state and percent whole (never cut); the
    tool's name cut if it must be; the progress bar shorter, then left out; then `submitted`."""
    out = Table(box=None, pad_edge=False, title=time.strftime("%H:%M:%S", time.localtime(at or time.time())),
                title_justify="left", padding=(0, GAP // 2))
    id_w = max([len("task_id"), *(len(t["task_id"]) for t in tasks)])
    tool_w = max([len("tool"), *(len(t["tool_name"]) for t in tasks)])
    submitted_w = max([len("submitted"), *(len(t["submitted_at"]) for t in tasks)])
    shards_w = max([0, *(len(t["shards"]) for t in tasks if t.get("shards"))])
    fixed = id_w + STATE_WIDTH + 5 + 2 * GAP + (shards_w + GAP if shards_w else 0)
    tool_w = max(4, min(tool_w, width - fixed - GAP))
    room = width - fixed - GAP - tool_w
    bar_w = min(BAR_WIDTH, room - GAP - (submitted_w + GAP if room >= BAR_WIDTH + submitted_w + 2 * GAP else 0))
    show_bar = bar_w >= 8
    show_submitted = room - (bar_w + GAP if show_bar else 0) >= submitted_w + GAP
    out.add_column("task_id", no_wrap=True, min_width=id_w)
    out.add_column("tool", no_wrap=True, overflow="ellipsis", max_width=tool_w)
    out.add_column("state", no_wrap=True, min_width=STATE_WIDTH)
    if show_bar:
        out.add_column("progress", no_wrap=True, width=bar_w)
    out.add_column("%", no_wrap=True, justify="right", min_width=5)
    if shards_w:
        out.add_column("shards", no_wrap=True, min_width=shards_w)
    if show_submitted:
        out.add_column("submitted", no_wrap=True, min_width=submitted_w)
    for t in tasks:
        pct = percent_of(t)
        cells: list[Any] = [t["task_id"], t["tool_name"], Text(t["state"], style=STYLE.get(t["state"], ""))]
        if show_bar:
            cells.append(ProgressBar(total=100, completed=pct, width=bar_w))
        cells.append(f"{pct:5.1f}")
        if shards_w:
            cells.append(t.get("shards") or "")
        if show_submitted:
            cells.append(t["submitted_at"])
        out.add_row(*cells)
    if not tasks:
        out.add_row("(no tasks)", *[""] * (len(out.columns) - 1))
    return out


async def watch(url: str, token: str | None, args: dict[str, Any], console: Console, *, interval: float = 1.0,
                until_done: bool = False, frames: int | None = None) -> list[dict[str, Any]]:
    """Keep the table up to date until interrupted (or, with `until_done`, until every task shown
    has ended; `frames`: at most this many refreshes). Returns the last frame's rows (a sweep's
    shards as one)."""
    from fastmcp import Client

    tasks: list[dict[str, Any]] = []
    shown = 0
    async with Client(url, auth=token) as client:
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                tasks = (await _call(client, "list_tasks", {**args, "whole_sweeps": True}))["tasks"]
                live.update(table(tasks, width=console.width), refresh=True)
                shown += 1
                if (until_done and all(t["state"] in FINAL for t in tasks)) or (frames is not None and shown >= frames):
                    return tasks
                await anyio.sleep(interval)


async def _call(client: Any, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await client.call_tool(tool, args, raise_on_error=False)
    data: dict[str, Any] = res.structured_content or json.loads(res.content[0].text)
    if res.is_error:
        raise RuntimeError(f"{data.get('code')}: {data.get('message')}")
    return data
