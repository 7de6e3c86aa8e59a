"""`controlplane jobs`: the operator's view of the jobs table (read only: never migrates)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from controlplane.cli.common import HomeOpt, settings_of
from controlplane.cli.db import require_head


def jobs_list(home: HomeOpt = None,
              state: Annotated[list[str] | None, typer.Option(help="launching, active, draining, abandoned, done, "
                                                                   "dropped (repeatable; default all)")] = None,
              limit: int = 50, as_json: Annotated[bool, typer.Option("--json")] = False) -> None:
    """The jobs the control plane launched, newest first, read from its database. `--state
    abandoned` lists the jobs that never confirmed they stopped: their tasks have ended, but the
    cloud may still run (and bill) them."""
    from datetime import UTC, datetime

    from controlplane.store import Store
    from controlplane.store.db import Database

    settings = settings_of(home)
    db = Database(settings.resolved_database_url)
    require_head(db)
    rows = Store(db).jobs.for_operator(state, limit)
    if as_json:
        print(json.dumps([{k: getattr(r, k) for k in ("job_id", "task_id", "attempt", "provider", "job_name",
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

