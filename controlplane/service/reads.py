"""get_task_status, get_task_result, a task's timeline, and the operator's overview."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from controlplane import api, blocking, dependencies
from controlplane.api import iso
from controlplane.catalog import Catalog
from controlplane.estimates import Estimator
from controlplane.objectstore.local import LocalObjectStore
from controlplane.objectstore.registry import ObjectStores
from controlplane.placement import NO_CAPACITY
from controlplane.service.access import Access
from controlplane.service.answers import Artifact, Move, TaskResult, TaskStatus, TimelineEntry
from controlplane.service.polling import poll_after_ms
from controlplane.service.usage import Costs
from controlplane.settings import Settings
from controlplane.states import TERMINAL, TaskState
from controlplane.store import Store
from controlplane.store.rows import JobRow, TaskRow
from controlplane_providers.base import Capability, Provider


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


PlacementMoves = list[tuple[str, int, str, int]]  # (tool, placement index, provider, attempts moved off it)


class Reads:
    def __init__(self, settings: Settings, store: Store, catalog: Catalog, object_stores: ObjectStores,
                 estimator: Estimator, providers: dict[str, Provider[Any]], access: Access, costs: Costs):
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.object_stores = object_stores
        self.estimator = estimator
        self.providers = providers
        self.access = access
        self.costs = costs
        # Whether callers run on this machine and the download links live only as long as this
        # process (stdio: its own internal listener serves them): local-store artifacts then carry
        # a `file_url` too, which outlives the server (docs/design/downloads.md).
        self.same_host = False

    def status(self, caller: str, req: api.GetTaskStatus) -> TaskStatus:
        return self.describe(self.access.readable(caller, req.task_id))

    def describe(self, task: TaskRow) -> TaskStatus:
        """A task's status (no access check: for a task the caller may read)."""
        state = task.state
        progress = task.progress
        if progress is not None:
            progress.pop("ts", None)
            eta = self.estimator.eta(task, progress, time.time())
            if eta is not None:
                progress["eta_s"] = eta
        used = self.costs.of(task)
        extra: dict[str, Any] = {}
        if state == TaskState.WAITING:
            extra["waiting_for"] = dependencies.unfinished(self.store.tasks.parents_of(task.task_id))
        job = None
        several = len(self.catalog.placements(task.tool_name)) > 1
        if task.job_id and (several or state == TaskState.SCHEDULED or self._may_link(task)):
            job = self.store.jobs.get(task.ref)  # (else its job says nothing the task does not)
        if task.job_id:  # where the attempt runs: its job's placement (a tool's only one: the task's)
            extra["provider"] = job.provider if job is not None else task.provider
        if several:
            if job is not None:
                extra["placement"] = job.placement
            extra["moves"] = self._moves(task)
        if job is not None:  # the attempt's own placement
            provider = self.providers.get(job.provider)
            if state == TaskState.SCHEDULED and job.provider_reason:
                extra["waiting_reason"] = job.provider_reason  # e.g. no compute capacity yet
            if provider is not None and provider.supports(Capability.LOG_LINK) and job.handle_json:
                link = provider.log_link(provider.handle(job.handle_json))
                if link:
                    extra["log_link"] = link
        return TaskStatus(
            task_id=task.task_id, state=state, tool_name=task.tool_name, attempt=task.attempt,
            max_attempts=task.max_attempts, priority=task.priority, queue=task.resource_class,
            position=self.store.tasks.queue_position(task) if state == TaskState.QUEUED else None,
            job_id=task.job_id, worker_id=task.job_id, submitted_at=iso(task.submitted_at), started_at=iso(task.started_at),
            updated_at=iso(task.updated_at), heartbeat_at=iso(task.heartbeat_at),
            completed_at=iso(task.completed_at), expires_at=iso(task.expires_at), timeout_at=iso(task.timeout_at),
            progress=progress, cancel_requested=bool(task.cancel_requested),
            estimated_runtime_seconds=task.estimate_s, tags=task.tags, error=task.error,
            poll_after_ms=None if state in TERMINAL or state == TaskState.EXPIRED else self.poll_after_ms(task, job),
            usage=used.usage, estimated_cost=used.estimated_cost, **extra)

    def _moves(self, task: TaskRow) -> list[Move]:
        """The task's attempts that moved off their placement for want of room, oldest first: their
        jobs keep the provider's word (`placement.NO_CAPACITY`) and why."""
        return [Move(attempt=j.attempt, placement=j.placement, provider=j.provider, reason=j.provider_reason or "",
                     at=iso(j.finished_at)) for j in self.store.jobs.of_task(task.task_id)
                if j.provider_status == NO_CAPACITY]

    def poll_after_ms(self, task: TaskRow, job: JobRow | None = None) -> int:
        """`polling.poll_after_ms` at the placement of the task's attempt (`job`: its job, when read)."""
        where = job.provider if job is not None else None
        if where is None and task.state == TaskState.SCHEDULED and len(self.catalog.placements(task.tool_name)) > 1:
            placed = self.store.jobs.get(task.ref)
            where = placed.provider if placed is not None else None
        return poll_after_ms(task, self.estimator, self.providers, where)

    def _may_link(self, task: TaskRow) -> bool:
        """Whether a provider the task's attempts may run on links to a job's log in its console."""
        names = {p.provider for p in self.catalog.placements(task.tool_name)} | {task.provider}
        return any((p := self.providers.get(n)) is not None and p.supports(Capability.LOG_LINK) for n in names)

    def result(self, caller: str, req: api.GetTaskResult) -> TaskResult:
        return self.result_of(self.access.readable(caller, req.task_id), req.url_ttl_s)

    def result_of(self, task: TaskRow, url_ttl_s: int | None = None) -> TaskResult:
        """A task's result (no access check: for a task the caller may read)."""
        state = task.state
        done = state in TERMINAL
        ttl = min(url_ttl_s or self.settings.artifact_url_ttl_s, self.settings.max_artifact_url_ttl_s)
        artifacts = []
        if done:
            now = time.time()
            for a in self.store.artifacts.of_attempt(task.ref):
                objects = self.object_stores.get(a.store_url)
                if not objects.signs_locally:
                    blocking.must_not_block()  # signing may call out: not on the event loop
                lifetime = min(ttl, objects.max_url_ttl_s)
                local = self.same_host and isinstance(objects, LocalObjectStore)
                artifacts.append(Artifact(
                    artifact_id=a.artifact_id, name=a.name, kind=a.kind, size_bytes=a.size_bytes, sha256=a.sha256,
                    content_type=a.content_type,
                    download_url=objects.signed_url(a.storage_key, expires_in=lifetime,
                                                  filename=PurePosixPath(a.name).name),
                    expires_at=iso(math.floor(now) + lifetime),
                    **({"file_url": objects.file_url(a.storage_key)} if local else {})))  # type: ignore[attr-defined]
        pending: dict[str, object] = {}
        if not done:
            pending["message"] = ("the task expired; its result and artifacts were removed"
                                  if state == TaskState.EXPIRED else f"the task is {state}; the result is not ready yet")
            pending["poll_after_ms"] = None if state == TaskState.EXPIRED else self.poll_after_ms(task)
        used = self.costs.of(task)
        return TaskResult(task_id=task.task_id, state=state, result=task.result if done else None, artifacts=artifacts,
                          error=task.error if done else None, completed_at=iso(task.completed_at),
                          attempt=task.attempt, usage=used.usage, estimated_cost=used.estimated_cost,
                          **pending)

    def timeline(self, caller: str, task_id: str) -> list[TimelineEntry]:
        """A task's audit (every transition, retry, launch and cancel), oldest first, for a
        caller who may read the task (NOT_FOUND otherwise, as for every read)."""
        task = self.access.readable(caller, task_id)
        return [TimelineEntry(ts=iso(e.ts), kind=e.kind, attempt=e.attempt, from_state=e.from_state,
                              to_state=e.to_state, detail=e.detail) for e in self.store.logs.events(task.task_id)]

    def moves(self) -> PlacementMoves:
        """(tool, placement index, provider, attempts moved off it) over the jobs on file: a count
        about everyone's tasks, never a task itself (a scan of the jobs, so not on the metrics' scrape)."""
        return self.store.jobs.moves_by_placement(NO_CAPACITY)

    def overview(self) -> Overview:
        """Every queue's depth and slots, and the tasks on file by state and tool: numbers about
        everyone's tasks, never a task itself."""
        depths = self.store.tasks.queue_depths()
        queues = [QueueView(rc.name, depths.get(rc.name, 0), self.store.tasks.slots_busy(rc.name), rc.max_concurrency)
                  for rc in self.catalog.resource_classes.values()]
        return Overview(self.store.tasks.count_by_tool_and_state(), queues)
