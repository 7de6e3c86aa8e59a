"""The control plane's performance benchmark: `python bench/run.py [--quick] [--transport http|memory]`.

What it measures, in one run, each against the issue's target:

1. MCP call latency through a real fastmcp `Client` (protocol negotiated by `mode="auto"`), as
   ratios to a no-op tool's p50 measured in the same run: `submit_task` (target p50 <= 1.5x
   no-op), `get_task_status` (p50 <= 1.2x; of the task just submitted, which is queued, and of a
   running task), and, without a target, `cancel_task`. The no-op is a separate minimal FastMCP
   server with one no-op tool, served the same way (uvicorn, `http_app(path="/mcp")`, same
   options; see `bench/servers.py`). Default transport: Streamable HTTP to servers on 127.0.0.1,
   each in its own process (the control plane through `controlplane.serve.HttpServer`, as
   `controlplane serve --transport http` runs it); `--transport memory` calls both servers
   in-process (`Client(server)`) for comparison. Beside each call's latency the report gives the
   tool's own time (`duration` in the result's meta), so MCP/transport overhead shows apart.
2. `list_tasks` over 100k stored tasks (p99 <= 20 ms), for several filters: the newest page,
   a state, a tool, a common tag, a rare tag, a tag of one old batch, a one-day window five
   days back, a page continued from a cursor halfway down, and a full page of 200.
3. `tail_task_logs` of a 1M-line log near its start (cursor), near its end (cursor) and with
   `from_end` (end vs start within 1.5x: the cost does not grow with the log).
4. submit-to-running latency of the `exercise` tool on the real local provider (a runner
   process per task; no target): as the client sees it (polling `get_task_status` every 10 ms)
   and as the server recorded it (`started_at - submitted_at`).
5. One reconciler cycle over 10k in-flight tasks with a provider double that counts its API
   calls (poll_batch_size 100): wall time, process CPU time and poll calls (under 1 s, at most
   ceil(N / batch) polls). The first cycle records every job's provider status (as after their
   launch); the later ones are the steady state.
6. The RSS of a control-plane server process holding those 10k in-flight tasks, once it is
   serving and its own reconciler loop has run (under 200 MB).
7. Calls per second with 1, 4, 16 and 64 concurrent clients, both protocol eras, as ratios to the
   no-op's with the same clients (`bench/concurrency.py`; at 16 clients submit >= 0.8x, status
   and result >= 0.9x).
8. A million tasks on file (`bench/scale.py`; quick: 200k): the database's size per task,
   start-up to the first answered call, list_tasks, submit and status against a 10k store in the
   same run, and one expiry sweep.
9. Memory per in-flight task (RSS over a fresh server) and the reconciler cycle at 10k and 100k in
   flight, beside 200k finished tasks (`bench/inflight.py`; quick: 10k and 30k beside 50k).

How: every store is a fresh CONTROLPLANE home under a temporary directory. The stored tasks and
log lines are written in bulk through SQL (`bench/seed.py`), not through MCP: ten days of history,
95% one owner, two tools, tags, mixed final states (older than the ttl are expired), and at
the newest end running tasks in every slot plus a queue of 200. The latency server uses the
provider double (`bench/doubles.py`) so its running tasks stay running and no job process
competes for the CPU. Calls are warmed up first, then interleaved round by round, so drift hits
every measure alike: submit; then in random order the no-op, both statuses, one list filter
(in turn) and one tail position (in turn); then cancel of the submitted task, which keeps the
queue at its seeded length. Submit and cancel wake the server's scheduler and reconciler, so
before the submit and before the shuffled calls the round pauses (`--settle-ms`) and then makes
one unmeasured call to each server (an idle pause leaves processes cold on this VM). Latencies
are wall times around `Client.call_tool`; p50/p99 interpolate linearly. Rounds stop at their
count or at a time budget, whichever comes first; the report gives every n.

`--quick` (under a minute on 2 cores) stores 20k tasks and a 200k-line log and makes fewer
calls; the report says so. The figures only mean something as ratios within one run. The
benchmark exits 0 whether or not targets are met (MISS rows say which are not); it exits
non-zero only when something does not work (a call answers an error, a server does not start).
The last line of stdout is one JSON object with every figure.

The report also says whether the control plane's listening socket is IPPROTO_TCP: if it is not,
asyncio never sets TCP_NODELAY on its connections and every HTTP answer waits ~40 ms for a
delayed ACK (Nagle), which swamps every other figure of part 1.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/run.py` puts bench/, not the project, on the path
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402
from fastmcp import Client  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.markup import escape  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import (  # noqa: E402
    MB,
    Answer,
    BenchError,
    call,
    cpu_seconds,
    finite,
    git_state,
    helper,
    percentile,
    ready_info,
    reap_jobs,
    summary,
)
from bench.seed import Seeded, list_variants, seed_history, seed_inflight, seed_log  # noqa: E402

TERMINAL = {"succeeded", "failed", "cancelled", "timed_out", "expired"}

# The targets.
SUBMIT_RATIO = 1.5  # submit_task p50 / no-op p50
STATUS_RATIO = 1.2  # get_task_status p50 / no-op p50
LIST_P99_MS = 20.0
TAIL_END_VS_START = 1.5
CYCLE_WALL_S = 1.0
RSS_MB = 200.0


@dataclass
class Config:
    quick: bool
    transport: str
    history: int  # stored tasks for list_tasks
    log_lines: int  # lines of the long log
    warmup: int  # unmeasured rounds
    rounds: int  # measured rounds
    local_tasks: int  # submit-to-running samples
    sleep_s: float  # the exercise tool's sleep in those
    inflight: int  # tasks in flight for the reconciler and RSS measures
    batch: int  # the provider double's poll_batch_size
    cycles: int  # reconciler cycles measured
    budget_s: float  # measured rounds stop early when they have taken this long
    settle_ms: float  # pause after each submit and cancel (their background work)
    seed: int


def parse_iso(s: str) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp()


# ==== 1-3: latency of the MCP calls ================================================================
def tail_variants(seeded: Seeded, lines: int) -> dict[str, dict[str, Any]]:
    tid = seeded.log_task_id
    return {
        "start": {"task_id": tid, "cursor": "log_000000100"},
        "end": {"task_id": tid, "cursor": f"log_{max(lines - 300, 0):09d}"},
        "from_end": {"task_id": tid, "from_end": True},
    }


@asynccontextmanager
async def latency_servers(cfg: Config, home: Path, tmp: Path) -> AsyncIterator[dict[str, Any]]:
    """The no-op server and the control plane (with the provider double) as client targets."""
    if cfg.transport == "http":
        noop = helper("noop", tmp, "noop").start()
        cp = helper("controlplane", tmp, "controlplane", "--home", str(home), "--double").start()
        try:
            await asyncio.gather(noop.wait_ready(), cp.wait_ready())
            yield {"noop": ready_info(noop)["url"], "cp": ready_info(cp)["url"],
                   "noop_pid": noop.pid, "cp_pid": cp.pid, "cp_nodelay": ready_info(cp)["socket_ipproto_tcp"]}
        finally:
            cp.stop()
            noop.stop()
    else:
        from bench.doubles import CountingProvider
        from bench.servers import noop_server
        from controlplane.app import ControlPlane
        from controlplane.mcp.server import build_server
        from controlplane.settings import Settings

        cp = ControlPlane(Settings(home=home), providers={"local": CountingProvider()})
        try:
            yield {"noop": noop_server(), "cp": build_server(cp, with_auth=False), "noop_pid": None, "cp_pid": None,
                   "cp_nodelay": None}
        finally:
            cp.db.dispose()


class Samples:
    """Call latencies by measure, with the tool's own time beside the client's."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = {}
        self.tool_ms: dict[str, list[float]] = {}

    def add(self, key: str, a: Answer) -> None:
        self.ms.setdefault(key, []).append(a.ms)
        if a.tool_ms is not None:
            self.tool_ms.setdefault(key, []).append(a.tool_ms)

    def summary(self, key: str, base_p50: float | None = None) -> dict[str, Any]:
        s = summary(self.ms[key])
        if key in self.tool_ms:
            s["tool_p50_ms"] = percentile(self.tool_ms[key], 50)
        if base_p50:
            s["ratio_p50"] = s["p50_ms"] / base_p50
            s["ratio_p99"] = s["p99_ms"] / base_p50
        return s


async def bench_latency(cfg: Config, tmp: Path, console: Console) -> dict[str, Any]:
    from controlplane.settings import Settings
    from controlplane.store.db import Database

    home = tmp / "mcp"
    settings = Settings(home=home)
    settings.ensure_home()
    db = Database(settings.resolved_database_url)
    db.upgrade()
    t0 = time.perf_counter()
    seeded = seed_history(db, cfg.history, seed=cfg.seed)
    assert seeded.log_task_id is not None
    seed_log(db, seeded.log_task_id, cfg.log_lines)
    db.engine.dispose()
    seed_s = time.perf_counter() - t0
    console.log(f"stored {cfg.history:,} tasks {seeded.by_state} and a {cfg.log_lines:,}-line log in {seed_s:.1f} s")

    lists = list_variants(seeded)
    tails = tail_variants(seeded, cfg.log_lines)
    rng = random.Random(cfg.seed)
    samples = Samples()
    out: dict[str, Any] = {"seed_s": seed_s, "stored_by_state": seeded.by_state}

    async with latency_servers(cfg, home, tmp) as srv, AsyncExitStack() as stack:
        noop = await stack.enter_async_context(Client(srv["noop"], timeout=60))
        cpc = await stack.enter_async_context(Client(srv["cp"], timeout=60))
        await noop.list_tools()
        await cpc.list_tools()
        out["protocol_version"] = cpc.protocol_version
        out["cp_socket_ipproto_tcp"] = srv["cp_nodelay"]  # None in memory: no socket
        # sanity: what we are about to measure works and returns what we expect
        page = (await call(cpc, "list_tasks", {})).data
        if len(page["tasks"]) != 50:
            raise BenchError(f"list_tasks over the stored tasks returned {len(page['tasks'])} tasks")
        tail = (await call(cpc, "tail_task_logs", tails["end"])).data
        if len(tail["lines"]) != 200 or tail["lines"][-1]["seq"] != cfg.log_lines - 100:
            raise BenchError(f"tail near the end returned {len(tail['lines'])} lines")

        settle = cfg.settle_ms / 1000
        running = {"task_id": seeded.running_ids[0]}

        async def quiesce() -> None:
            # A submit or a cancel wakes the scheduler and the reconciler: let that background work
            # finish so that it does not land on whichever call comes next. An idle pause leaves the
            # processes cold (on this VM the next call is ~2 ms slower), so one unmeasured call to
            # each server follows it: every measured call then runs warm, the no-op's too.
            await asyncio.sleep(settle)
            await call(noop, "noop", {})
            await call(cpc, "get_task_status", running)

        async def round_(i: int, record: bool) -> None:
            await quiesce()
            a = await call(cpc, "submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": 1}, "tags": ["bench"]})
            task_id = a.data["task_id"]
            if record:
                samples.add("submit", a)
            await quiesce()
            lv = list(lists)[i % len(lists)]
            tv = list(tails)[i % len(tails)]
            ops = [
                ("noop", noop, "noop", {}),
                ("status_queued", cpc, "get_task_status", {"task_id": task_id}),
                ("status_running", cpc, "get_task_status", {"task_id": rng.choice(seeded.running_ids)}),
                ("list:" + lv, cpc, "list_tasks", lists[lv]),
                ("tail:" + tv, cpc, "tail_task_logs", tails[tv]),
            ]
            rng.shuffle(ops)
            for key, client, tool, args in ops:
                a = await call(client, tool, args)
                if key == "status_queued" and a.data["state"] != "queued":
                    raise BenchError(f"the submitted task is {a.data['state']}, not queued")
                if key == "status_running" and a.data["state"] != "running":
                    raise BenchError(f"a seeded running task is {a.data['state']}")
                if record:
                    samples.add(key, a)
            a = await call(cpc, "cancel_task", {"task_id": task_id, "reason": "benchmark"})
            if record:
                samples.add("cancel", a)

        for i in range(cfg.warmup):
            await round_(i, False)
        gc.collect()
        cpu0 = {k: cpu_seconds(srv[k + "_pid"]) for k in ("noop", "cp") if srv[k + "_pid"]}
        t0 = time.perf_counter()
        rounds = 0
        least = 2 * len(lists)  # every list filter measured at least twice, whatever the budget
        while rounds < cfg.rounds and (rounds < least or time.perf_counter() - t0 < cfg.budget_s):
            await round_(rounds, True)
            rounds += 1
        out["measure_s"] = time.perf_counter() - t0
        out["rounds"] = rounds
        out["budget_hit"] = rounds < cfg.rounds
        if cpu0:  # server CPU per call served, unmeasured calls and background loops included
            calls = {"noop": rounds * 3, "cp": rounds * 8}
            out["server_cpu_ms_per_call"] = {k: (cpu_seconds(srv[k + "_pid"]) - cpu0[k]) * 1000 / calls[k]
                                             for k in cpu0}
            out["server_rss_mb"] = {k: psutil.Process(srv[k + "_pid"]).memory_info().rss / MB for k in cpu0}

    base = summary(samples.ms["noop"])
    out["noop"] = base
    for key in ("submit", "status_queued", "status_running", "cancel"):
        out[key] = samples.summary(key, base["p50_ms"])
    out["list"] = {k: samples.summary("list:" + k, base["p50_ms"]) for k in lists}
    out["list_all"] = summary([x for k in lists for x in samples.ms["list:" + k]])
    out["tail"] = {k: samples.summary("tail:" + k, base["p50_ms"]) for k in tails}
    start = out["tail"]["start"]["p50_ms"]
    out["tail_end_vs_start"] = out["tail"]["end"]["p50_ms"] / start
    out["tail_from_end_vs_start"] = out["tail"]["from_end"]["p50_ms"] / start
    return out


# ==== 4: submit-to-running on the local provider ===================================================
@asynccontextmanager
async def local_server(cfg: Config, home: Path, tmp: Path) -> AsyncIterator[Any]:
    """The control plane with its real local provider: `HttpServer` in a subprocess, as
    `controlplane serve --transport http` runs it (or in-process for memory)."""
    if cfg.transport == "http":
        proc = helper("local", tmp, "controlplane", "--home", str(home)).start()
        try:
            await proc.wait_ready()
            yield ready_info(proc)["url"]
        finally:
            proc.stop()
    else:
        from controlplane.app import ControlPlane
        from controlplane.mcp.server import build_server
        from controlplane.settings import Settings

        cp = ControlPlane(Settings(home=home))
        try:
            yield build_server(cp, with_auth=False)
        finally:
            cp.db.dispose()


async def bench_local(cfg: Config, tmp: Path) -> dict[str, Any]:
    home = tmp / "local"
    client_ms: list[float] = []
    server_ms: list[float] = []
    try:
        async with local_server(cfg, home, tmp) as target, Client(target, timeout=60) as client:
            for i in range(cfg.local_tasks + 1):  # the first one warms up (imports, page cache)
                t0 = time.perf_counter()
                sub = (await call(client, "submit_task",
                                  {"tool_name": "exercise", "inputs": {"sleep_s": cfg.sleep_s}})).data
                tid = sub["task_id"]
                while True:
                    st = (await call(client, "get_task_status", {"task_id": tid})).data
                    if st["state"] == "running":
                        seen = (time.perf_counter() - t0) * 1000
                        break
                    if st["state"] in TERMINAL:
                        raise BenchError(f"exercise task ended {st['state']} before it was seen running: {st}")
                    if time.perf_counter() - t0 > 60:
                        raise BenchError(f"exercise task still {st['state']} after 60 s")
                    await asyncio.sleep(0.01)
                recorded = (parse_iso(st["started_at"]) - parse_iso(st["submitted_at"])) * 1000
                while st["state"] not in TERMINAL:  # free the slot before the next one
                    await asyncio.sleep(0.1)
                    st = (await call(client, "get_task_status", {"task_id": tid})).data
                    if time.perf_counter() - t0 > 120:
                        raise BenchError(f"exercise task still {st['state']} after 120 s")
                if st["state"] != "succeeded":
                    raise BenchError(f"exercise task ended {st['state']}: {st.get('error')}")
                if i:
                    client_ms.append(seen)
                    server_ms.append(recorded)
    finally:
        reap_jobs(home)
    return {"client": summary(client_ms), "server_recorded": summary(server_ms), "sleep_s": cfg.sleep_s}


# ==== 5-6: reconciler cycle and RSS with 10k in flight =============================================
async def bench_inflight(cfg: Config, tmp: Path) -> dict[str, Any]:
    from controlplane.settings import Settings
    from controlplane.store.db import Database

    home = tmp / "inflight"
    settings = Settings(home=home)
    settings.ensure_home()
    db = Database(settings.resolved_database_url)
    db.upgrade()
    ids = seed_inflight(db, cfg.inflight, seed=cfg.seed)
    db.engine.dispose()

    proc = helper("inflight", tmp, "controlplane", "--home", str(home), "--double", "--batch", str(cfg.batch),
                  "--cycles", str(cfg.cycles)).start()
    try:
        await proc.wait_ready(timeout=300)
        info = ready_info(proc)
        # Use the server a little, let its own reconciler loop run a cycle or two over the 10k
        # jobs (the leader is woken at once, then every reconcile_interval_s), and watch its RSS.
        async with Client(info["url"], timeout=60) as client:
            page = (await call(client, "list_tasks", {"states": ["running"], "limit": 200})).data
            st = (await call(client, "get_task_status", {"task_id": ids[len(ids) // 2]})).data
            if len(page["tasks"]) != 200 or st["state"] != "running":
                raise BenchError("the in-flight server does not show its running tasks")
        p = psutil.Process(proc.pid)
        rss = []
        for _ in range(12):  # 3 s: at least one background cycle (reconcile_interval_s = 2 s)
            rss.append(p.memory_info().rss)
            await asyncio.sleep(0.25)
    finally:
        proc.stop()
    allowed = math.ceil(cfg.inflight / cfg.batch)
    cycles = info["cycles"]
    for c in cycles:
        c["allowed_poll_calls"] = allowed
    return {"n": cfg.inflight, "batch": cfg.batch, "allowed_poll_calls": allowed, "cycles": cycles,
            "rss_mb": {"peak_while_serving": max(rss) / MB, "last": rss[-1] / MB,
                       "after_import": info["rss_after_import"] / MB, "after_open": info["rss_after_open"] / MB,
                       "after_cycles": info["rss_after_cycles"] / MB}}


# ==== report =======================================================================================
def verdicts(r: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every target: the measured value, the limit, and whether it is met."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, value: float, limit: float, unit: str) -> None:
        out[name] = {"value": value, "limit": limit, "unit": unit, "pass": bool(value <= limit)}

    lat = r["latency"]
    add("submit_task p50 / no-op p50", lat["submit"]["ratio_p50"], SUBMIT_RATIO, "x")
    add("get_task_status (queued) p50 / no-op p50", lat["status_queued"]["ratio_p50"], STATUS_RATIO, "x")
    add("get_task_status (running) p50 / no-op p50", lat["status_running"]["ratio_p50"], STATUS_RATIO, "x")
    for k, s in lat["list"].items():
        add(f"list_tasks [{k}] p99", s["p99_ms"], LIST_P99_MS, "ms")
    add("tail_task_logs end / start (p50)", lat["tail_end_vs_start"], TAIL_END_VS_START, "x")
    add("tail_task_logs from_end / start (p50)", lat["tail_from_end_vs_start"], TAIL_END_VS_START, "x")
    inf = r["inflight"]
    for c in inf["cycles"]:
        add(f"reconciler cycle {c['cycle']} wall", c["wall_s"], CYCLE_WALL_S, "s")
        add(f"reconciler cycle {c['cycle']} poll calls", c["poll_calls"], inf["allowed_poll_calls"], "calls")
    add("RSS with 10k in flight (peak)", inf["rss_mb"]["peak_while_serving"], RSS_MB, "MB")
    for name, v in r.get("concurrency", {}).get("verdicts", {}).items():  # ratios that must reach a floor
        out[name] = {"value": v["value"], "limit": v["limit"], "unit": "x (at least)", "pass": v["pass"]}
    for part in ("scale", "inflight_scale"):
        for name, v in r.get(part, {}).get("verdicts", {}).items():
            out[f"{part}: {name}"] = v
    return out


def render(r: dict[str, Any], console: Console) -> None:
    """The human-readable table (the JSON line after it has every figure)."""
    cfg = r["config"]
    lat, v = r["latency"], r["verdicts"]
    small = cfg["history"] < 100_000 or cfg["log_lines"] < 1_000_000
    size_note = (f"{cfg['history']:,} stored tasks, {cfg['log_lines']:,}-line log"
                 + (" (QUICK MODE: fewer calls)" if cfg["quick"] else "")
                 + (" (SMALLER than the issue's 100k tasks / 1M log lines)" if small else ""))
    t = Table(title=f"mcp-controlplane benchmark — transport {cfg['transport']}, {size_note}",
              title_justify="left", caption="'in tool': the p50 of the tool's own duration (service call and "
              "its thread hop), the rest of a call is MCP, transport and client", caption_justify="left")
    for col, just in (("measure", "left"), ("n", "right"), ("p50", "right"), ("p99", "right"), ("in tool", "right"),
                      ("figure", "right"), ("target", "left"), ("", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]

    def ms(x: float | None) -> str:
        return "" if x is None else f"{x:.2f} ms"

    def mark(*keys: str) -> str:
        if not keys:
            return "[dim]info[/]"
        return "[green]PASS[/]" if all(v[k]["pass"] for k in keys) else "[bold red]MISS[/]"

    def row(label: str, s: dict[str, Any] | None, figure: str = "", target: str = "", *keys: str,
            info: bool = True) -> None:
        s = s or {}
        t.add_row(escape(label), str(s.get("n", "")), ms(s.get("p50_ms")), ms(s.get("p99_ms")),
                  ms(s.get("tool_p50_ms")), figure, target, mark(*keys) if keys or info else "")

    noop_how = "separate FastMCP server" + ("" if cfg["transport"] == "http" else ", in-memory")
    row(f"no-op tool ({noop_how})", lat["noop"], "1.00x", info=False)
    for key, label, limit, vkey in (
        ("submit", "submit_task", SUBMIT_RATIO, "submit_task p50 / no-op p50"),
        ("status_queued", "get_task_status (queued task)", STATUS_RATIO, "get_task_status (queued) p50 / no-op p50"),
        ("status_running", "get_task_status (running task)", STATUS_RATIO,
         "get_task_status (running) p50 / no-op p50"),
        ("cancel", "cancel_task (queued task)", None, None),
    ):
        s = lat[key]
        row(label, s, f"{s['ratio_p50']:.2f}x no-op", f"p50 <= {limit}x no-op" if limit else "",
            *([vkey] if vkey else []))
    t.add_section()
    for k, s in lat["list"].items():
        row(f"list_tasks: {k}", s, f"{s['ratio_p50']:.2f}x no-op", f"p99 <= {LIST_P99_MS:g} ms",
            f"list_tasks [{k}] p99")
    row("list_tasks: all filters together", lat["list_all"], info=False)
    t.add_section()
    s = lat["tail"]["start"]
    row("tail_task_logs: near the start", s, f"{s['ratio_p50']:.2f}x no-op")
    for k, label in (("end", "near the end"), ("from_end", "from_end")):
        vkey = f"tail_task_logs {k} / start (p50)"
        row(f"tail_task_logs: {label}", lat["tail"][k], f"{v[vkey]['value']:.2f}x start",
            f"<= {TAIL_END_VS_START}x start", vkey)
    t.add_section()
    loc = r["local"]
    row(f"local submit->running, client view (exercise, sleep_s={loc['sleep_s']:g})", loc["client"])
    row("local submit->running, server timestamps", loc["server_recorded"])
    t.add_section()
    inf = r["inflight"]
    for c in inf["cycles"]:
        kind = "first poll" if c["cycle"] == 1 else "steady"
        t.add_row(f"reconciler cycle {c['cycle']} ({kind}), {c['jobs']:,} jobs", "", f"{c['wall_s'] * 1000:.0f} ms",
                  "", "", f"{c['poll_calls']} polls, CPU {c['cpu_s'] * 1000:.0f} ms",
                  f"< {CYCLE_WALL_S:g} s, <= {inf['allowed_poll_calls']} polls",
                  mark(f"reconciler cycle {c['cycle']} wall", f"reconciler cycle {c['cycle']} poll calls"))
    t.add_row(f"server RSS, {inf['n']:,} in flight (peak while serving)", "", "", "", "",
              f"{inf['rss_mb']['peak_while_serving']:.0f} MB", f"< {RSS_MB:g} MB", mark("RSS with 10k in flight (peak)"))
    console.print(t)
    extra = [f"{lat['rounds']} measured rounds in {lat['measure_s']:.0f} s"
             + (" (time budget reached)" if lat["budget_hit"] else ""), f"protocol {lat.get('protocol_version')}"]
    if "server_cpu_ms_per_call" in lat:
        cpu, rss = lat["server_cpu_ms_per_call"], lat["server_rss_mb"]
        extra.append(f"server CPU per call: no-op {cpu['noop']:.2f} ms, control plane {cpu['cp']:.2f} ms (background "
                     f"loops included); server RSS: no-op {rss['noop']:.0f} MB, control plane with "
                     f"{cfg['history']:,} tasks {rss['cp']:.0f} MB")
    console.print("; ".join(extra))
    if "concurrency" in r:
        from bench.concurrency import render as render_concurrency

        render_concurrency(r["concurrency"], console)
    if lat.get("cp_socket_ipproto_tcp") is False:
        console.print("[bold yellow]warning:[/] the control plane's listening socket is not IPPROTO_TCP, so its "
                      "connections lack TCP_NODELAY: each HTTP answer waits ~40 ms on Nagle + delayed ACK")
    missed = [k for k, x in v.items() if not x["pass"]]
    console.print(f"{len(v) - len(missed)}/{len(v)} targets met"
                  + (f"; missed: {escape(', '.join(missed))}" if missed else ""))


def run(cfg: Config, tmp: Path, console: Console) -> dict[str, Any]:
    """Every part in its own event loop. With `--transport memory` the control planes run in this
    process, and a control plane that stops leaves its internal listener's socket registered in the
    loop's selector after closing it (see the report of this benchmark): a later listener that
    gets the same fd number in the same loop would never accept a connection."""
    r: dict[str, Any] = {"benchmark": "mcp-controlplane", "config": asdict(cfg)}
    t0 = time.perf_counter()
    console.log(f"[bold]1-3[/] MCP latency over {cfg.transport} (up to {cfg.rounds} rounds or {cfg.budget_s:g} s, "
                f"after {cfg.warmup} warm-up rounds)")
    r["latency"] = asyncio.run(bench_latency(cfg, tmp, console))
    console.log(f"[bold]4[/] local provider submit->running ({cfg.local_tasks} tasks)")
    r["local"] = asyncio.run(bench_local(cfg, tmp))
    console.log(f"[bold]5-6[/] reconciler cycle and RSS with {cfg.inflight:,} tasks in flight")
    r["inflight"] = asyncio.run(bench_inflight(cfg, tmp))
    console.log("[bold]7[/] calls per second with 1, 4, 16 and 64 concurrent clients, both protocol eras")
    from bench.concurrency import bench_concurrency

    (tmp / "concurrency").mkdir()
    r["concurrency"] = asyncio.run(bench_concurrency(tmp / "concurrency", console, quick=cfg.quick, seed=cfg.seed))
    console.log(f"[bold]8[/] a million tasks on file{' (quick: 200k)' if cfg.quick else ''}: size, start-up, "
                "list, submit/status, one expiry sweep")
    from bench.scale import bench_scale

    r["scale"] = asyncio.run(bench_scale(tmp, console, quick=cfg.quick))
    console.log(f"[bold]9[/] memory per in-flight task and the reconciler cycle at {'10k and 30k' if cfg.quick else '10k and 100k'}")
    from bench.inflight import bench_inflight_scale

    (tmp / "inflight-scale").mkdir()
    r["inflight_scale"] = asyncio.run(bench_inflight_scale(cfg.quick, tmp / "inflight-scale", console))
    r["verdicts"] = verdicts(r)
    r["all_pass"] = all(x["pass"] for x in r["verdicts"].values())
    r["elapsed_s"] = time.perf_counter() - t0
    import fastmcp

    r["env"] = {"python": platform.python_version(), "fastmcp": fastmcp.__version__, "cpus": os.cpu_count(),
                "platform": platform.platform(), **git_state()}
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="See the module docstring of bench/run.py for what each measure means.")
    ap.add_argument("--quick", action="store_true", help="20k tasks, 200k log lines, fewer calls: under a minute")
    ap.add_argument("--transport", choices=["http", "memory"], default="http",
                    help="how the MCP calls reach the servers (default: Streamable HTTP on 127.0.0.1)")
    ap.add_argument("--tasks", type=int, help="stored tasks for list_tasks (default 100000, quick 20000)")
    ap.add_argument("--log-lines", type=int, help="lines of the long log (default 1000000, quick 200000)")
    ap.add_argument("--rounds", type=int, help="measured call rounds (default 2000, quick 360)")
    ap.add_argument("--budget", type=float, help="stop the measured rounds after this many seconds "
                    "(default 240, quick 20); the report gives the number of samples")
    ap.add_argument("--settle-ms", type=float, default=25.0,
                    help="pause after each submit and cancel, for the work they wake (default 25)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--keep", action="store_true", help="keep the temporary homes and server logs")
    args = ap.parse_args()
    q = args.quick
    cfg = Config(
        quick=q, transport=args.transport,
        history=args.tasks or (20_000 if q else 100_000),
        log_lines=args.log_lines or (200_000 if q else 1_000_000),
        warmup=20 if q else 100, rounds=args.rounds or (360 if q else 2000),
        local_tasks=5 if q else 20, sleep_s=1.0, inflight=10_000, batch=100, cycles=3,
        budget_s=args.budget or (20.0 if q else 240.0), settle_ms=args.settle_ms, seed=args.seed,
    )
    for k in [k for k in os.environ if k.startswith("CONTROLPLANE_")]:
        del os.environ[k]  # an isolated run: nothing from the caller's control plane settings
    console = Console(width=None if sys.stdout.isatty() else 150)
    tmp = Path(tempfile.mkdtemp(prefix="cp-bench-"))
    try:
        result = run(cfg, tmp, console)
    except BenchError as e:
        console.print(f"[bold red]benchmark failed:[/] {e}")
        print(json.dumps({"benchmark": "mcp-controlplane", "config": asdict(cfg), "error": str(e)}))
        return 1
    finally:
        if args.keep:
            console.log(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    render(result, console)
    print(json.dumps(finite(result), separators=(",", ":"), allow_nan=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
