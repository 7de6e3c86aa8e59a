"""`TaskService`: the task operations behind the canonical tools, composed from one module per
operation; answers as JSON-ready dicts (each the `dump()` of its model in `answers`)."""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from controlplane import api
from controlplane.admission import Admission
from controlplane.budgets import Budgets
from controlplane.catalog import Catalog
from controlplane.estimates import Estimator
from controlplane.limits import Limits, Streams
from controlplane.objectstore.registry import ObjectStores
from controlplane.prices import PriceTable, Pricing
from controlplane.references import Resolver
from controlplane.service.access import Access, AdminReads
from controlplane.service.answers import WaitDone, WaitPending
from controlplane.service.cancel import Cancels
from controlplane.service.listing import Listing, folds
from controlplane.service.logs import Logs
from controlplane.service.reads import Overview, PlacementMoves, Reads
from controlplane.service.submit import Submits
from controlplane.service.sweeps import Sweeps
from controlplane.service.uploads import Uploads
from controlplane.service.usage import Costs
from controlplane.settings import Settings, csv
from controlplane.states import FINAL, TaskState
from controlplane.store import Store
from controlplane.store.rows import TaskRow
from controlplane_providers.base import Provider


class TaskService:
    """Every operation takes the caller first (an owner string or an `identity.Caller`) and
    raises `ControlPlaneError`s with the codes of `controlplane.errors`."""

    def __init__(self, settings: Settings, store: Store, catalog: Catalog, object_stores: ObjectStores,
                 estimator: Estimator, providers: dict[str, Provider[Any]] | None = None,
                 wake: Callable[..., None] = lambda **_: None, pricing: Pricing | None = None):
        self.settings = settings
        self.store = store
        self.catalog = catalog
        self.object_stores = object_stores
        self.estimator = estimator
        self.providers = providers or {}
        self.pricing = pricing or Pricing(PriceTable.load(settings.resolved_prices_path), catalog, self.providers)
        self.budgets = Budgets(store)  # per caller or tag (controlplane.budgets)
        self.limits = Limits(settings, store)  # per caller (controlplane.limits)
        self.streams = Streams(self.limits, store)
        self.audit = AdminReads(store)
        self.access = Access(store, self.audit)
        self.admission = Admission(settings, catalog, self.providers, estimator, self.limits, self.pricing,
                                   self.budgets, readable=self.access.get,
                                   resolver=Resolver(store, csv(settings.input_url_prefixes), self.access.get,
                                                     store.writer.clock))
        self.validate_inputs = self.admission.validate_inputs
        self.costs = Costs(store, self.pricing)
        self.submits = Submits(store, self.admission, self.pricing, estimator, self.providers, wake)
        self.load, self.commits = self.submits.load, self.submits.commits
        self._submit_alone = self.submits.alone  # the write tried on the loop first (replaceable in tests)
        self.reads = Reads(settings, store, catalog, object_stores, estimator, self.providers, self.access, self.costs)
        self.logs = Logs(settings, store, self.providers, self.access)
        self.listing = Listing(store, self.access)
        self.cancels = Cancels(store, self.access, wake)
        self.uploads = Uploads(settings, store, object_stores)
        self.sweeps = Sweeps(settings, store, catalog, self.admission, self.submits, self.reads, self.access,
                             self.pricing, estimator, wake)

    @property
    def same_host(self) -> bool:
        """Whether callers run on this machine while download links live only as long as this
        process: local-store artifacts then carry a `file_url` too."""
        return self.reads.same_host

    @same_host.setter
    def same_host(self, value: bool) -> None:
        self.reads.same_host = value

    def submit(self, caller: str, req: api.SubmitTask) -> dict[str, Any]:
        return self.submits.submit(caller, req).dump()

    async def submit_grouped(self, caller: str, req: api.SubmitTask) -> dict[str, Any]:
        """`submit` for callers on the event loop (`Submits.grouped`)."""
        return (await self.submits.grouped(caller, req, self._submit_alone)).dump()

    async def submit_direct(self, caller: str, tool_name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        """A catalog tool called by name: its arguments are the inputs (the two-stage answer)."""
        sub = await self.submits.grouped(caller, api.SubmitTask(tool_name=tool_name, inputs=arguments),
                                         self._submit_alone)
        return Submits.direct(tool_name, sub).dump()

    def poll_after_ms(self, task: TaskRow) -> int:
        return self.reads.poll_after_ms(task)

    def get(self, caller: str, task_id: str) -> TaskRow | None:
        """The task if the caller may read it, else None (`Access.get`)."""
        return self.access.get(caller, task_id)

    def task_ids(self, caller: str, prefix: str, limit: int) -> list[str]:
        """The caller's task ids starting with `prefix`, newest first (argument completion)."""
        return self.store.tasks.task_ids(caller, prefix, limit)

    def recent_inputs(self, caller: str, tool_name: str, limit: int) -> list[dict[str, Any]]:
        """The inputs of the caller's latest tasks of a tool (argument completion)."""
        return self.store.tasks.recent_inputs(caller, tool_name, limit)

    def status(self, caller: str, req: api.GetTaskStatus) -> dict[str, Any]:
        return self.reads.status(caller, req).dump()

    def result(self, caller: str, req: api.GetTaskResult) -> dict[str, Any]:
        return self.reads.result(caller, req).dump()

    def waited(self, caller: str, task: TaskRow, timeout_s: float) -> dict[str, Any]:
        """wait_task's answer for the caller's task as last seen after waiting up to `timeout_s`:
        once it ended, done with its result (get_task_result's answer); else not done, with its
        status."""
        if TaskState(task.state) in FINAL:
            return WaitDone.of(self.reads.result(caller, api.GetTaskResult(task_id=task.task_id))).dump()
        return WaitPending(done=False, message=f"the task is still {task.state} after {timeout_s:g} s; call "
                           "wait_task again or poll get_task_status", status=self.reads.describe(task)).dump()

    def usage_report(self, caller: str, req: api.UsageReport) -> dict[str, Any]:
        return self.costs.report(caller, req).dump()

    def tail(self, caller: str, req: api.TailTaskLogs) -> dict[str, Any]:
        return self.logs.tail(caller, req).dump()

    def list(self, caller: str, req: api.ListTasks, *, sweep_rows: bool = True) -> dict[str, Any]:
        """A page of list_tasks; with whole_sweeps each sweep's row is the sweep's own (unless not
        `sweep_rows`: its lowest shard's, naming its `sweep`, for a view that builds its own)."""
        page = self.listing.list(caller, req).dump()
        if sweep_rows and folds(req):
            page["tasks"] = self.sweeps.rows(caller, page["tasks"])
        return page

    def cancel(self, caller: str, req: api.CancelTask) -> dict[str, Any]:
        return self.cancels.cancel(caller, req).dump()

    def submit_sweep(self, caller: str, req: api.SubmitSweep) -> dict[str, Any]:
        return self.sweeps.submit(caller, req).dump()

    def sweep_status(self, caller: str, req: api.GetSweepStatus) -> dict[str, Any]:
        return self.sweeps.status(caller, req).dump()

    def cancel_sweep(self, caller: str, req: api.CancelSweep) -> dict[str, Any]:
        return self.sweeps.cancel(caller, req).dump()

    def sweep_result(self, caller: str, req: api.GetSweepResult) -> dict[str, Any]:
        return self.sweeps.result(caller, req).dump()

    def create_upload(self, caller: str, req: api.CreateUpload) -> dict[str, Any]:
        return self.uploads.create(caller, req).dump()

    def complete_upload(self, caller: str, req: api.CompleteUpload) -> dict[str, Any]:
        return self.uploads.complete(caller, req).dump()

    def timeline(self, caller: str, task_id: str) -> builtins.list[dict[str, Any]]:  # `list` is a method here
        return [e.dump() for e in self.reads.timeline(caller, task_id)]

    def overview(self) -> Overview:
        return self.reads.overview()

    def moves(self) -> PlacementMoves:
        return self.reads.moves()
