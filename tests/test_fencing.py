"""The leader lease's fencing (`controlplane/store/leases.py`): each takeover bumps the lease's
epoch, and a leader that lost its lease while paused claims nothing, launches nothing and records
nothing when it wakes, so no job is launched twice. Both engines."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from controlplane import api
from controlplane.app import LEADER_LEASE, ControlPlane
from controlplane.settings import Settings
from controlplane.store.leases import Fence, Fenced
from tests.conftest import FAST, reap_jobs

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
    (every launch writes a '# launching' line into its job's console.log)."""
    counts: dict[str, int] = {}
    for home in homes:
        for log in (home / "jobs").glob("*/console.log"):
            n = sum(1 for line in log.read_text(errors="replace").splitlines() if line.startswith("# launching "))
            counts[log.parent.name] = counts.get(log.parent.name, 0) + n
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
        a.scheduler._fresh.update(job.worker_id for _t, job in claimed)  # as tick() records its own claims
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
