"""Extra executions of an attempt (a paused leader launching again, a retried launch whose first
try did start, a cloud's own retry): a claim refused to one is counted on the attempt's job, and
the reconciler looks the attempt up by its marker, stops every execution that is not the job's
own and still runs, and records, logs and counts what it stopped. Against an in-memory runner
that keeps every execution it is told of; both engines."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.app import ControlPlane
from controlplane.ops import metrics
from controlplane.settings import Settings
from controlplane.store.leases import Fence, Fenced
from controlplane_providers.base import (Handle, JobPhase, JobStatus, LaunchSpec, Provider,
                                         TransientProviderError)
from tests.test_states import new_task


@dataclass(frozen=True)
class ExecHandle(Handle):
    execution: str
    job_name: str
    seen_at: float | None = None  # differs between a launched handle and a found one (not identity)


class Executions(Provider[ExecHandle]):
    """A runner that keeps every execution of a name: each runs until stopped or `ended`."""

    name = "local"
    handle_type = ExecHandle
    poll_interval_s = 0.0

    def __init__(self) -> None:
        self.executions: dict[str, list[str]] = {}  # job name -> executions, oldest first
        self.ended: set[str] = set()
        self.cancels: list[tuple[str, str]] = []
        self.looks: list[str] = []  # find_all's job names
        self.fail_looks = 0  # the next n find_all calls fail (throttled)

    def start(self, job_name: str) -> ExecHandle:
        execution = f"{job_name}-{len(self.executions.setdefault(job_name, [])) + 1}"
        self.executions[job_name].append(execution)
        return ExecHandle(execution, job_name, seen_at=time.time())

    def launch(self, spec: LaunchSpec) -> ExecHandle:
        return self.start(spec.job_name)

    def find(self, spec: LaunchSpec) -> ExecHandle | None:
        found = self.find_all(spec)
        return found[0] if found else None

    def find_all(self, spec: LaunchSpec) -> list[ExecHandle]:
        self.looks.append(spec.job_name)
        if self.fail_looks:
            self.fail_looks -= 1
            raise TransientProviderError("throttled")
        return [ExecHandle(e, spec.job_name) for e in reversed(self.executions.get(spec.job_name, []))]

    def same_job(self, a: ExecHandle, b: ExecHandle) -> bool:
        return a.execution == b.execution

    def poll(self, handles: list[ExecHandle]) -> list[JobStatus]:
        return [JobStatus(JobPhase.FAILED, exit_code=75, raw_status="failed") if h.execution in self.ended
                else JobStatus(JobPhase.RUNNING, started_at=time.time(), raw_status="running") for h in handles]

    def cancel(self, handle: ExecHandle, reason: str = "cancelled") -> None:
        self.cancels.append((handle.execution, reason))
        self.ended.add(handle.execution)


@pytest.fixture
def runner() -> Executions:
    return Executions()


@pytest.fixture
def cp(home: Path, runner: Executions) -> ControlPlane:
    """A refused runner is given kill_grace_s to exit by itself: none here, but in its own test."""
    return ControlPlane(Settings(home=home, kill_grace_s=0.0), providers={"local": runner})


def running_task(cp: ControlPlane, runner: Executions) -> tuple[str, str]:
    """A running task whose attempt's job runs one execution: (task id, job name)."""
    assert cp.store.tasks.submit(new_task(), queue_limit=100).created
    [(task, job)] = cp.store.jobs.claim_for_launch("cpu_small", capacity=100)
    assert cp.store.jobs.record_launch(job.worker_id, runner.start(job.job_name).encode())
    cp.attempts.mark_running(task.task_id, task.attempt, time.time())
    return task.task_id, job.job_name


def stopped_metric() -> float:
    return metrics.REGISTRY.get_sample_value("controlplane_extra_executions_total",
                                             {"provider": "local", "action": "stopped"}) or 0.0


def test_a_refused_claim_is_counted_on_its_attempts_job_alone(cp: ControlPlane, runner: Executions) -> None:
    tid, _ = running_task(cp, runner)
    other, _ = running_task(cp, runner)
    cp.store.jobs.note_refused_claim(tid, 1)
    cp.store.jobs.note_refused_claim(tid, 1)
    cp.store.jobs.note_refused_claim(tid, 2)  # no such attempt: nothing
    job = cp.store.jobs.get(tid, 1)
    assert (job.extra_claims, job.extra_checked, job.extra_stopped) == (2, 0, 0)
    assert cp.store.jobs.get(other, 1).extra_claims == 0


def test_the_reconciler_stops_an_extra_execution_and_says_so(cp: ControlPlane, runner: Executions,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    tid, name = running_task(cp, runner)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.looks == []  # nothing refused: nothing looked up

    runner.start(name)  # a second execution of the attempt, whose claim is refused
    cp.store.jobs.note_refused_claim(tid, 1)
    before = stopped_metric()
    with caplog.at_level(logging.WARNING, logger="controlplane.reconciler"):
        stats = cp.reconciler.cycle_sync(force_poll=True)
    assert runner.looks == [name] and runner.cancels == [(f"{name}-2", "an extra execution of the attempt")]
    assert stats.extra_stopped == 1 and stopped_metric() == before + 1
    job = cp.store.jobs.get(tid, 1)
    assert (job.extra_claims, job.extra_checked, job.extra_stopped) == (1, 1, 1)
    [said] = [r for r in caplog.records if getattr(r, "action", None) == "extra_stopped"]
    fields = ("task_id", "attempt", "provider", "job_name")
    assert tuple(getattr(said, f) for f in fields) == (tid, 1, "local", name)

    cp.reconciler.cycle_sync(force_poll=True)  # looked into: not again
    assert runner.looks == [name] and len(runner.cancels) == 1
    assert cp.store.tasks.get(tid).state == "running"  # the attempt's own execution runs on


def test_an_extra_execution_that_ended_by_itself_is_checked_not_stopped(cp: ControlPlane,
                                                                        runner: Executions) -> None:
    tid, name = running_task(cp, runner)
    runner.ended.add(runner.start(name).execution)  # its runner was refused and exited 75
    cp.store.jobs.note_refused_claim(tid, 1)
    cp.reconciler.cycle_sync(force_poll=True)
    job = cp.store.jobs.get(tid, 1)
    assert runner.cancels == [] and (job.extra_claims, job.extra_checked, job.extra_stopped) == (1, 1, 0)


def test_a_refused_runner_has_the_grace_to_exit_by_itself(cp: ControlPlane, runner: Executions) -> None:
    """It exits at once with the status that says why: stopped meanwhile, it would say it was killed."""
    cp.settings.kill_grace_s = 0.5
    tid, name = running_task(cp, runner)
    extra = runner.start(name)
    cp.store.jobs.note_refused_claim(tid, 1)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.looks == [] and cp.store.jobs.get(tid, 1).extra_checked == 0  # not yet
    runner.ended.add(extra.execution)  # it exited
    time.sleep(0.6)
    cp.reconciler.cycle_sync(force_poll=True)
    job = cp.store.jobs.get(tid, 1)
    assert runner.looks == [name] and runner.cancels == [] and (job.extra_checked, job.extra_stopped) == (1, 0)

    cp.store.jobs.note_refused_claim(tid, 1)  # another one, which lingers: stopped after its own grace
    third = runner.start(name)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == []
    time.sleep(0.6)
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [(third.execution, "an extra execution of the attempt")]
    assert cp.store.jobs.get(tid, 1).extra_stopped == 1


def test_a_failed_look_is_left_for_the_next_cycle(cp: ControlPlane, runner: Executions) -> None:
    tid, name = running_task(cp, runner)
    runner.start(name)
    cp.store.jobs.note_refused_claim(tid, 1)
    runner.fail_looks = 3  # every try of this cycle
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [] and cp.store.jobs.get(tid, 1).extra_checked == 0
    cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [(f"{name}-2", "an extra execution of the attempt")]
    assert cp.store.jobs.get(tid, 1).extra_stopped == 1


def test_a_leader_that_lost_its_lease_stops_nothing(cp: ControlPlane, runner: Executions) -> None:
    tid, name = running_task(cp, runner)
    runner.start(name)
    cp.store.jobs.note_refused_claim(tid, 1)
    epoch = cp.store.leases.acquire("leader", "A", 0.2)
    assert epoch is not None
    time.sleep(0.3)
    assert cp.store.leases.acquire("leader", "B", 10) is not None  # B took over
    cp.reconciler.fence = lambda: Fence("leader", "A", epoch)
    with pytest.raises(Fenced):
        cp.reconciler.cycle_sync(force_poll=True)
    assert runner.cancels == [] and cp.store.jobs.get(tid, 1).extra_checked == 0
