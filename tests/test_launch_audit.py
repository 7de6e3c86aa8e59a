"""The audit names every launch once, also of a job whose runner ran and ended before its launch
was recorded (the control plane restarted between the provider call and its record)."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.settings import Settings
from controlplane_runner import events as ev
from tests.doubles import MemoryProvider
from tests.test_states import new_task


def launched_events(cp: ControlPlane, task_id: str) -> int:
    with cp.store.db.engine.connect() as c:
        return int(c.execute(text("select count(*) from task_events where task_id = :t and kind = 'launched'"),
                             {"t": task_id}).scalar_one())


def test_a_job_that_ran_before_its_launch_was_recorded_is_in_the_audit_once(home: Path) -> None:
    cp = ControlPlane(Settings(home=home), providers={"local": MemoryProvider()})
    assert cp.store.tasks.submit(new_task()).created
    [(task, job)] = cp.store.jobs.claim_for_launch("cpu_small", capacity=100)  # the intent; no record follows
    now = time.time()
    cp.attempts.apply(task.ref, [
        ev.started(pid=1, job_name=job.job_name, seq=1, ts=now),
        ev.finished(status="succeeded", exit_code=0, signal=None, error=None, stop_reason=None, result={"ok": 1},
                    artifacts=[], started_at=now, finished_at=now + 1, seq=2, ts=now + 1),
    ])
    ended = cp.store.tasks.get(task.task_id)
    assert ended is not None and ended.state == "succeeded"
    assert launched_events(cp, task.task_id) == 1
    assert not cp.store.jobs.record_launch(job.job_id, {"job": job.job_name})  # a late record adds none
    assert launched_events(cp, task.task_id) == 1


def test_a_recorded_launch_is_in_the_audit_once(home: Path) -> None:
    cp = ControlPlane(Settings(home=home), providers={"local": MemoryProvider()})
    assert cp.store.tasks.submit(new_task()).created
    [(task, job)] = cp.store.jobs.claim_for_launch("cpu_small", capacity=100)
    assert cp.store.jobs.record_launch(job.job_id, MemoryProvider().start(job.job_name).encode())
    now = time.time()
    cp.attempts.apply(task.ref, [
        ev.started(pid=1, job_name=job.job_name, seq=1, ts=now),
        ev.finished(status="succeeded", exit_code=0, signal=None, error=None, stop_reason=None, result={"ok": 1},
                    artifacts=[], started_at=now, finished_at=now + 1, seq=2, ts=now + 1),
    ], job_ended=True)
    assert launched_events(cp, task.task_id) == 1
