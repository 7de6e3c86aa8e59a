"""Tasks that wait for others: `python bench/dependencies.py [--quick]`.

1. From a parent's end to its child's launch, on the real local provider (a runner process per
   task) with the default scheduler interval, over a chain (each task `after` the previous one)
   and a fan-out (children `after` one parent; enough slots for all of them). A parent's end is
   the audit's transition into `succeeded`; a child's claim is its move to `scheduled` (the
   scheduler took it), its launch its `launched` record (the provider's launch call returned: a
   runner process started). Each delay is given in ms and in scheduler ticks begun in
   between: 1 is the tick the parent's end woke (or the next one due), the target; median, p95
   and max.
2. The scheduler's tick and the reconciler's cycle with 0 and then 10,000 tasks waiting for one
   running parent, two control planes in one process on the provider double of `bench/doubles.py`
   (nothing else running), ticked and cycled in alternation: wall time per tick and per cycle
   (median of `--rounds`, and the ratio 10,000 / 0), the
   database statements each runs and the provider calls each makes (the same: waiting tasks are
   never polled). Then the parent's end releasing them: its own transaction (one batch,
   `CONTROLPLANE_RELEASE_BATCH`) and the follow-ups that release the rest (`settle_left`, as the
   reconciler's cycle runs them), the longest and their sum.

Prints tables and, as its last line, one JSON object with every figure. `--quick` (about a
minute on 2 cores): a chain of 8 and a fan-out of 8, 2,000 waiting tasks instead of 10,000.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/...` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from bench.doubles import CountingProvider  # noqa: E402
from controlplane.app import ControlPlane  # noqa: E402
from controlplane.settings import Settings  # noqa: E402
from controlplane.states import TaskState  # noqa: E402
from controlplane.store import NewTask  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * p
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def summary(xs: list[float]) -> dict[str, float]:
    return {"n": len(xs), "median": pct(xs, 0.5), "p95": pct(xs, 0.95), "max": max(xs)}


# ---- 1. a parent's end to its child's launch ------------------------------------------------------
async def release_delays(home: Path, chain: int, fan: int) -> dict[str, Any]:
    from fastmcp import Client

    from tests.conftest import Agent, serving, write_catalog

    write_catalog(home, concurrency=fan + 2, queue_length=1000)
    cp = ControlPlane(Settings(home=home))
    ticks: list[float] = []
    tick = cp.scheduler.tick

    async def counted() -> int:
        ticks.append(time.time())
        return await tick()
    cp.scheduler.tick = counted  # type: ignore[method-assign]
    async with serving(cp) as server, Client(server.url) as client:
        agent = Agent(client)
        chained: list[str] = [await agent.submit(inputs={})]
        for _ in range(chain - 1):
            chained.append((await agent.call("submit_task", tool_name="exercise", inputs={},
                                             after=[chained[-1]]))["task_id"])
        await agent.wait(chained[-1], timeout=60 + 10 * chain)
        parent = await agent.submit(inputs={"sleep_s": 0.5})
        children = [(await agent.call("submit_task", tool_name="exercise", inputs={}, after=[parent]))["task_id"]
                    for _ in range(fan)]
        for c in children:
            await agent.wait(c, timeout=120)
        interval = cp.settings.scheduler_interval_s

    def delays(pairs: list[tuple[str, str]]) -> dict[str, Any]:
        claimed_ms, ms, n_ticks = [], [], []
        for parent_id, child_id in pairs:
            ended = next(e.ts for e in cp.store.logs.events(parent_id) if e.to_state == TaskState.SUCCEEDED)
            events = cp.store.logs.events(child_id)
            claimed = next(e.ts for e in events if e.to_state == TaskState.SCHEDULED)
            launched = next(e.ts for e in events if e.kind == "launched")
            claimed_ms.append((claimed - ended) * 1000)
            ms.append((launched - ended) * 1000)
            n_ticks.append(float(sum(ended < t <= launched for t in ticks)))
        return {"claimed_ms": summary(claimed_ms), "ms": summary(ms), "ticks": summary(n_ticks)}

    out = {"scheduler_interval_s": interval, "chain": delays(list(zip(chained, chained[1:], strict=False))),
           "fan_out": delays([(parent, c) for c in children])}
    cp.db.dispose()
    return out


# ---- 2. what waiting tasks cost the loops ---------------------------------------------------------
def new_task(after: tuple[str, ...] = ()) -> NewTask:
    return NewTask(owner="bench", tool_name="exercise", inputs_json="{}", input_size=None, provider="local",
                   resource_class="cpu_small", priority=0, ttl_s=86400, idempotency_key=None, tags=[],
                   resources_json="{}", max_runtime_s=3600, max_attempts=1, estimate_s=1.0, after=after)


def with_parent(home: Path, waiting: int) -> tuple[ControlPlane, CountingProvider, str]:
    """A control plane on the double with one running parent and `waiting` tasks after it."""
    provider = CountingProvider(poll_batch_size=100)
    cp = ControlPlane(Settings(home=home), providers={"local": provider})
    parent = cp.store.tasks.submit(new_task()).task.task_id
    asyncio.run(cp.scheduler.tick())  # launched on the double: running for ever
    assert cp.store.tasks.get(parent).state in (TaskState.SCHEDULED, TaskState.RUNNING)
    for start in range(0, waiting, 1000):
        cp.store.tasks.submit_many([(new_task((parent,)), ()) for _ in range(start, min(start + 1000, waiting))])
    return cp, provider, parent


def loop_costs(planes: list[tuple[ControlPlane, CountingProvider]], rounds: int) -> list[dict[str, Any]]:
    """Per tick and per cycle of each control plane, measured in alternation (round by round, so
    drift hits each alike): median wall ms, the statements run, the provider calls made."""
    statements = [0]
    saved = [(cp.db.run, cp.db.fetch) for cp, _ in planes]
    for (cp, _), (run, fetch) in zip(planes, saved, strict=True):
        def counting_run(c: Any, stmt: Any, params: Any, run: Any = run) -> Any:
            statements[0] += 1
            return run(c, stmt, params)

        def counting_fetch(stmt: Any, params: Any, fetch: Any = fetch, **kw: Any) -> Any:
            statements[0] += 1
            return fetch(stmt, params, **kw)
        cp.db.run, cp.db.fetch = counting_run, counting_fetch  # type: ignore[method-assign]

    async def measure() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{} for _ in planes]
        for name in ("tick", "cycle"):
            figs = [{"ms": [], "statements": [], "provider_calls": []} for _ in planes]
            for r in range(rounds + 1):
                for (cp, provider), fig in zip(planes, figs, strict=True):
                    statements[0] = 0
                    provider.reset()
                    t0 = time.perf_counter()
                    await (cp.scheduler.tick() if name == "tick" else cp.reconciler.cycle(force_poll=True))
                    if r:  # the first round warms
                        fig["ms"].append((time.perf_counter() - t0) * 1000)
                        fig["statements"].append(statements[0])
                        fig["provider_calls"].append(sum(provider.calls.values()))
            for o, fig in zip(out, figs, strict=True):
                o[name] = {"ms": statistics.median(fig["ms"]), "statements": max(fig["statements"]),
                           "provider_calls": max(fig["provider_calls"])}
        return out

    try:
        return asyncio.run(measure())
    finally:
        for (cp, _), (run, fetch) in zip(planes, saved, strict=True):
            cp.db.run, cp.db.fetch = run, fetch  # type: ignore[method-assign]


def waiting_costs(home: Path, waiting: int, rounds: int) -> dict[str, Any]:
    idle, idle_provider, _ = with_parent(home / "none", 0)
    busy, busy_provider, parent = with_parent(home / "many", waiting)
    none, many = loop_costs([(idle, idle_provider), (busy, busy_provider)], rounds)
    if busy.store.tasks.get(parent).state == TaskState.SCHEDULED:
        busy.store.tasks.transition(parent, TaskState.RUNNING)
    t0 = time.perf_counter()
    busy.store.tasks.transition(parent, TaskState.SUCCEEDED, values={"started_at": time.time()})
    end_s = time.perf_counter() - t0
    follow_ups: list[float] = []
    while True:
        t0 = time.perf_counter()
        if busy.store.tasks.settle_left() is None:
            break
        follow_ups.append(time.perf_counter() - t0)
    queued = busy.store.tasks.count_by_state().get("queued", 0)
    assert queued == waiting, f"{queued} of {waiting} released"
    idle.db.dispose()
    busy.db.dispose()
    return {"waiting": waiting, "none": none, "many": many, "release_end_s": end_s,
            "follow_ups": len(follow_ups), "follow_up_max_s": max(follow_ups, default=0.0),
            "release_all_s": end_s + sum(follow_ups),
            "ratio": {k: many[k]["ms"] / none[k]["ms"] for k in ("tick", "cycle")}}


def main() -> int:
    from rich.console import Console
    from rich.table import Table

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--chain", type=int, default=20)
    ap.add_argument("--fan-out", type=int, default=12)
    ap.add_argument("--waiting", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=200, help="ticks and cycles timed each way")
    args = ap.parse_args()
    if args.quick:
        args.chain, args.fan_out, args.waiting, args.rounds = 8, 8, 2000, 100
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="cp-bench-deps-") as tmp:
        console.log(f"a chain of {args.chain} and a fan-out of {args.fan_out} on the local provider")
        release = asyncio.run(release_delays(Path(tmp) / "release", args.chain, args.fan_out))
        console.log(f"the loops with 0 and {args.waiting} tasks waiting")
        costs = waiting_costs(Path(tmp) / "costs", args.waiting, args.rounds)

    t1 = Table(title=f"a parent's end to its child's launch (scheduler interval {release['scheduler_interval_s']} s)")
    for col in ("shape", "n", "claimed: median ms", "p95", "launched: median ms", "p95", "max", "ticks: median",
                "p95", "max"):
        t1.add_column(col, justify="left" if col == "shape" else "right")
    for shape in ("chain", "fan_out"):
        cl, ms, tk = release[shape]["claimed_ms"], release[shape]["ms"], release[shape]["ticks"]
        t1.add_row(shape, str(ms["n"]), f"{cl['median']:.0f}", f"{cl['p95']:.0f}", f"{ms['median']:.0f}",
                   f"{ms['p95']:.0f}", f"{ms['max']:.0f}", f"{tk['median']:.0f}", f"{tk['p95']:.1f}", f"{tk['max']:.0f}")
    t2 = Table(title=f"the loops with 0 and {costs['waiting']} tasks waiting (median of {args.rounds} each)")
    for col in ("loop", "ms, 0 waiting", f"ms, {costs['waiting']}", "ratio", "statements", "provider calls"):
        t2.add_column(col, justify="left" if col == "loop" else "right")
    for k in ("tick", "cycle"):
        a, b = costs["none"][k], costs["many"][k]
        t2.add_row(k, f"{a['ms']:.2f}", f"{b['ms']:.2f}", f"{costs['ratio'][k]:.2f}x",
                   f"{a['statements']} / {b['statements']}", f"{a['provider_calls']} / {b['provider_calls']}")
    out = Console(width=max(Console().width, 120))
    out.print(t1)
    out.print(t2)
    out.print(f"the parent's end releasing {costs['waiting']} children: {costs['release_end_s']:.2f} s in its "
              f"transaction, then {costs['follow_ups']} follow-ups (longest {costs['follow_up_max_s']:.2f} s), "
              f"{costs['release_all_s']:.2f} s in all")
    print(json.dumps({"benchmark": "dependencies", "quick": args.quick, "release": release, "costs": costs,
                      "time": time.time()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
