"""Bad input through the MCP tools, as an agent might send it: wrong types, unknown fields, too
much data, unknown tools and tasks, forged cursors, requests beyond the limits.

Each is answered INVALID_REQUEST (or NOT_FOUND for a task that is not there) with a message that
names what was wrong, never a traceback or a server path, and none of them changes the database."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from sqlalchemy import func, select

from controlplane.app import ControlPlane
from controlplane.store.models import Task, TaskEvent
from tests.conftest import ROOT, Agent

pytestmark = pytest.mark.anyio

TASK = "<the finished task>"  # placeholder for the id of a real, finished task of the caller
UNKNOWN_ID = "tsk_" + "a" * 26  # well-formed, never issued


def list_cursor(text: str) -> str:
    return "lst_" + base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def oversized(cp: ControlPlane) -> dict[str, Any]:
    return {"result": {"blob": "x" * (cp.settings.max_input_bytes + 1)}}


def db_state(cp: ControlPlane) -> tuple[int, int, dict[str, tuple[str, int]]]:
    """Number of tasks and of task_events, and each task's state and version."""
    T, EV = Task.__table__, TaskEvent.__table__
    with cp.db.engine.connect() as c:
        n_tasks = c.execute(select(func.count()).select_from(T)).scalar_one()
        n_events = c.execute(select(func.count()).select_from(EV)).scalar_one()
        rows = {r.task_id: (r.state, r.version) for r in c.execute(select(T.c.task_id, T.c.state, T.c.version))}
    return n_tasks, n_events, rows


def assert_clean(err: dict[str, Any], cp: ControlPlane) -> None:
    """An error a client can show as it is: code, message, maybe a hint, and no internals."""
    assert set(err) <= {"code", "message", "hint"}, err
    text = " ".join(str(v) for v in err.values())
    for leak in ("Traceback", 'File "', ".py", str(ROOT), str(cp.settings.home), "/tmp/", "sqlite", "sqlalchemy"):
        assert leak not in text, (leak, err)


@pytest.fixture
async def finished(agent: Agent) -> str:
    """A task of the caller that has finished, so nothing changes the database behind our back."""
    tid = await agent.submit(inputs={"log_lines": 3})
    assert (await agent.wait(tid))["state"] == "succeeded"
    return tid


async def refused(agent: Agent, cp: ControlPlane, tool: str, args: dict[str, Any], task_id: str) -> dict[str, Any]:
    args = {k: (task_id if v == TASK else v) for k, v in args.items()}
    before = db_state(cp)
    err = await agent.error(tool, **args)
    assert_clean(err, cp)
    assert db_state(cp) == before, f"{tool} {args} changed the database"
    return err


INVALID = [
    # --- wrong types (strict: no "5" for 5, no true for 1)
    ("submit_task", {"tool_name": "exercise", "priority": "5"}, "priority"),
    ("submit_task", {"tool_name": "exercise", "priority": True}, "priority"),
    ("submit_task", {"tool_name": "exercise", "priority": 1.5}, "priority"),
    ("submit_task", {"tool_name": "exercise", "inputs": "{}"}, "inputs"),
    ("submit_task", {"tool_name": "exercise", "tags": "project:x"}, "tags"),
    ("submit_task", {"tool_name": "exercise", "resources": {"cpu": "1"}}, "resources.cpu"),
    ("submit_task", {"tool_name": 7}, "tool_name"),
    ("list_tasks", {"limit": "x"}, "limit"),
    ("list_tasks", {"states": ["running", "napping"]}, "states.1"),
    ("list_tasks", {"submitted_after": "last tuesday"}, "submitted_after"),
    ("tail_task_logs", {"task_id": TASK, "limit": "x"}, "limit"),
    ("tail_task_logs", {"task_id": TASK, "from_end": "yes"}, "from_end"),
    ("get_task_status", {"task_id": 12345}, "task_id"),
    ("get_task_result", {"task_id": TASK, "url_ttl_s": "3600"}, "url_ttl_s"),
    # --- missing or malformed required fields
    ("submit_task", {}, "tool_name"),
    ("get_task_status", {}, "task_id"),
    ("get_task_status", {"task_id": "ab"}, "task_id"),
    ("cancel_task", {"task_id": TASK, "reason": ""}, "reason"),
    ("submit_task", {"tool_name": "exercise", "tags": ["ok", "bad\nline"]}, "tags.1"),
    # --- unknown fields, top level and nested
    ("submit_task", {"tool_name": "exercise", "colour": "red"}, "colour"),
    ("submit_task", {"tool_name": "exercise", "resources": {"cpus": 2}}, "resources.cpus"),
    ("list_tasks", {"user": "bob"}, "user"),  # (`owner` is an argument: someone else's list is empty, test_owner)
    ("get_task_status", {"task_id": TASK, "verbose": True}, "verbose"),
    # --- the tool's own input schema
    ("submit_task", {"tool_name": "exercise", "inputs": {"sleep_s": -1}}, "inputs.sleep_s"),
    ("submit_task", {"tool_name": "exercise", "inputs": {"surprise": 1}}, "surprise"),
    ("exercise", {"exit_code": 256}, "inputs.exit_code"),
    # --- unknown tools
    ("submit_task", {"tool_name": "rm_rf"}, "'rm_rf'"),
    ("rm_rf", {"path": "/"}, "'rm_rf'"),
    ("submit_task", {"tool_name": "submit_task"}, "'submit_task'"),
    # --- malformed cursors
    ("tail_task_logs", {"task_id": TASK, "cursor": "garbage"}, "cursor"),
    ("tail_task_logs", {"task_id": TASK, "cursor": "log_"}, "cursor"),
    ("tail_task_logs", {"task_id": TASK, "cursor": "log_-1"}, "cursor"),
    ("tail_task_logs", {"task_id": TASK, "cursor": "log_12ab"}, "cursor"),
    ("tail_task_logs", {"task_id": TASK, "cursor": "log_" + "9" * 19}, "cursor"),
    ("tail_task_logs", {"task_id": TASK, "cursor": "log_" + "9" * 61}, "cursor"),
    ("tail_task_logs", {"task_id": TASK, "cursor": list_cursor("v1:1")}, "cursor"),
    pytest.param("tail_task_logs", {"task_id": TASK, "cursor": "log_²"}, "cursor",
                 id="tail_task_logs-superscript-digit-cursor"),
    ("list_tasks", {"cursor": "garbage"}, "cursor"),
    ("list_tasks", {"cursor": "lst_"}, "cursor"),
    ("list_tasks", {"cursor": "lst_!!!!"}, "cursor"),
    ("list_tasks", {"cursor": "lst_a"}, "cursor"),
    ("list_tasks", {"cursor": "lst_é"}, "cursor"),
    ("list_tasks", {"cursor": list_cursor("v2:5")}, "cursor"),
    ("list_tasks", {"cursor": list_cursor("v1:abc")}, "cursor"),
    ("list_tasks", {"cursor": list_cursor("v1:-3")}, "cursor"),
    ("list_tasks", {"cursor": "log_000000001"}, "cursor"),
    pytest.param("list_tasks", {"cursor": list_cursor("v1:" + "9" * 20)}, "cursor",
                 id="list_tasks-cursor-pk-overflow"),
    pytest.param("list_tasks", {"cursor": list_cursor("v1:1.5:" + "9" * 20)}, "cursor",
                 id="list_tasks-cursor-pk-overflow-with-time"),
    ("list_tasks", {"cursor": list_cursor("v1:nan:5")}, "cursor"),
    ("list_tasks", {"cursor": list_cursor("v1:inf:5")}, "cursor"),
    ("list_tasks", {"cursor": list_cursor("v1:1.5:5:7")}, "cursor"),
    # --- cursor and from_end together
    ("tail_task_logs", {"task_id": TASK, "cursor": "log_000000001", "from_end": True}, "from_end"),
    # --- beyond the limits
    ("submit_task", {"tool_name": "exercise", "resources": {"cpu": 2}}, "resources.cpu"),
    ("submit_task", {"tool_name": "exercise", "resources": {"memory_mb": 2049}}, "resources.memory_mb"),
    ("submit_task", {"tool_name": "exercise", "resources": {"gpu": 1}}, "resources.gpu"),
    ("submit_task", {"tool_name": "exercise", "resources": {"scratch_mb": 10**9}}, "resources.scratch_mb"),
    ("submit_task", {"tool_name": "exercise", "resources": {"scratch_mb": 1}}, "resources.scratch_mb"),
    ("submit_task", {"tool_name": "exercise", "resources": {"resource_class": "cpu_standard", "cpu": 3}},
     "resources.cpu"),
    ("submit_task", {"tool_name": "exercise", "resources": {"resource_class": "gpu_huge"}}, "'gpu_huge'"),
    ("submit_task", {"tool_name": "exercise", "resources": {"max_runtime_s": 3601}}, "resources.max_runtime_s"),
    ("submit_task", {"tool_name": "exercise", "resources": {"max_runtime_s": 10**30}}, "resources.max_runtime_s"),
    ("submit_task", {"tool_name": "exercise", "resources": {"max_runtime_s": 0}}, "resources.max_runtime_s"),
    ("submit_task", {"tool_name": "exercise", "ttl_s": 90 * 24 * 3600 + 1}, "ttl_s"),
    ("submit_task", {"tool_name": "exercise", "ttl_s": 59}, "ttl_s"),
    ("submit_task", {"tool_name": "exercise", "priority": 101}, "priority"),
    ("submit_task", {"tool_name": "exercise", "tags": ["t"] * 33}, "tags"),
    ("submit_task", {"tool_name": "exercise", "idempotency_key": "k" * 201}, "idempotency_key"),
    # --- NUL (U+0000) in text the server keeps or looks up as it is: PostgreSQL's text cannot hold
    # it, so it is refused on every engine (a tool's inputs are kept as JSON and may hold it)
    ("submit_task", {"tool_name": "exercise", "idempotency_key": "k\x00"}, "idempotency_key"),
    ("submit_task", {"tool_name": "exercise", "tags": ["a\x00b"]}, "tags.0"),
    ("cancel_task", {"task_id": TASK, "reason": "no\x00pe"}, "reason"),
    ("list_tasks", {"tool_name": "exer\x00cise"}, "tool_name"),
    ("list_tasks", {"tags_any": ["\x00"]}, "tags_any.0"),
    ("list_tasks", {"limit": 0}, "limit"),
    ("list_tasks", {"limit": 201}, "limit"),
    ("tail_task_logs", {"task_id": TASK, "limit": 1001}, "limit"),
    ("get_task_result", {"task_id": TASK, "url_ttl_s": 59}, "url_ttl_s"),
]


def _case_id(tool: str, args: dict[str, Any], field: str) -> str:
    shown = ",".join(f"{k}={repr(v)[:24]}" for k, v in args.items() if v != TASK)
    return f"{tool}({shown})"


@pytest.mark.parametrize(
    ("tool", "args", "field"),
    [c if hasattr(c, "marks") else pytest.param(*c, id=_case_id(*c)) for c in INVALID],
)
async def test_invalid_request_names_the_field_and_changes_nothing(agent: Agent, cp: ControlPlane, finished: str,
                                                                  tool: str, args: dict[str, Any],
                                                                  field: str) -> None:
    err = await refused(agent, cp, tool, args, finished)
    assert err["code"] == "INVALID_REQUEST", err
    assert field in err["message"], err


async def test_scratch_disk_the_provider_cannot_reserve_is_refused_with_the_reason(agent: Agent, cp: ControlPlane,
                                                                                  finished: str) -> None:
    """Scratch disk is never accepted and ignored: the local provider cannot reserve any, so asking
    for it is refused, naming the field and saying why, and nothing is created."""
    err = await refused(agent, cp, "submit_task", {"tool_name": "exercise", "resources": {"scratch_mb": 512}},
                        finished)
    assert err["code"] == "INVALID_REQUEST"
    assert err["message"].startswith("resources.scratch_mb: the local provider cannot reserve scratch disk for this "
                                     "task: local jobs write to this host's disk"), err
    assert "omit resources.scratch_mb" in err["hint"]
    # Asking for none is asking for nothing: accepted, and the task runs.
    tid = await agent.submit(inputs={}, resources={"scratch_mb": 0})
    assert (await agent.wait(tid))["state"] == "succeeded"


async def test_oversized_inputs_are_refused(agent: Agent, cp: ControlPlane, finished: str) -> None:
    for tool, args in (("submit_task", {"tool_name": "exercise", "inputs": oversized(cp)}),
                       ("exercise", oversized(cp))):
        err = await refused(agent, cp, tool, args, finished)
        assert err["code"] == "INVALID_REQUEST"
        assert err["message"].startswith("inputs are ") and str(cp.settings.max_input_bytes) in err["message"]
        assert "by reference" in err["hint"]


@pytest.mark.parametrize("tool", ["get_task_status", "tail_task_logs", "get_task_result", "cancel_task"])
@pytest.mark.parametrize("task_id", [UNKNOWN_ID, "tsk_nope", "x" * 64, "tsk_" + "a" * 26 + "\x00"],
                         ids=["well-formed", "short", "64-chars", "with-nul"])
async def test_unknown_task_is_not_found(agent: Agent, cp: ControlPlane, finished: str, tool: str,
                                         task_id: str) -> None:
    err = await refused(agent, cp, tool, {"task_id": task_id}, finished)
    assert err == {"code": "NOT_FOUND", "message": "task not found"}


async def test_bad_requests_leave_the_good_path_working(agent: Agent, cp: ControlPlane, finished: str) -> None:
    """After all that, the same caller's real task is intact and its cursors still work."""
    page = await agent.call("tail_task_logs", task_id=finished, limit=2)
    assert [ln["message"] for ln in page["lines"]] == ["line 0", "line 1"]
    rest = await agent.call("tail_task_logs", task_id=finished, cursor=page["next_cursor"])
    assert [ln["message"] for ln in rest["lines"]] == ["line 2"] and rest["has_more"] is False
    listed = await agent.call("list_tasks", limit=1)
    assert [t["task_id"] for t in listed["tasks"]] == [finished] and listed["next_cursor"] is None


async def test_filter_times_without_a_zone_are_utc(agent: Agent) -> None:
    tid = await agent.submit(inputs={})
    early = await agent.call("list_tasks", submitted_after="0001-01-01T00:00:00")
    assert tid in [t["task_id"] for t in early["tasks"]]
    late = await agent.call("list_tasks", submitted_after="9999-12-31T00:00:00")
    assert late["tasks"] == []
