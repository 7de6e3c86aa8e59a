"""The state machine as the store enforces it: every legal transition applies and leaves exactly
one audit event written in the same transaction; every other (source, target) pair is refused
with IllegalTransition and leaves the task exactly as it was."""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from itertools import pairwise

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from controlplane import states
from controlplane.app import ControlPlane
from controlplane.states import TRANSITIONS, IllegalTransition, TaskState
from controlplane.store import NewTask

ALL_PAIRS = [(src, dst) for src in TaskState for dst in TaskState]
LEGAL = [(src, dst) for src, dst in ALL_PAIRS if dst in TRANSITIONS[src]]
ILLEGAL = [(src, dst) for src, dst in ALL_PAIRS if dst not in TRANSITIONS[src]]


def _pair_id(pair: tuple[TaskState, TaskState]) -> str:
    return f"{pair[0].value}->{pair[1].value}"


def path_to(target: TaskState) -> list[TaskState]:
    """A shortest legal path of transitions from `queued` (where every task starts) to `target`."""
    seen = {TaskState.QUEUED: [TaskState.QUEUED]}
    todo = deque([TaskState.QUEUED])
    while todo:
        here = todo.popleft()
        for nxt in sorted(TRANSITIONS[here]):
            if nxt not in seen:
                seen[nxt] = seen[here] + [nxt]
                todo.append(nxt)
    return seen[target][1:]


def new_task(owner: str = "alice") -> NewTask:
    return NewTask(owner=owner, tool_name="exercise", inputs_json="{}", input_size=None, provider="local",
                   resource_class="cpu_small", priority=0, ttl_s=3600, idempotency_key=None, tags=[],
                   resources_json="{}", max_runtime_s=60, max_attempts=1, estimate_s=1.0)


def start_of(state: TaskState) -> TaskState:
    """Where a task that reaches `state` starts: `waiting` (submitted with a parent not yet
    ended) is its own start, every other state is reached from `queued`."""
    return TaskState.WAITING if state == TaskState.WAITING else TaskState.QUEUED


def task_in(cp: ControlPlane, state: TaskState) -> str:
    """Submit a task and walk it along legal transitions until it is in `state`."""
    if state == TaskState.WAITING:
        parent = cp.store.tasks.submit(new_task()).task.task_id
        sub = cp.store.tasks.submit(replace(new_task(), after=(parent,)))
    else:
        sub = cp.store.tasks.submit(new_task())
    assert sub.created and sub.task.state == start_of(state)
    for step in [] if state == TaskState.WAITING else path_to(state):
        cp.store.tasks.transition(sub.task.task_id, step)
    assert cp.store.tasks.get(sub.task.task_id).state == state.value
    return sub.task.task_id


def test_the_eleven_states_of_the_design() -> None:
    assert {s.value for s in TaskState} == {
        "waiting", "queued", "scheduled", "running", "cancel_requested", "cancelling",
        "succeeded", "failed", "cancelled", "timed_out", "expired",
    }
    assert set(TRANSITIONS) == set(TaskState)
    assert states.TERMINAL == {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED, TaskState.TIMED_OUT}
    assert states.FINAL == states.TERMINAL | {TaskState.EXPIRED}
    # Terminal states only expire, and expired is the end.
    for s in states.TERMINAL:
        assert TRANSITIONS[s] == {TaskState.EXPIRED}
    assert TRANSITIONS[TaskState.EXPIRED] == frozenset()


@pytest.mark.parametrize("state", list(TaskState), ids=lambda s: s.value)
def test_every_state_is_reachable_from_queued(cp: ControlPlane, state: TaskState) -> None:
    task_id = task_in(cp, state)
    trail = [(e.from_state, e.to_state) for e in cp.store.logs.events(task_id)]
    start = start_of(state)
    walked = [start, *(path_to(state) if start == TaskState.QUEUED else [])]
    assert trail == [(None, start.value)] + [(a.value, b.value) for a, b in pairwise(walked)]


@pytest.mark.parametrize("pair", LEGAL, ids=_pair_id)
def test_legal_transition_applies_with_exactly_one_event(cp: ControlPlane, pair: tuple[TaskState, TaskState]) -> None:
    src, dst = pair
    task_id = task_in(cp, src)
    before = cp.store.tasks.get(task_id)
    events_before = cp.store.logs.events(task_id)

    out = cp.store.tasks.transition(task_id, dst)

    after = cp.store.tasks.get(task_id)
    assert out is not None and out.state == after.state == dst.value
    assert after.version == before.version + 1
    events = cp.store.logs.events(task_id)
    assert events[: len(events_before)] == events_before
    [new] = events[len(events_before):]
    assert (new.kind, new.from_state, new.to_state) == (dst.value, src.value, dst.value)
    assert new.attempt == after.attempt
    assert new.ts == after.updated_at
    if dst in states.TERMINAL:
        assert after.completed_at == after.updated_at
        assert after.expires_at == after.completed_at + after.ttl_s


@pytest.mark.parametrize("pair", LEGAL, ids=_pair_id)
def test_transition_and_its_event_commit_together(cp: ControlPlane, pair: tuple[TaskState, TaskState]) -> None:
    """If the event cannot be written, the state change is rolled back with it."""
    src, dst = pair
    task_id = task_in(cp, src)
    before = cp.store.tasks.get(task_id)
    events_before = cp.store.logs.events(task_id)
    refuse_inserts(cp, "task_events", "task_events refused")

    with pytest.raises(DBAPIError, match="task_events refused"):
        cp.store.tasks.transition(task_id, dst)

    assert cp.store.tasks.get(task_id) == before
    assert cp.store.logs.events(task_id) == events_before


@pytest.mark.parametrize("pair", ILLEGAL, ids=_pair_id)
def test_illegal_transition_is_refused_and_changes_nothing(cp: ControlPlane, pair: tuple[TaskState, TaskState]) -> None:
    src, dst = pair
    task_id = task_in(cp, src)
    before = cp.store.tasks.get(task_id)
    events_before = cp.store.logs.events(task_id)

    with pytest.raises(IllegalTransition) as refused:
        cp.store.tasks.transition(task_id, dst)

    assert (refused.value.task_id, refused.value.current, refused.value.target) == (task_id, src.value, dst.value)
    assert cp.store.tasks.get(task_id) == before
    assert cp.store.logs.events(task_id) == events_before


def refuse_inserts(cp: ControlPlane, table: str, message: str) -> None:
    """A trigger that makes every insert into `table` fail with `message` (in each engine's SQL)."""
    with cp.db.engine.begin() as c:
        if cp.db.is_sqlite:
            c.execute(text(f"CREATE TRIGGER refuse_inserts BEFORE INSERT ON {table} "
                           f"BEGIN SELECT RAISE(ABORT, '{message}'); END"))
        else:
            c.execute(text(f"CREATE FUNCTION refuse_inserts() RETURNS trigger LANGUAGE plpgsql AS "
                           f"$$ BEGIN RAISE EXCEPTION '{message}'; END $$"))
            c.execute(text(f"CREATE TRIGGER refuse_inserts BEFORE INSERT ON {table} "
                           f"FOR EACH ROW EXECUTE FUNCTION refuse_inserts()"))


def test_only_from_guard_leaves_a_moved_task_alone(cp: ControlPlane) -> None:
    task_id = task_in(cp, TaskState.RUNNING)
    before = cp.store.tasks.get(task_id)
    assert cp.store.tasks.transition(task_id, TaskState.QUEUED, only_from=[TaskState.SCHEDULED]) is None
    assert cp.store.tasks.get(task_id) == before


# ---- jobs ---------------------------------------------------------------------------------------
from controlplane.states import JOB_TRANSITIONS, JobState  # noqa: E402


def job_in(cp: ControlPlane, state: JobState):
    """A job row in `state` (its task claimed into a slot, then the row set directly)."""
    cp.store.tasks.submit(new_task())
    [(_task, job)] = cp.store.jobs.claim_for_launch("cpu_small", 1000, limit=1)
    with cp.db.write() as c:
        c.execute(text("update jobs set state = :s where job_id = :w"), {"s": state.value, "w": job.job_id})
    return cp.store.jobs.get(job.ref)


@pytest.mark.parametrize("src", list(JobState), ids=lambda s: s.value)
def test_job_moves_follow_their_table(cp: ControlPlane, src: JobState) -> None:
    for dst in JobState:
        job = job_in(cp, src)
        w = cp.store.writer
        if dst in JOB_TRANSITIONS[src]:
            with w.tx() as c:
                w.move_job(c, job, dst, now=123.0)
            after = cp.store.jobs.get(job.ref)
            assert after.state == dst
            assert (after.abandoned_at == 123.0) == (dst == JobState.ABANDONED)
        else:
            with pytest.raises(IllegalTransition):
                with w.tx() as c:
                    w.move_job(c, job, dst, now=123.0)
            assert cp.store.jobs.get(job.ref) == job  # nothing written


def test_ended_jobs_are_not_watched_and_only_launching_and_active_report() -> None:
    from controlplane.states import REPORTING, WATCHED

    assert WATCHED == {JobState.ACTIVE, JobState.DRAINING, JobState.ABANDONED}
    assert REPORTING == {JobState.LAUNCHING, JobState.ACTIVE}
    assert not JOB_TRANSITIONS[JobState.DONE] and not JOB_TRANSITIONS[JobState.DROPPED]


def queue_depths(cp: ControlPlane) -> tuple[dict[tuple[str, int], int], dict[tuple[str, int], int]]:
    """(what queue_depth says, what counting the queued tasks says), per (class, priority)."""
    with cp.db.read() as c:
        kept = {(r[0], r[1]): r[2] for r in c.exec_driver_sql(
            "SELECT resource_class, priority, waiting FROM queue_depth WHERE waiting <> 0")}
        counted = {(r[0], r[1]): r[2] for r in c.exec_driver_sql(
            "SELECT resource_class, priority, count(*) FROM tasks WHERE state = 'queued' GROUP BY 1, 2")}
    return kept, counted


@pytest.mark.parametrize("pair", LEGAL, ids=_pair_id)
def test_the_queue_depth_admission_reads_follows_every_transition(cp: ControlPlane,
                                                                   pair: tuple[TaskState, TaskState]) -> None:
    """Admission reads the depth the triggers keep instead of counting the queue: it must be the
    count, after every legal move (into the queue, out of it, or past it) and row writes that
    bypass the store (a purge, a bulk insert, a task moved to another priority)."""
    src, dst = pair
    others = [task_in(cp, s) for s in (TaskState.QUEUED, TaskState.QUEUED, TaskState.RUNNING)]
    task_id = task_in(cp, src)
    cp.store.tasks.transition(task_id, dst)
    kept, counted = queue_depths(cp)
    # (a waiting task's parent is one more queued task; a waiting task itself is in no queue)
    assert kept == counted and sum(counted.values()) == 2 + (dst == TaskState.QUEUED) + (src == TaskState.WAITING)
    with cp.db.write() as c:
        c.execute(text("UPDATE tasks SET priority = 5 WHERE task_id = :t"), {"t": others[0]})
        c.execute(text("DELETE FROM task_events WHERE task_id = :t"), {"t": others[1]})
        c.execute(text("DELETE FROM tasks WHERE task_id = :t"), {"t": others[1]})
    kept, counted = queue_depths(cp)
    assert kept == counted and counted[("cpu_small", 5)] == 1
