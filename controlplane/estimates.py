"""Runtime estimates (seed 000): how long a task should take, and how long it has left.

The estimate at submit time is the catalog's figure for the tool. While a task runs, its ETA is
the tool's own `eta_s` when it reports one, else an extrapolation of its progress percentage,
else what is left of the estimate.
"""

from __future__ import annotations

from typing import Any

from controlplane.catalog import ToolSpec


class Estimator:
    def estimate(self, tool: ToolSpec, input_size: float | None) -> float:
        return float(tool.estimate_s)

    def eta(self, task: dict[str, Any], progress: dict[str, Any], now: float) -> float | None:
        if progress.get("eta_s") is not None:
            return progress["eta_s"]
        started = task.get("started_at")
        if not started:
            return None
        elapsed = max(0.0, now - started)
        pct = progress.get("percent")
        if isinstance(pct, int | float) and 0 < pct < 100:
            return round(elapsed * (100 - pct) / pct, 1)
        if task.get("estimate_s"):
            return round(max(0.0, task["estimate_s"] - elapsed), 1)
        return None
