"""A task's whole life through the MCP tools, as an agent sees it: submit, status with progress,
logs, result with a working artifact link, listing, and the audit trail behind it."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from tests import odd_text_tool
from tests.conftest import FAST, Agent, catalog_text

pytestmark = pytest.mark.anyio


async def test_submit_run_and_collect(agent: Agent, cp) -> None:
    sub = await agent.call("submit_task", tool_name="exercise",
                           inputs={"progress_steps": 5, "sleep_s": 0.5, "log_lines": 300, "artifact_bytes": 200_000,
                                   "result": {"answer": 42}},
                           tags=["project:demo"])
    assert sub["state"] == "queued" and sub["queue"] == "cpu_small" and sub["position"] == 1
    assert sub["task_id"].startswith("tsk_") and sub["poll_after_ms"] > 0

    st = await agent.wait(sub["task_id"])
    assert st["state"] == "succeeded", st
    assert st["progress"]["step"] == 5 and st["progress"]["step_total"] == 5 and st["progress"]["percent"] == 100
    assert st["attempt"] == 1 and st["started_at"] and st["completed_at"] and st["error"] is None

    lines = await agent.all_logs(sub["task_id"])
    assert [ln["message"] for ln in lines] == [f"line {i}" for i in range(300)]
    assert [ln["seq"] for ln in lines] == list(range(1, 301))

    res = await agent.call("get_task_result", task_id=sub["task_id"])
    assert res["state"] == "succeeded" and res["error"] is None
    assert res["result"]["answer"] == 42 and res["result"]["steps"] == 5
    [art] = res["artifacts"]
    assert art["name"] == "data.bin" and art["size_bytes"] == 200_000 and art["kind"] == "binary"
    async with httpx.AsyncClient() as http:
        body = (await http.get(art["download_url"])).content
    assert len(body) == art["size_bytes"]
    assert hashlib.sha256(body).hexdigest() == art["sha256"] == res["result"]["artifact_sha256"]

    listed = await agent.call("list_tasks", tags_any=["project:demo"])
    assert [t["task_id"] for t in listed["tasks"]] == [sub["task_id"]]

    kinds = [(e.kind, e.from_state, e.to_state) for e in cp.store.logs.events(sub["task_id"])]
    assert kinds == [
        ("submitted", None, "queued"),
        ("scheduled", "queued", "scheduled"),
        ("launched", None, None),
        ("running", "scheduled", "running"),
        ("succeeded", "running", "succeeded"),
    ]


async def test_a_catalog_tool_answers_in_the_shape_of_submit_task(agent: Agent) -> None:
    """One shape: a catalog tool called directly answers what submit_task answers (`state`, the
    queue, the estimate and its cost), plus a message saying how to follow the task."""
    direct = await agent.call("exercise", sleep_s=0)
    submitted = await agent.call("submit_task", tool_name="exercise", inputs={"sleep_s": 0})
    assert set(direct) == set(submitted) | {"message"}
    assert direct["state"] == submitted["state"] == "queued" and "status" not in direct
    assert direct["estimated_cost"]["currency"] == submitted["estimated_cost"]["currency"]
    for tid in (direct["task_id"], submitted["task_id"]):
        assert (await agent.wait(tid))["state"] == "succeeded"


async def test_catalog_tool_answers_with_task_and_estimate(agent: Agent) -> None:
    out = await agent.call("lj_relax", n_atoms=13, fmax=0.01)
    assert set(out) >= {"task_id", "state", "estimated_runtime_seconds", "message"}
    assert out["state"] == "queued" and out["estimated_runtime_seconds"] > 0
    st = await agent.wait(out["task_id"])
    assert st["state"] == "succeeded"
    res = await agent.call("get_task_result", task_id=out["task_id"])
    # LJ13 relaxes to its icosahedral minimum from this start: E = -44.3268 (reduced units)
    assert res["result"]["energy"] == pytest.approx(-44.3268, abs=1e-3)
    assert res["result"]["converged"] is True
    assert res["artifacts"][0]["name"] == "trajectory.xyz" and res["artifacts"][0]["kind"] == "trajectory"


async def test_failed_tool_reports_exit_code(agent: Agent) -> None:
    tid = await agent.submit(inputs={"exit_code": 3, "log_lines": 2})
    st = await agent.wait(tid)
    assert st["state"] == "failed"
    assert st["error"]["code"] == "TOOL_FAILED" and st["error"]["exit_code"] == 3
    res = await agent.call("get_task_result", task_id=tid)
    assert res["error"]["code"] == "TOOL_FAILED"


async def test_nul_in_inputs_comes_back_intact_and_in_output_is_kept_alike(home: Path) -> None:
    """NUL (U+0000) reaches the tool and its result intact (both are kept as JSON), and what the tool
    prints or reports with NUL in it is kept with U+FFFD instead on every engine (PostgreSQL's text
    cannot hold NUL): the task succeeds either way."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + odd_text_tool.CATALOG_ENTRY)
    async with Client(build_server(ControlPlane(Settings(home=home, **FAST)))) as client:
        agent = Agent(client)
        tid = await agent.submit("odd_text", inputs={"echo": "in\x00put"}, idempotency_key="nul-run")
        st = await agent.wait(tid)
        assert st["state"] == "succeeded", st
        assert (st["progress"]["phase"], st["progress"]["message"]) == ("ph\ufffdase", "half\ufffdway")
        lines = {(ln["stream"], ln["message"]) for ln in await agent.all_logs(tid)}
        assert {("stdout", "out\ufffdin\ufffdput"), ("stderr", "err\ufffd")} <= lines
        res = await agent.call("get_task_result", task_id=tid)
        assert res["result"]["echo"] == "in\x00put"
        [art] = res["artifacts"]
        assert (art["name"], art["kind"]) == ("odd.txt", "file")
        async with httpx.AsyncClient() as http:
            assert (await http.get(art["download_url"])).content == b"x\x00y"
        # the same submit again finds the same task: its inputs compare equal as they were sent
        again = await agent.call("submit_task", tool_name="odd_text", inputs={"echo": "in\x00put"},
                                 idempotency_key="nul-run")
        assert again["task_id"] == tid
