"""`controlplane budgets list | set | clear`: budgets per caller or tag, in the database."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from controlplane.cli.common import HomeOpt, JsonOpt, OwnerOpt, cleared, err
from controlplane.cli.db import open_store

app = typer.Typer(no_args_is_help=True, help="Budgets per caller or tag, in the database (every replica "
                                             "reads them within CONTROLPLANE_LIMITS_REFRESH_S).")


class Period(StrEnum):
    day = "day"
    week = "week"
    month = "month"


TagOpt = Annotated[str | None, typer.Option("--tag", help="A tag: every task that carries it, whoever submitted it")]


def _budget_subject(owner: str | None, tag: str | None) -> tuple[str, str]:
    if (owner is None) == (tag is None):
        err.print("[red]name one caller (--owner) or one tag (--tag)[/]")
        raise typer.Exit(2)
    return ("owner", owner) if owner is not None else ("tag", tag)  # type: ignore[return-value]


def _currency(settings: Any) -> str:
    from controlplane.prices import PriceTable

    return PriceTable.load(settings.resolved_prices_path).currency


def _budgets_table(settings: Any, rows: list[Any], as_json: bool) -> None:
    currency = _currency(settings)
    if as_json:
        print(json.dumps({"currency": currency, "budgets": [{"scope": r.scope, "subject": r.subject, "period": r.period,
                                                             "amount": r.amount} for r in rows]}, indent=2))
        return
    table = Table(box=None, pad_edge=False)
    for name in ("scope", "caller or tag", "period", f"amount ({currency})"):
        table.add_column(name, no_wrap=True, overflow="ignore")
    for r in rows:
        table.add_row(r.scope, r.subject, r.period, f"{r.amount:g}")
    Console(width=max(120, Console().width)).print(table)


@app.command("list")
def budgets_list(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Every budget, in the price table's currency."""
    settings, store = open_store(home, migrate=False)
    _budgets_table(settings, store.usage.budgets(), as_json)


@app.command("set")
def budgets_set(amount: Annotated[float, typer.Argument(min=0, help="At most this much per period, in the price "
                                                                    "table's currency")],
                owner: OwnerOpt = None, tag: TagOpt = None,
                period: Annotated[Period, typer.Option(help="A calendar period, UTC (weeks from Monday)")] = Period.month,
                home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Set the budget of one caller or one tag: a submit that would take its spending in the period
    (spent + tasks not yet ended + the submit's estimate) above it is refused (LIMIT_EXCEEDED)."""
    scope, subject = _budget_subject(owner, tag)
    settings, store = open_store(home)
    _budgets_table(settings, [store.usage.set_budget(scope, subject, period.value, amount)], as_json)


@app.command("clear")
def budgets_clear(owner: OwnerOpt = None, tag: TagOpt = None, home: HomeOpt = None) -> None:
    """Remove one caller's or tag's budget."""
    scope, subject = _budget_subject(owner, tag)
    _settings_, store = open_store(home)
    cleared(store.usage.clear_budget(scope, subject), f"{scope} {subject}", "no budget", "no budget any more")

