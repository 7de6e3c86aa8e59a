"""The reconciler walks its watched jobs a page at a time: every job is polled and reconciled
exactly once per cycle however many pages that takes (jobs that end or start during the walk
included), polls stay within ceil(n / poll_batch_size) per poll key, provider statuses are recorded within a
budget per cycle, a job is never stopped twice in a cycle, tasks that need more than a poll (cancelled, past their timeout) get it on whichever
page their job falls, and a page is one range of the index of watched jobs."""

from __future__ import annotations

import math
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import text

from controlplane.app import ControlPlane
from controlplane.ids import AttemptRef
from controlplane.settings import Settings
from controlplane.states import WATCHED, JobState, TaskState
from controlplane.store import job_queries as jq
from controlplane.store.models import WATCHED_JOBS_WHERE
from controlplane_providers.base import JobPhase, JobStatus, MalformedHandle
from tests.conftest import query_plan
from tests.doubles import MemoryHandle, MemoryProvider
from tests.test_states import new_task

PAGE = 7
BATCH = 4


@pytest.fixture
def double() -> MemoryProvider:
    """Every job runs until told otherwise; a stopped one too (its task stays cancelling)."""
    double = MemoryProvider(poll_batch_size=BATCH)
    double.ignore_cancel = True
    return double


@pytest.fixture
def cp(home: Path, double: MemoryProvider) -> ControlPlane:
    cp = ControlPlane(Settings(home=home), providers={"local": double})
    cp.reconciler.page_size = PAGE
    return cp


def running(cp: ControlPlane, double: MemoryProvider, n: int,
            groups: tuple[str, ...] = ("g1", "g2")) -> dict[str, str]:
    """`n` running tasks, each with an active job (its handle in one of `groups`, in turn):
    {job name: task id}."""
    for _ in range(n):
        assert cp.store.tasks.submit(new_task()).created
    out = {}
    for i, (task, job) in enumerate(cp.store.jobs.claim_for_launch("cpu_small", capacity=10_000)):
        handle = double.start(job.job_name, group=groups[i % len(groups)])
        assert cp.store.jobs.record_launch(job.job_id, handle.encode())
        cp.attempts.mark_running(task.ref, time.time())
        out[job.job_name] = task.task_id
    return out


def walk_order(cp: ControlPlane) -> list[str]:
    return [j.job_name for j in cp.store.jobs.watched()]


def test_a_cycle_over_many_pages_polls_every_job_once_in_as_few_calls(cp: ControlPlane,
                                                                      double: MemoryProvider) -> None:
    jobs = running(cp, double, 50)  # 8 pages of 7
    stats = cp.reconciler.cycle_sync(force_poll=True)
    assert stats.jobs == 50
    assert double.polled() == Counter(list(jobs))  # each exactly once
    # per poll key: ceil(25 / 4) calls of at most 4 handles of that key
    assert len(double.polls) == 2 * math.ceil(25 / BATCH) == stats.provider_calls["local.poll"]
    assert all(len(call) <= BATCH and len({h.group for h in call}) == 1 for call in double.polls)
    watched = cp.store.jobs.watched()
    assert len(watched) == 50 and {j.provider_status for j in watched} == {"running"}  # every status recorded
    assert {cp.store.tasks.get(t).state for t in jobs.values()} == {TaskState.RUNNING.value}


def test_jobs_that_end_or_start_during_the_walk_are_reconciled_at_most_once(cp: ControlPlane,
                                                                           double: MemoryProvider) -> None:
    jobs = running(cp, double, 30)
    order = walk_order(cp)
    failed, gone_meanwhile = order[2], order[-1]
    double.set_status(failed, JobStatus(JobPhase.FAILED, reason="exit 3", exit_code=3, raw_status="failed"))
    started: dict[str, str] = {}

    def meanwhile() -> None:  # during the first poll, before the last page is read
        cp.attempts.end_lost(AttemptRef(jobs[gone_meanwhile], 1), "its runner said it ended", job_state=JobState.DONE)
        started.update(running(cp, double, 1))

    double.on_next_poll = meanwhile
    stats = cp.reconciler.cycle_sync(force_poll=True)
    polled = double.polled()
    assert max(polled.values()) == 1  # nothing twice
    assert set(order) - {gone_meanwhile} <= set(polled) <= set(order) | set(started)  # nothing skipped
    assert stats.finished == 1 and cp.store.tasks.get(jobs[failed]).state == TaskState.FAILED.value
    assert cp.store.tasks.get(jobs[gone_meanwhile]).state == TaskState.FAILED.value
    double.polls.clear()
    cp.reconciler.cycle_sync(force_poll=True)  # the next cycle: what is still watched, once each
    assert double.polled() == Counter(set(order) - {failed, gone_meanwhile} | set(started))


def test_a_burst_of_first_statuses_is_recorded_over_cycles_and_decides_nothing_late(
        cp: ControlPlane, double: MemoryProvider) -> None:
    """A cycle records at most `status_budget` provider statuses (bounded writes per cycle); the
    rest are recorded by the next cycles. What a status decides does not wait: a job that ended
    is reconciled in the cycle that sees it, recorded status or not."""
    cp.reconciler.status_budget = 8
    jobs = running(cp, double, 20)
    ended = walk_order(cp)[-1]  # walked last: past the budget
    double.set_status(ended, JobStatus(JobPhase.FAILED, reason="exit 3", exit_code=3, raw_status="failed"))
    stats = cp.reconciler.cycle_sync(force_poll=True)
    assert stats.finished == 1 and cp.store.tasks.get(jobs[ended]).state == TaskState.FAILED.value
    recorded = [j.provider_status for j in cp.store.jobs.watched()]
    assert len(recorded) == 19 and recorded.count("running") == 8 and recorded.count(None) == 11
    cp.reconciler.cycle_sync(force_poll=True)
    assert [j.provider_status for j in cp.store.jobs.watched()].count("running") == 16
    cp.reconciler.cycle_sync(force_poll=True)
    assert {j.provider_status for j in cp.store.jobs.watched()} == {"running"}


def test_a_job_past_its_timeout_and_silent_is_stopped_once(cp: ControlPlane, double: MemoryProvider) -> None:
    jobs = running(cp, double, 20)
    late = walk_order(cp)[-1]  # on the last page
    now = time.time()
    with cp.db.write() as c:
        c.execute(text("update tasks set timeout_at = :ts where task_id = :t"), {"ts": now - 1, "t": jobs[late]})
        c.execute(text("update jobs set seen_at = :ts where task_id = :t"), {"ts": now - 3600, "t": jobs[late]})
    cp.reconciler.started_at = now - 7200  # silent since before this server started, too
    cp.reconciler.cycle_sync(force_poll=True)
    cp.reconciler.cycle_sync(force_poll=True)  # within STOP_RESEND_S: not again
    assert double.cancels == [(late, "timeout")]
    assert cp.store.tasks.get(jobs[late]).state == TaskState.CANCELLING.value
    assert len(double.polls) == 2 * 2 * math.ceil(10 / BATCH)  # and every job polled, both cycles


def test_a_cancel_reaches_the_job_on_whichever_page_it_falls(cp: ControlPlane, double: MemoryProvider) -> None:
    jobs = running(cp, double, 20)
    order = walk_order(cp)
    first, last = order[0], order[-1]
    for name in (first, last):
        cp.store.tasks.transition(jobs[name], TaskState.CANCEL_REQUESTED)
    cp.reconciler.cycle_sync(force_poll=True)
    assert sorted(double.cancels) == sorted([(first, "cancel"), (last, "cancel")])
    assert {cp.store.tasks.get(jobs[n]).state for n in (first, last)} == {TaskState.CANCELLING.value}
    assert double.polled() == Counter(list(jobs))


def test_a_job_with_an_unreadable_handle_is_named_once_and_forgotten_once_not_watched(
        cp: ControlPlane, double: MemoryProvider, caplog: pytest.LogCaptureFixture) -> None:
    """Said once while it is watched, however many cycles; once it is no longer watched the
    reconciler holds nothing for it (a long-lived server does not grow with such jobs)."""
    jobs = running(cp, double, 10)
    damaged = walk_order(cp)[3]
    with cp.db.write() as c:
        c.execute(text("update jobs set handle_json = '{\"job\": 7}' where task_id = :t"), {"t": jobs[damaged]})
    for _ in range(3):
        cp.reconciler.cycle_sync(force_poll=True)
    said = [r for r in caplog.records if "cannot be polled or stopped" in r.getMessage()]
    assert len(said) == 1 and damaged in said[0].getMessage()
    assert damaged not in double.polled() and len(double.polled()) == 9
    cp.attempts.end_lost(AttemptRef(jobs[damaged], 1), "its runner said it ended", job_state=JobState.DONE)
    cp.reconciler.cycle_sync(force_poll=True)
    assert cp.reconciler._unreadable == {}


def test_a_page_of_handles_decodes_together_and_a_bad_one_is_named_alone(double: MemoryProvider) -> None:
    good = ['{"job": "a", "execution": "a", "group": "g"}',
            '{"job": "b", "execution": "b", "group": "g", "added_later": 1}']
    assert double.handles(good) == [MemoryHandle("a", "a", "g"), MemoryHandle("b", "b", "g")]
    out = double.handles([good[0], '{"job": 7}', "", good[1]])
    assert out[0] == MemoryHandle("a", "a", "g") and out[3] == MemoryHandle("b", "b", "g")
    assert isinstance(out[1], MalformedHandle) and "provider local" in str(out[1]) and "job" in str(out[1])
    assert isinstance(out[2], MalformedHandle)


@pytest.mark.sqlite_only("SQLite's planner, which has no statistics, is what `likely` steers")
def test_a_page_is_one_range_of_the_index_of_watched_jobs(cp: ControlPlane) -> None:
    assert WATCHED_JOBS_WHERE == "state IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(WATCHED)))
    with cp.db.read() as c:
        plan = query_plan(cp.db, c, jq.WATCHED_PAGE, {"after_ts": 0.0, "after_jid": "", "lim": PAGE})
    assert plan == ["SEARCH jobs USING INDEX ix_jobs_watched ((created_at,job_id)>(?,?))"]


def test_what_a_cloud_says_is_kept_whatever_its_words(cp: ControlPlane, double: MemoryProvider) -> None:
    """A status word longer than its column and a reason holding NUL (text PostgreSQL cannot
    keep as it is) are recorded alike on every engine, and the cycle goes on."""
    jobs = running(cp, double, 2)
    odd, plain = list(jobs)
    double.set_status(odd, JobStatus(JobPhase.PENDING, raw_status="WAITING_FOR_A_VERY_LONG_TIME_INDEED_" * 2,
                                     waiting_reason="no capacity\x00 in the zone"))
    cp.reconciler.cycle_sync(force_poll=True)
    got = cp.store.jobs.get(AttemptRef(jobs[odd], 1))
    assert (got.provider_status, got.provider_reason) == ("WAITING_FOR_A_VERY_LONG_TIME_IND",
                                                          "no capacity\ufffd in the zone")
    assert cp.store.jobs.get(AttemptRef(jobs[plain], 1)).provider_status == "running"
