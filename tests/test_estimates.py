"""Runtime estimates (docs/design/two-stage-answer.md) learn from the tool's history: with an input-size feature the
estimate for a new size gets closer to the truth as runs accumulate, starting from the catalog's
figure; without history the catalog's figure is the answer."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from sqlalchemy import text

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.estimates import fit
from controlplane.store import NewTask


def true_runtime(n_atoms: float) -> float:
    return 0.002 * n_atoms**2  # an O(N^2) computation


def add_run(cp: ControlPlane, n_atoms: int, runtime: float, t0: float) -> None:
    task = cp.store.tasks.submit(NewTask(
        owner="hist", tool_name="lj_relax", inputs_json=f'{{"n_atoms":{n_atoms}}}', input_size=float(n_atoms),
        provider="local", resource_class="cpu_small", priority=0, ttl_s=3600, idempotency_key=None, tags=[],
        resources_json="{}", max_runtime_s=3600, max_attempts=1, estimate_s=8.0)).task
    with cp.db.write() as c:
        c.execute(text("update tasks set state='succeeded', started_at=:s, completed_at=:e where task_id=:t"),
                  {"s": t0, "e": t0 + runtime, "t": task.task_id})


def estimate_for(cp: ControlPlane, n_atoms: int) -> float:
    cp.estimator.forget()
    sub = cp.service.submit("someone", api.SubmitTask(tool_name="lj_relax", inputs={"n_atoms": n_atoms}))
    return sub["estimated_runtime_seconds"]


def test_the_estimate_improves_as_history_accumulates(cp: ControlPlane) -> None:
    rng = random.Random(4)
    target = 120  # a size no past run had
    truth = true_runtime(target)
    assert estimate_for(cp, target) == cp.catalog.tool("lj_relax").estimate_s  # no history: the catalog
    errors = []
    t0 = 1_000_000.0
    for batch in (3, 10, 40):
        while len(cp.store.tasks.runtimes("lj_relax", 1000)) < batch:
            n = rng.choice([13, 38, 55, 75, 100])
            add_run(cp, n, true_runtime(n) * rng.uniform(0.9, 1.1), t0)
            t0 += 100
        errors.append(abs(estimate_for(cp, target) - truth) / truth)
    prior_error = abs(cp.catalog.tool("lj_relax").estimate_s - truth) / truth
    assert prior_error > errors[0] > errors[1] > errors[2]
    assert errors[-1] < 0.15  # within 15% of the truth after 40 runs


def test_without_a_size_feature_the_median_runtime_is_learnt() -> None:
    model = fit([(None, r) for r in (2.0, 3.0, 4.0, 100.0)])
    assert model is not None and model.b is None and model.predict(None) == pytest.approx(3.5)


def test_eta_comes_from_the_tool_then_from_progress(cp: ControlPlane) -> None:
    task = SimpleNamespace(started_at=100.0, estimate_s=50.0)
    assert cp.estimator.eta(task, {"eta_s": 7}, 110.0) == 7
    assert cp.estimator.eta(task, {"percent": 25}, 110.0) == 30.0  # 10 s for a quarter
    assert cp.estimator.eta(task, {}, 110.0) == 40.0
