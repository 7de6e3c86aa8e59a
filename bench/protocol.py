"""The MCP-native surface, measured: `python bench/protocol.py [--quick]`.

1. `tasks/get` (the tasks extension, 2026-07-28) as ratios to a no-op tool call measured in the
   same run (target p50 <= 1.2x): of a working task and of a completed one (its result inline),
   beside `get_task_status` of the same tasks. Two no-op baselines: fastmcp's default (each answer
   an SSE stream) and `json_response=True`; the target is checked against the JSON one, the
   stricter. A client with the tasks extension calls all of them (so it sends the same `_meta`).
2. The direct JSON path for calls that stream nothing (`controlplane/http/quiet_json.py`) against
   the SDK's default 2026-07-28 path, which opens a deferred SSE response (task group, channel,
   disconnect watcher) and falls back to a JSON body when the handler sent nothing: the same
   calls against a second control plane with `json_responses=false` ("deferred"), and the same
   pair of no-op servers (fastmcp default vs `json_response=True`), interleaved; through
   fastmcp's Client and as bare HTTP POSTs (httpx, 2026-07-28 headers), which show the server
   and wire cost without the client library's.
3. Progress latency on the real local provider (target p50 <= 100 ms): a catalog tool
   (`bench/probe_tool.py`) reports a step every `--interval` s with its wall-clock time in the
   message; the client follows the task with `wait_task` and a progressToken and, for every
   `notifications/progress` it receives, takes now - that time. This spans the tool's report to
   the runner, the runner's batching (50 ms) and HTTP callback, the ingest into the store, the
   server's wake-up of the waiting call, and the notification over the SSE stream.

Servers are subprocesses on 127.0.0.1 (`bench/servers.py`), each with a fresh home; the control
planes run the real local provider. Calls are warmed up, then interleaved round by round in a
random order, so drift hits every measure alike. Figures mean something only as ratios within
one run. The last line of stdout is one JSON object with every figure; the exit code is 0 unless
something did not work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from fastmcp import Client  # noqa: E402
from fastmcp_tasks import call_tool_task  # noqa: E402
from fastmcp_tasks.client import TasksClientExtension  # noqa: E402
from fastmcp_tasks.client_models import ClientGetTaskResult, GetTaskRequest, GetTaskRequestParams  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench.harness import BenchError, ServerProc, finite, helper, ready_info, reap_jobs, summary  # noqa: E402
from tests.wire import modern_request  # noqa: E402

TASKS_GET_RATIO = 1.2
PROGRESS_P50_MS = 100.0
PROBE_TOOL = """
[tools.progress_probe]
description = "Reports progress steps whose messages carry the time they were made (bench/protocol.py)."
resource_class = "cpu_small"
command = ["{python}", "-m", "bench.probe_tool"]
estimate_s = 5

[tools.progress_probe.input_schema]
type = "object"
additionalProperties = false
properties.steps = { type = "integer", minimum = 1, maximum = 1000 }
properties.interval_s = { type = "number", minimum = 0, maximum = 60 }
"""


def controlplane(name: str, tmp: Path, *settings: str) -> ServerProc:
    from controlplane.catalog import default_catalog_text

    home = tmp / name
    home.mkdir(parents=True)
    (home / "catalog.toml").write_text(default_catalog_text() + PROBE_TOOL)
    args = [a for kv in settings for a in ("--set", kv)]
    return helper(name, tmp, "controlplane", "--home", str(home), *args)


def client(url: str) -> Client:
    return Client(url, extensions=[TasksClientExtension()], timeout=60)


async def tool_call(c: Client, tool: str, args: dict[str, Any]) -> dict[str, Any]:
    res = await c.call_tool(tool, args, raise_on_error=False)
    data = res.structured_content or (json.loads(res.content[0].text) if res.content else {})
    if res.is_error:
        raise BenchError(f"{tool}({json.dumps(args)}) answered an error: {data}")
    return data


async def tasks_get(c: Client, task_id: str) -> ClientGetTaskResult:
    return await c.session.send_request(GetTaskRequest(params=GetTaskRequestParams(task_id=task_id)),
                                        ClientGetTaskResult)


TASKS_META = {"io.modelcontextprotocol/clientCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}}


def raw_call(http: httpx.AsyncClient, url: str, method: str, params: dict[str, Any], expect: str) -> Any:
    """A 2026-07-28 request as bare HTTP: what the server and the wire cost without a client
    library's own overhead. `expect` is the content type the answer must have."""
    body, headers = modern_request(method, params, meta=TASKS_META)

    async def go() -> None:
        r = await http.post(url, json=body, headers=headers)
        kind = r.headers.get("content-type", "")
        if r.status_code != 200 or not kind.startswith(expect) or '"error":' in r.text[:300]:
            raise BenchError(f"{method} answered {r.status_code} {kind}: {r.text[:300]}")

    return go


async def prepare(c: Client) -> dict[str, str]:
    """A task that keeps working (it sleeps) and one that completed, with its result."""
    working = (await call_tool_task(c, "exercise", {"sleep_s": 3600})).task_id
    done = (await call_tool_task(c, "exercise", {"log_lines": 3, "progress_steps": 2})).task_id
    deadline = time.monotonic() + 60
    while True:
        w, d = await tasks_get(c, working), await tasks_get(c, done)
        st = (await tool_call(c, "get_task_status", {"task_id": working}))["state"]
        if st == "running" and d.status == "completed" and w.status == "working":
            return {"working": working, "done": done}
        if d.status in ("failed", "cancelled"):
            raise BenchError(f"the completed task ended {d.status}")
        if time.monotonic() > deadline:
            raise BenchError(f"tasks not ready after 60 s: {st}, {d.status}")
        await asyncio.sleep(0.05)


async def bench_calls(cfg: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    procs = {"noop_sse": helper("noop_sse", tmp, "noop"), "noop_json": helper("noop_json", tmp, "noop", "--json"),
             "cp_json": controlplane("cp_json", tmp, "json_responses=true"),
             "cp_sse": controlplane("cp_sse", tmp, "json_responses=false")}
    try:
        for p in procs.values():
            p.start()
        await asyncio.gather(*(p.wait_ready() for p in procs.values()))
        urls = {k: ready_info(p)["url"] for k, p in procs.items()}
        async with client(urls["noop_sse"]) as noop_sse, client(urls["noop_json"]) as noop_json, \
                client(urls["cp_json"]) as cpj, client(urls["cp_sse"]) as cps, httpx.AsyncClient() as http:
            tj, ts = await prepare(cpj), await prepare(cps)
            J = S = "application/json"  # the deferred path answers JSON too when nothing was sent
            noop = {"name": "noop", "arguments": {}}
            status_j = {"name": "get_task_status", "arguments": {"task_id": tj["working"]}}
            status_s = {"name": "get_task_status", "arguments": {"task_id": ts["working"]}}
            calls = {
                "raw noop (deferred)": raw_call(http, urls["noop_sse"], "tools/call", noop, S),
                "raw noop (json)": raw_call(http, urls["noop_json"], "tools/call", noop, J),
                "raw tasks/get working": raw_call(http, urls["cp_json"], "tasks/get", {"taskId": tj["working"]}, J),
                "raw tasks/get working (deferred)": raw_call(http, urls["cp_sse"], "tasks/get", {"taskId": ts["working"]}, S),
                "raw get_task_status working": raw_call(http, urls["cp_json"], "tools/call", status_j, J),
                "raw get_task_status working (deferred)": raw_call(http, urls["cp_sse"], "tools/call", status_s, S),
                "noop (deferred)": lambda: noop_sse.call_tool("noop", {}),
                "noop (json)": lambda: noop_json.call_tool("noop", {}),
                "tasks/get working": lambda: tasks_get(cpj, tj["working"]),
                "tasks/get completed": lambda: tasks_get(cpj, tj["done"]),
                "get_task_status working": lambda: tool_call(cpj, "get_task_status", {"task_id": tj["working"]}),
                "tasks/get working (deferred)": lambda: tasks_get(cps, ts["working"]),
                "tasks/get completed (deferred)": lambda: tasks_get(cps, ts["done"]),
                "get_task_status working (deferred)": lambda: tool_call(cps, "get_task_status", {"task_id": ts["working"]}),
            }
            ms: dict[str, list[float]] = {k: [] for k in calls}
            rng = random.Random(cfg.seed)
            keys = list(calls)
            started = time.perf_counter()
            for r in range(cfg.warmup + cfg.rounds):
                rng.shuffle(keys)
                for k in keys:
                    t0 = time.perf_counter()
                    await calls[k]()
                    if r >= cfg.warmup:
                        ms[k].append((time.perf_counter() - t0) * 1000)
                if r >= cfg.warmup and time.perf_counter() - started > cfg.budget:
                    break
            await tool_call(cpj, "cancel_task", {"task_id": tj["working"]})
            await tool_call(cps, "cancel_task", {"task_id": ts["working"]})
            await asyncio.sleep(1.5)  # the runners stop
        out: dict[str, Any] = {k: summary(v) for k, v in ms.items()}
        for k, s in out.items():  # raw calls against the raw no-op, client calls against the client's
            prefix = "raw " if k.startswith("raw ") else ""
            s["vs_noop_json"] = s["p50_ms"] / out[f"{prefix}noop (json)"]["p50_ms"]
            s["vs_noop_sse"] = s["p50_ms"] / out[f"{prefix}noop (deferred)"]["p50_ms"]
        pairs = {k: (f"{k} (deferred)", k) for k in ("tasks/get working", "tasks/get completed",
                                                       "get_task_status working", "raw tasks/get working",
                                                       "raw get_task_status working")}
        pairs.update({n: (f"{n} (deferred)", f"{n} (json)") for n in ("noop", "raw noop")})
        json_vs_sse = {k: out[a]["p50_ms"] / out[b]["p50_ms"] for k, (a, b) in pairs.items()}
        out["json_vs_sse"] = json_vs_sse
        return out
    finally:
        for p in procs.values():
            p.stop()
        for name in ("cp_json", "cp_sse"):
            reap_jobs(tmp / name)


async def follow_probes(submit_url: str, follow_url: str, tasks: int, steps: int,
                        interval: float) -> tuple[list[float], list[int]]:
    """Submit `tasks` probe tasks (plus one to warm up) on `submit_url` and follow each with
    wait_task on `follow_url` (the same server, or another replica): the latencies (ms) of the
    notifications, and how many each task had."""
    latencies: list[float] = []
    per_task: list[int] = []
    async with Client(submit_url, timeout=120) as s, Client(follow_url, timeout=120) as c:
        for i in range(tasks + 1):  # the first warms up (imports, page cache)
            got: list[float] = []

            async def on_progress(progress: float, total: float | None, message: str | None,
                                  got: list[float] = got) -> None:
                now = time.time()
                m = re.search(r"t=(\d+\.\d+)", message or "")
                if m:
                    got.append((now - float(m.group(1))) * 1000)

            # submit_task answers at once whatever the client (importing fastmcp_tasks makes
            # every fastmcp Client wait for a catalog tool's task to finish)
            task_id = (await tool_call(s, "submit_task", {"tool_name": "progress_probe", "inputs": {
                "steps": steps, "interval_s": interval}}))["task_id"]
            res = await c.call_tool("wait_task", {"task_id": task_id, "timeout_s": 120},
                                    progress_handler=on_progress, raise_on_error=False)
            data = res.structured_content or {}
            if res.is_error or data.get("state") != "succeeded":
                raise BenchError(f"the probe task did not succeed: {data}")
            if i:
                latencies.extend(got)
                per_task.append(len(got))
    return latencies, per_task


async def bench_progress(cfg: argparse.Namespace, tmp: Path, console: Console) -> dict[str, Any]:
    proc = controlplane("cp_progress", tmp)
    try:
        proc.start()
        await proc.wait_ready()
        url = ready_info(proc)["url"]  # the two-stage answer, then wait_task
        latencies, per_task = await follow_probes(url, url, cfg.progress_tasks, cfg.steps, cfg.interval)
    finally:
        proc.stop()
        reap_jobs(tmp / "cp_progress")
    return {**summary(latencies), "notifications_per_task": per_task, "steps_per_task": cfg.steps,
            "interval_s": cfg.interval}


def render(r: dict[str, Any], console: Console) -> None:
    t = Table(title="1-2. call latency (ms), ratios to the no-op call's p50 in the same run "
                    "(raw HTTP calls to the raw no-op)")
    for col in ("call", "n", "p50", "p99", "vs no-op json", "vs no-op deferred"):
        t.add_column(col, justify="left" if col == "call" else "right")
    for k, s in r["calls"].items():
        if k == "json_vs_sse":
            continue
        t.add_row(k, str(s["n"]), f"{s['p50_ms']:.2f}", f"{s['p99_ms']:.2f}", f"{s['vs_noop_json']:.2f}x",
                  f"{s['vs_noop_sse']:.2f}x")
    console.print(t)
    for k, v in r["calls"]["json_vs_sse"].items():
        console.print(f"  {k}: the deferred path takes {v:.2f}x the direct JSON path (p50)")
    p = r["progress"]
    console.print(f"3. progress latency, tool report -> client notification: p50 {p['p50_ms']:.1f} ms, "
                  f"p99 {p['p99_ms']:.1f} ms, max {p['max_ms']:.1f} ms over {p['n']} notifications "
                  f"({p['notifications_per_task']} per task of {p['steps_per_task']} steps)")
    for name, v in r["verdicts"].items():
        console.print(f"  {'PASS' if v['pass'] else 'MISS'} {name}: {v['value']:.2f} (target {v['target']})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer calls and tasks: about half a minute")
    ap.add_argument("--rounds", type=int, help="measured call rounds (default 600, quick 120)")
    ap.add_argument("--budget", type=float, help="stop the measured rounds after this many seconds")
    ap.add_argument("--progress-tasks", type=int, help="probe tasks followed (default 5, quick 2)")
    ap.add_argument("--steps", type=int, default=20, help="progress steps per probe task")
    ap.add_argument("--interval", type=float, default=0.3,
                    help="seconds between steps (> 0.25: the 4-per-second throttle would coalesce them)")
    ap.add_argument("--seed", type=int, default=7)
    cfg = ap.parse_args()
    cfg.warmup = 20 if cfg.quick else 60
    cfg.rounds = cfg.rounds or (120 if cfg.quick else 600)
    cfg.budget = cfg.budget or (20.0 if cfg.quick else 120.0)
    cfg.progress_tasks = cfg.progress_tasks or (2 if cfg.quick else 5)
    for k in [k for k in os.environ if k.startswith("CONTROLPLANE_")]:
        del os.environ[k]
    console = Console(width=None if sys.stdout.isatty() else 150)
    tmp = Path(tempfile.mkdtemp(prefix="cp-bench-protocol-"))
    r: dict[str, Any] = {"benchmark": "mcp-controlplane protocol", "config": vars(cfg)}
    try:
        console.log("1-2. tasks/get, get_task_status and no-op calls (direct JSON and deferred paths)")
        r["calls"] = asyncio.run(bench_calls(cfg, tmp, console))
        console.log("3. progress latency on the local provider")
        r["progress"] = asyncio.run(bench_progress(cfg, tmp, console))
    except BenchError as e:
        console.print(f"[bold red]benchmark failed:[/] {e}")
        print(json.dumps({"benchmark": r["benchmark"], "error": str(e)}))
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c = r["calls"]
    r["verdicts"] = {
        "tasks/get working p50 / no-op (json) p50": {"value": c["tasks/get working"]["vs_noop_json"],
                                                      "target": f"<= {TASKS_GET_RATIO}"},
        "tasks/get completed p50 / no-op (json) p50": {"value": c["tasks/get completed"]["vs_noop_json"],
                                                        "target": f"<= {TASKS_GET_RATIO}"},
        "progress latency p50 (ms)": {"value": r["progress"]["p50_ms"], "target": f"<= {PROGRESS_P50_MS:g}"},
    }
    for name, v in r["verdicts"].items():
        limit = TASKS_GET_RATIO if "tasks/get" in name else PROGRESS_P50_MS
        v["pass"] = v["value"] <= limit
    render(r, console)
    print(json.dumps(finite(r), separators=(",", ":"), allow_nan=False, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
