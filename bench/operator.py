"""The operator's view under a store of 10,000 tasks (issue 17).

* the dashboard's task list (`GET /dashboard`, the default owner's newest 50 of 10,000, the queues
  and the providers) and a `/metrics` scrape (its grouped count over every task) over HTTP, each
  as a ratio to a no-op MCP tool call (`bench.servers` noop: fastmcp, one tool that does nothing)
  measured in the same run;
* `submit_task` p50 with metrics on and off (`CONTROLPLANE_METRICS=false`: every metric object is
  a no-op, no /mcp timer, no /metrics): two servers on two copies of the same store, called in
  alternation, round by round, so drift on the machine falls on both alike. Their ratio is what
  metrics add to a submit.

Both control planes run the provider double (`bench.doubles`) in place of the local provider, so
that a submit's job starts no process. `python bench/operator.py [--quick]`; the last line of
output is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/operator.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from fastmcp import Client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import BenchError, call, helper, ready_info, standalone, summary  # noqa: E402
from bench.scale import open_db  # noqa: E402
from bench.seed import seed_history  # noqa: E402

STORED = 10_000


async def timed_get(http: httpx.AsyncClient, url: str, **kw: Any) -> float:
    t0 = time.perf_counter()
    r = await http.get(url, **kw)
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise BenchError(f"GET {url} answered {r.status_code}")
    return ms


async def bench_operator(tmp: Path, console: Console, *, quick: bool) -> dict[str, Any]:
    rounds = 60 if quick else 400
    warmup = 10 if quick else 40
    on_home, off_home = tmp / "on", tmp / "off"
    db = open_db(on_home)
    seed_history(db, STORED, seed=7)
    db.dispose()
    shutil.copytree(on_home, off_home)
    servers = {
        "noop": helper("noop", tmp, "noop"),
        "on": helper("on", tmp, "controlplane", "--home", str(on_home), "--double"),
        "off": helper("off", tmp, "controlplane", "--home", str(off_home), "--double", "--set", "metrics=false"),
    }
    try:
        for s in servers.values():
            s.start()
        for s in servers.values():
            await s.wait_ready(timeout=300)
        urls = {k: ready_info(s)["url"] for k, s in servers.items()}
        async with Client(urls["noop"]) as noop, Client(urls["on"]) as on, Client(urls["off"]) as off, \
                httpx.AsyncClient(timeout=60, headers={"Accept": "text/html"}) as http:
            root = urls["on"].removesuffix("/mcp")
            submit = {"tool_name": "exercise", "inputs": {}}
            for _ in range(warmup):
                await call(noop, "noop", {})
                await timed_get(http, f"{root}/dashboard")
                await timed_get(http, f"{root}/metrics")
                await call(on, "submit_task", submit)
                await call(off, "submit_task", submit)
            noop_ms, page_ms, scrape_ms, on_ms, off_ms = [], [], [], [], []
            console.log(f"{rounds} rounds: noop, dashboard, /metrics, submit with metrics on and off")
            for i in range(rounds):
                noop_ms.append((await call(noop, "noop", {})).ms)
                page_ms.append(await timed_get(http, f"{root}/dashboard"))
                scrape_ms.append(await timed_get(http, f"{root}/metrics"))
                pair = [(on, on_ms), (off, off_ms)] if i % 2 == 0 else [(off, off_ms), (on, on_ms)]
                for client, out in pair:
                    out.append((await call(client, "submit_task", submit)).ms)
                    await asyncio.sleep(0.01)  # the work a submit wakes (the scheduler) settles
    finally:
        for s in servers.values():
            s.stop()
    figures = {"noop": summary(noop_ms), "dashboard": summary(page_ms), "metrics_scrape": summary(scrape_ms),
               "submit_metrics_on": summary(on_ms), "submit_metrics_off": summary(off_ms)}
    base = figures["noop"]["p50_ms"]
    return {"stored_tasks": STORED, "rounds": rounds, "figures": figures, "ratios": {
        "dashboard_p50_vs_noop": figures["dashboard"]["p50_ms"] / base,
        "metrics_scrape_p50_vs_noop": figures["metrics_scrape"]["p50_ms"] / base,
        "submit_p50_metrics_on_vs_off": figures["submit_metrics_on"]["p50_ms"] / figures["submit_metrics_off"]["p50_ms"],
    }}


def render(r: dict[str, Any], console: Console) -> None:
    t = Table(title=f"operator's view, {r['stored_tasks']:,} tasks stored ({r['rounds']} rounds)")
    for col in ("measure", "p50 ms", "p99 ms", "p50 ratio"):
        t.add_column(col)
    f, ratios = r["figures"], r["ratios"]
    rows = [("no-op MCP call (baseline)", "noop", 1.0),
            ("GET /dashboard", "dashboard", ratios["dashboard_p50_vs_noop"]),
            ("GET /metrics", "metrics_scrape", ratios["metrics_scrape_p50_vs_noop"]),
            ("submit_task, metrics off", "submit_metrics_off", 1.0),
            ("submit_task, metrics on", "submit_metrics_on", ratios["submit_p50_metrics_on_vs_off"])]
    for label, key, ratio in rows:
        t.add_row(label, f"{f[key]['p50_ms']:.2f}", f"{f[key]['p99_ms']:.2f}", f"{ratio:.2f}")
    console.print(t)
    console.print("ratios: dashboard and /metrics to the no-op call; submit with metrics on to off")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="60 rounds (default 400)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary homes and server logs")
    args = ap.parse_args()
    return standalone("operator", lambda tmp, console: asyncio.run(bench_operator(tmp, console, quick=args.quick)),
                      render, keep=args.keep, extra={"quick": args.quick})


if __name__ == "__main__":
    sys.exit(main())
