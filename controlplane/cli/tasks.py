"""`controlplane tasks list | watch | show | logs | cancel | result | submit`: the tasks of a
running server, through its MCP tools."""

from __future__ import annotations

import json
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from controlplane.cli.common import JsonOpt, err, json_option

app = typer.Typer(no_args_is_help=True, help="Work with the tasks of a running server (over MCP).")

UrlOpt = Annotated[str, typer.Option("--url", envvar="CONTROLPLANE_URL", help="MCP endpoint of the server")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="CONTROLPLANE_TOKEN", help="Bearer token")]
DEFAULT_URL = "http://127.0.0.1:8000/mcp"


def _call(url: str, token: str | None, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    """A tool's answer; on a tool error, its code and message on stderr and exit 1. The call goes
    over the stateless wire (`wire`, no MCP library imported), or through fastmcp's client to a
    server that does not speak it."""
    from controlplane.cli import wire

    try:
        is_error, data = wire.caller(url, token).call(tool, args)
    except wire.Refused as e:
        _refused(url, token, e.status)
    except wire.NotModern:
        is_error, data = _call_by_session(url, token, tool, args)
    except Exception as e:  # noqa: BLE001 - connection problems are the user's to see, briefly
        _not_served(url, token, e)
    if is_error:
        err.print(f"[red]{data.get('code')}[/]: {data.get('message')}" + (f" ({data['hint']})" if data.get("hint") else ""))
        raise typer.Exit(1)
    return data


def _call_by_session(url: str, token: str | None, tool: str, args: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(is_error, answer) of a call through fastmcp's client, in a session of its own."""
    import asyncio

    from fastmcp import Client

    async def go() -> tuple[bool, dict[str, Any]]:
        async with Client(url, auth=token) as c:
            r = await c.call_tool(tool, args, raise_on_error=False)
            return r.is_error, (r.structured_content or json.loads(r.content[0].text))

    try:
        return asyncio.run(go())
    except Exception as e:  # noqa: BLE001 - connection problems are the user's to see, briefly
        _not_served(url, token, e)


def _not_served(url: str, token: str | None, e: Exception) -> NoReturn:
    """Say why a call failed and exit: the server refused the token (`_refused`) or could not be
    reached (exit 3). A client's error does not always say which, so the server is asked once
    more, plainly."""
    status = _refusal(url, token)
    if status is not None:
        _refused(url, token, status)
    err.print(f"[red]cannot reach {escape(url)}:[/] {type(e).__name__}: {escape(str(e))}")
    raise typer.Exit(3)


def _refused(url: str, token: str | None, status: int) -> NoReturn:
    """Exit 4 saying that the server refused the token (401, with how to pass one) or that it
    lacks a scope the call needs (403)."""
    if status == 401:
        why = "the token was refused" if token else "this server needs a bearer token"
        err.print(f"[red]refused by {escape(url)}: 401 Unauthorized[/] ({why}): pass one with --token TOKEN "
                  "or the CONTROLPLANE_TOKEN environment variable")
        raise typer.Exit(4)
    err.print(f"[red]refused by {escape(url)}: 403 Forbidden[/] (the token lacks a scope this call needs)")
    raise typer.Exit(4)


def _refusal(url: str, token: str | None) -> int | None:
    """401 or 403 if the server at `url` refuses this token (or none) outright, else None."""
    import httpx

    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    if token:
        headers["authorization"] = f"Bearer {token}"
    try:
        status = httpx.post(url, headers=headers, content=b"{}", timeout=5).status_code
    except httpx.HTTPError:
        return None
    return status if status in (401, 403) else None


def _print(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2))
        return
    # One field a line, never wrapped or cut at the terminal's width: states, ids and links stay
    # whole (a link is copied as it is); each artifact's links on lines of their own.
    out = Console(soft_wrap=True, highlight=False)
    listed = data.get("artifacts")
    artifacts: list[Any] = listed if isinstance(listed, list) else []
    width = max((len(k) for k in data), default=0)
    for k, v in data.items():
        if k == "artifacts" and artifacts:
            continue
        out.print(f"{k:<{width}}  {json.dumps(v) if isinstance(v, dict | list) else v}", markup=False)
    for art in artifacts:
        out.print(f"artifact {art.get('name')} ({art.get('size_bytes')} bytes, sha256 {art.get('sha256')}, "
                  f"link expires {art.get('expires_at')})", markup=False)
        for link in ("download_url", "file_url"):
            if art.get(link):
                out.print(f"  {art[link]}", markup=False)


@app.command("list")
def tasks_list(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, state: Annotated[list[str] | None, typer.Option()] = None,
               tool: Annotated[str | None, typer.Option()] = None, tag: Annotated[list[str] | None, typer.Option()] = None,
               owner: Annotated[str | None, typer.Option(help="Whose tasks (tasks:admin: anyone's; a team: a "
                                                              "teammate's)")] = None,
               parent: Annotated[str | None, typer.Option(help="Only the tasks waiting (or that waited) for "
                                                               "this one")] = None,
               whole_sweeps: Annotated[bool, typer.Option("--whole-sweeps", help="A sweep's shards as one row "
                                                          "(its sweep id, state, percent, shards)")] = False,
               limit: int = 50, cursor: str | None = None, as_json: JsonOpt = False) -> None:
    """List your tasks, newest first."""
    args: dict[str, Any] = {"limit": limit}
    if whole_sweeps:
        args["whole_sweeps"] = True
    if parent:
        args["parent"] = parent
    if owner:
        args["owner"] = owner
    if state:
        args["states"] = state
    if tool:
        args["tool_name"] = tool
    if tag:
        args["tags_any"] = tag
    if cursor:
        args["cursor"] = cursor
    data = _call(url, token, "list_tasks", args)
    if as_json:
        print(json.dumps(data, indent=2))
        return
    # Ids and times are never cut or wrapped (they are what users copy); the table grows instead.
    table = Table(box=None, pad_edge=False)
    shards = any("shards" in t for t in data["tasks"])  # a sweep's row (--whole-sweeps)
    for name in ("task_id", "tool", "state", "%", "submitted", "completed", *(["shards"] if shards else [])):
        table.add_column(name, no_wrap=True, overflow="ignore")
    for t in data["tasks"]:
        table.add_row(t["task_id"], t["tool_name"], t["state"], str(t["percent"] or ""), t["submitted_at"],
                      t["completed_at"] or "", *([t.get("shards") or ""] if shards else []))
    Console(width=max(200, Console().width)).print(table)
    if data.get("next_cursor"):
        err.print(f"more: --cursor {data['next_cursor']}")


@app.command("watch")
def tasks_watch(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
                state: Annotated[list[str] | None, typer.Option(help="Only tasks in these states")] = None,
                tool: Annotated[str | None, typer.Option()] = None, limit: int = 20,
                interval: Annotated[float, typer.Option(help="Seconds between refreshes")] = 1.0,
                until_done: Annotated[bool, typer.Option("--until-done", help="Stop once every task shown has "
                                                         "ended")] = False) -> None:
    """A live table of your newest tasks with progress bars (Ctrl-C to stop)."""
    import asyncio

    from controlplane.watch import watch

    args: dict[str, Any] = {"limit": limit}
    if state:
        args["states"] = state
    if tool:
        args["tool_name"] = tool
    try:
        asyncio.run(watch(url, token, args, Console(), interval=interval, until_done=until_done))
    except KeyboardInterrupt:
        pass
    except Exception as e:  # noqa: BLE001 - connection problems are the user's to see, briefly
        _not_served(url, token, e)


@app.command("show")
def tasks_show(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Status and progress of a task."""
    _print(_call(url, token, "get_task_status", {"task_id": task_id}), as_json)


@app.command("logs")
def tasks_logs(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, cursor: str | None = None,
               limit: int = 200, from_end: Annotated[bool, typer.Option("--from-end")] = False,
               follow: Annotated[bool, typer.Option("--follow", "-f")] = False) -> None:
    """Print a task's log lines (--follow keeps printing until the task ends)."""
    import time

    from controlplane.states import FINAL

    args: dict[str, Any] = {"task_id": task_id, "limit": limit}
    if cursor:
        args["cursor"] = cursor
    elif from_end:
        args["from_end"] = True
    while True:
        page = _call(url, token, "tail_task_logs", args)
        for line in page["lines"]:
            print(f"{line['ts']} {line['stream']:<6} {line['message']}")
        args = {"task_id": task_id, "limit": limit, "cursor": page["next_cursor"]}
        if not follow or (not page["has_more"] and page["state"] in FINAL):
            break
        if not page["has_more"]:
            time.sleep(1)


@app.command("cancel")
def tasks_cancel(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, reason: str = "user-request",
                 cascade: Annotated[bool, typer.Option(help="Also cancel the tasks waiting for it")] = False,
                 as_json: JsonOpt = False) -> None:
    """Cancel a task."""
    _print(_call(url, token, "cancel_task", {"task_id": task_id, "reason": reason, "cascade": cascade}), as_json)


@app.command("result")
def tasks_result(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Result, error and artifact links of a finished task."""
    _print(_call(url, token, "get_task_result", {"task_id": task_id}), as_json)


@app.command("submit")
def tasks_submit(tool_name: str, inputs: Annotated[str, typer.Option(help="JSON object of inputs (@FILE: from a file)")] = "{}",
                 url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, priority: int = 0,
                 idempotency_key: str | None = None,
                 after: Annotated[list[str] | None, typer.Option(help="A task to wait for (repeat for several)")] = None,
                 as_json: JsonOpt = False) -> None:
    """Submit a catalog tool as a task."""
    args: dict[str, Any] = {"tool_name": tool_name, "inputs": json_option(inputs, "--inputs"), "priority": priority}
    if idempotency_key:
        args["idempotency_key"] = idempotency_key
    if after:
        args["after"] = after
    _print(_call(url, token, "submit_task", args), as_json)
