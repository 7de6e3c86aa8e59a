"""OpenTelemetry traces of tasks, optional (`pip install 'mcp-controlplane[otel]'`,
`CONTROLPLANE_OTEL=true`).

One trace per task, from its submit to its end, whichever process does what: its trace id and
its root span id are derived from the task id (`ids`), so the replica that answered the submit,
the leader that launched the job and the one that saw it end all add to the same trace without
storing anything. Its spans, all children of that root:

    task.submit   the submit itself (in the MCP request), linked both ways with the request span
                  fastmcp makes for the `tools/call` (the request's trace and the task's are two)
    task.queued   from submit (or a retry's not-before) until the scheduler claimed a slot
    task.launch   the provider's launch call (find first, after a restart)
    task.run      from the job's start to the attempt's end; status ERROR unless it succeeded

The root span itself is never exported (its id is the task's; only its children are), so a
trace viewer shows the task's spans under a root it does not have: every span carries `task.id`.
With the extra installed and no tracer provider configured by the operator (e.g. by
`opentelemetry-instrument`), `configure` sets one that exports OTLP over HTTP, configured by the
standard `OTEL_EXPORTER_OTLP_*` variables. Off (the default) every hook here is one test of a
module-level None.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.store.rows import TaskRow

_tracer: Any = None  # an opentelemetry Tracer while traces are on
NAME = "controlplane"


class TracesUnavailable(RuntimeError):
    pass


def configure(on: bool) -> None:
    """Turn task traces on (with the global tracer provider, set up here if nobody did) or off."""
    global _tracer
    if not on:
        _tracer = None
        return
    try:
        from opentelemetry import trace
    except ImportError:  # pragma: no cover - opentelemetry-api comes with mcp
        raise TracesUnavailable("CONTROLPLANE_OTEL needs opentelemetry: pip install 'mcp-controlplane[otel]'") from None
    if isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # nobody configured an SDK
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise TracesUnavailable("CONTROLPLANE_OTEL needs the otel extra: "
                                    "pip install 'mcp-controlplane[otel]'") from None
        provider = TracerProvider(resource=Resource.create({"service.name": "mcp-controlplane"}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer(NAME)


def enabled() -> bool:
    return _tracer is not None


def ids(task_id: str) -> tuple[int, int]:
    """(trace id, root span id) of a task's trace."""
    h = hashlib.sha256(b"controlplane-task:" + task_id.encode()).digest()
    return int.from_bytes(h[:16], "big") or 1, int.from_bytes(h[16:24], "big") or 1


def _root(task_id: str) -> Any:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    trace_id, span_id = ids(task_id)
    ctx = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(ctx))


def _ns(t: float | None) -> int | None:
    return int(t * 1e9) if t is not None else None


def _attrs(task: TaskRow) -> dict[str, Any]:
    return {"task.id": task.task_id, "task.tool": task.tool_name, "task.queue": task.resource_class,
            "task.attempt": task.attempt}


def submitted(task_id: str, tool: str, state: str) -> None:
    """Inside the MCP request that created the task: its submit span, linked to the request's."""
    tracer = _tracer
    if tracer is None:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Link

    request = trace.get_current_span()
    links = [Link(request.get_span_context())] if request.get_span_context().is_valid else []
    with tracer.start_as_current_span("task.submit", context=_root(task_id), links=links,
                                      attributes={"task.id": task_id, "task.tool": tool, "task.state": state}) as span:
        if request.is_recording():
            request.add_link(span.get_span_context(), {"task.id": task_id})


def queued(task: TaskRow, now: float) -> None:
    """The scheduler claimed a slot for the task: its wait in the queue."""
    tracer = _tracer
    if tracer is None:
        return
    start = max(task.submitted_at, task.not_before or 0.0)
    span = tracer.start_span("task.queued", context=_root(task.task_id), start_time=_ns(start), attributes=_attrs(task))
    span.end(end_time=_ns(now))


def launching(task: TaskRow, provider: str, job_name: str) -> Any:
    """A context manager around the provider's launch call (a no-op while traces are off)."""
    tracer = _tracer
    if tracer is None:
        return nullcontext()
    return tracer.start_as_current_span("task.launch", context=_root(task.task_id),
                                        attributes={**_attrs(task), "provider": provider, "job.name": job_name})


def ended(task: TaskRow) -> None:
    """An attempt ended (the task's new row): the run's span, from the job's start."""
    tracer = _tracer
    if tracer is None:
        return
    from opentelemetry.trace import Status, StatusCode

    end = task.completed_at or task.updated_at or time.time()
    start = task.started_at or end
    span = tracer.start_span("task.run", context=_root(task.task_id), start_time=_ns(start),
                             attributes={**_attrs(task), "task.outcome": str(task.state)})
    if task.state != "succeeded":
        code = (task.error or {}).get("code") if isinstance(task.error, dict) else None
        span.set_status(Status(StatusCode.ERROR, str(code or task.state)))
    span.end(end_time=_ns(end))


