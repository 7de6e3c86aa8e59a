"""`controlplane sweeps show | cancel`: a running server's sweeps, each followed and stopped as one
(`get_sweep_status`, `cancel_sweep`) over the same calls as `controlplane tasks`."""

from __future__ import annotations

from typing import Any

import typer

from controlplane.cli.common import JsonOpt
from controlplane.cli.tasks import DEFAULT_URL, TokenOpt, UrlOpt, _call, _print

app = typer.Typer(no_args_is_help=True, help="Follow and cancel the sweeps of a running server (over MCP).")


def summary(st: dict[str, Any]) -> str:
    """A sweep's one line: shards ended of all, running and failed, and its percent."""
    counts: dict[str, int] = st.get("counts") or {}
    failed = counts.get("failed", 0) + counts.get("timed_out", 0)
    return (f"{st['ended']}/{st['shards']} ended, {counts.get('running', 0)} running, {failed} failed "
            f"({st['percent']:.1f}%)")


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
