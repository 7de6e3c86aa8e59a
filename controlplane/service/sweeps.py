"""submit_sweep, get_sweep_status, cancel_sweep and get_sweep_result: a sweep's shards admitted
whole (every shard checked like a submit, all of them counted by one submit's guards, written in
one transaction), followed as one, stopped as one, and read back page by page in shard order."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, cast

from controlplane import api, sweeps
from controlplane.admission import Admission, Base
from controlplane.api import iso
from controlplane.catalog import Catalog
from controlplane.errors import BY_REFERENCE, ControlPlaneError, ErrorCode, invalid
from controlplane.estimates import Estimator, sweep_runtime
from controlplane.guards import LimitReached, QueueFull
from controlplane.outcomes import cancelled_error
from controlplane.prices import Pricing, Usage, money
from controlplane.service.access import Access
from controlplane.service.answers import (
    CostSoFar,
    ListedTask,
    Money,
    ShardResult,
    SweepAnswer,
    SweepCancelAnswer,
    SweepFailure,
    SweepResult,
    SweepStatus,
    UsageFigures,
)
from controlplane.service.logs import ASCII_DIGITS
from controlplane.service.reads import Reads
from controlplane.service.submit import Submits, queue_full
from controlplane.settings import Settings
from controlplane.states import FINAL, TaskState
from controlplane.store import NewTask, Store
from controlplane.store.rows import SweepRow
from controlplane.store.sweeps import NewSweep

FIRST_FAILURES = 5  # failures get_sweep_status shows
CURSOR_PREFIX = "swc_"


def shard_invalid(shard: int, field: str, message: str, hint: str | None) -> ControlPlaneError:
    """A sweep refused whole for one shard's inputs: names the shard and the field."""
    return invalid(f"shard {shard}: {field}: {message}", hint=hint, shard=shard, field=field)


class Sweeps:
    def __init__(self, settings: Settings, store: Store, catalog: Catalog, admission: Admission, submits: Submits,
                 reads: Reads, access: Access, pricing: Pricing, estimator: Estimator, wake: Callable[..., None]):
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.admission = admission
        self.submits = submits
        self.reads = reads
        self.access = access
        self.pricing = pricing
        self.estimator = estimator
        self.wake = wake

    # ---- submit_sweep -------------------------------------------------------------------------
    def submit(self, caller: str, req: api.SubmitSweep) -> SweepAnswer:
        vary = req.vary.as_json()
        count = sweeps.shard_count(vary)
        limit = self.settings.sweep_max_shards
        if count > limit:
            raise ControlPlaneError(ErrorCode.SWEEP_TOO_LARGE, f"the sweep makes {count} shards; the limit is {limit}",
                                    hint="split it into several sweeps", shards=count, max=limit)
        base = self.admission.base(caller, req)
        tasks = [self._shard(base, shard, sweeps.inputs_of(req.base_inputs, change))
                 for shard, change in enumerate(sweeps.overrides(vary))]
        self.admission.check_disk(base)
        guards = self.admission.guards(caller, tasks[0])
        slots = min(req.max_parallel or base.rc.max_concurrency, base.rc.max_concurrency)
        costs = [t.estimate_cost for t in tasks]
        new = NewSweep(
            owner=str(caller), tool_name=base.tool.name, resource_class=base.rc.name,
            base_inputs_json=json.dumps(req.base_inputs, separators=(",", ":"), sort_keys=True),
            vary_json=json.dumps(vary, separators=(",", ":")), priority=req.priority, tags=list(req.tags),
            team=tasks[0].team, max_parallel=req.max_parallel, fail_fast=req.fail_fast,
            idempotency_key=req.idempotency_key,
            estimate_s=sweep_runtime([t.estimate_s or 0.0 for t in tasks], slots),
            estimate_cost=None if any(c is None for c in costs) else sum(c or 0.0 for c in costs))
        try:
            got = self.store.sweeps.submit(new, tasks, guards)
        except QueueFull as e:
            raise queue_full(e) from None
        except LimitReached as e:
            raise self.submits.refused(e) from None
        sweep = got.sweep
        if got.created:
            self.wake(reconciler=False, queued_in=sweep.resource_class)
        elif (sweep.base_inputs_json, sweep.vary_json) != (new.base_inputs_json, new.vary_json):
            raise invalid(f"idempotency_key '{req.idempotency_key}' was already used for sweep {sweep.sweep_id} "
                          "with different inputs", hint="use a new key for a different request")
        extra: dict[str, Any] = {} if got.created else {"deduplicated": True}
        est = sweep.estimate_s or 0.0
        return SweepAnswer(
            sweep_id=sweep.sweep_id, tool_name=sweep.tool_name, shards=sweep.shards, queue=sweep.resource_class,
            submitted_at=iso(sweep.created_at), max_parallel=sweep.max_parallel, fail_fast=sweep.fail_fast,
            estimated_runtime_seconds=sweep.estimate_s,
            estimated_cost=Money(amount=money(sweep.estimate_cost), currency=self.pricing.currency),
            poll_after_ms=int(min(30.0, max(1.0, est / 20)) * 1000),
            message=f"{sweep.shards} shards of {sweep.tool_name} queued as sweep {sweep.sweep_id} (estimated "
                    f"runtime {est:.0f} s). Follow it with get_sweep_status; page its results with "
                    "get_sweep_result; each shard is a task (list_tasks(sweep=...)).", **extra)

    def _shard(self, base: Base, shard: int, inputs: dict[str, Any]) -> NewTask:
        """One shard's task, checked as a submit's; a refusal names the shard (and the field)."""
        inputs_json = json.dumps(inputs, separators=(",", ":"), sort_keys=True)
        size, most = len(inputs_json.encode()), self.settings.max_input_bytes
        if size > most:
            raise shard_invalid(shard, "inputs", f"{size} bytes; the limit is {most}", BY_REFERENCE)
        found = self.admission.input_error(base.tool.name, inputs)
        if found is not None:
            raise shard_invalid(shard, found[0], found[1], f"see the input schema of tool '{base.tool.name}'")
        try:
            return self.admission.task(base, inputs, inputs_json)
        except ControlPlaneError as e:  # (a reference it names)
            raise ControlPlaneError(e.code, f"shard {shard}: {e.message}", e.hint, **{**e.extra, "shard": shard}) \
                from None

    # ---- get_sweep_status ---------------------------------------------------------------------
    def rows(self, caller: str, tasks: list[ListedTask]) -> list[ListedTask]:
        """A page of list_tasks whose sweeps take one row each (its lowest shard's, naming its
        `sweep`) with each made the sweep's own row (`sweeps.fold`, from get_sweep_status)."""
        statuses: dict[str, dict[str, Any]] = {}
        for sid in dict.fromkeys(t["sweep"] for t in tasks if "sweep" in t):
            try:
                statuses[sid] = self.status(caller, api.GetSweepStatus(sweep_id=sid)).dump()
            except ControlPlaneError as e:  # (purged since the page was read: its shard's row stays)
                if e.code is not ErrorCode.NOT_FOUND:
                    raise
        return cast(list[ListedTask], sweeps.fold(cast(list[dict[str, Any]], tasks), statuses))

    def status(self, caller: str, req: api.GetSweepStatus) -> SweepStatus:
        sweep = self.access.sweep(caller, req.sweep_id)
        counts = self.store.sweeps.state_counts(sweep.sweep_id)
        ended = sum(n for state, n in counts.items() if state in FINAL)
        # The running shards and the failures are read only when the counts say there are some
        # (a queued sweep's status is three statements, not five).
        running = self.store.sweeps.running(sweep.sweep_id) if counts.get(TaskState.RUNNING) else []
        failed = any(counts.get(s) for s in sweeps.FAILURES)
        now = time.time()
        pct = 0.0
        remaining: list[float] = []
        for task in running:
            progress = task.progress or {}
            p = progress.get("percent")
            pct += min(100.0, max(0.0, float(p))) / 100 if isinstance(p, int | float) else 0.0
            eta = self.estimator.eta(task, progress, now)
            remaining.append(eta if eta is not None else 0.0)
        done = ended >= sweep.shards
        if done and sweep.stopped_at is None:  # read before the stop that ended it committed: its row again
            sweep = self.store.sweeps.get(sweep.sweep_id) or sweep
        percent = round(100.0 * (ended + pct) / sweep.shards, 2) if sweep.shards else 100.0
        return SweepStatus(
            sweep_id=sweep.sweep_id, tool_name=sweep.tool_name, shards=sweep.shards,
            counts={str(s): n for s, n in sorted(counts.items()) if n}, ended=ended, done=done, percent=percent,
            eta_s=0.0 if done else self._eta(sweep, counts, remaining), submitted_at=iso(sweep.created_at),
            stopped_at=iso(sweep.stopped_at), stop_reason=sweep.stop_reason, max_parallel=sweep.max_parallel,
            fail_fast=sweep.fail_fast, **self._used(sweep, running, now),
            failures=[SweepFailure(shard=shard, task_id=tid, state=state, error=error)
                      for shard, tid, state, error in
                      (self.store.sweeps.first_failures(sweep.sweep_id, FIRST_FAILURES) if failed else [])],
            poll_after_ms=None if done else int(min(30.0, max(1.0, (sum(remaining) or 10.0) / 10)) * 1000))

    def _eta(self, sweep: SweepRow, counts: dict[TaskState, int], remaining: list[float]) -> float | None:
        """What is left: the running shards' own ETAs and the shards still to start at the tool's
        current estimate, spread over the slots the sweep may hold (never less than the longest)."""
        tool = self.catalog.tool(sweep.tool_name)
        rc = self.catalog.resource_classes.get(sweep.resource_class)
        if tool is None or rc is None:
            return None
        waiting = sum(counts.get(s, 0) for s in (TaskState.WAITING, TaskState.QUEUED, TaskState.SCHEDULED))
        each = self.estimator.estimate(tool, None)
        slots = min(sweep.max_parallel or rc.max_concurrency, rc.max_concurrency)
        return sweep_runtime([*remaining, *([each] * waiting)], slots)

    def _used(self, sweep: SweepRow, running: list[Any], now: float) -> dict[str, Any]:
        """usage and estimated_cost: the shards' recorded attempts (one aggregate) and the running
        attempts so far, as a task's status counts them."""
        sums = self.store.sweeps.usage(sweep.sweep_id)
        used = Usage(sums["run_s"], sums["vcpu_s"], sums["memory_gib_s"], sums["gpu_s"])
        cost, unpriced = sums["cost"] or 0.0, sums["unpriced"] or 0
        for task in running:
            if task.started_at is None:
                continue
            priced = self.pricing.of_attempt(task, None)
            so_far = priced.usage(now - task.started_at)
            used = used + so_far
            now_cost = so_far.cost(priced.rate)
            unpriced += now_cost is None
            cost += now_cost or 0.0
        return {"usage": UsageFigures(**used.as_dict()),
                "estimated_cost": CostSoFar(amount=None if unpriced else money(cost), currency=self.pricing.currency,
                                            at_submit=money(sweep.estimate_cost))}

    # ---- cancel_sweep -------------------------------------------------------------------------
    def cancel(self, caller: str, req: api.CancelSweep) -> SweepCancelAnswer:
        sweep = self.access.sweep_to_cancel(caller, req.sweep_id)
        reason = req.reason if sweep.owner == caller else f"by an administrator: {req.reason}"
        why = f"was cancelled ({reason})"
        _, moved = self.store.sweeps.stop(sweep.sweep_id, why, cancelled_error(f"sweep {sweep.sweep_id} {why}"))
        if moved:
            self.wake(scheduler=False)  # the reconciler stops the running shards' jobs
            return SweepCancelAnswer(sweep_id=sweep.sweep_id, acknowledged=True, cancelled=moved)
        return SweepCancelAnswer(sweep_id=sweep.sweep_id, acknowledged=False, cancelled=0,
                                 message="every shard has ended or is being stopped; nothing to cancel")

    # ---- get_sweep_result ---------------------------------------------------------------------
    def result(self, caller: str, req: api.GetSweepResult) -> SweepResult:
        sweep = self.access.sweep(caller, req.sweep_id)
        start = decode_cursor(req.cursor) if req.cursor else 0
        rows = self.store.sweeps.page(sweep.sweep_id, start, req.limit)
        vary = json.loads(sweep.vary_json)
        results = []
        for task in rows:
            res = self.reads.result_of(task, req.url_ttl_s)
            results.append(ShardResult(shard=task.shard or 0, task_id=task.task_id,
                                       override=sweeps.override(vary, task.shard or 0), state=res.state,
                                       result=res.result, error=res.error, artifacts=res.artifacts,
                                       completed_at=res.completed_at))
        last = rows[-1].shard if rows else None
        more = last is not None and last + 1 < sweep.shards and len(rows) == req.limit
        return SweepResult(sweep_id=sweep.sweep_id, shards=sweep.shards, results=results,
                           next_cursor=f"{CURSOR_PREFIX}{last + 1}" if more and last is not None else None)


def decode_cursor(cursor: str) -> int:
    """The shard a get_sweep_result cursor starts at; INVALID_REQUEST if malformed."""
    digits = cursor.removeprefix(CURSOR_PREFIX)
    if not cursor.startswith(CURSOR_PREFIX) or not ASCII_DIGITS.fullmatch(digits) or len(digits) > 9:
        raise invalid("malformed cursor", hint="pass the next_cursor of a previous get_sweep_result answer")
    return int(digits)
