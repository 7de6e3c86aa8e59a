"""The `controlplane` command line (typer + rich).

    controlplane serve [--transport stdio|http] [--host 127.0.0.1] [--port 8000] [--home DIR]
    controlplane demo [--home DIR]
    controlplane tasks list|show|logs|cancel|result|submit|watch ...   (against a running server)
    controlplane db upgrade [--home DIR]   (the one-shot migration of a deployment)
    controlplane catalog validate CATALOG   (every problem at once)
    controlplane catalog export CATALOG [--default-image IMAGE] [--format json|yaml]   (for terraform/)
    controlplane catalog check CATALOG OUTPUTS.json   (a catalog against `terraform output -json`)
    controlplane jobs [--state abandoned] [--home DIR]   (the operator's view of the jobs table)
    controlplane limits list | set OWNER [--submits-per-minute N ...] | clear OWNER   (per caller)
    controlplane budgets list | set (--owner O | --tag T) AMOUNT [--period month] | clear (--owner O | --tag T)
    controlplane usage [--by tool --by tag --by owner] [--since ISO] [--until ISO] [--owner O]
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="mcp-controlplane: run heavy compute as durable tasks for AI agents.")
tasks_app = typer.Typer(no_args_is_help=True, help="Work with the tasks of a running server (over MCP).")
db_app = typer.Typer(no_args_is_help=True, help="Database maintenance.")
catalog_app = typer.Typer(no_args_is_help=True, help="The tool catalog and the cloud jobs deployed for it "
                                                     "(terraform/README.md).")
limits_app = typer.Typer(no_args_is_help=True, help="Limits per caller, in the database (every replica reads "
                                                   "them within CONTROLPLANE_LIMITS_REFRESH_S).")
app.add_typer(tasks_app, name="tasks")
app.add_typer(db_app, name="db")
app.add_typer(catalog_app, name="catalog")
budgets_app = typer.Typer(no_args_is_help=True, help="Budgets per caller or tag, in the database (every replica "
                                                     "reads them within CONTROLPLANE_LIMITS_REFRESH_S).")
app.add_typer(limits_app, name="limits")
app.add_typer(budgets_app, name="budgets")

err = Console(stderr=True)


def _version(shown: bool) -> None:
    if shown:
        from controlplane import __version__

        print(f"mcp-controlplane {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit")] = False) -> None:
    """mcp-controlplane: run heavy compute as durable tasks for AI agents."""


HomeOpt = Annotated[Path | None, typer.Option("--home", help="State directory (default $CONTROLPLANE_HOME or "
                                              "~/.controlplane)", envvar="CONTROLPLANE_HOME")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer")]


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


def _settings(home: Path | None):
    from controlplane.settings import Settings

    return Settings(home=home) if home else Settings()


def _logging(level: str = "WARNING") -> None:
    from controlplane.ops.logs import configure  # text as ever, or JSON records (CONTROLPLANE_LOG_FORMAT)
    configure(os.environ.get("CONTROLPLANE_LOG_LEVEL", level), _settings(None).log_format)


@app.command()
def serve(
    transport: Annotated[Transport, typer.Option(help="MCP transport")] = Transport.stdio,
    host: Annotated[str, typer.Option(help="HTTP bind address", envvar="CONTROLPLANE_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (a container platform's $PORT)",
                                      envvar=["CONTROLPLANE_PORT", "PORT"])] = 8000,
    home: HomeOpt = None,
) -> None:
    """Run the MCP server (stdio, or Streamable HTTP at /mcp)."""
    from controlplane.app import ControlPlane
    from controlplane.catalog import CatalogError
    from controlplane.mcp.oauth import AuthConfigError
    from controlplane.mcp.auth import TokenFileError
    from controlplane.ops.logs import announce
    from controlplane.serve import HttpServer, UnsafeBind, serve_stdio, settle_heap
    from controlplane.store.db import CannotOpenDatabase

    _logging("INFO" if transport == Transport.http else "WARNING")
    try:
        cp = ControlPlane(_settings(home))
        if transport == Transport.stdio:
            asyncio.run(serve_stdio(cp))
            return
        server = HttpServer(cp, host, port)
    except (CatalogError, UnsafeBind, AuthConfigError, OSError, CannotOpenDatabase, TokenFileError) as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    settle_heap()
    announce(f"serving MCP at {server.url}", err.print)  # a JSON record in the JSON log format
    asyncio.run(server.serve())


@app.command()
def demo(
    home: HomeOpt = None,
    n_atoms: Annotated[int, typer.Option(help="Atoms in the Lennard-Jones cluster")] = 100,
    fmax: Annotated[float, typer.Option(help="Force convergence threshold")] = 1e-4,
    seed: Annotated[int, typer.Option(help="Random seed of the starting geometry")] = 1,
) -> None:
    """Start a server on the embedded defaults and run lj_relax through an MCP client."""
    from controlplane.demo import demo as run

    _logging()
    raise typer.Exit(run(_settings(home), {"n_atoms": n_atoms, "fmax": fmax, "max_steps": 20000, "seed": seed}))


@db_app.command("upgrade")
def db_upgrade(home: HomeOpt = None) -> None:
    """Apply the database migrations (servers also do this when they start, unless
    CONTROLPLANE_MIGRATE_ON_START=false: then this is the deployment's one-shot step)."""
    from controlplane.store.db import CannotOpenDatabase, Database

    settings = _settings(home)
    settings.ensure_home()
    try:
        db = Database(settings.resolved_database_url)
        db.upgrade()
    except CannotOpenDatabase as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(2) from None
    err.print(f"database at revision {db.current_revision()}")


CatalogArg = Annotated[Path, typer.Argument(help="The catalog (TOML, YAML or JSON)")]
ImageOpt = Annotated[str | None, typer.Option(help="Image of the tools that name none (e.g. the example tools' "
                                                   "image, infra/tools/Dockerfile)")]


class CatalogFormat(StrEnum):
    json = "json"
    yaml = "yaml"


@catalog_app.command("validate")
def catalog_validate(catalog: CatalogArg) -> None:
    """Check a catalog as a server would load it (with this environment's CONTROLPLANE_* settings)
    and list every problem, one a line, each naming the tool and the field. Exits 1 if any."""
    from controlplane.catalog import Catalog, CatalogError, server_problems
    from controlplane.settings import Settings

    try:
        loaded = Catalog.load(catalog)
        problems = server_problems(loaded, max_ttl_s=Settings().max_ttl_s)
    except CatalogError as e:
        loaded, problems = None, list(e.problems)
    for problem in problems:
        err.print(f"[red]error:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if problems or loaded is None:
        err.print(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in {escape(str(catalog))}",
                  highlight=False, soft_wrap=True)
        raise typer.Exit(1)
    err.print(f"{escape(str(catalog))}: valid ({len(loaded.tools)} tools, {len(loaded.resource_classes)} "
              "resource classes)", highlight=False, soft_wrap=True)


@catalog_app.command("export")
def catalog_export(catalog: CatalogArg, default_image: ImageOpt = None,
                   fmt: Annotated[CatalogFormat, typer.Option("--format")] = CatalogFormat.json,
                   output: Annotated[Path | None, typer.Option("--output", "-o", help="File to write (default: "
                                                                                      "stdout)")] = None) -> None:
    """Validate a catalog and write it as the Terraform modules read it (their `catalog` input):
    one job per tool with its image, cpu and memory, and the catalog the server is given. Warns
    (on stderr, without failing) of a tool command naming a path on this machine."""
    from controlplane.catalog import CatalogError
    from controlplane.deployment import DeploymentError, dumps, export

    try:
        text = dumps(export(catalog, default_image=default_image, warn=lambda problem: err.print(
            f"[yellow]warning:[/] {escape(problem)}", highlight=False, soft_wrap=True)), fmt.value)
    except (CatalogError, DeploymentError) as e:
        err.print(f"[red]error:[/] {escape(str(e))}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    if output:
        output.write_text(text)
    else:
        sys.stdout.write(text)


@catalog_app.command("check")
def catalog_check(catalog: CatalogArg,
                  outputs: Annotated[str, typer.Argument(help="`terraform output -json` of the deployment, as a file, "
                                                              "or - for stdin")],
                  default_image: ImageOpt = None) -> None:
    """Check that a deployment made exactly one job per catalog tool, with the tool's image, cpu and
    memory. Exits 1 listing every difference, 2 when the catalog or the outputs cannot be read."""
    from controlplane.deployment import check

    try:
        raw = sys.stdin.read() if outputs == "-" else Path(outputs).read_text()
        problems = check(catalog, json.loads(raw), default_image=default_image)
    except OSError as e:
        err.print(f"[red]error:[/] {escape(outputs)}: cannot read the outputs: {e.strerror}", highlight=False,
                  soft_wrap=True)
        raise typer.Exit(2) from None
    except ValueError as e:  # CatalogError, DeploymentError, JSONDecodeError
        shown = f"{outputs}: not JSON: {e}" if isinstance(e, json.JSONDecodeError) else str(e)
        err.print(f"[red]error:[/] {escape(shown)}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    for problem in problems:
        err.print(f"[red]mismatch:[/] {escape(problem)}", highlight=False, soft_wrap=True)
    if problems:
        raise typer.Exit(1)
    err.print("every catalog tool has its job, with the catalog's image, cpu and memory")


@app.command("jobs")
def jobs_list(home: HomeOpt = None,
              state: Annotated[list[str] | None, typer.Option(help="launching, active, draining, abandoned, done, "
                                                                   "dropped (repeatable; default all)")] = None,
              limit: int = 50, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The jobs the control plane launched, newest first, read from its database. `--state
    abandoned` lists the jobs that never confirmed they stopped: their tasks have ended, but the
    cloud may still run (and bill) them."""
    from datetime import UTC, datetime

    from controlplane.store.db import Database
    from controlplane.store import Store

    settings = _settings(home)
    db = Database(settings.resolved_database_url)
    _require_head(db)
    rows = Store(db).jobs.for_operator(state, limit)
    if as_json:
        print(json.dumps([{k: getattr(r, k) for k in ("worker_id", "task_id", "attempt", "provider", "job_name",
                                                        "state", "handle_json", "created_at", "finished_at",
                                                        "abandoned_at", "stop_requested_at", "provider_status",
                                                        "provider_reason", "extra_claims", "extra_checked",
                                                        "extra_stopped")} for r in rows], indent=2))
        return

    def when(t: float | None) -> str:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%SZ") if t else ""

    table = Table(box=None, pad_edge=False)
    for name in ("job", "task_id", "provider", "state", "provider status", "created", "abandoned", "extra"):
        table.add_column(name, no_wrap=True, overflow="ignore")
    for r in rows:  # extra: claims refused to other executions of the attempt / those of them stopped
        table.add_row(r.job_name, r.task_id, r.provider, r.state, r.provider_status or "", when(r.created_at),
                      when(r.abandoned_at), f"{r.extra_claims}/{r.extra_stopped}" if r.extra_claims else "")
    Console(width=max(200, Console().width)).print(table)


# ---- limits per caller --------------------------------------------------------------------------
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


def _store(home: Path | None, *, migrate: bool = True) -> Any:
    """The settings and the store of the home's database: migrated to the newest revision for a
    command that writes, checked to be at it for one that only reads (`_require_head`)."""
    from controlplane.store import Store
    from controlplane.store.db import Database

    settings = _settings(home)
    settings.ensure_home()
    db = Database(settings.resolved_database_url)
    if migrate:
        db.upgrade()
    else:
        _require_head(db)
    return settings, Store(db)


def _require_head(db: Any) -> None:
    """Go on only if the database is at the newest revision this version knows; else exit 2
    saying where it is and what to do. Read-only commands call this instead of migrating: a newer
    CLI pointed at a deployment must not change the schema under its running servers."""
    from alembic.script import ScriptDirectory
    from sqlalchemy.engine import make_url

    from controlplane.store.db import MIGRATIONS_DIR, CannotOpenDatabase

    script = ScriptDirectory(str(MIGRATIONS_DIR))
    head = script.get_current_head()
    file = make_url(db.url).database if db.is_sqlite else None
    try:  # a missing SQLite file is a database never migrated: connecting would create it
        current = None if file and not Path(file).exists() else db.current_revision()
    except CannotOpenDatabase as e:
        err.print(f"[red]error:[/] {escape(str(e))}", soft_wrap=True)
        raise typer.Exit(2) from None
    if current == head:
        return
    if current is None:
        where = "has no schema yet (never migrated)"
    elif current not in {s.revision for s in script.walk_revisions()}:
        err.print(f"[red]error:[/] the database is at revision {current}, newer than this controlplane knows "
                  f"(it expects {head}): use the version that migrated it", soft_wrap=True)
        raise typer.Exit(2)
    else:
        where = f"is at revision {current}"
    err.print(f"[red]error:[/] the database {where}, this controlplane expects {head}: run `controlplane db "
              "upgrade` first (commands that only read never migrate)", soft_wrap=True)
    raise typer.Exit(2)


def _caller_store(home: Path | None, *, migrate: bool = True) -> Any:
    settings, store = _store(home, migrate=migrate)
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


@limits_app.command("list")
def limits_list(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """The defaults (CONTROLPLANE_LIMIT_*) and every caller's overrides ('(n)': the default applies)."""
    settings, callers = _caller_store(home, migrate=False)
    _limits_table(settings, callers.overrides(), as_json)


@limits_app.command("set")
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


@limits_app.command("clear")
def limits_clear(owner: str, home: HomeOpt = None) -> None:
    """Remove a caller's overrides: the defaults apply to it again."""
    _settings_, callers = _caller_store(home)
    _cleared(callers.clear_override(owner), owner, "no overrides", "the defaults apply")


def _cleared(done: bool, what: str, nothing: str, after: str) -> None:
    """Say what a `clear` did; exit 1 when there was nothing to clear."""
    if not done:
        err.print(f"{what}: {nothing}")
        raise typer.Exit(1)
    err.print(f"{what}: {after}")


# ---- budgets and usage --------------------------------------------------------------------------
class Period(StrEnum):
    day = "day"
    week = "week"
    month = "month"


OwnerOpt = Annotated[str | None, typer.Option("--owner", help="A caller: a static token's identity, or an OAuth "
                                                              "caller's '<issuer>#<subject>'")]
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


@budgets_app.command("list")
def budgets_list(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Every budget, in the price table's currency."""
    settings, store = _store(home, migrate=False)
    _budgets_table(settings, store.usage.budgets(), as_json)


@budgets_app.command("set")
def budgets_set(amount: Annotated[float, typer.Argument(min=0, help="At most this much per period, in the price "
                                                                    "table's currency")],
                owner: OwnerOpt = None, tag: TagOpt = None,
                period: Annotated[Period, typer.Option(help="A calendar period, UTC (weeks from Monday)")] = Period.month,
                home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """Set the budget of one caller or one tag: a submit that would take its spending in the period
    (spent + tasks not yet ended + the submit's estimate) above it is refused (LIMIT_EXCEEDED)."""
    scope, subject = _budget_subject(owner, tag)
    settings, store = _store(home)
    _budgets_table(settings, [store.usage.set_budget(scope, subject, period.value, amount)], as_json)


@budgets_app.command("clear")
def budgets_clear(owner: OwnerOpt = None, tag: TagOpt = None, home: HomeOpt = None) -> None:
    """Remove one caller's or tag's budget."""
    scope, subject = _budget_subject(owner, tag)
    _settings_, store = _store(home)
    _cleared(store.usage.clear_budget(scope, subject), f"{scope} {subject}", "no budget", "no budget any more")


class GroupBy(StrEnum):
    tool = "tool"
    tag = "tag"
    owner = "owner"


@app.command("usage")
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

    settings, store = _store(home, migrate=False)
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


# ---- client commands ----------------------------------------------------------------------------
UrlOpt = Annotated[str, typer.Option("--url", envvar="CONTROLPLANE_URL", help="MCP endpoint of the server")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="CONTROLPLANE_TOKEN", help="Bearer token")]
DEFAULT_URL = "http://127.0.0.1:8000/mcp"


def _call(url: str, token: str | None, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    from fastmcp import Client

    async def go() -> tuple[bool, dict[str, Any]]:
        async with Client(url, auth=token) as c:
            r = await c.call_tool(tool, args, raise_on_error=False)
            return r.is_error, (r.structured_content or json.loads(r.content[0].text))

    try:
        is_error, data = asyncio.run(go())
    except Exception as e:  # noqa: BLE001 - connection problems are the user's to see, briefly
        _not_served(url, token, e)
    if is_error:
        err.print(f"[red]{data.get('code')}[/]: {data.get('message')}" + (f" ({data['hint']})" if data.get("hint") else ""))
        raise typer.Exit(1)
    return data


def _not_served(url: str, token: str | None, e: Exception) -> NoReturn:
    """Say why a call failed and exit: the server refused the token (401: exit 4, with how to pass
    one; 403: exit 4) or could not be reached (exit 3). The MCP client's error does not say which,
    so the server is asked once more, plainly."""
    status = _refusal(url, token)
    if status == 401:
        why = "the token was refused" if token else "this server needs a bearer token"
        err.print(f"[red]refused by {escape(url)}: 401 Unauthorized[/] ({why}): pass one with --token TOKEN "
                  "or the CONTROLPLANE_TOKEN environment variable")
        raise typer.Exit(4)
    if status == 403:
        err.print(f"[red]refused by {escape(url)}: 403 Forbidden[/] (the token lacks a scope this call needs)")
        raise typer.Exit(4)
    err.print(f"[red]cannot reach {escape(url)}:[/] {type(e).__name__}: {escape(str(e))}")
    raise typer.Exit(3)


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
    artifacts = data.get("artifacts") if isinstance(data.get("artifacts"), list) else []
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


@tasks_app.command("list")
def tasks_list(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, state: Annotated[list[str] | None, typer.Option()] = None,
               tool: Annotated[str | None, typer.Option()] = None, tag: Annotated[list[str] | None, typer.Option()] = None,
               owner: Annotated[str | None, typer.Option(help="Whose tasks (tasks:admin: anyone's; a team: a "
                                                              "teammate's)")] = None,
               limit: int = 50, cursor: str | None = None, as_json: JsonOpt = False) -> None:
    """List your tasks, newest first."""
    args: dict[str, Any] = {"limit": limit}
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
    for name in ("task_id", "tool", "state", "%", "submitted", "completed"):
        table.add_column(name, no_wrap=True, overflow="ignore")
    for t in data["tasks"]:
        table.add_row(t["task_id"], t["tool_name"], t["state"], str(t["percent"] or ""), t["submitted_at"],
                      t["completed_at"] or "")
    Console(width=max(200, Console().width)).print(table)
    if data.get("next_cursor"):
        err.print(f"more: --cursor {data['next_cursor']}")


@tasks_app.command("watch")
def tasks_watch(url: UrlOpt = DEFAULT_URL, token: TokenOpt = None,
                state: Annotated[list[str] | None, typer.Option(help="Only tasks in these states")] = None,
                tool: Annotated[str | None, typer.Option()] = None, limit: int = 20,
                interval: Annotated[float, typer.Option(help="Seconds between refreshes")] = 1.0,
                until_done: Annotated[bool, typer.Option("--until-done", help="Stop once every task shown has "
                                                         "ended")] = False) -> None:
    """A live table of your newest tasks with progress bars (Ctrl-C to stop)."""
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


@tasks_app.command("show")
def tasks_show(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Status and progress of a task."""
    _print(_call(url, token, "get_task_status", {"task_id": task_id}), as_json)


@tasks_app.command("logs")
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


@tasks_app.command("cancel")
def tasks_cancel(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, reason: str = "user-request",
                 as_json: JsonOpt = False) -> None:
    """Cancel a task."""
    _print(_call(url, token, "cancel_task", {"task_id": task_id, "reason": reason}), as_json)


@tasks_app.command("result")
def tasks_result(task_id: str, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, as_json: JsonOpt = False) -> None:
    """Result, error and artifact links of a finished task."""
    _print(_call(url, token, "get_task_result", {"task_id": task_id}), as_json)


@tasks_app.command("submit")
def tasks_submit(tool_name: str, inputs: Annotated[str, typer.Option(help="JSON object of inputs")] = "{}",
                 url: UrlOpt = DEFAULT_URL, token: TokenOpt = None, priority: int = 0,
                 idempotency_key: str | None = None, as_json: JsonOpt = False) -> None:
    """Submit a catalog tool as a task."""
    try:
        parsed = json.loads(inputs)
    except ValueError:
        err.print("[red]--inputs must be a JSON object[/]")
        raise typer.Exit(2) from None
    args: dict[str, Any] = {"tool_name": tool_name, "inputs": parsed, "priority": priority}
    if idempotency_key:
        args["idempotency_key"] = idempotency_key
    _print(_call(url, token, "submit_task", args), as_json)


if __name__ == "__main__":
    app()
