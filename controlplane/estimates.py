"""Runtime estimates (docs/design/two-stage-answer.md): how long a task should take, and how long it has left.

The estimate at submit time learns from the tool's history: the runtimes (started to completed)
of its recent successful tasks. When the catalog names an input-size feature and the history
spans several sizes, runtime is fitted as a power of the size (least squares on logs: a
computation that scales like N^2 is a straight line there); otherwise it is the median runtime.
While the history is short the catalog's figure still weighs in: the fit counts for n / (n + 5)
of the answer after n runs. Fits are cached per tool and refreshed every `refresh_s` seconds.

A sweep's estimate is its shards' spread over the slots it may hold at once (`sweep_runtime`).

While a task runs, its ETA is the tool's own `eta_s` when it reports one, else an extrapolation
of its progress percentage, else what is left of the estimate.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controlplane.catalog import ToolSpec
from controlplane.store.rows import TaskRow

PRIOR_WEIGHT = 5.0  # the catalog's figure counts as this many observed runs


@dataclass(frozen=True)
class RuntimeModel:
    n: int
    median_s: float
    # log(runtime) = a + b * log(size), when the history spans several sizes
    a: float | None = None
    b: float | None = None

    def predict(self, size: float | None) -> float:
        if self.a is not None and self.b is not None and size is not None and size > 0:
            return math.exp(self.a + self.b * math.log(size))
        return self.median_s


def fit(history: list[tuple[float | None, float]]) -> RuntimeModel | None:
    """A model of (input size, runtime) observations; None without any."""
    runs = [(s, r) for s, r in history if r is not None and r > 0]
    if not runs:
        return None
    median = statistics.median(r for _, r in runs)
    sized = [(math.log(s), math.log(r)) for s, r in runs if s is not None and s > 0]
    if len(sized) >= 3 and len({x for x, _ in sized}) >= 2:
        mx = statistics.fmean(x for x, _ in sized)
        my = statistics.fmean(y for _, y in sized)
        sxx = sum((x - mx) ** 2 for x, _ in sized)
        b = sum((x - mx) * (y - my) for x, y in sized) / sxx
        b = min(4.0, max(0.0, b))  # runtimes do not shrink with size, nor grow beyond N^4
        return RuntimeModel(len(runs), median, my - b * mx, b)
    return RuntimeModel(len(runs), median)


class Estimator:
    def __init__(self, history: Callable[[str, int], list[tuple[float | None, float]]] | None = None,
                 *, window: int = 200, refresh_s: float = 30.0):
        self._history = history  # (tool name, how many) -> recent (input size, runtime s)
        self.window = window
        self.refresh_s = refresh_s
        self._models: dict[str, tuple[float, RuntimeModel | None]] = {}
        self._lock = threading.Lock()

    def model(self, tool_name: str) -> RuntimeModel | None:
        if self._history is None:
            return None
        now = time.monotonic()
        with self._lock:
            cached = self._models.get(tool_name)
        if cached is not None and now - cached[0] < self.refresh_s:
            return cached[1]
        model = fit(self._history(tool_name, self.window))
        with self._lock:
            self._models[tool_name] = (now, model)
        return model

    def forget(self, tool_name: str | None = None) -> None:
        """Drop cached fits (all, or one tool's), e.g. after a change of catalog."""
        with self._lock:
            if tool_name is None:
                self._models.clear()
            else:
                self._models.pop(tool_name, None)

    def estimate(self, tool: ToolSpec, input_size: float | None) -> float:
        prior = float(tool.estimate_s)
        model = self.model(tool.name)
        if model is None:
            return prior
        w = model.n / (model.n + PRIOR_WEIGHT)
        return round(w * model.predict(input_size) + (1 - w) * prior, 3)

    def eta(self, task: TaskRow, progress: dict[str, Any], now: float) -> float | None:
        reported: float | None = progress.get("eta_s")
        if reported is not None:
            return reported
        started = task.started_at
        if not started:
            return None
        elapsed = max(0.0, now - started)
        pct = progress.get("percent")
        if isinstance(pct, int | float) and 0 < pct < 100:
            return round(elapsed * (100 - pct) / pct, 1)
        if task.estimate_s:
            return round(max(0.0, task.estimate_s - elapsed), 1)
        return None


def sweep_runtime(estimates: list[float], slots: int) -> float:
    """The runtime of a whole sweep from its shards' estimates with `slots` of them at once: the
    work spread over the slots, and never less than its longest shard."""
    if not estimates:
        return 0.0
    return round(max(max(estimates), sum(estimates) / max(1, slots)), 3)
