"""The leader lease's fencing (`controlplane/store/leases.py`): each takeover bumps the lease's
epoch, and a leader that lost its lease while paused claims nothing, launches nothing and records
nothing when it wakes, so no job is launched twice; its reconciler makes no transition and sends
no stop from what it read before the pause. Both engines."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from controlplane import api
from controlplane.app import LEADER_LEASE, ControlPlane
from controlplane.ids import AttemptRef
from controlplane.settings import Settings
from controlplane.store.leases import Fence, Fenced
from controlplane_providers.local import LocalProvider
from tests.conftest import FAST, pid_alive, reap_jobs, runner_starts

pytestmark = pytest.mark.anyio


def _submit(cp: ControlPlane, sleep_s: float = 30) -> str:
    return cp.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": sleep_s}))["task_id"]


def test_a_takeover_bumps_the_epoch_and_fences_the_old_holder(cp: ControlPlane) -> None:
    leases = cp.store.leases
    first = leases.acquire(LEADER_LEASE, "A", 0.3)
    assert first is not None and leases.acquire(LEADER_LEASE, "A", 0.3) == first  # a renewal keeps it
    assert leases.acquire(LEADER_LEASE, "B", 10) is None  # held by A
    time.sleep(0.4)
    second = leases.acquire(LEADER_LEASE, "B", 10)
    assert second == first + 1
    tid = _submit(cp)
    with pytest.raises(Fenced):  # A's claim, made after it lost the lease, is refused whole
        cp.store.jobs.claim_for_launch("cpu_small", 4, fence=Fence(LEADER_LEASE, "A", first))
    assert cp.store.tasks.get(tid).state == "queued"
    claimed = cp.store.jobs.claim_for_launch("cpu_small", 4, fence=Fence(LEADER_LEASE, "B", second))
    assert [t.task_id for t, _ in claimed] == [tid]
    assert not leases.holds(Fence(LEADER_LEASE, "B", second), margin_s=60)  # not with a minute to spare
    leases.release(LEADER_LEASE, "B")
    assert leases.acquire(LEADER_LEASE, "A", 10) == second + 1  # after a release: never back


def _launches(*homes: Path) -> dict[str, int]:
    """How many times each job was started, read from the local provider's job directories
    (every runner that starts a job says so on its console.log as it claims it)."""
    counts: dict[str, int] = {}
    for home in homes:
        for job_dir in (home / "jobs").iterdir() if (home / "jobs").exists() else ():
            counts[job_dir.name] = counts.get(job_dir.name, 0) + runner_starts(job_dir)
    return counts


async def test_a_leader_paused_past_its_lease_launches_nothing_when_it_wakes(home: Path, tmp_path: Path) -> None:
    # Two replicas on one database (on SQLite, one file for both), each with its own home (and so its own job directories: the
    # successor cannot find a job the old leader started there, which makes a doubled launch real).
    a = ControlPlane(Settings(home=home, **{**FAST, "leader_lease_s": 0.5}))
    b = ControlPlane(Settings(home=tmp_path / "b", database_url=a.settings.resolved_database_url, **FAST))
    try:
        epoch = a.store.leases.acquire(LEADER_LEASE, a.holder, 0.5)
        assert epoch is not None
        a.fence = Fence(LEADER_LEASE, a.holder, epoch)
        tids = [_submit(a) for _ in range(3)]
        # A claims the tasks and reads what it has to launch, and is paused right there (its
        # scheduler's tick, stopped between its claim and its provider calls).
        claimed = a.store.jobs.claim_for_launch("cpu_small", 4, fence=a.fence)
        a.scheduler._fresh.update(job.job_id for _t, job in claimed)  # as tick() records its own claims
        todo = a.store.jobs.launch_intents()
        assert len(todo) == 3
        time.sleep(0.6)  # the lease runs out while A is paused
        b_epoch = b.store.leases.acquire(LEADER_LEASE, b.holder, 10)
        assert b_epoch == epoch + 1
        b.fence = Fence(LEADER_LEASE, b.holder, b_epoch)
        assert await b.scheduler.tick() == 3  # the new leader launches the intents it found
        for job in todo:  # A wakes and carries on where it stopped
            await a.scheduler._launch_guarded(job)
        assert _launches(home, tmp_path / "b") == {job.job_name: 1 for job in todo}
        for tid in tids:
            assert b.store.tasks.get(tid).state == "scheduled"
    finally:
        reap_jobs(home)
        reap_jobs(tmp_path / "b")


# ---- the reconciler's writes ----------------------------------------------------------------------
class PausingLocal(LocalProvider):
    """The local provider, whose poll can hold the calling thread once it has the statuses (the
    leader paused between reading its jobs and acting on what it read)."""

    def __init__(self, *args: Any, **kw: Any):
        super().__init__(*args, **kw)
        self.pause = False
        self.paused = threading.Event()
        self.resume = threading.Event()

    def poll(self, handles):  # type: ignore[no-untyped-def]
        statuses = super().poll(handles)
        if self.pause:
            self.paused.set()
            self.resume.wait(30)
        return statuses


def _replicas(home: Path, other: Path, lease_s: float, **a_settings: Any) -> tuple[ControlPlane, ControlPlane]:
    """A (leading, with a pausing local provider) and B, two replicas on one database."""
    a = ControlPlane(Settings(home=home, **{**FAST, "leader_lease_s": lease_s, **a_settings}),
                     providers={"local": PausingLocal.configured(home, kill_grace_s=1.0)})
    b = ControlPlane(Settings(home=other, database_url=a.settings.resolved_database_url, **FAST))
    return a, b


def _lead(cp: ControlPlane, lease_s: float) -> Fence:
    epoch = cp.store.leases.acquire(LEADER_LEASE, cp.holder, lease_s)
    assert epoch is not None
    cp.fence = Fence(LEADER_LEASE, cp.holder, epoch)
    return cp.fence


def _runner_pid(home: Path) -> int:
    (pidfile,) = (home / "jobs").glob("*/runner.pid")
    return int(json.loads(pidfile.read_text())["pid"])


def _writes(cp: ControlPlane, tid: str) -> tuple[Any, ...]:
    """What a reconciler could have written about a task: its row, its audit, its jobs."""
    return (cp.store.tasks.get(tid), [(e.kind, e.ts) for e in cp.store.logs.events(tid)], cp.store.jobs.of_task(tid))


async def test_a_reconciler_that_lost_its_lease_makes_no_transition(home: Path, tmp_path: Path) -> None:
    a, b = _replicas(home, tmp_path / "b", 0.5)
    try:
        old = _lead(a, 0.5)
        tid = _submit(a)
        assert await a.scheduler.tick() == 1
        _lead(a, 0.5)
        a.reconciler.cycle_sync(force_poll=True)  # the job runs: the task is running
        assert a.store.tasks.get(tid).state == "running"
        b.service.cancel("local", api.CancelTask(task_id=tid))  # a cancel recorded by another replica
        before = _writes(a, tid)
        assert before[0].state == "cancel_requested"
        time.sleep(0.6)
        assert _lead(b, 10).epoch == old.epoch + 1  # B took over while A was away
        a.fence = old  # A still thinks it leads
        try:
            a.reconciler.cycle_sync(force_poll=True)
        except Fenced:
            pass
        assert _writes(a, tid) == before  # no transition, no stop recorded, no job moved
        assert pid_alive(_runner_pid(home))  # and no stop sent
        with pytest.raises(Fenced):  # each cycle ends at its first write
            a.reconciler.cycle_sync(force_poll=True)
        await b.reconciler.cycle(force_poll=True)  # the leader does what was asked
        assert b.store.tasks.get(tid).state == "cancelling"
        assert b.store.jobs.get(AttemptRef(tid, 1)).stop_sent_at is not None
    finally:
        reap_jobs(home)


async def test_a_leader_paused_mid_cycle_stops_nothing_it_read_as_silent(home: Path, tmp_path: Path) -> None:
    """A reads a running job whose runner has been silent past heartbeat_timeout_s and polls it,
    and is paused there past its lease. Meanwhile the runner's heartbeat reaches B, which took the
    lease over. A wakes with what it read: without the fence it would stop the healthy job (and
    then fail its task as lost); with it, A writes and sends nothing."""
    a, b = _replicas(home, tmp_path / "b", 0.5, heartbeat_timeout_s=1.0)
    provider = a.providers["local"]
    assert isinstance(provider, PausingLocal)
    try:
        old = _lead(a, 0.5)
        tid = _submit(a)
        assert await a.scheduler.tick() == 1
        _lead(a, 0.5)
        a.reconciler.cycle_sync(force_poll=True)
        assert a.store.tasks.get(tid).state == "running"
        a.reconciler.started_at -= 60  # A has led for a while (a restart is not the runner's silence)
        a.store.attempts.touch({AttemptRef(tid, 1): time.time() - 30})  # the runner's last word, 30 s ago
        before = _writes(a, tid)
        _lead(a, 0.5)
        provider.pause = True
        async with anyio.create_task_group() as tg:
            outcome: list[BaseException | None] = []

            async def a_cycle() -> None:
                try:
                    await a.reconciler.cycle(force_poll=True)
                    outcome.append(None)
                except Fenced as e:
                    outcome.append(e)

            tg.start_soon(a_cycle)
            assert await anyio.to_thread.run_sync(provider.paused.wait, 10)
            time.sleep(0.6)  # A is paused past its lease
            assert _lead(b, 10).epoch == old.epoch + 1
            b.store.attempts.touch({AttemptRef(tid, 1): time.time()})  # the runner is heard again, by B
            provider.resume.set()
        after = _writes(a, tid)
        assert after[2][0].stop_sent_at is None and after[2][0].stop_requested_at is None
        assert after[0].state == "running" and after[1] == before[1]
        assert pid_alive(_runner_pid(home))  # the healthy job was not stopped
        assert isinstance(outcome[0], Fenced)  # A's cycle ended at its first write
    finally:
        provider.resume.set()
        reap_jobs(home)
