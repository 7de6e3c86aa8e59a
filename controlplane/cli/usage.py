"""`controlplane usage`: what the tasks used and their estimated cost, from the database (read
only: never migrates)."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from controlplane.cli.common import HomeOpt, JsonOpt, OwnerOpt, err
from controlplane.cli.db import open_store


class GroupBy(StrEnum):
    tool = "tool"
    tag = "tag"
    owner = "owner"


def usage_report(by: Annotated[list[GroupBy] | None, typer.Option("--by", help="Sum per tool, tag and/or owner "
                                                                            "(repeatable; default: tool)")] = None,
                 since: Annotated[str | None, typer.Option(help="ISO 8601 time (default: the start of this month, "
                                                                "UTC)")] = None,
                 until: Annotated[str | None, typer.Option(help="ISO 8601 time (default: now)")] = None,
                 owner: OwnerOpt = None, home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """What the tasks used and their estimated cost at list prices, from the database (every
    caller's, or one's), per attempt that ended in [since, until)."""
    import time
    from datetime import UTC, datetime

    from controlplane.api import iso
    from controlplane.budgets import period_bounds
    from controlplane.prices import PriceTable, summarize

    def epoch(text: str | None, default: float) -> float:
        if text is None:
            return default
        try:
            t = datetime.fromisoformat(text)
        except ValueError:
            err.print(f"[red]{text!r}: expected an ISO 8601 time[/]")
            raise typer.Exit(2) from None
        return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()

    settings, store = open_store(home, migrate=False)
    group_by = list(dict.fromkeys(g.value for g in (by or [GroupBy.tool])))
    end = epoch(until, time.time())
    start = epoch(since, period_bounds("month", end)[0])
    table_ = PriceTable.load(settings.resolved_prices_path)
    data = {"since": iso(start), "until": iso(end), "owner": owner, "group_by": group_by, "currency": table_.currency,
            "prices_as_of": table_.as_of, **summarize(store.usage.report(group_by, owner, start, end), group_by)}
    if as_json:
        print(json.dumps(data, indent=2))
        return
    table = Table(box=None, pad_edge=False, title=f"usage {data['since']} .. {data['until']} "
                                                  f"(list prices of {table_.as_of}, {table_.currency})")
    for name in (*group_by, "tasks", "attempts", "run s", "vCPU s", "GiB s", "GPU s", "cost"):
        table.add_column(name, no_wrap=True, overflow="ignore")
    rows = data["groups"] + ([{**{g: "(total)" for g in group_by}, "tasks": "", "attempts": "", **data["total"]}]
                             if "total" in data and data["groups"] else [])
    for g in rows:
        u = g["usage"]
        cost = f"{g['estimated_cost']:.6f}" + (f" (+{g['unpriced_attempts']} unpriced)" if g["unpriced_attempts"] else "")
        table.add_row(*[str(g[k]) if g[k] is not None else "-" for k in group_by], str(g["tasks"]), str(g["attempts"]),
                      f"{u['run_seconds']:.1f}", f"{u['vcpu_seconds']:.1f}", f"{u['memory_gib_seconds']:.1f}",
                      f"{u['gpu_seconds']:.1f}", cost)
    Console(width=max(160, Console().width)).print(table)

