"""The choice of placement: `python bench/placement.py [--quick]`.

1. Its cost per launch: the scheduler's claim (`JobStore.claim_for_launch` with its `Placer`,
   one transaction per batch of claims, on SQLite) of queued tasks whose tool has 1 placement
   (the baseline) and 5 placements: the first taken; the first four skipped by their open
   breakers; by `cheapest` (each task's cost at each placement, at the price table); and the
   worst case of `max_running` (the first four full, so that each claim counts five placements).
   Per claimed task: wall time, database statements, and the ratio to one placement; and the
   decision alone (`Placer.__call__`, no database) in microseconds.
2. From a capacity refusal to the next placement's launch: a control plane running its loops
   (default intervals) on two provider doubles, the first refusing every launch for capacity;
   for each task, the time (ms) and the scheduler ticks from the refusal to the launch on the
   second (median, p95, max).

Prints tables and, as its last line, one JSON object with every figure. `--quick`: 300 tasks
per variant and 10 moves (about half a minute on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/...` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

from pydantic_settings import SettingsConfigDict  # noqa: E402
from sqlalchemy import event, text  # noqa: E402

from bench.doubles import CountingHandle, CountingProvider  # noqa: E402
from controlplane import api  # noqa: E402
from controlplane.app import ControlPlane  # noqa: E402
from controlplane.catalog import default_catalog_text  # noqa: E402
from controlplane.settings import Settings  # noqa: E402
from controlplane_providers import registry  # noqa: E402
from controlplane_providers.base import (  # noqa: E402
    CapacityProviderError,
    LaunchSpec,
    ProviderOptions,
    ProviderSettings,
)

EXERCISE = 'provider = "local"\nresource_class = "cpu_small"\ncommand = ["{python}", "-m", "controlplane_tools.exercise"]'
BATCH = 50  # tasks per claim (one transaction), as a tick with that many free slots


class ZoneOptions(ProviderOptions):
    zone: str = "a"


class ZoneSettings(ProviderSettings):
    model_config = SettingsConfigDict(env_prefix="CONTROLPLANE_ZONED_", extra="ignore")


class Zoned(CountingProvider):
    """The benchmarks' double with a zone per placement (its price region: a breaker's site);
    `refuse`: every launch refused for capacity, the time of each refusal kept."""

    Options = ZoneOptions
    Settings = ZoneSettings

    def __init__(self, name: str = "zoned", refuse: bool = False):
        super().__init__(name)
        self.refuse = refuse
        self.refused_at: dict[str, float] = {}  # task id -> when its launch was refused
        self.launched_at: dict[str, float] = {}  # task id -> when it launched

    def price_region(self, options: Any) -> str | None:
        return str(options.zone)

    def launch(self, spec: LaunchSpec) -> CountingHandle:
        if self.refuse:
            self.refused_at.setdefault(spec.task_id, time.perf_counter())
            raise CapacityProviderError(f"zone {spec.options.zone} is full")
        handle = super().launch(spec)
        self.launched_at[spec.task_id] = time.perf_counter()
        return handle


def placed(zone: str, extra: str = "", provider: str = "zoned") -> str:
    return f'{{ provider = "{provider}", options = {{ zone = "{zone}" }}{extra} }}'


def catalog(placements: list[str], policy: str = "ordered") -> str:
    text = default_catalog_text()
    text = text.replace(EXERCISE, f'placements = [{", ".join(placements)}]\nresource_class = "bench"\n'
                                  'command = ["{python}", "-m", "controlplane_tools.exercise"]')
    return text + f'\n[resource_classes.bench]\nmax_concurrency = 100000\nmax_queue_length = 1000000\n' \
                  f'placement_policy = "{policy}"\n'


def prices(home: Path) -> None:
    """Each zone its own price (the cheapest last), for `cheapest`."""
    lines = [f'[zoned.{z}]\nvcpu_per_second = {0.00002 * (5 - i)}\nmemory_gib_per_second = 0.000002\n'
             for i, z in enumerate("abcde")]
    (home / "prices.toml").write_text("".join(lines))


@dataclass
class Variant:
    name: str
    placements: list[str]
    policy: str = "ordered"
    open_sites: tuple[str, ...] = ()
    prefill: int = 0  # tasks claimed before the timing (to fill the max_running placements)


VARIANTS = [
    Variant("1 placement", [placed("a")]),
    Variant("5, first taken", [placed(z) for z in "abcde"]),
    Variant("5, first four open", [placed(z) for z in "abcde"], open_sites=("zoned/a", "zoned/b", "zoned/c", "zoned/d")),
    Variant("5, cheapest", [placed(z) for z in "abcde"], policy="cheapest"),
    Variant("5, first four full", [placed(z, ", max_running = 1") for z in "abcd"] + [placed("e", ", max_running = 100000")],
            prefill=4),
]


@dataclass
class Bench:
    """One variant's control plane, its tasks queued, and what its claims cost so far."""

    v: Variant
    cp: ControlPlane
    wall: float = 0.0
    claimed: int = 0
    statements: int = 0


def prepare(root: Path, v: Variant, tasks: int) -> Bench:
    home = root / v.name.replace(" ", "_").replace(",", "")
    home.mkdir(parents=True)
    prices(home)
    (home / "catalog.toml").write_text(catalog(v.placements, v.policy))
    cp = ControlPlane(Settings(home=home), providers={"zoned": Zoned()})
    for site in v.open_sites:
        for _ in range(cp.settings.placement_breaker_failures):
            cp.breakers.failed(site)
    for _ in range(tasks + v.prefill):
        cp.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={}))
    if v.prefill:
        cp.store.jobs.claim_for_launch("bench", 100000, v.prefill, place=cp.scheduler.placer)
    b = Bench(v, cp)
    # every statement SQLite runs from here on (BEGIN and COMMIT included), on new connections
    cp.db.engines.dispose()

    def traced(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.set_trace_callback(lambda _sql: setattr(b, "statements", b.statements + 1))

    for engine in {cp.db.engines.engine, cp.db.engines.read_engine}:
        event.listen(engine, "connect", traced)
    return b


def claim_batch(b: Bench, n: int) -> None:
    """One claim of `n` tasks (one transaction), as a tick with `n` free slots: timed and counted."""
    placer = b.cp.scheduler.placer
    started = time.perf_counter()
    got = b.cp.store.jobs.claim_for_launch("bench", 100000, n, place=placer,
                                           lookahead=32 if placer.may_skip("bench") else 0)
    b.wall += time.perf_counter() - started
    assert len(got) == n, (b.v.name, len(got))
    b.claimed += n


def decision_us(b: Bench, n: int) -> float:
    """The decision alone (`Placer.__call__`: no database; `busy` as the claim would answer)."""
    cp, placer = b.cp, b.cp.scheduler.placer
    with cp.db.read() as c:
        tid = c.execute(text("SELECT task_id FROM tasks ORDER BY pk DESC LIMIT 1")).scalar_one()
    task = cp.store.tasks.get(tid)
    assert task is not None
    full = bool(b.v.prefill)

    def busy(_tool: str, i: int) -> int:
        return 1 if full and i < 4 else 0

    t0 = time.perf_counter()
    for _ in range(n):
        placer(task, list, busy)
    return (time.perf_counter() - t0) / n * 1e6


def claim_costs(root: Path, tasks: int) -> list[dict[str, Any]]:
    benches = [prepare(root, v, tasks) for v in VARIANTS]
    for b in benches:
        claim_batch(b, 1)  # each variant's connections opened (and traced) before the timing
        b.wall, b.claimed, b.statements = 0.0, 0, 0
    left = tasks - 1
    while left > 0:  # the variants in turn, a batch each: drift of the machine falls on all alike
        n = min(BATCH, left)
        for b in benches:
            claim_batch(b, n)
        left -= n
    rows = []
    for b in benches:
        with b.cp.db.read() as c:
            used = [r[0] for r in c.execute(text("SELECT DISTINCT placement FROM jobs ORDER BY placement"))]
        rows.append({"variant": b.v.name, "us_per_claim": b.wall / b.claimed * 1e6,
                     "statements_per_claim": b.statements / b.claimed,
                     "decision_us": decision_us(b, 5000 if tasks >= 1000 else 2000), "placements_used": used})
        b.cp.db.dispose()
    return rows


async def refusal_to_launch(home: Path, moves: int) -> dict[str, Any]:
    home.mkdir(parents=True)
    (home / "catalog.toml").write_text(catalog([placed("a", provider="full"), placed("b")]))
    full, room = Zoned("full", refuse=True), Zoned("zoned")
    registry.register("full", Zoned)
    # no breaker in the way: every task's first attempt goes to the full zone and is refused
    cp = ControlPlane(Settings(home=home, placement_breaker_failures=10 ** 6), providers={"full": full, "zoned": room})
    logging.getLogger("controlplane.scheduler").setLevel(logging.ERROR)  # a warning per move
    ms, ticks = [], []
    async with cp.running():
        for _ in range(moves):
            tid = cp.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={}))["task_id"]
            while tid not in full.refused_at:
                await asyncio.sleep(0.001)
            at_refusal = cp.scheduler.ticks
            while tid not in room.launched_at:
                await asyncio.sleep(0.001)
            ms.append((room.launched_at[tid] - full.refused_at[tid]) * 1000)
            ticks.append(cp.scheduler.ticks - at_refusal)
            await asyncio.sleep(0.05)
    return {"moves": moves, "ms": summary(ms), "ticks": summary([float(t) for t in ticks]),
            "scheduler_interval_s": cp.settings.scheduler_interval_s}


def summary(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {"median": statistics.median(xs), "p95": xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))],
            "max": xs[-1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--moves", type=int, default=None)
    args = ap.parse_args()
    tasks = args.tasks or (300 if args.quick else 3000)
    moves = args.moves or (10 if args.quick else 50)
    registry.register("zoned", Zoned)
    out: dict[str, Any] = {"tasks": tasks}
    with tempfile.TemporaryDirectory() as tmp:
        rows = claim_costs(Path(tmp), tasks)
        base = rows[0]
        print(f"1. the claim per launch ({tasks} tasks per variant, batches of {BATCH}, SQLite)")
        print(f"{'variant':22} {'us/claim':>9} {'ratio':>6} {'stmts':>6} {'decision us':>12} {'ratio':>6}  placements")
        for r in rows:
            r["ratio"] = r["us_per_claim"] / base["us_per_claim"]
            r["decision_ratio"] = r["decision_us"] / base["decision_us"]
            print(f"{r['variant']:22} {r['us_per_claim']:9.1f} {r['ratio']:6.2f} {r['statements_per_claim']:6.2f} "
                  f"{r['decision_us']:12.2f} {r['decision_ratio']:6.1f}  {r['placements_used']}")
        out["claims"] = rows
        moved = asyncio.run(refusal_to_launch(Path(tmp) / "moves", moves))
        out["refusal_to_launch"] = moved
        print(f"\n2. a capacity refusal to the next placement's launch ({moves} tasks, scheduler interval "
              f"{moved['scheduler_interval_s']} s)")
        print(f"   ms:    median {moved['ms']['median']:.1f}  p95 {moved['ms']['p95']:.1f}  max {moved['ms']['max']:.1f}")
        print(f"   ticks: median {moved['ticks']['median']:.0f}  p95 {moved['ticks']['p95']:.0f}  "
              f"max {moved['ticks']['max']:.0f}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
