"""What the commands share: the error console, the common options, the settings of a home, the
logging setup and the way a `clear` reports."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

err = Console(stderr=True)

HomeOpt = Annotated[Path | None, typer.Option("--home", help="State directory (default $CONTROLPLANE_HOME or "
                                              "~/.controlplane)", envvar="CONTROLPLANE_HOME")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON answer")]
OwnerOpt = Annotated[str | None, typer.Option("--owner", help="A caller: a static token's identity, or an OAuth "
                                                              "caller's '<issuer>#<subject>'")]


def json_option(text: str, option: str) -> dict[str, Any]:
    """The JSON object of a command-line option, or exit 2 naming the option. `@FILE` reads it from
    a file and `@-` from standard input (a sweep's thousands of overrides do not fit a command
    line)."""
    import json
    import sys

    if text.startswith("@"):
        try:
            text = sys.stdin.read() if text == "@-" else Path(text[1:]).read_text()
        except OSError as e:
            err.print(f"[red]{option}: cannot read {text[1:]}: {e.strerror}[/]")
            raise typer.Exit(2) from None
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        err.print(f"[red]{option} must be a JSON object[/]")
        raise typer.Exit(2)
    return value


def settings_of(home: Path | None) -> Any:
    """The settings, with `home` as the state directory when given."""
    from controlplane.settings import Settings

    return Settings(home=home) if home else Settings()


def setup_logging(level: str = "WARNING") -> None:
    """Log to stderr at `level`, or at $CONTROLPLANE_LOG_LEVEL when set, in the configured format."""
    from controlplane.ops.logs import configure  # text as ever, or JSON records (CONTROLPLANE_LOG_FORMAT)
    configure(os.environ.get("CONTROLPLANE_LOG_LEVEL", level), settings_of(None).log_format)


def cleared(done: bool, what: str, nothing: str, after: str) -> None:
    """Say what a `clear` did; exit 1 when there was nothing to clear."""
    if not done:
        err.print(f"{what}: {nothing}")
        raise typer.Exit(1)
    err.print(f"{what}: {after}")
