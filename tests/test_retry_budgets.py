"""Retry budgets are counted apart: a tool that fails spends `max_attempts`, a job that is lost,
preempted or not launched spends `max_recoveries` (SkyPilot's habit), each only for the kinds the
policy's `retry_on` names; the wait before the next attempt doubles, is capped and is jittered."""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path

import anyio
import pytest
from fastmcp import Client

from controlplane.app import ControlPlane
from controlplane.catalog import RetryPolicy
from controlplane.mcp.server import build_server
from controlplane.outcomes import backoff_delay, decide, decide_launch_failure, decide_lost
from controlplane.settings import Settings
from controlplane.states import TaskState
from controlplane.store.rows import TaskRow
from tests.conftest import FAST, Agent, write_catalog
from tests.test_reconciler import kill_tree, runner_pid

BOTH = RetryPolicy(max_attempts=2, max_recoveries=3, backoff_s=1.0,
                   retry_on=("tool_failed", "worker_lost", "launch_failed"))
FAILED = {"status": "failed", "exit_code": 1}


def task(**over: object) -> TaskRow:
    base = dict(pk=1, task_id="tsk_x", owner="o", tool_name="t", inputs_json="{}", input_size=None, provider="local",
                resource_class="c", store_url="", priority=0, ttl_s=60, idempotency_key=None, tags_json="[]",
                resources_json="{}", max_runtime_s=60, state=TaskState.RUNNING, attempt=1, max_attempts=2,
                not_before=0.0, submitted_at=0.0, updated_at=0.0, version=1, max_recoveries=3)
    return TaskRow(**{**base, **over})  # type: ignore[arg-type]


def test_a_lost_job_does_not_spend_the_tools_budget() -> None:
    # three losses in a row are recovered although the tool may only be tried twice
    for n in range(3):
        d = decide_lost(task(attempt=n + 1, recoveries=n), "preempted", BOTH)
        assert d.is_retry and d.retry == "recovery"
    assert not decide_lost(task(attempt=4, recoveries=3), "preempted", BOTH).is_retry
    # ...and after them the tool still has its own retry
    d = decide(task(attempt=4, recoveries=3, failures=0), FAILED, BOTH)
    assert d.is_retry and d.retry == "failure"
    assert not decide(task(attempt=5, recoveries=3, failures=1), FAILED, BOTH).is_retry


def test_launch_failures_are_recoveries_and_only_named_kinds_retry() -> None:
    assert decide_launch_failure(task(), "no capacity", BOTH).retry == "recovery"
    only_lost = RetryPolicy(max_attempts=3, max_recoveries=3, retry_on=("worker_lost",))
    assert not decide(task(), FAILED, only_lost).is_retry
    assert not decide_launch_failure(task(), "no capacity", only_lost).is_retry
    assert decide_lost(task(), "gone", only_lost).is_retry


def test_without_max_recoveries_the_old_shared_budget_is_kept(home: Path) -> None:
    write_catalog(home, exercise_retry='{ max_attempts = 3, retry_on = ["worker_lost"] }')
    cp = ControlPlane(Settings(home=home, **FAST))
    from controlplane import api

    tid = cp.service.submit("me", api.SubmitTask(tool_name="exercise", inputs={}))["task_id"]
    row = cp.store.tasks.get(tid)
    assert (row.max_attempts, row.max_recoveries, row.failures, row.recoveries) == (3, 2, 0, 0)


def test_backoff_doubles_is_capped_and_jittered() -> None:
    rng = random.Random(7)
    for n, full in [(1, 2.0), (2, 4.0), (3, 8.0), (10, 60.0)]:
        waits = [backoff_delay(2.0, n, cap_s=60.0, rng=rng) for _ in range(500)]
        assert full / 2 <= min(waits) and max(waits) <= full  # never sooner than half, never past the cap
        assert statistics.pstdev(waits) > full / 20  # spread out: tasks failed together come back apart
    assert backoff_delay(0.0, 5) == 0.0
    assert backoff_delay(2.0, 3, rng=random.Random(1)) == backoff_delay(2.0, 3, rng=random.Random(1))


def test_a_retry_waits_its_backoff() -> None:
    d = decide(task(), FAILED, BOTH)
    assert d.is_retry and 0.5 <= d.backoff_s <= 1.0


@pytest.mark.anyio
async def test_a_lost_attempt_is_recovered_and_counted_as_a_recovery(home: Path) -> None:
    write_catalog(home, exercise_retry='{ max_attempts = 1, max_recoveries = 1, backoff_s = 0, '
                                       'retry_on = ["worker_lost", "tool_failed"] }')
    cp = ControlPlane(Settings(home=home, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"sleep_s": 3})
        await agent.wait(tid, {"running"})
        kill_tree(runner_pid(home, tid, 1))  # lost: a recovery, although the tool has no retries
        deadline = time.monotonic() + 60
        while (st := await agent.call("get_task_status", task_id=tid))["attempt"] != 2 or st["state"] != "running":
            assert time.monotonic() < deadline, st
            await anyio.sleep(0.05)
        kill_tree(runner_pid(home, tid, 2))  # lost again: the recovery budget is spent
        st = await agent.wait(tid, timeout=60)
        assert st["state"] == "failed" and st["error"]["code"] == "WORKER_LOST" and st["attempt"] == 2
        row = cp.store.tasks.get(tid)
        assert (row.failures, row.recoveries) == (0, 1)
        retries = [e.detail for e in cp.store.logs.events(tid) if e.kind == "retry"]
        assert [r["retry"] for r in retries] == ["recovery"]
