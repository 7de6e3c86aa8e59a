"""Admission: what a submit asks for, checked against the catalog and the server's limits, as the
task to write (with the caller's team) and the guards its write must pass (the caller's limits,
its budgets, its queue's length: `controlplane.guards`). Everything a submit does but the write
and its guards, so it can run on the event loop before a group commit
(`controlplane.group_commit`) writes the task."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError as SchemaValidationError

from controlplane import api
from controlplane.budgets import Budgets
from controlplane.catalog import Catalog
from controlplane.catalog_models import ResourceClass, ToolSpec
from controlplane.errors import ControlPlaneError, ErrorCode, invalid, not_found, too_large
from controlplane.estimates import Estimator
from controlplane.guards import QueueLength
from controlplane.identity import team_for_new_task
from controlplane.launch import check_scratch
from controlplane.limits import Limits
from controlplane.prices import Priced, Pricing
from controlplane.references import Resolver, check_fits
from controlplane.settings import Settings
from controlplane.store import NewTask
from controlplane.store.tasks import Guards
from controlplane_providers.base import Provider


class Admission:
    def __init__(self, settings: Settings, catalog: Catalog, providers: dict[str, Provider[Any]], estimator: Estimator,
                 limits: Limits, pricing: Pricing, budgets: Budgets,
                 readable: Callable[[str, str], object | None] = lambda caller, task_id: None,
                 resolver: Resolver | None = None):
        self.settings = settings
        self.resolver = resolver  # the references in file fields (None: none are resolved)
        self.readable = readable  # the task if the caller may read it (`Access.get`), else None
        self.catalog = catalog
        self.providers = providers
        self.estimator = estimator
        self.limits = limits
        self.pricing = pricing
        self.budgets = budgets

    def check(self, caller: str, req: api.SubmitTask) -> tuple[NewTask, Guards]:
        """The task a submit asks for, checked against the catalog and the limits, and the guards
        its write must pass, in the order they run: everything but the write."""
        inputs_json = self.checked_inputs(self.tool(req.tool_name).name, req.inputs)  # (checked first, as ever)
        base = self.base(caller, req)
        new = self.task(base, req.inputs, inputs_json)
        self.check_disk(base)
        return new, self.guards(caller, new)

    def check_disk(self, base: Base) -> None:
        """INVALID_REQUEST unless every placement of the tool guarantees the scratch disk the
        submit asks for (checked once per submit, after its tasks' own inputs: may block)."""
        check_scratch(self.providers, self.catalog, base.tool.name, base.rc.name, base.resources.get("scratch_mb"))

    def tool(self, name: str) -> ToolSpec:
        """The catalog's tool of that name (INVALID_REQUEST when there is none)."""
        tool = self.catalog.tool(name)
        if tool is None:
            raise ControlPlaneError(ErrorCode.INVALID_REQUEST, f"unknown tool '{name}'",
                                    hint="list the available tools with tools/list")
        return tool

    def checked_inputs(self, tool_name: str, inputs: dict[str, Any]) -> str:
        """The inputs as stored (compact JSON), once within the server's size limit and the tool's
        schema."""
        inputs_json = json.dumps(inputs, separators=(",", ":"), sort_keys=True)
        if len(inputs_json.encode()) > self.settings.max_input_bytes:
            raise too_large(f"inputs are {len(inputs_json.encode())} bytes; the limit is {self.settings.max_input_bytes}")
        self.validate_inputs(tool_name, inputs)
        return inputs_json

    def base(self, caller: str, req: api.SubmitTask | api.SubmitSweep) -> Base:
        """What a submit's tasks share, checked: the tool, the tasks they wait for, the queue, the
        resources and limits of the catalog, the time to keep them."""
        tool = self.tool(req.tool_name)
        after = self.parents(caller, req.after)
        res = req.resources or api.Resources()
        rc_name = res.resource_class or tool.resource_class
        rc = self.catalog.resource_classes.get(rc_name)
        if rc is None:
            raise invalid(f"unknown resource class '{rc_name}'",
                          hint=f"available: {', '.join(sorted(self.catalog.resource_classes))}")
        for field, asked, limit in (("cpu", res.cpu, rc.cpu), ("memory_mb", res.memory_mb, rc.memory_mb),
                                    ("gpu", res.gpu, rc.gpu)):
            if asked is not None and asked > limit:
                raise invalid(f"resources.{field}={asked} exceeds resource class '{rc_name}' limit of {limit}")
        max_runtime = res.max_runtime_s or tool.default_runtime_s
        if max_runtime > tool.max_runtime_s:
            raise invalid(f"resources.max_runtime_s={max_runtime} exceeds the tool's max of {tool.max_runtime_s}")
        ttl = req.ttl_s or tool.ttl_s or self.settings.default_ttl_s
        if ttl > self.settings.max_ttl_s:
            raise invalid(f"ttl_s={ttl} exceeds the server's max of {self.settings.max_ttl_s}")
        resources = {k: v for k, v in res.model_dump().items() if v is not None and k != "resource_class"}
        # Its cost per second where its provider runs it (the estimate's price).
        rate = self.pricing.of(tool.name, tool.provider, rc_name, resources)
        return Base(caller=caller, tool=tool, rc=rc, after=after, resources=resources, ttl=ttl,
                    max_runtime=max_runtime, rate=rate, priority=req.priority, tags=list(req.tags),
                    idempotency_key=req.idempotency_key)

    def task(self, base: Base, inputs: dict[str, Any], inputs_json: str | None = None) -> NewTask:
        """The task of `base` with these inputs, checked against the tool's schema and the
        server's size limit (unless `inputs_json` says they were), its references resolved, its
        runtime and cost estimated."""
        tool = base.tool
        if inputs_json is None:
            inputs_json = self.checked_inputs(tool.name, inputs)
        refs = self.resolver.resolve(base.caller, tool.input_schema, inputs, tool.max_input_file_mb, base.after) \
            if self.resolver is not None else ()
        check_fits(refs, base.resources.get("scratch_mb"), base.rc.scratch_mb, base.rc.name)  # on the scratch disk
        input_size = tool.input_size(inputs)
        estimate = self.estimator.estimate(tool, input_size)
        return NewTask(
            owner=str(base.caller), tool_name=tool.name, inputs_json=inputs_json, input_size=input_size,
            provider=tool.provider, resource_class=base.rc.name, priority=base.priority, ttl_s=base.ttl,
            idempotency_key=base.idempotency_key, tags=base.tags, resources_json=json.dumps(base.resources),
            max_runtime_s=base.max_runtime, max_attempts=tool.retry.max_attempts, estimate_s=estimate,
            max_recoveries=tool.retry.max_recoveries,
            store_url=tool.object_store or base.rc.object_store or "",
            team=team_for_new_task(base.caller), estimate_cost=self.pricing.estimate(base.rate, estimate),
            after=base.after, refs=refs,
        )

    def guards(self, caller: str, new: NewTask) -> Guards:
        """The guards a submit's write must pass, in the order they run (`controlplane.guards`)."""
        rc = self.catalog.resource_classes[new.resource_class]
        limits = self.limits.for_submit(caller)
        budgets = self.budgets.for_submit(str(caller), new.tags, time.time())
        return (*((limits,) if limits is not None else ()), *budgets, QueueLength(rc.max_queue_length))

    def parents(self, caller: str, after: list[str]) -> tuple[str, ...]:
        """The tasks a submit waits for, distinct and sorted: at most `max_parents`
        (INVALID_REQUEST), each one the caller may read (NOT_FOUND, as for an unknown task). They
        all exist before the new task, so no cycle can form."""
        found = tuple(sorted(dict.fromkeys(after)))
        if len(found) > self.settings.max_parents:
            raise invalid(f"after names {len(found)} tasks; the limit is {self.settings.max_parents}",
                          hint="wait for fewer tasks, or chain them through intermediate tasks")
        for task_id in found:
            if self.readable(caller, task_id) is None:
                raise not_found(f"task {task_id} named in after")
        return found

    def validate_inputs(self, tool_name: str, inputs: dict[str, Any]) -> None:
        """INVALID_REQUEST naming the first offending field (`inputs.<field>`) unless the inputs fit
        the tool's schema."""
        found = self.input_error(tool_name, inputs)
        if found is not None:
            field, message = found
            raise invalid(f"{field}: {message}", hint=f"see the input schema of tool '{tool_name}'")

    def input_error(self, tool_name: str, inputs: dict[str, Any]) -> tuple[str, str] | None:
        """(the first offending field, `inputs.<field>`, and what is wrong with it), or None when
        the inputs fit the tool's schema."""
        errors = self.catalog.validator(tool_name).errors(inputs)
        if not errors:
            return None
        e: SchemaValidationError = errors[0]
        where = ".".join(str(p) for p in e.path)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return (f"inputs.{where}" if where else "inputs"), f"{e.message}{more}"


@dataclass(frozen=True)
class Base:
    """What the tasks of one submit share (one task's, or a sweep's shards'), checked."""

    caller: str  # as the request came (an `identity.Caller` keeps its teams: a task's team is its first)
    tool: ToolSpec
    rc: ResourceClass
    after: tuple[str, ...]
    resources: dict[str, Any]
    ttl: int
    max_runtime: int
    rate: Priced  # its shape and its provider's rate, for the estimate's cost
    priority: int
    tags: list[str]
    idempotency_key: str | None
