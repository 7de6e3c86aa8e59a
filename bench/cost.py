"""What cost and usage cost a call: `submit_task` with no budget, with budgets of other callers
only, and with a caller's and a tag's budget both applying (each counting 10,000 attempts on
file in the period and the tasks in flight, which grow as the benchmark submits);
`get_task_status` of a finished task (its usage is read) against a queued one (nothing read);
and `usage_report` over those 10,000 attempts by tool and by tag, against that status call.
Servers in this process over HTTP (2026-07-28, one client each; the reads on a fourth),
measured in interleaved rounds so that the machine's drift falls on all alike.

    python bench/cost.py [--calls 300] [--rounds 5] [--attempts 10000]

Prints a table and, last, one JSON line with every figure (p50s in ms, and the ratios).
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
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fastmcp import Client  # noqa: E402
from sqlalchemy import insert  # noqa: E402

from controlplane.app import ControlPlane  # noqa: E402
from controlplane.settings import Settings  # noqa: E402
from controlplane.store import queries as q  # noqa: E402
from tests.conftest import FAST, reap_jobs, serving  # noqa: E402

PRICES = "[local.default]\nvcpu_per_hour = 36.0\nmemory_gib_per_hour = 3.6\n"
HOLD = {"tool_name": "exercise", "inputs": {"sleep_s": 3600}, "tags": ["proj"]}  # two run, the rest wait


def seed_usage(cp: ControlPlane, attempts: int) -> None:
    """`attempts` ended attempts of the default owner this month, a third of them tagged."""
    now = time.time()
    rows = [{"task_id": f"tsk_bench{i:020d}", "attempt": 1, "task_pk": 10_000_000 + i, "owner": "local",
             "tool_name": ("exercise", "lj_relax")[i % 2], "provider": "local", "region": None,
             "started_at": now - 3600 - i, "ended_at": now - 3000 - i, "cpu": 1.0, "memory_mb": 2048, "gpu": 0,
             "run_s": 600.0, "vcpu_s": 600.0, "memory_gib_s": 1200.0, "gpu_s": 0.0, "cost": 7.2, "currency": "USD"}
            for i in range(attempts)]
    tags = [{"task_pk": r["task_pk"], "tag": "proj", "owner": "local", "submitted_at": r["started_at"]}
            for r in rows[::3]]
    with cp.store.writer.tx() as c:
        c.execute(insert(q.USAGE), rows)
        c.execute(q.INSERT_TAGS, tags)


def p50_ms(xs: list[float]) -> float:
    return round(statistics.median(xs) * 1000, 3)


async def main(calls: int, rounds: int, attempts: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp())
    cps: dict[str, ControlPlane] = {}
    for name in ("none", "others", "applies", "reads"):
        home = tmp / name
        home.mkdir(parents=True)
        (home / "prices.toml").write_text(PRICES)
        cps[name] = ControlPlane(Settings(home=home, **FAST))
        seed_usage(cps[name], attempts)
    cps["others"].store.usage.set_budget("owner", "someone else", "month", 1e12)
    cps["others"].store.usage.set_budget("tag", "another tag", "month", 1e12)
    cps["applies"].store.usage.set_budget("owner", "local", "month", 1e12)
    cps["applies"].store.usage.set_budget("tag", "proj", "month", 1e12)
    for cp in cps.values():
        cp.service.budgets.refresh()

    times: dict[str, list[float]] = {}

    async def timed(key: str, client: Client, tool: str, args: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        res = await client.call_tool(tool, args, raise_on_error=False)
        times.setdefault(key, []).append(time.perf_counter() - t0)
        assert not res.is_error, res.content[0].text

    try:
        async with serving(cps["none"]) as s0, serving(cps["others"]) as s1, serving(cps["applies"]) as s2, \
                serving(cps["reads"]) as s3:
            clients = {name: await Client(srv.url).__aenter__() for name, srv in
                       (("none", s0), ("others", s1), ("applies", s2))}
            main_client = await Client(s3.url).__aenter__()  # reads on a server of their own
            done = (await main_client.call_tool("submit_task", {"tool_name": "exercise", "inputs": {}})).structured_content
            while (await main_client.call_tool("get_task_status", {"task_id": done["task_id"]})).structured_content[
                    "state"] != "succeeded":
                await asyncio.sleep(0.05)
            queued = (await main_client.call_tool("submit_task", HOLD)).structured_content["task_id"]
            for _ in range(30):  # warm up
                for client in clients.values():
                    await client.call_tool("submit_task", HOLD)
                await main_client.call_tool("get_task_status", {"task_id": done["task_id"]})
                await main_client.call_tool("usage_report", {"group_by": ["tag"]})
            per = max(1, calls // rounds)
            for _ in range(rounds):
                for name, client in clients.items():
                    for _ in range(per):
                        await timed(f"submit_{name}", client, "submit_task", HOLD)
                for _ in range(per):
                    await timed("status_queued", main_client, "get_task_status", {"task_id": queued})
                    await timed("status_finished", main_client, "get_task_status", {"task_id": done["task_id"]})
                for _ in range(max(1, per // 5)):
                    await timed("report_by_tool", main_client, "usage_report", {"group_by": ["tool"]})
                    await timed("report_by_tag", main_client, "usage_report", {"group_by": ["tag"]})
            for client in (*clients.values(), main_client):
                await client.__aexit__(None, None, None)
    finally:
        for cp in cps.values():
            reap_jobs(cp.settings.home)
    p = {k: p50_ms(v) for k, v in times.items()}
    return {"attempts_on_file": attempts, "p50_ms": p, "ratios": {
        "submit_budgets_of_others_vs_none": round(p["submit_others"] / p["submit_none"], 3),
        "submit_budgets_apply_vs_none": round(p["submit_applies"] / p["submit_none"], 3),
        "status_finished_vs_queued": round(p["status_finished"] / p["status_queued"], 3),
        "report_by_tool_vs_status": round(p["report_by_tool"] / p["status_queued"], 3),
        "report_by_tag_vs_status": round(p["report_by_tag"] / p["status_queued"], 3),
    }, "calls": {k: len(v) for k, v in times.items()}}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=300, help="measured calls per kind")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--attempts", type=int, default=10_000, help="ended attempts on file in the period")
    a = ap.parse_args()
    out = asyncio.run(main(a.calls, a.rounds, a.attempts))
    for k, v in out["p50_ms"].items():
        print(f"{k:24s} p50 {v:8.3f} ms  ({out['calls'][k]} calls)")
    for k, v in out["ratios"].items():
        print(f"{k:36s} {v:.3f}x")
    print(json.dumps(out))
