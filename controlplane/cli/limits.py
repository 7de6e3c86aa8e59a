"""`controlplane limits list | set | clear`: limits per caller, in the database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from controlplane.cli.common import HomeOpt, JsonOpt, cleared, err
from controlplane.cli.db import open_store

app = typer.Typer(no_args_is_help=True, help="Limits per caller, in the database (every replica reads "
                                             "them within CONTROLPLANE_LIMITS_REFRESH_S).")

LIMIT_HELP = "a number, 'default' (the setting's) or 'none' (no limit)"


def _limit(value: str | None) -> int | None | str:
    """An option's value: '' (not given), None (back to the default), -1 (no limit) or a count."""
    if value is None:
        return ""
    v = value.strip().lower()
    if v == "default":
        return None
    if v in ("none", "unlimited"):
        return -1
    try:
        n = int(v)
    except ValueError:
        n = -2
    if n < 0:
        err.print(f"[red]{value!r}: expected {LIMIT_HELP}[/]")
        raise typer.Exit(2)
    return n


def _caller_store(home: Path | None, *, migrate: bool = True) -> Any:
    settings, store = open_store(home, migrate=migrate)
    return settings, store.callers


def _limits_table(settings: Any, rows: list[Any], as_json: bool) -> None:
    cols = ("submits_per_minute", "submits_per_day", "tasks_in_flight", "streams")
    defaults = {"submits_per_minute": settings.limit_submits_per_minute, "submits_per_day": settings.limit_submits_per_day,
                "tasks_in_flight": settings.limit_tasks_in_flight, "streams": settings.limit_streams}
    if as_json:
        print(json.dumps({"defaults": defaults, "callers": [{"owner": r.owner, **{c: getattr(r, c) for c in cols}}
                                                            for r in rows]}, indent=2))
        return

    def shown(v: int | None, default: int | None) -> str:
        if v is None:
            return f"({'-' if default is None else default})"
        return "none" if v < 0 else str(v)

    table = Table(box=None, pad_edge=False)
    for name in ("owner", *cols):
        table.add_column(name, no_wrap=True, overflow="ignore")
    table.add_row("(default)", *[str(defaults[c]) if defaults[c] is not None else "-" for c in cols])
    for r in rows:
        table.add_row(r.owner, *[shown(getattr(r, c), defaults[c]) for c in cols])
    Console(width=max(160, Console().width)).print(table)


@app.command("list")
def limits_list(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """The defaults (CONTROLPLANE_LIMIT_*) and every caller's overrides ('(n)': the default applies)."""
    settings, callers = _caller_store(home, migrate=False)
    _limits_table(settings, callers.overrides(), as_json)


@app.command("set")
def limits_set(owner: Annotated[str, typer.Argument(help="The caller: a static token's identity, or an OAuth "
                                                          "caller's '<issuer>#<subject>'")],
               submits_per_minute: Annotated[str | None, typer.Option(help=LIMIT_HELP)] = None,
               submits_per_day: Annotated[str | None, typer.Option(help=LIMIT_HELP)] = None,
               tasks_in_flight: Annotated[str | None, typer.Option(help=LIMIT_HELP)] = None,
               streams: Annotated[str | None, typer.Option(help=LIMIT_HELP)] = None,
               home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Override limits for one caller (the options not given stay as they were)."""
    given = {k: _limit(v) for k, v in (("submits_per_minute", submits_per_minute), ("submits_per_day", submits_per_day),
                                       ("tasks_in_flight", tasks_in_flight), ("streams", streams))}
    values = {k: v for k, v in given.items() if v != ""}
    if not values:
        err.print("[red]name at least one limit[/] (--submits-per-minute, --submits-per-day, --tasks-in-flight, --streams)")
        raise typer.Exit(2)
    settings, callers = _caller_store(home)
    row = callers.set_override(owner, values)
    _limits_table(settings, [row], as_json)


@app.command("clear")
def limits_clear(owner: str, home: HomeOpt = None) -> None:
    """Remove a caller's overrides: the defaults apply to it again."""
    _settings_, callers = _caller_store(home)
    cleared(callers.clear_override(owner), owner, "no overrides", "the defaults apply")

