"""Prometheus metrics (prometheus-client), served at /metrics.

What is counted where it happens (module-level objects, one line at each seam; a counter's
increment is a float add under an uncontended lock, and nothing on a call's path reads the
database for a metric):

    controlplane_submits_total{tool}                    TaskService.submitted (a task created)
    controlplane_completions_total{tool,outcome}        Attempts._end and a queued task's cancel
    controlplane_queue_wait_seconds{resource_class}     Scheduler.tick: submit -> claimed into a slot
    controlplane_launch_seconds{provider}               Scheduler._launch: the provider's launch call
    controlplane_provider_calls_total{provider,op}      the control plane's calls of a provider
    controlplane_provider_errors_total{provider,op}       (launch, find, poll, cancel), and their failures
    controlplane_reconcile_cycle_seconds                one reconciler cycle (the leader's)
    controlplane_extra_executions_total{provider,action}  extra executions of an attempt: a claim
        refused to one (action "refused", the runner claim route), one stopped ("stopped", the reconciler)
    controlplane_runner_callback_seconds{route}         the runner callback API (claim, events, heartbeat)
    controlplane_mcp_request_seconds{method}            a POST to /mcp, arrival to the end of its answer

What is read when Prometheus scrapes (`StoreCollector`, `LimiterCollector`):

    controlplane_tasks{state,tool}                      one grouped count over the tasks table
    controlplane_queue_depth{resource_class}            the queue depths the triggers keep
    controlplane_slots_busy / _slots{resource_class}    tasks holding a slot / max_concurrency
    controlplane_provider_requests_total{api,account,region}   every cloud HTTP request, retries
    controlplane_provider_throttled_total{...}, _throttled_seconds_total{...}   waits for the
        client-side limiter (providers/ratelimit.py); _rate_limited_total{...}: 429 answers

Multi-process: uvicorn runs one process per replica here (never `--workers`), and each replica is
its own scrape target, so prometheus-client's multiprocess mode is not needed. The counters and
histograms are per process; `controlplane_tasks` and the queue figures are the database's, the same
on every replica: aggregate them with max(), not sum().

`disable()` swaps every module-level metric for a no-op (CONTROLPLANE_METRICS=false, and the
benchmark's "off" side): the call sites look the object up at call time.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from controlplane_providers import ratelimit

REGISTRY = CollectorRegistry(auto_describe=True)  # the process's counters (several servers in one test share it)
_FAST = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_SLOW = (0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

SUBMITS = Counter("controlplane_submits", "Tasks created", ["tool"], registry=REGISTRY)
COMPLETIONS = Counter("controlplane_completions", "Tasks that ended, by outcome (their final state)",
                      ["tool", "outcome"], registry=REGISTRY)
QUEUE_WAIT = Histogram("controlplane_queue_wait_seconds", "From submit (or retry) to a slot", ["resource_class"],
                       buckets=_SLOW, registry=REGISTRY)
LAUNCH = Histogram("controlplane_launch_seconds", "A provider's launch call", ["provider"], buckets=_FAST,
                   registry=REGISTRY)
PROVIDER_CALLS = Counter("controlplane_provider_calls", "Calls of a provider by the control plane",
                         ["provider", "op"], registry=REGISTRY)
PROVIDER_ERRORS = Counter("controlplane_provider_errors", "Calls of a provider that failed (each try)",
                          ["provider", "op"], registry=REGISTRY)
RECONCILE = Histogram("controlplane_reconcile_cycle_seconds", "One reconciler cycle", buckets=_FAST,
                      registry=REGISTRY)
CALLBACK = Histogram("controlplane_runner_callback_seconds", "Runner callback requests", ["route"],
                     buckets=_FAST, registry=REGISTRY)
EXTRA_EXECUTIONS = Counter("controlplane_extra_executions", "Extra executions of an attempt: claims refused to them "
                           "(refused) and executions the reconciler stopped (stopped)", ["provider", "action"],
                           registry=REGISTRY)
MOVES = Counter("controlplane_moves", "Attempts moved off a placement to the tool's next, by why: its launch was "
                "refused for room (refused), its job waited past the placement's patience (patience), its "
                "provider gave up on the waiting job (stuck)", ["tool", "placement", "provider", "reason"],
                registry=REGISTRY)
MCP_REQUEST = Histogram("controlplane_mcp_request_seconds", "POSTs to the MCP endpoint, to the end of the answer",
                        ["method"], buckets=_FAST, registry=REGISTRY)

NAMES = ("SUBMITS", "COMPLETIONS", "QUEUE_WAIT", "LAUNCH", "PROVIDER_CALLS", "PROVIDER_ERRORS", "RECONCILE",
         "CALLBACK", "MCP_REQUEST", "EXTRA_EXECUTIONS", "MOVES")


class _Off:
    """Stands in for a metric when metrics are off: every use is a no-op."""

    def labels(self, *_: Any, **__: Any) -> _Off:
        return self

    def inc(self, *_: Any) -> None:
        pass

    def observe(self, *_: Any) -> None:
        pass


_OFF = _Off()
_ON = {name: globals()[name] for name in NAMES}


def disable() -> None:
    globals().update({name: _OFF for name in NAMES})


def enable() -> None:
    globals().update(_ON)


def enabled() -> bool:
    return globals()["SUBMITS"] is not _OFF


def provider_call(provider: str, op: str, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, counted as one call of `provider` (and as an error if it raises)."""
    PROVIDER_CALLS.labels(provider, op).inc()
    try:
        return fn(*args)
    except Exception:
        PROVIDER_ERRORS.labels(provider, op).inc()
        raise


def extra_executions(provider: str, action: str, n: int = 1) -> None:
    """`n` extra executions of an attempt on `provider`: "refused" (a claim refused to one) or
    "stopped" (the reconciler stopped one)."""
    if n:
        EXTRA_EXECUTIONS.labels(provider, action).inc(n)


def moved(tool: str, placement: int, provider: str, why: str) -> None:
    """An attempt of `tool` moved off its placement (index `placement`, on `provider`), for `why`."""
    MOVES.labels(tool, str(placement), provider, why).inc()


def timed_callback(route: str, endpoint: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """A runner callback route, timed (`controlplane_runner_callback_seconds{route}`)."""

    async def timed(request: Request) -> Response:
        start = time.perf_counter()
        try:
            return await endpoint(request)
        finally:
            CALLBACK.labels(route).observe(time.perf_counter() - start)

    return timed


class TimeMcpCalls:
    """Wraps the MCP endpoint's ASGI app: the time of each POST until its answer ended, by the
    2026-07-28 `Mcp-Method` header ("-" for earlier eras, whose method is only in the body,
    which this does not read)."""

    def __init__(self, inner: ASGIApp):
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not enabled():
            await self.inner(scope, receive, send)
            return
        start = time.perf_counter()
        method = "-"
        for k, v in scope["headers"]:
            if k == b"mcp-method":
                method = v.decode("latin-1")[:64]
                break

        async def timed(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                MCP_REQUEST.labels(method).observe(time.perf_counter() - start)

        await self.inner(scope, receive, timed)


class QueueFigures(Protocol):
    """One queue as the collector reads it."""

    @property
    def name(self) -> str: ...
    @property
    def waiting(self) -> int: ...
    @property
    def busy(self) -> int: ...
    @property
    def slots(self) -> int: ...


class StoreFigures(Protocol):
    """The database's figures the collector reads (`TaskService.overview` answers them)."""

    @property
    def tasks(self) -> Mapping[tuple[str, str], int]: ...  # (state, tool) -> tasks
    @property
    def queues(self) -> Sequence[QueueFigures]: ...


class StoreCollector(Collector):
    """The database's figures, read at scrape time by calling `read`: a grouped count along an
    index and a few rows (`TaskService.overview`; its cost per scrape is measured by bench/operator.py)."""

    def __init__(self, read: Callable[[], StoreFigures]):
        self.read = read

    def collect(self) -> Iterator[Any]:
        yield from self._read()

    def _read(self) -> list[Any]:
        overview = self.read()
        tasks = GaugeMetricFamily("controlplane_tasks", "Tasks on file, by state and tool", labels=["state", "tool"])
        for (state, tool), n in sorted(overview.tasks.items()):
            tasks.add_metric([state, tool], n)
        depth = GaugeMetricFamily("controlplane_queue_depth", "Tasks waiting in a queue", labels=["resource_class"])
        busy = GaugeMetricFamily("controlplane_slots_busy", "Tasks holding a slot of a queue", labels=["resource_class"])
        slots = GaugeMetricFamily("controlplane_slots", "Slots of a queue (max_concurrency)", labels=["resource_class"])
        for q in overview.queues:
            depth.add_metric([q.name], q.waiting)
            busy.add_metric([q.name], q.busy)
            slots.add_metric([q.name], q.slots)
        return [tasks, depth, busy, slots]


class LimiterCollector(Collector):
    """Every cloud API request passes one limiter (`providers/ratelimit.py`): its counts."""

    def collect(self) -> Iterator[Any]:
        labels = ["api", "account", "region"]
        requests = CounterMetricFamily("controlplane_provider_requests", "Cloud API requests (retries included)",
                                       labels=labels)
        waits = CounterMetricFamily("controlplane_provider_throttled", "Requests that waited for the client-side "
                                    "limiter", labels=labels)
        waited = CounterMetricFamily("controlplane_provider_throttled_seconds", "Time spent waiting for it",
                                     labels=labels)
        limited = CounterMetricFamily("controlplane_provider_rate_limited", "Answers 429 (throttled by the cloud)",
                                      labels=labels)
        errors = CounterMetricFamily("controlplane_provider_request_errors", "Requests that failed or answered "
                                     "an error status", labels=labels)
        for name, limiter in ratelimit.limiters():
            api, account, region = (name.split(":") + ["-", "-"])[:3]
            values = [api, account, region]
            requests.add_metric(values, limiter.calls)
            waits.add_metric(values, limiter.waits)
            waited.add_metric(values, limiter.waited_s)
            limited.add_metric(values, limiter.rate_limited)
            errors.add_metric(values, limiter.errors)
        yield from (requests, waits, waited, limited, errors)


class BreakerCollector(Collector):
    """Each placement site's breaker (`controlplane.breakers`) as the leader holds it: one series
    per state, 1 for the state it is in."""

    def __init__(self, read: Callable[[], Mapping[str, str]]):
        self.read = read

    def collect(self) -> Iterator[Any]:
        g = GaugeMetricFamily("controlplane_placement_breaker", "A placement site's breaker: 1 for its state "
                              "(closed, half_open: one probe goes, open: skipped)", labels=["site", "state"])
        for site, now in self.read().items():
            for state in ("closed", "half_open", "open"):
                g.add_metric([site, state], 1.0 if state == now else 0.0)
        yield g


def registry_for(overview: Callable[[], StoreFigures],
                 breakers: Callable[[], Mapping[str, str]] | None = None) -> CollectorRegistry:
    """The scrape-time collectors of one control plane, whose figures `overview` (and its
    placement breakers' `breakers`) read (beside the process-wide `REGISTRY`)."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(StoreCollector(overview))
    reg.register(LimiterCollector())
    if breakers is not None:
        reg.register(BreakerCollector(breakers))
    return reg


def exposition(own: CollectorRegistry) -> bytes:
    """The text format of the process's metrics and one control plane's."""
    return generate_latest(REGISTRY) + generate_latest(own)
