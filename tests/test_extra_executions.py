"""Extra executions of an attempt (a paused leader launching again, a retried launch whose first
try did start, a cloud's own retry): a claim refused to one is counted on the attempt's job, and
the reconciler looks the attempt up by its marker, stops every execution that is not the job's
own and still runs, and records, logs and counts what it stopped. Against an in-memory runner
that keeps every execution it is told of; both engines."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.ops import metrics
from controlplane.settings import Settings
from controlplane.store.leases import Fence, Fenced
from tests.doubles import MemoryProvider
from tests.test_states import new_task


@pytest.fixture
def runner() -> MemoryProvider:
    return MemoryProvider()


@pytest.fixture
def cp(home: Path, runner: MemoryProvider) -> ControlPlane:
    """A refused runner is given kill_grace_s to exit by itself: none here, but in its own test."""
    return ControlPlane(Settings(home=home, kill_grace_s=0.0), providers={"local": runner})


def running_task(cp: ControlPlane, runner: MemoryProvider) -> tuple[str, str]:
    """A running task whose attempt's job runs one execution: (task id, job name)."""
    assert cp.store.tasks.submit(new_task()).created
    [(task, job)] = cp.store.jobs.claim_for_launch("cpu_small", capacity=100)
    assert cp.store.jobs.record_launch(job.job_id, runner.start(job.job_name).encode())
    cp.attempts.mark_running(task.ref, time.time())
    return task.task_id, job.job_name


def stopped_metric() -> float:
    return metrics.REGISTRY.get_sample_value("controlplane_extra_executions_total",
                                             {"provider": "local", "action": "stopped"}) or 0.0


def test_a_refused_claim_is_counted_on_its_attempts_job_alone(cp: ControlPlane, runner: MemoryProvider) -> None:
    tid, _ = running_task(cp, runner)
    other, _ = running_task(cp, runner)
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 2))  # no such attempt: nothing
    job = cp.store.jobs.get(AttemptRef(tid, 1))
    assert (job.extra_claims, job.extra_checked, job.extra_stopped) == (2, 0, 0)
    assert cp.store.jobs.get(AttemptRef(other, 1)).extra_claims == 0


def test_the_reconciler_stops_an_extra_execution_and_says_so(cp: ControlPlane, runner: MemoryProvider,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    tid, name = running_task(cp, runner)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.looks == []  # nothing refused: nothing looked up

    runner.start(name)  # a second execution of the attempt, whose claim is refused
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    before = stopped_metric()
    with caplog.at_level(logging.WARNING, logger="controlplane.reconciler"):
        stats = cp.reconciler.cycle_sync(force_poll=True)
    assert runner.looks == [name] and runner.cancels == [(f"{name}-2", "an extra execution of the attempt")]
    assert stats.extra_stopped == 1 and stopped_metric() == before + 1
    job = cp.store.jobs.get(AttemptRef(tid, 1))
    assert (job.extra_claims, job.extra_checked, job.extra_stopped) == (1, 1, 1)
    [said] = [r for r in caplog.records if getattr(r, "action", None) == "extra_stopped"]
    fields = ("task_id", "attempt", "provider", "job_name")
    assert tuple(getattr(said, f) for f in fields) == (tid, 1, "local", name)

    cp.reconciler.cycle_sync(force_poll=True)  # looked into: not again
    assert runner.looks == [name] and len(runner.cancels) == 1
    assert cp.store.tasks.get(tid).state == "running"  # the attempt's own execution runs on


def test_an_extra_execution_that_ended_by_itself_is_checked_not_stopped(cp: ControlPlane,
                                                                        runner: MemoryProvider) -> None:
    tid, name = running_task(cp, runner)
    runner.end(runner.start(name), 75)  # its runner was refused and exited 75
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    cp.reconciler.cycle_sync(force_poll=True)
    job = cp.store.jobs.get(AttemptRef(tid, 1))
    assert runner.cancels == [] and (job.extra_claims, job.extra_checked, job.extra_stopped) == (1, 1, 0)


def test_a_refused_runner_has_the_grace_to_exit_by_itself(cp: ControlPlane, runner: MemoryProvider) -> None:
    """It exits at once with the status that says why: stopped meanwhile, it would say it was killed."""
    cp.settings.kill_grace_s = 0.5
    tid, name = running_task(cp, runner)
    extra = runner.start(name)
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.looks == [] and cp.store.jobs.get(AttemptRef(tid, 1)).extra_checked == 0  # not yet
    runner.end(extra, 75)  # it exited
    time.sleep(0.6)
    cp.reconciler.cycle_sync(force_poll=True)
    job = cp.store.jobs.get(AttemptRef(tid, 1))
    assert runner.looks == [name] and runner.cancels == [] and (job.extra_checked, job.extra_stopped) == (1, 0)

    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))  # another one, which lingers: stopped after its own grace
    third = runner.start(name)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == []
    time.sleep(0.6)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [(third.execution, "an extra execution of the attempt")]
    assert cp.store.jobs.get(AttemptRef(tid, 1)).extra_stopped == 1


def test_a_failed_look_is_left_for_the_next_cycle(cp: ControlPlane, runner: MemoryProvider) -> None:
    tid, name = running_task(cp, runner)
    runner.start(name)
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    runner.fail_looks = 3  # every try of this cycle
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [] and cp.store.jobs.get(AttemptRef(tid, 1)).extra_checked == 0
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [(f"{name}-2", "an extra execution of the attempt")]
    assert cp.store.jobs.get(AttemptRef(tid, 1)).extra_stopped == 1


def test_a_leader_that_lost_its_lease_stops_nothing(cp: ControlPlane, runner: MemoryProvider) -> None:
    tid, name = running_task(cp, runner)
    runner.start(name)
    cp.store.jobs.note_refused_claim(AttemptRef(tid, 1))
    epoch = cp.store.leases.acquire("leader", "A", 0.2)
    assert epoch is not None
    time.sleep(0.3)
    assert cp.store.leases.acquire("leader", "B", 10) is not None  # B took over
    cp.reconciler.fence = lambda: Fence("leader", "A", epoch)
    with pytest.raises(Fenced):
        cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [] and cp.store.jobs.get(AttemptRef(tid, 1)).extra_checked == 0
