"""The task operations behind the canonical tools: submit, status, logs, list, cancel, result.

Transport-agnostic: the MCP surface and the CLI call these with a caller identity and a
validated request, and get JSON-ready dicts back. Every read checks the owner; someone else's
task answers exactly like an unknown one (NOT_FOUND). Errors are `ControlPlaneError`s with the
codes of `controlplane.errors`.
"""

from __future__ import annotations

import base64
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath
from typing import Any


from controlplane import api, blocking
from controlplane.api import iso
from controlplane.catalog import Catalog
from controlplane.errors import ControlPlaneError, ErrorCode, invalid, not_found
from controlplane.estimates import Estimator
from controlplane.identity import Caller, may_cancel, may_read
from controlplane.budgets import Budgets, budget_exceeded, period_bounds
from controlplane.limits import Limits, Streams, limit_exceeded
from controlplane.prices import PriceTable, Pricing, Usage, money, summarize
from controlplane.objectstore.local import LocalObjectStore
from controlplane.objectstore.registry import StoreRegistry
from controlplane.ops import metrics
from controlplane.settings import Settings
from controlplane.states import TERMINAL, TaskState
from controlplane.outcomes import cancelled_error
from controlplane.admission import Admission
from controlplane.group_commit import GroupCommit
from controlplane.store import BudgetReached, LimitReached, NewTask, QueueFull, Store, Submitted
from controlplane.store.rows import TaskRow, TaskSummary
from controlplane_providers.base import Capability, Provider, TransientProviderError

LOG_CURSOR_PREFIX = "log_"
PROVIDER_CURSOR_PREFIX = "plog_"
LIST_CURSOR_PREFIX = "lst_"
# Submits made while others are being served wait up to this long for more to join their group
# commit on SQLite, whose commit then runs on the event loop (`GroupCommit.gather_s`), or until every
# call in progress has joined. 16 clients submitting (`bench/concurrency.py`, A/B runs): no wait,
# batches of 2, 0.67x the no-op's calls/s; 2 ms 0.74-0.78x; 4 ms 0.78-0.83x (batches of 7, the
# wait 4.9 ms on average: the loop is busy when the timer is due); 8 ms 0.73x.
GROUP_GATHER_S = 0.004
_ASCII_DIGITS = re.compile(r"[0-9]{1,18}")  # fits a 64-bit integer column on every engine


# The times an answer can write (years 1 to 9999, UTC): a filter time beyond them (a zone offset
# can carry a valid date past either end) means the same as the end itself, as no task lies there.
EARLIEST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
LATEST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def _epoch(when: datetime | None) -> float | None:
    """A filter time as epoch seconds, within [EARLIEST, LATEST]; a time without a zone is UTC."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return min(max((when - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds(), EARLIEST), LATEST)


def queue_full(e: QueueFull) -> ControlPlaneError:
    return ControlPlaneError(ErrorCode.QUEUE_OVERLOADED, f"queue '{e.queue}' is full ({e.length} tasks waiting)",
                             hint="retry later, or lower the rate of submissions")


class AdminReads:
    """Admins' reads of other callers' tasks, in each task's audit (task_events, kind
    `admin_read`, or `admin_list` for a row of list_tasks, with who read it): at most once per
    admin and task every `every_s` per server, so that a tail followed page by page is one
    entry, not hundreds."""

    def __init__(self, store: Store, every_s: float = 600.0):
        self.store = store
        self.every_s = every_s
        self._seen: dict[tuple[str, ...], float] = {}

    def read(self, admin: str, task: TaskRow) -> None:
        now = time.monotonic()
        key = (str(admin), task.task_id)
        if now - self._seen.get(key, -math.inf) < self.every_s:
            return
        self.store.tasks.audit(task.task_id, "admin_read", {"by": str(admin)})  # (WouldBlock: before the write)
        self._remember([key], now)

    def listed(self, admin: str, rows: list[tuple[TaskSummary, str]]) -> None:
        """A page of list_tasks showing others' tasks: an `admin_list` entry in each (who listed
        it), at most once per admin and task every `every_s`, written in one statement."""
        now = time.monotonic()
        due = [(r, (str(admin), r.task_id, "list")) for r, owner in rows if owner != str(admin)]
        due = [(r, key) for r, key in due if now - self._seen.get(key, -math.inf) >= self.every_s]
        if not due:
            return
        self.store.tasks.audit_reads([(r.task_id, r.state.value, r.attempt) for r, _ in due], "admin_list",
                                     {"by": str(admin)})  # (WouldBlock: before the write)
        self._remember([key for _, key in due], now)

    def _remember(self, keys: list[tuple[str, ...]], now: float) -> None:
        for key in keys:
            self._seen[key] = now
        if len(self._seen) > 10_000:
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.every_s}


# The states of a task whose current attempt is running (its usage so far is counted from its start).
_RUNNING = frozenset({TaskState.RUNNING, TaskState.CANCEL_REQUESTED, TaskState.CANCELLING})


class TaskService:
    def __init__(self, settings: Settings, store: Store, catalog: Catalog, stores: StoreRegistry,
                 estimator: Estimator, providers: dict[str, Provider] | None = None,
                 wake: Callable[..., None] = lambda **_: None, pricing: Pricing | None = None):
        self.settings = settings
        self.providers = providers or {}
        self.pricing = pricing or Pricing(PriceTable.load(settings.resolved_prices_path), catalog, self.providers)
        self.budgets = Budgets(store)  # per caller or tag (controlplane.budgets)
        self.store = store
        self.catalog = catalog
        self.stores = stores
        self.estimator = estimator
        self.wake = wake  # nudges the scheduler/reconciler after a submit or cancel
        self.limits = Limits(settings, store)  # per caller (controlplane.limits)
        self.streams = Streams(self.limits, store)
        self.audit = AdminReads(store)
        self.admission = Admission(settings, catalog, self.providers, estimator, self.limits, self.pricing,
                                   self.budgets)
        self.validate_inputs = self.admission.validate_inputs
        # Submits from the event loop are written together (one transaction, one fsync).
        self.load = blocking.Load()  # calls in progress on the loop (the MCP tools count them)
        self.commits: GroupCommit[tuple[NewTask, int], Submitted] = GroupCommit(
            store.tasks.submit_many, write_many_on_loop=store.tasks.submit_many_on_loop,
            gather_s=GROUP_GATHER_S if store.db.is_sqlite else 0.0, in_progress=lambda: self.load.calls)
        self.load.on_answered = self.commits.poke
        # Whether callers run on this machine and the download links live only as long as this
        # process (stdio: its own internal listener serves them): local-store artifacts then carry
        # a `file_url` too, which outlives the server (docs/design/downloads.md).
        self.same_host = False

    # ==== submit ==============================================================================
    def submit(self, owner: str, req: api.SubmitTask) -> dict[str, Any]:
        new, queue_limit = self.admission.check(owner, req)
        try:
            sub = self.store.tasks.submit(new, queue_limit=queue_limit)
        except QueueFull as e:
            raise queue_full(e) from None
        except LimitReached as e:
            raise self.refused(e) from None
        return self.submitted(new, sub)

    async def submit_grouped(self, owner: str, req: api.SubmitTask) -> dict[str, Any]:
        """`submit` for callers on the event loop. A submit alone is written at once, on the loop
        (a short SQLite transaction costs less than a hop to a thread and back); one made while
        other calls are being served (`blocking.Load`) or a group commit is forming or in flight,
        or that finds the write lock taken, joins one (`controlplane.group_commit`: one
        transaction and one fsync for all, off the loop). Either way it is answered once its
        task is on disk."""
        new, queue_limit = await blocking.call(self.admission.check, owner, req)
        try:
            alone = not (self.commits.busy or self.load.others)
            sub = self._submit_alone(new, queue_limit) if alone else None
            if sub is None:
                sub = await self.commits.run((new, queue_limit))
        except QueueFull as e:
            raise queue_full(e) from None
        except LimitReached as e:
            raise self.refused(e) from None
        return await blocking.call(self.submitted, new, sub)

    def refused(self, e: LimitReached) -> ControlPlaneError:
        """A submit refused by a limit of its caller, or by a budget."""
        return budget_exceeded(e, self.pricing.currency) if isinstance(e, BudgetReached) else limit_exceeded(e)

    def _submit_alone(self, new: NewTask, queue_limit: int) -> Submitted | None:
        """The write on the loop, or None when it would wait (the lock taken, or an engine that
        is reached over the network)."""
        try:
            with blocking.inline():
                return self.store.tasks.submit(new, queue_limit=queue_limit)
        except blocking.WouldBlock:
            return None

    def submitted(self, new: NewTask, sub: Submitted) -> dict[str, Any]:
        """The answer to a submit once its task is written (or found by its idempotency key)."""
        task, created = sub.task, sub.created
        if created:
            self.wake(reconciler=False, queued_in=task.resource_class)  # a new task needs a slot, not a reconcile
            metrics.SUBMITS.labels(task.tool_name).inc()
        elif task.inputs_json != new.inputs_json and task.state != TaskState.EXPIRED:
            raise invalid(f"idempotency_key '{new.idempotency_key}' was already used for task {task.task_id} "
                          "with different inputs", hint="use a new key for a different request")
        position = sub.position
        if not created and task.state == TaskState.QUEUED:
            position = self.store.tasks.queue_position(task)
        out = {
            "task_id": task.task_id,
            "state": task.state,
            "queue": task.resource_class,
            "position": position,
            "submitted_at": iso(task.submitted_at),
            "poll_after_ms": self.poll_after_ms(task),
            "estimated_runtime_seconds": task.estimate_s,
            "estimated_cost": {"amount": money(task.estimate_cost), "currency": self.pricing.currency},
        }
        if not created:
            out["deduplicated"] = True
        return out

    def poll_after_ms(self, task: TaskRow) -> int:
        """When it is worth asking again: a tenth of the expected remaining time (the tool's own
        ETA while it runs, else the estimate), 0.5 s to 30 s; while the job is being placed, no
        sooner than its provider looks at it again."""
        remaining = task.estimate_s or 10.0
        if task.state == TaskState.RUNNING and task.started_at:
            progress = task.progress or {}
            eta = self.estimator.eta(task, progress, time.time())
            remaining = eta if eta is not None else remaining
        interval = min(30.0, max(0.5, remaining / 10))
        provider = self.providers.get(task.provider)
        if task.state == TaskState.SCHEDULED and provider is not None:
            interval = max(interval, min(30.0, provider.poll_interval_s / 2))
        return int(interval * 1000)

    # ==== status ==============================================================================
    def get(self, owner: str, task_id: str) -> TaskRow | None:
        """The caller's task, or None (unknown and someone else's alike). A caller with rights
        over others' tasks (`identity.Caller`: a team, tasks:admin) also gets those it may read."""
        if type(owner) is str:  # no rights beyond its own tasks
            return self.store.tasks.get(task_id, owner)
        task = self.store.tasks.get(task_id)
        if task is None or not may_read(owner, task.owner, task.team):
            return None
        if task.owner != owner and not (task.team is not None and task.team in owner.teams):  # type: ignore[attr-defined]
            self.audit.read(owner, task)  # an admin reading someone else's task
        return task

    def task_ids(self, owner: str, prefix: str, limit: int) -> list[str]:
        """The caller's task ids starting with `prefix`, newest first (argument completion)."""
        return self.store.tasks.task_ids(owner, prefix, limit)

    def recent_inputs(self, owner: str, tool_name: str, limit: int) -> list[dict[str, Any]]:
        """The inputs of the caller's latest tasks of a tool (argument completion)."""
        return self.store.tasks.recent_inputs(owner, tool_name, limit)

    def _owned(self, owner: str, task_id: str) -> TaskRow:
        task = self.get(owner, task_id)
        if task is None:
            raise not_found()
        return task

    def status(self, owner: str, req: api.GetTaskStatus) -> dict[str, Any]:
        return self.describe(self._owned(owner, req.task_id))

    def describe(self, task: TaskRow) -> dict[str, Any]:
        state = task.state
        progress = task.progress
        if progress is not None:
            progress.pop("ts", None)
            eta = self.estimator.eta(task, progress, time.time())
            if eta is not None:
                progress["eta_s"] = eta
        out: dict[str, Any] = {
            "task_id": task.task_id,
            "state": state,
            "tool_name": task.tool_name,
            "attempt": task.attempt,
            "max_attempts": task.max_attempts,
            "priority": task.priority,
            "queue": task.resource_class,
            "position": self.store.tasks.queue_position(task) if state == TaskState.QUEUED else None,
            "worker_id": task.worker_id,
            "submitted_at": iso(task.submitted_at),
            "started_at": iso(task.started_at),
            "updated_at": iso(task.updated_at),
            "heartbeat_at": iso(task.heartbeat_at),
            "completed_at": iso(task.completed_at),
            "expires_at": iso(task.expires_at),
            "timeout_at": iso(task.timeout_at),
            "progress": progress,
            "cancel_requested": bool(task.cancel_requested),
            "estimated_runtime_seconds": task.estimate_s,
            "tags": task.tags,
            "error": task.error,
            "poll_after_ms": None if state in TERMINAL or state == TaskState.EXPIRED else self.poll_after_ms(task),
            **self.usage(task),
        }
        provider = self.providers.get(task.provider)
        links = provider is not None and provider.supports(Capability.LOG_LINK)
        if state == TaskState.SCHEDULED or links:
            job = self.store.jobs.get(task.task_id, task.attempt)
            if job is not None:
                if state == TaskState.SCHEDULED and job.provider_reason:
                    out["waiting_reason"] = job.provider_reason  # e.g. no compute capacity yet
                if links and job.handle_json:
                    out["log_link"] = provider.log_link(provider.handle(job.handle_json))
        return out

    # ==== usage and cost ======================================================================
    def usage(self, task: TaskRow) -> dict[str, Any]:
        """What the task used (its attempts that ended, and the one running so far) and its
        estimated cost at list price (`controlplane.prices`), with the estimate made at submit.
        A task that has not run yet reads nothing for it; one on its first attempt reads nothing
        either (its usage so far is its run time times its shape)."""
        used, cost, unpriced = Usage(), 0.0, 0
        running = task.started_at is not None and task.state in _RUNNING
        if task.attempt > 1 or (task.started_at is not None and not running):
            # a recorded attempt (a retry's earlier ones, or the one that ended)
            sums = self.store.usage.of_task(task.task_id)
            used = Usage(sums["run_s"], sums["vcpu_s"], sums["memory_gib_s"], sums["gpu_s"])
            cost, unpriced = sums["cost"] or 0.0, sums["unpriced"] or 0  # (NULL sums: no attempt recorded)
        if running:
            priced = self.pricing.of_task(task)
            so_far = priced.usage(time.time() - task.started_at)
            used = used + so_far
            now_cost = so_far.cost(priced.rate)
            unpriced += now_cost is None
            cost += now_cost or 0.0
        return {"usage": used.as_dict(),
                "estimated_cost": {"amount": None if unpriced else money(cost), "currency": self.pricing.currency,
                                   "at_submit": money(task.estimate_cost)}}

    def usage_report(self, caller: str, req: api.UsageReport) -> dict[str, Any]:
        """Usage and cost summed per group over [since, until): the caller's own, or (tasks:admin)
        everyone's or one owner's."""
        now = time.time()
        until = _epoch(req.until)
        until = now if until is None else until
        since = _epoch(req.since)
        if since is None:  # the month `until` falls in (the one before, when it is a month's first instant)
            since = period_bounds("month", max(until - 0.001, EARLIEST))[0]
        elif since >= until:
            raise invalid("since: must be before until")
        admin = isinstance(caller, Caller) and caller.admin
        if req.everyone and req.owner is not None:
            raise invalid("give owner or everyone, not both")
        if req.everyone and not admin:
            raise ControlPlaneError(ErrorCode.FORBIDDEN, "everyone's usage needs the tasks:admin scope",
                                    hint="omit everyone to see your own usage")
        owner = None if req.everyone else (req.owner or str(caller))
        # Someone else's usage, without tasks:admin: the answer of a caller who used nothing.
        mine = admin or owner == str(caller)
        rows = self.store.usage.report(req.group_by, owner, since, until) if mine else []
        return {"since": iso(since), "until": iso(until), "owner": owner, "group_by": req.group_by,
                "currency": self.pricing.currency, "prices_as_of": self.pricing.table.as_of,
                **summarize(rows, req.group_by)}

    # ==== logs ================================================================================
    def tail(self, owner: str, req: api.TailTaskLogs) -> dict[str, Any]:
        task = self._owned(owner, req.task_id)
        if req.cursor is not None and req.from_end:
            raise invalid("give either cursor or from_end, not both")
        limit = min(req.limit, self.settings.max_log_page)
        if req.source == "provider":
            return self._provider_tail(task, req, limit)
        if req.from_end:
            lines = self.store.logs.last(task.task_id, limit)
            after = lines[0].seq - 1 if lines else task.log_seq
        else:
            after = self._log_cursor(req.cursor)
            lines = self.store.logs.tail(task.task_id, after, limit)
        last = lines[-1].seq if lines else max(after, 0)
        return {
            "task_id": task.task_id,
            "state": task.state,
            "lines": [{"seq": ln.seq, "ts": iso(ln.ts), "stream": ln.stream, "level": ln.level,
                       "message": ln.message, "attempt": ln.attempt} for ln in lines],
            "next_cursor": f"{LOG_CURSOR_PREFIX}{last:09d}",
            # Older lines than the cursor asked for were dropped by the per-task log cap.
            "truncated": after + 1 < task.log_first_seq,
            "has_more": last < task.log_seq,
        }

    def _provider_tail(self, task: TaskRow, req: api.TailTaskLogs, limit: int) -> dict[str, Any]:
        """A page of the job runner's own log (CloudWatch, the local console) for the current
        attempt; its cursor wraps the provider's (e.g. CloudWatch's forward token)."""
        provider = self.providers.get(task.provider)
        if provider is None or not provider.supports(Capability.LOGS):
            raise ControlPlaneError(ErrorCode.CAPABILITY_MISSING, f"the {task.provider} provider keeps no log "
                                    "of its own", hint="use source='task'")
        if req.from_end:
            raise invalid("from_end is not available with source='provider'")
        cursor = None
        if req.cursor is not None:
            if not req.cursor.startswith(PROVIDER_CURSOR_PREFIX):
                raise invalid("malformed cursor", hint="pass the next_cursor of a previous answer with the same source")
            cursor = req.cursor[len(PROVIDER_CURSOR_PREFIX):] or None
        out: dict[str, Any] = {"task_id": task.task_id, "state": task.state, "source": "provider",
                               "attempt": task.attempt, "lines": [], "next_cursor": req.cursor or PROVIDER_CURSOR_PREFIX}
        job = self.store.jobs.get(task.task_id, task.attempt)
        if job is None or not job.handle_json:
            out["reason"] = "the job has not been launched yet"
            return out
        blocking.must_not_block()  # a cloud logging API
        try:
            page = provider.logs(provider.handle(job.handle_json), cursor, limit)
        except TransientProviderError:
            out["reason"] = "the provider's log service did not answer (throttled or unavailable); try again"
            return out
        out["lines"] = [{"ts": iso(ln.ts), "stream": ln.stream, "message": ln.message} for ln in page.lines]
        out["next_cursor"] = PROVIDER_CURSOR_PREFIX + (page.next_cursor or cursor or "")
        if page.reason:
            out["reason"] = page.reason
        return out

    @staticmethod
    def _log_cursor(cursor: str | None) -> int:
        if cursor is None:
            return 0
        digits = cursor.removeprefix(LOG_CURSOR_PREFIX)
        if not cursor.startswith(LOG_CURSOR_PREFIX) or not _ASCII_DIGITS.fullmatch(digits):
            raise invalid("malformed cursor", hint="pass the next_cursor of a previous tail_task_logs answer")
        return int(digits)

    # ==== list ================================================================================
    def list(self, owner: str, req: api.ListTasks) -> dict[str, Any]:
        after = self._decode_list_cursor(req.cursor) if req.cursor else None
        if req.everyone:
            return self._list_everyone(owner, req, after)
        teams = None
        caller = owner
        if req.owner is not None and req.owner != owner:  # someone else's tasks
            if not isinstance(owner, Caller) or not (owner.admin or owner.teams):
                return {"tasks": [], "next_cursor": None}  # as for a caller with no tasks
            teams = None if owner.admin else sorted(owner.teams)  # a teammate's: those shared with a team of ours
            owner = req.owner
        rows = self.store.tasks.list(
            owner, teams=teams, states_=[s.value for s in req.states] if req.states else None, tool_name=req.tool_name,
            tags_any=req.tags_any, submitted_after=_epoch(req.submitted_after),
            submitted_before=_epoch(req.submitted_before), after=after, limit=req.limit + 1)
        more = len(rows) > req.limit
        rows = rows[: req.limit]
        if teams is None and owner != caller:  # an administrator reading another owner's tasks
            self.audit.listed(caller, [(r, owner) for r in rows])
        cursor = self._encode_list_cursor(rows[-1].submitted_at, rows[-1].pk) if more and rows else None
        return {"tasks": [self._listed(r) for r in rows], "next_cursor": cursor}

    def _list_everyone(self, caller: str, req: api.ListTasks, after: tuple[float, int] | None) -> dict[str, Any]:
        """Every owner's tasks for tasks:admin, each row with its owner (audited); anyone else is
        refused as usage_report refuses everyone's usage (FORBIDDEN)."""
        if req.owner is not None:
            raise invalid("give owner or everyone, not both")
        if not isinstance(caller, Caller) or not caller.admin:
            raise ControlPlaneError(ErrorCode.FORBIDDEN, "everyone's tasks need the tasks:admin scope",
                                    hint="omit everyone to list your own tasks")
        found = self.store.tasks.list_everyone(
            states_=[s.value for s in req.states] if req.states else None, tool_name=req.tool_name,
            tags_any=req.tags_any, submitted_after=_epoch(req.submitted_after),
            submitted_before=_epoch(req.submitted_before), after_pk=after[1] if after else None,
            limit=req.limit + 1)
        more = len(found) > req.limit
        found = found[: req.limit]
        self.audit.listed(caller, found)
        last = found[-1][0] if more and found else None
        return {"tasks": [{**self._listed(r), "owner": owner} for r, owner in found],
                "next_cursor": self._encode_list_cursor(last.submitted_at, last.pk) if last else None}

    @staticmethod
    def _listed(r: TaskSummary) -> dict[str, Any]:
        """A task as a row of list_tasks shows it."""
        progress = r.progress
        return {
            "task_id": r.task_id, "state": r.state, "tool_name": r.tool_name,
            "priority": r.priority, "queue": r.resource_class, "attempt": r.attempt,
            "submitted_at": iso(r.submitted_at), "started_at": iso(r.started_at),
            "updated_at": iso(r.updated_at), "completed_at": iso(r.completed_at),
            "tags": r.tags,
            "percent": progress.get("percent") if progress else None,
        }

    @staticmethod
    def _encode_list_cursor(submitted_at: float, pk: int) -> str:
        raw = f"v1:{submitted_at!r}:{pk}".encode()
        return LIST_CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def _decode_list_cursor(cursor: str) -> tuple[float, int]:
        try:
            if not cursor.startswith(LIST_CURSOR_PREFIX):
                raise ValueError
            raw = cursor[len(LIST_CURSOR_PREFIX):]
            text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
            version, ts, pk = text.split(":")
            when = float(ts)
            if version != "v1" or not _ASCII_DIGITS.fullmatch(pk) or not math.isfinite(when):
                raise ValueError
            return when, int(pk)
        except (ValueError, UnicodeDecodeError):
            raise invalid("malformed cursor", hint="pass the next_cursor of a previous list_tasks answer") from None

    # ==== cancel ==============================================================================
    def cancel(self, owner: str, req: api.CancelTask) -> dict[str, Any]:
        if type(owner) is str:
            task, acknowledged = self.store.tasks.request_cancel(req.task_id, owner, req.reason,
                                                                 cancelled_error(req.reason))
        else:
            task, acknowledged = self._cancel_as(owner, req)
        if task is None:
            raise not_found()
        if acknowledged:
            self.wake(scheduler=False)  # the reconciler stops the job
            if task.state == TaskState.CANCELLED:  # a queued task ends here, not in Attempts
                metrics.COMPLETIONS.labels(task.tool_name, task.state).inc()
        out = {"task_id": task.task_id, "state": task.state, "acknowledged": acknowledged}
        if not acknowledged:
            out["message"] = f"the task is already {task.state}; nothing to cancel"
        return out

    def _cancel_as(self, caller: str, req: api.CancelTask) -> tuple[TaskRow | None, bool]:
        """A cancel by a caller with rights over others' tasks: its own as usual; a teammate's is
        refused (FORBIDDEN: it may read it, so it knows the task exists); any task for an admin,
        recorded in the task's audit with who asked."""
        found = self.store.tasks.get(req.task_id)
        if found is None or not may_read(caller, found.owner, found.team):
            return None, False
        if not may_cancel(caller, found.owner):
            raise ControlPlaneError(ErrorCode.FORBIDDEN, "this task is a teammate's: you may read it, not cancel it",
                                    hint="ask its owner, or an operator with tasks:admin")
        if found.owner == caller:
            return self.store.tasks.request_cancel(req.task_id, caller, req.reason, cancelled_error(req.reason))
        reason = f"by an administrator: {req.reason}"  # what the owner reads in the task's error
        return self.store.tasks.request_cancel(req.task_id, found.owner, reason, cancelled_error(reason),
                                               admin=str(caller))

    # ==== result ==============================================================================
    def result(self, owner: str, req: api.GetTaskResult) -> dict[str, Any]:
        task = self._owned(owner, req.task_id)
        state = task.state
        done = state in TERMINAL
        ttl = min(req.url_ttl_s or self.settings.artifact_url_ttl_s, self.settings.max_artifact_url_ttl_s)
        artifacts = []
        if done:
            now = time.time()
            for a in self.store.artifacts.of(task.task_id, task.attempt):
                store = self.stores.get(a.store_url)
                if not store.signs_locally:
                    blocking.must_not_block()  # signing may call out: not on the event loop
                lifetime = min(ttl, store.max_url_ttl_s)
                artifacts.append({
                    "artifact_id": a.artifact_id, "name": a.name, "kind": a.kind,
                    "size_bytes": a.size_bytes, "sha256": a.sha256, "content_type": a.content_type,
                    "download_url": store.signed_url(a.storage_key, expires_in=lifetime,
                                                     filename=PurePosixPath(a.name).name),
                    "expires_at": iso(math.floor(now) + lifetime),
                })
                if self.same_host and isinstance(store, LocalObjectStore):
                    artifacts[-1]["file_url"] = store.file_url(a.storage_key)
        out = {
            "task_id": task.task_id,
            "state": state,
            "result": task.result if done else None,
            "artifacts": artifacts,
            "error": task.error if done else None,
            "completed_at": iso(task.completed_at),
            "attempt": task.attempt,
            **self.usage(task),
        }
        if not done:
            out["message"] = ("the task expired; its result and artifacts were removed" if state == TaskState.EXPIRED
                              else f"the task is {state}; the result is not ready yet")
            out["poll_after_ms"] = None if state == TaskState.EXPIRED else self.poll_after_ms(task)
        return out

    # ==== a catalog tool called directly (the two-stage answer) ===========================================
    async def submit_direct(self, owner: str, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A catalog tool called by name: its arguments are the inputs (the two-stage answer). The
        answer is submit_task's, plus a `message` saying how to follow the task."""
        sub = await self.submit_grouped(owner, api.SubmitTask(tool_name=tool_name, inputs=arguments))
        est = sub["estimated_runtime_seconds"]
        return {**sub, "message": (f"{tool_name} queued as task {sub['task_id']} (estimated runtime {est:.0f} s). "
                                   "Follow it with get_task_status, tail_task_logs and get_task_result.")}

    # ==== the operator's view (controlplane.dashboard, /metrics) ===============================
    def timeline(self, owner: str, task_id: str) -> list[dict[str, Any]]:
        """A task's audit (every transition, retry, launch and cancel), oldest first, for a
        caller who may read the task (NOT_FOUND otherwise, as for every read)."""
        task = self._owned(owner, task_id)
        return [{"ts": iso(e.ts), "kind": e.kind, "attempt": e.attempt, "from": e.from_state, "to": e.to_state,
                 "detail": e.detail} for e in self.store.logs.events(task.task_id)]

    def overview(self) -> Overview:
        """Every queue's depth and slots, and the tasks on file by state and tool: numbers about
        everyone's tasks, never a task itself."""
        depths = self.store.tasks.queue_depths()
        queues = [QueueView(rc.name, depths.get(rc.name, 0), self.store.tasks.slots_busy(rc.name), rc.max_concurrency)
                  for rc in self.catalog.resource_classes.values()]
        return Overview(self.store.tasks.count_by_tool_and_state(), queues)


@dataclass(frozen=True)
class QueueView:
    name: str
    waiting: int
    busy: int
    slots: int


@dataclass(frozen=True)
class Overview:
    tasks: dict[tuple[str, str], int]  # (state, tool) -> tasks
    queues: list[QueueView]
