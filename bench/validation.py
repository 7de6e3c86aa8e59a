"""What a client pays to check an answer against the tool's outputSchema: `python bench/validation.py`.

The canonical tools publish their answers' JSON schemas, and the Python clients validate every
structured answer they receive: the `mcp` SDK's session with `jsonschema` (a validator compiled
once per tool), fastmcp's `Client` on top of it with a pydantic adapter made from the schema
(cached by the schema's digest, which it computes per call). Neither is the server's time, but
both are in the latency a client measures (bench/run.py's figures). This prints each, per
answer, beside the server's own time to build that answer, for a status, a list page of 50 and
of 200 rows, and a log page of 100 and 1,000 lines, on a fresh local home.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastmcp.utilities.json_schema_type import json_schema_to_type_adapter
from jsonschema.validators import validator_for
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.seed import seed_log  # noqa: E402
from controlplane import api  # noqa: E402
from controlplane.app import ControlPlane  # noqa: E402
from controlplane.mcp.tools import output_schema  # noqa: E402
from controlplane.service import answers  # noqa: E402
from controlplane.settings import Settings  # noqa: E402


def best_ms(fn: Callable[[], Any], rounds: int = 7, n: int = 10) -> float:
    """The best of `rounds` means over `n` calls, in milliseconds."""
    runs = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        runs.append((time.perf_counter() - t) / n * 1000)
    return min(runs)


def main() -> None:
    home = Path(tempfile.mkdtemp(prefix="cp-bench-validation-"))
    cp = ControlPlane(Settings(home=home))
    for _ in range(200):
        cp.service.submit("bench", api.SubmitTask(tool_name="exercise", inputs={}, tags=["a", "b"]))
    first = cp.service.list("bench", api.ListTasks(limit=1))["tasks"][0]["task_id"]
    seed_log(cp.store.db, first, 2000)
    cases: list[tuple[str, Any, Callable[[], dict[str, Any]]]] = [
        ("get_task_status", answers.TaskStatus, lambda: cp.service.status("bench", api.GetTaskStatus(task_id=first))),
        ("list_tasks, 50 rows", answers.TaskList, lambda: cp.service.list("bench", api.ListTasks(limit=50))),
        ("list_tasks, 200 rows", answers.TaskList, lambda: cp.service.list("bench", api.ListTasks(limit=200))),
        ("tail_task_logs, 100 lines", answers.TailAnswer,
         lambda: cp.service.tail("bench", api.TailTaskLogs(task_id=first, limit=100))),
        ("tail_task_logs, 1,000 lines", answers.TailAnswer,
         lambda: cp.service.tail("bench", api.TailTaskLogs(task_id=first, limit=1000))),
    ]
    table = Table(title="validating one answer against its outputSchema (best of 7, ms)")
    for col in ("answer", "server builds it", "mcp SDK (jsonschema)", "fastmcp adapter", "both / server"):
        table.add_column(col, justify="right")
    for name, model, read in cases:
        data = read()
        schema = output_schema(model)
        validator = validator_for(schema)(schema)
        server = best_ms(read)
        sdk = best_ms(lambda: list(validator.iter_errors(data)))  # noqa: B023
        adapter = best_ms(lambda: json_schema_to_type_adapter(schema).validate_python(data))  # noqa: B023
        table.add_row(name, f"{server:.2f}", f"{sdk:.2f}", f"{adapter:.2f}", f"{(sdk + adapter) / server:.1f}x")
    Console().print(table)


if __name__ == "__main__":
    main()
