"""The `controlplane` command line (typer + rich): the app, its server commands (`serve`, `demo`)
and the command groups, one module each.

    controlplane serve [--transport stdio|http] [--host 127.0.0.1] [--port 8000] [--home DIR]
    controlplane demo [--home DIR]
    controlplane tasks list|show|logs|cancel|result|submit|watch ...   (against a running server)
    controlplane put FILE [--name N]   (upload a file to a running server: its upload:// reference)
    controlplane get artifact://TASK_ID/NAME [-o FILE]   (download an artifact, checked, resumable)
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

from enum import StrEnum
from typing import Annotated

import typer

from controlplane.cli import budgets, catalog, db, downloads, jobs, limits, sweeps, tasks, uploads, usage
from controlplane.cli.common import HomeOpt, err, settings_of, setup_logging

app = typer.Typer(no_args_is_help=True, add_completion=False,
                  help="mcp-controlplane: run heavy compute as durable tasks for AI agents.")


def _version(shown: bool) -> None:
    if shown:
        from controlplane import __version__

        print(f"mcp-controlplane {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                                help="Print the version and exit")] = False) -> None:
    """mcp-controlplane: run heavy compute as durable tasks for AI agents."""


class Transport(StrEnum):
    stdio = "stdio"
    http = "http"


@app.command()
def serve(
    transport: Annotated[Transport, typer.Option(help="MCP transport")] = Transport.stdio,
    host: Annotated[str, typer.Option(help="HTTP bind address", envvar="CONTROLPLANE_HOST")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="HTTP port (a container platform's $PORT)",
                                      envvar=["CONTROLPLANE_PORT", "PORT"])] = 8000,
    home: HomeOpt = None,
) -> None:
    """Run the MCP server (stdio, or Streamable HTTP at /mcp)."""
    import asyncio

    from controlplane.app import ControlPlane
    from controlplane.catalog import CatalogError
    from controlplane.mcp.auth import TokenFileError
    from controlplane.mcp.oauth import AuthConfigError
    from controlplane.ops.logs import announce
    from controlplane.serve import HttpServer, UnsafeBind, serve_stdio, settle_heap
    from controlplane.store.db import CannotOpenDatabase

    setup_logging("INFO" if transport == Transport.http else "WARNING")
    try:
        cp = ControlPlane(settings_of(home))
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

    setup_logging()
    raise typer.Exit(run(settings_of(home), {"n_atoms": n_atoms, "fmax": fmax, "max_steps": 20000, "seed": seed}))


# Commands first, then the groups, in the order `--help` lists them.
app.command("jobs")(jobs.jobs_list)
app.command("usage")(usage.usage_report)
app.command("put")(uploads.put)
app.command("get")(downloads.get)
app.add_typer(tasks.app, name="tasks")
app.add_typer(sweeps.app, name="sweeps")
app.add_typer(db.app, name="db")
app.add_typer(catalog.app, name="catalog")
app.add_typer(limits.app, name="limits")
app.add_typer(budgets.app, name="budgets")
