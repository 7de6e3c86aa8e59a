"""`controlplane sweeps submit | show | result | cancel`: a running server's sweeps, each submitted,
followed, read and stopped as one (`submit_sweep`, `get_sweep_status`, `get_sweep_result`,
`cancel_sweep`) over the same calls as `controlplane tasks`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from controlplane.cli.common import JsonOpt, err, json_option
from controlplane.cli.tasks import DEFAULT_URL, TokenOpt, UrlOpt, _call, _print

app = typer.Typer(no_args_is_help=True, help="Submit, follow, read and cancel the sweeps of a running server (over MCP).")


def summary(st: dict[str, Any]) -> str:
    """A sweep's one line: shards ended of all, running and failed, and its percent."""
    counts: dict[str, int] = st.get("counts") or {}
    failed = counts.get("failed", 0) + counts.get("timed_out", 0)
    return (f"{st['ended']}/{st['shards']} ended, {counts.get('running', 0)} running, {failed} failed "
            f"({st['percent']:.1f}%)")


@app.command("submit")
def sweeps_submit(tool_name: str,
                  vary: Annotated[str, typer.Option(help='How the shards differ, as JSON: {"list": [override, ...]} or '
                                                    '{"grid": {"name": [values], ...}}; @FILE reads it from a file, '
                                                    '@- from standard input')],
                  base: Annotated[str, typer.Option(help="JSON object of the inputs every shard shares (@FILE: from "
                                                    "a file)")] = "{}",
                  url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, priority: int = 0,
                  tag: Annotated[list[str] | None, typer.Option(help="Every shard's tag (repeat for several)")] = None,
                  after: Annotated[list[str] | None, typer.Option(help="A task every shard waits for (repeat for "
                                                                  "several)")] = None,
                  max_parallel: Annotated[int | None, typer.Option(help="At most this many shards run at once")] = None,
                  fail_fast: Annotated[int | None, typer.Option(help="Cancel the rest once this many shards "
                                                                "failed")] = None,
                  idempotency_key: str | None = None, as_json: JsonOpt = False) -> None:
    """Submit a catalog tool over many inputs as one sweep (a task a shard, admitted whole or not)."""
    args: dict[str, Any] = {"tool_name": tool_name, "base_inputs": json_option(base, "--base"),
                            "vary": json_option(vary, "--vary"), "priority": priority}
    optional = {"tags": tag, "after": after, "max_parallel": max_parallel, "fail_fast": fail_fast,
                "idempotency_key": idempotency_key}
    args.update({k: v for k, v in optional.items() if v is not None})
    answer = _call(url, token, "submit_sweep", args)
    if not as_json:
        print(f"{answer['sweep_id']} {tool_name}: {answer['shards']} shards")
    _print(answer, as_json)


@app.command("show")
def sweeps_show(sweep_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """A sweep as one: its shards counted by state, progress, ETA, cost so far and first failures."""
    st = _call(url, token, "get_sweep_status", {"sweep_id": sweep_id})
    if not as_json:
        print(f"{st['sweep_id']} {st['tool_name']}: {summary(st)}")
    _print(st, as_json)


@app.command("cancel")
def sweeps_cancel(sweep_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, reason: str = "user-request",
                  as_json: JsonOpt = False) -> None:
    """Cancel every shard of a sweep not yet ended."""
    _print(_call(url, token, "cancel_sweep", {"sweep_id": sweep_id, "reason": reason}), as_json)


@app.command("result")
def sweeps_result(sweep_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
                  cursor: Annotated[str | None, typer.Option(help="next_cursor of the previous page")] = None,
                  limit: Annotated[int, typer.Option(help="Shards per page (at most 200)")] = 50,
                  every: Annotated[bool, typer.Option("--all", help="Every page, from the cursor on")] = False,
                  as_json: JsonOpt = False) -> None:
    """The shards' results in shard order, a tab-separated line each: shard, task, state, override, result."""
    args: dict[str, Any] = {"sweep_id": sweep_id, "limit": limit}
    if cursor:
        args["cursor"] = cursor
    page = _call(url, token, "get_sweep_result", args)
    shards = list(page["results"])
    while every and page["next_cursor"]:
        page = _call(url, token, "get_sweep_result", {**args, "cursor": page["next_cursor"]})
        shards += page["results"]
    if as_json:
        print(json.dumps({**page, "results": shards}, indent=2))
        return
    for r in shards:
        outcome = r["result"] if r["state"] == "succeeded" else (r["error"] or {}).get("code", "")
        print(f"{r['shard']}\t{r['task_id']}\t{r['state']}\t{json.dumps(r['override'])}\t"
              f"{json.dumps(outcome) if outcome is not None else ''}")
    if page["next_cursor"]:
        err.print(f"more: --cursor {page['next_cursor']}")
