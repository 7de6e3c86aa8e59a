"""`controlplane catalog validate | export | check`: the tool catalog, and the cloud jobs deployed
for it."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from controlplane.cli.common import err

app = typer.Typer(no_args_is_help=True, help="The tool catalog and the cloud jobs deployed for it "
                                             "(terraform/README.md).")

CatalogArg = Annotated[Path, typer.Argument(help="The catalog (TOML, YAML or JSON)")]
ImageOpt = Annotated[str | None, typer.Option(help="Image of the tools that name none (e.g. the example tools' "
                                                   "image, infra/tools/Dockerfile)")]


class CatalogFormat(StrEnum):
    json = "json"
    yaml = "yaml"


@app.command("validate")
def catalog_validate(catalog: CatalogArg) -> None:
    """Check a catalog as a server would load it (with this environment's CONTROLPLANE_* settings)
    and list every problem, one a line, each naming the tool and the field. Exits 1 if any."""
    from controlplane import reachable
    from controlplane.catalog import Catalog, CatalogError, server_problems
    from controlplane.settings import Settings

    try:
        loaded = Catalog.load(catalog)
        settings = Settings()
        problems = server_problems(loaded, max_ttl_s=settings.max_ttl_s) + reachable.problems(
            loaded, job_store_access=settings.job_store_access, default_store=settings.resolved_object_store_url)
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


@app.command("export")
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


@app.command("check")
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

