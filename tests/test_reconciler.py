"""The reconciler against real local jobs: lost jobs are retried per policy or fail WORKER_LOST,
silent runners are stopped before their retry, provider API errors never fail a task, runners
that cannot reach the control plane deliver through the object store, and expiry removes a
task's logs, artifacts and objects (retrying a deletion that failed)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.mcp.server import build_server
from controlplane.objectstore.base import task_prefix
from controlplane.settings import Settings
from controlplane_providers.base import TransientProviderError
from controlplane_providers.local import LocalProvider
from tests.conftest import FAST, Agent, ToolCallError, expire_soon, pid_alive, runner_starts, write_catalog

pytestmark = pytest.mark.anyio


def runner_pid(home: Path, task_id: str, attempt: int) -> int:
    path = home / "jobs" / f"cp-{task_id.removeprefix('tsk_')}-a{attempt}" / "runner.pid"
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return json.loads(path.read_text())["pid"]


def kill_tree(pid: int) -> list[int]:
    """Kill the runner and everything of its process group (the job vanishes). A snapshot of its
    children alone missed a grandchild the tool was spawning at that moment, which then slept on
    for ever after the test; the group's kill takes it too."""
    p = psutil.Process(pid)
    victims = [p, *p.children(recursive=True)]
    os.killpg(os.getpgid(pid), signal.SIGKILL)  # the local provider starts each runner as a group leader
    for v in victims:  # (any that left the group)
        with contextlib.suppress(psutil.NoSuchProcess):
            v.kill()
    return [v.pid for v in victims]


async def test_lost_job_is_retried_per_policy(home: Path) -> None:
    write_catalog(home, exercise_retry='{ max_attempts = 2, backoff_s = 0, retry_on = ["worker_lost"] }')
    cp = ControlPlane(Settings(home=home, **FAST))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"sleep_s": 3, "spawn_children": 1})
        await agent.wait(tid, {"running"})
        killed = kill_tree(runner_pid(home, tid, 1))  # the job vanishes: runner, tool, children
        st = await agent.wait(tid, timeout=60)
        assert st["state"] == "succeeded" and st["attempt"] == 2
        assert not any(pid_alive(p) for p in killed)
        retry = [e for e in cp.store.logs.events(tid) if e.kind == "retry"]
        assert len(retry) == 1 and retry[0].detail["error"] == "WORKER_LOST"


async def test_lost_job_without_retries_fails_worker_lost(agent: Agent, home: Path) -> None:
    tid = await agent.submit(inputs={"sleep_s": 30})
    await agent.wait(tid, {"running"})
    kill_tree(runner_pid(home, tid, 1))
    st = await agent.wait(tid, timeout=30)
    assert st["state"] == "failed" and st["error"]["code"] == "WORKER_LOST" and st["attempt"] == 1


async def test_silent_runner_is_stopped_before_its_retry(home: Path) -> None:
    write_catalog(home, exercise_retry='{ max_attempts = 2, backoff_s = 0, retry_on = ["worker_lost"] }')
    cp = ControlPlane(Settings(home=home, **{**FAST, "heartbeat_timeout_s": 1.5}))
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"sleep_s": 2})
        await agent.wait(tid, {"running"})
        pid = runner_pid(home, tid, 1)
        await anyio.sleep(0.8)  # let it report at least once
        victims = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for v in victims:
            v.send_signal(signal.SIGSTOP)  # alive but silent: a hung runner
        st = await agent.wait(tid, timeout=60)
        assert st["state"] == "succeeded" and st["attempt"] == 2
        assert not any(pid_alive(v.pid) for v in victims)
        first, second = cp.store.jobs.get(AttemptRef(tid, 1)), cp.store.jobs.get(AttemptRef(tid, 2))
        assert first.stop_requested_at is not None
        # the second attempt was only scheduled once the first job was confirmed gone
        assert first.finished_at <= second.created_at


class FlakyLocal(LocalProvider):
    """The local provider behind an API that fails a third of its calls (429/5xx-like)."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.rng = random.Random(11)
        self.failures = 0

    def _flake(self) -> None:
        if self.rng.random() < 0.33:
            self.failures += 1
            raise TransientProviderError("503 Service Unavailable")

    def launch(self, spec):  # type: ignore[no-untyped-def]
        self._flake()
        return super().launch(spec)

    def poll(self, handles):  # type: ignore[no-untyped-def]
        self._flake()
        return super().poll(handles)

    def cancel(self, handle, reason="cancelled"):  # type: ignore[no-untyped-def]
        self._flake()
        return super().cancel(handle, reason)


async def test_provider_api_errors_never_fail_a_task(home: Path) -> None:
    settings = Settings(home=home, **FAST)
    flaky = FlakyLocal.configured(home, kill_grace_s=1.0)
    cp = ControlPlane(settings, providers={"local": flaky})
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tids = [await agent.submit(inputs={"sleep_s": 0.3, "log_lines": 5}) for _ in range(6)]
        cancel_me = await agent.submit(inputs={"sleep_s": 60})
        await agent.wait(cancel_me, {"running"}, timeout=60)
        await agent.call("cancel_task", task_id=cancel_me)
        for tid in tids:
            assert (await agent.wait(tid, timeout=90))["state"] == "succeeded"
        assert (await agent.wait(cancel_me, timeout=90))["state"] == "cancelled"
    assert flaky.failures > 0
    with cp.db.engine.connect() as c:
        assert c.execute(text("select count(*) from jobs")).scalar() == 7  # no launch was doubled


class AnswerLost(LocalProvider):
    """The local provider behind an API whose first launch answer is lost: the job is started,
    and the call fails as a 5xx after it would (so the control plane cannot know it ran)."""

    lost = 0

    def launch(self, spec):  # type: ignore[no-untyped-def]
        handle = super().launch(spec)
        if not self.lost:
            self.lost += 1
            time.sleep(1.0)  # the answer is late, and the runner already says it runs
            raise TransientProviderError("502 Bad Gateway")
        return handle


async def test_a_job_that_ran_before_its_launch_was_recorded_is_watched_to_its_end(home: Path) -> None:
    """The launch's answer is lost after the job started, and its runner reports that it runs
    before the scheduler's retry. The retry finds the job and records it (dropped, the job's end
    would go unseen and the task stay running until its timeout); it is not launched again."""
    settings = Settings(home=home, **FAST)
    lossy = AnswerLost.configured(home, kill_grace_s=1.0)
    cp = ControlPlane(settings, providers={"local": lossy})
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"sleep_s": 2, "result": {"k": 1}})
        await agent.wait(tid, {"running"}, timeout=30)
        assert cp.store.jobs.get(AttemptRef(tid, 1)).state == "launching"  # it runs, and its launch is not recorded yet
        st = await agent.wait(tid, timeout=30)
        res = await agent.call("get_task_result", task_id=tid)
    assert st["state"] == "succeeded" and res["result"]["k"] == 1, (st, res)
    assert lossy.lost == 1 and runner_starts(home / "jobs" / cp.store.jobs.get(AttemptRef(tid, 1)).job_name) == 1


async def test_a_job_whose_handle_cannot_be_read_does_not_stop_the_others(agent: Agent, cp: ControlPlane,
                                                                             home: Path, caplog: Any) -> None:
    """A stored handle that no longer decodes (another version wrote it, or it was damaged) leaves
    that one job unpolled, said once in the log; every other job is still reconciled."""
    stuck = await agent.submit(inputs={"sleep_s": 60})
    quick = await agent.submit(inputs={"sleep_s": 1.5})
    await agent.wait(stuck, {"running"})
    pid = runner_pid(home, stuck, 1)
    with cp.db.write() as c:
        c.execute(text("update jobs set handle_json = :h where task_id = :t"), {"h": '{"job_dir": 7}', "t": stuck})
    try:
        assert (await agent.wait(quick, timeout=60))["state"] == "succeeded"
        await cp.reconciler.cycle(force_poll=True)  # another cycle: the damaged job is not said twice
        assert (await agent.call("get_task_status", task_id=stuck))["state"] == "running"
        said = [r for r in caplog.records if "cannot be polled or stopped" in r.getMessage()]
        assert len(said) == 1 and stuck in said[0].getMessage()
    finally:
        kill_tree(pid)


async def test_runner_without_callback_delivers_through_the_store(home: Path) -> None:
    """A job that cannot reach the control plane (a dead callback URL) still gets its logs,
    result and artifacts in: the runner writes them to the object store."""
    settings = Settings(home=home, public_url="http://127.0.0.1:9", **FAST)  # nothing listens on port 9
    cp = ControlPlane(settings)
    async with Client(build_server(cp)) as client:
        agent = Agent(client)
        tid = await agent.submit(inputs={"log_lines": 500, "progress_steps": 2, "artifact_bytes": 1000,
                                         "result": {"via": "store"}})
        st = await agent.wait(tid, timeout=90)
        assert st["state"] == "succeeded", st
        lines = await agent.all_logs(tid)
        assert [ln["message"] for ln in lines] == [f"line {i}" for i in range(500)]
        task = cp.store.tasks.get(tid)
        assert task.result["via"] == "store"
        assert [a.name for a in cp.store.artifacts.of(tid)] == ["data.bin"]
        spilled = list(cp.object_stores.default.list(f"{task_prefix(tid)}attempts/1/events/"))
        assert spilled, "the events should have come through the object store"


class FailingDeletes:
    """Wraps the object store so that the first deletion fails."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def delete_prefix(self, prefix: str) -> int:
        self.calls += 1
        if self.calls == 1:
            raise OSError("object store unavailable")
        return self.inner.delete_prefix(prefix)


async def test_expiry_removes_logs_artifacts_and_objects(agent: Agent, cp: ControlPlane) -> None:
    tid = await agent.submit(inputs={"log_lines": 10, "artifact_bytes": 100}, ttl_s=60)
    assert (await agent.wait(tid))["state"] == "succeeded"
    store = cp.object_stores.default
    assert list(store.list(task_prefix(tid))) and cp.store.artifacts.of(tid)
    job_dir = Path(cp.settings.home) / "jobs" / cp.store.jobs.get(AttemptRef(tid, 1)).job_name
    assert job_dir.is_dir()
    with cp.db.write() as c:  # the ttl has passed
        c.execute(text("update tasks set expires_at = 0 where task_id = :t"), {"t": tid})
    failing = FailingDeletes(store)
    cp.object_stores._stores[cp.object_stores.default_url] = failing  # type: ignore[assignment]
    await cp.reconciler.cycle()
    assert cp.store.tasks.get(tid).state == "succeeded"  # deletion failed: nothing removed, retried later
    await expire_soon(cp, tid)  # next cycle (or the one after, if the job's runner is still exiting)
    assert failing.calls >= 2
    st = await agent.call("get_task_status", task_id=tid)
    assert st["state"] == "expired"
    assert list(store.list(task_prefix(tid))) == []
    assert cp.store.artifacts.of(tid) == [] and cp.store.logs.tail(tid, 0, 10) == []
    res = await agent.call("get_task_result", task_id=tid)
    assert res["result"] is None and res["artifacts"] == [] and "expired" in res["message"]
    assert (await agent.call("tail_task_logs", task_id=tid))["lines"] == []
    assert not os.path.exists(store.path_of(task_prefix(tid).rstrip("/")))
    assert not job_dir.exists()  # the local job's directory went with the task


async def test_expired_tasks_are_purged_after_retention_and_the_audit_outlives_them(agent: Agent,
                                                                                     cp: ControlPlane) -> None:
    tid = await agent.submit(inputs={"log_lines": 2}, ttl_s=60)
    assert (await agent.wait(tid))["state"] == "succeeded"
    with cp.db.write() as c:  # the ttl has passed
        c.execute(text("update tasks set expires_at = 1000 where task_id = :t"), {"t": tid})
    await expire_soon(cp, tid)
    assert (await agent.call("get_task_status", task_id=tid))["state"] == "expired"  # the tombstone answers
    now = time.time()
    kept = cp.store.retention.purge(now, purge_after_s=now, audit_retention_s=10 * now)  # not old enough
    assert kept.tasks == 0 and cp.store.tasks.get(tid) is not None
    while cp.store.jobs.get(AttemptRef(tid, 1)).state != "done":  # a job row goes once its provider said it ended
        await cp.reconciler.cycle(force_poll=True)
        await anyio.sleep(0.05)
    gone = cp.store.retention.purge(now, purge_after_s=60, audit_retention_s=10 * now)
    assert gone.tasks == 1 and cp.store.tasks.get(tid) is None and cp.store.jobs.get(AttemptRef(tid, 1)) is None
    with pytest.raises(ToolCallError) as e:
        await agent.call("get_task_status", task_id=tid)
    assert e.value.code == "NOT_FOUND"
    assert [ev.kind for ev in cp.store.logs.events(tid)][-1] == "expired"  # the audit is kept
    cp.store.retention.purge(now + 1, purge_after_s=60, audit_retention_s=0)  # ...for its own period
    assert cp.store.logs.events(tid) == []
