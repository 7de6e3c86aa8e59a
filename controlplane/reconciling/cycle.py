"""What one reconciler cycle shares: its figures, and the provider call with its tries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tenacity import Retrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from controlplane.ops import metrics
from controlplane.retention import Swept
from controlplane_providers.base import JobPhase, PermanentProviderError, Provider

ALIVE = frozenset({JobPhase.RUNNING, JobPhase.PENDING})  # a job in these phases still runs (or will)


@dataclass
class CycleStats:
    jobs: int = 0
    provider_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    finished: int = 0
    lost: int = 0
    stops: int = 0
    extra_stopped: int = 0  # extra executions of attempts stopped
    expired: int = 0
    purged: int = 0
    released: int = 0  # waiting children settled, and stopped sweeps' shards moved, that ends left (`store.releases`, `stop_left`)
    releases_left: bool = False  # ... and some still left when the cycle's time for them ran out
    retention: Swept | None = None  # the retention sweep's batches, timings and what it left


def call(provider: Provider[Any], op: str, *args: Any) -> Any:
    """A provider call (`op`: poll, cancel or find_all), tried three times (a provider retries its own
    transient errors inside; these tries cover a call that failed as a whole, e.g. a dropped
    connection). A `PermanentProviderError` is not tried again. Each try is counted
    (`controlplane.ops.metrics`). Blocks: run it in a worker thread."""
    for attempt in Retrying(stop=stop_after_attempt(3), wait=wait_exponential(multiplier=0.2, max=2),
                            retry=retry_if_not_exception_type(PermanentProviderError), reraise=True):
        with attempt:
            return metrics.provider_call(provider.name, op, getattr(provider, op), *args)
    return None  # pragma: no cover
