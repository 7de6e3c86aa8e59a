"""Sweeps (`submit_sweep`): what a sweep's `vary` makes of its shards, and when its failure policy
stops it, and how a sweep reads as one row of a list of tasks (`fold`: list_tasks' with
whole_sweeps, and so the dashboard's and `tasks watch`'s). Pure decisions; the store applies
them (`store.sweeps`), the service answers with them (`service.sweeps`), docs/design/sweeps.md
says why.

`vary` is one of two JSON forms:

* `{"list": [override, ...]}`: one shard per override (an object), in the order given;
* `{"grid": {"name": [values], ...}}`: one shard per combination, the product of the lists in
  the order of the keys as given (the first key varies slowest), each override naming one value
  of every key.

A shard's inputs are the base inputs with its override applied on top (a shallow merge: an
override's key replaces the base's whole value).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

from controlplane.errors import TaskErrorCode, task_error
from controlplane.states import TaskState

# A shard that ends in one of these counts against the sweep's `fail_fast` (after its own retries).
FAILURES = frozenset({TaskState.FAILED, TaskState.TIMED_OUT})


def shard_count(vary: Mapping[str, Any]) -> int:
    """How many shards `vary` makes, without making them (a grid's product can be huge)."""
    if "list" in vary:
        return len(vary["list"])
    return math.prod(len(values) for values in vary["grid"].values())


def override(vary: Mapping[str, Any], shard: int) -> dict[str, Any]:
    """Shard `shard`'s override (0-based): the list's item, or the grid's combination at that
    index (mixed radix, the last key varying fastest)."""
    if "list" in vary:
        return dict(vary["list"][shard])
    grid: Mapping[str, list[Any]] = vary["grid"]
    picked: dict[str, Any] = {}
    rest = shard
    for name in reversed(list(grid)):
        values = grid[name]
        rest, i = divmod(rest, len(values))
        picked[name] = values[i]
    return {name: picked[name] for name in grid}


def overrides(vary: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every shard's override, in shard order."""
    for shard in range(shard_count(vary)):
        yield override(vary, shard)


def inputs_of(base: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """A shard's inputs: the base with its override applied (shallow)."""
    return {**base, **change}


def trips(fail_fast: int | None, failures: int) -> bool:
    """Whether `failures` failed shards stop a sweep whose policy is `fail_fast` (None: never)."""
    return fail_fast is not None and failures >= fail_fast


def stopped_error(sweep_id: str, why: str) -> dict[str, Any]:
    """The error of a shard cancelled because its sweep stopped (`why`: its stop reason, "was
    cancelled (...)" or its failure policy's)."""
    return task_error(TaskErrorCode.CANCELLED, f"cancelled: sweep {sweep_id} {why}", sweep=sweep_id)


def failed_fast(sweep_id: str, fail_fast: int) -> str:
    """The stop reason of a sweep whose failure policy stopped it."""
    shards = "shard" if fail_fast == 1 else "shards"
    return f"stopped by its failure policy (fail_fast: {fail_fast} failed {shards})"


def sweep_state(st: dict[str, Any]) -> str:
    """A sweep's state as its row shows it: running or queued until every shard has ended, then
    succeeded (all did), cancelled (it was stopped) or failed."""
    counts: dict[str, int] = st.get("counts") or {}
    if not st["done"]:
        return "running" if counts.get("running") else "queued"
    if counts.get("succeeded", 0) == st["shards"]:
        return "succeeded"
    return "cancelled" if st.get("stopped_at") else "failed"


def shards_text(st: dict[str, Any]) -> str:
    """shards ended/all, running, failed."""
    counts: dict[str, int] = st.get("counts") or {}
    failed = counts.get("failed", 0) + counts.get("timed_out", 0)
    return f"{st['ended']}/{st['shards']} {counts.get('running', 0)} run {failed} failed"


def fold(tasks: list[dict[str, Any]], sweeps: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """A page of `list_tasks` rows with each sweep's shards folded into one row where its first
    shard was, made from the sweep's `get_sweep_status` answer in `sweeps` (a shard of a sweep
    not in it keeps its own row). A sweep's row has every field of a task's row (what all its
    shards share: priority, queue, tags, owner; attempt 0, started_at and updated_at null), and
    `sweep_id`, `shards` (its line), `counts` and `cost` so far."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for t in tasks:
        sid = t.get("sweep")
        if sid is None or sid not in sweeps:
            out.append(t)
        elif sid not in seen:
            seen.add(sid)
            st = sweeps[sid]
            cost = (st.get("estimated_cost") or {}).get("amount")
            shared = {k: t[k] for k in ("priority", "queue", "tags", "owner") if k in t}
            out.append({"task_id": sid, "sweep_id": sid, "tool_name": st["tool_name"], "state": sweep_state(st),
                        **shared, "attempt": 0, "percent": st["percent"], "submitted_at": st["submitted_at"],
                        "started_at": None, "updated_at": None,
                        "completed_at": st.get("stopped_at") if st.get("done") else None,
                        "shards": shards_text(st), "counts": st.get("counts") or {}, "cost": cost,
                        "currency": (st.get("estimated_cost") or {}).get("currency")})
    return out
