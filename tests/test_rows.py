"""The typed rows the store hands out: built from the driver's tuples by position when a query
selects the row's fields in order (the reconciler's 10,000 watched jobs a cycle), by name
otherwise, with the same result; and frozen."""

from __future__ import annotations

import dataclasses

import pytest

from controlplane.app import ControlPlane
from controlplane.states import JobState, TaskState
from controlplane.store import job_queries as jq
from controlplane.store import queries as q
from controlplane.store.rows import EventRow, LogLine, TaskSummary, WatchedJob, _field_names
from tests.test_states import new_task


def test_list_pages_are_read_in_the_order_of_their_fields() -> None:
    assert q.LIST_FIELDS == _field_names(TaskSummary)


def test_watched_jobs_are_read_in_the_order_of_their_fields() -> None:
    selected = tuple(c.name for c in jq.WATCHED_PAGE.selected_columns)
    assert selected == _field_names(WatchedJob)[: len(selected)] and selected[-1] == "job_state"
    assert tuple(c.name for c in jq.ATTENTION_TASKS.selected_columns)[1:] == ("attempt", "timeout_at",
                                                                            "stop_reason", "state")


@pytest.mark.parametrize(("stmt", "row"), [(q.TAIL_LOGS, LogLine),
                                           (q.LAST_LOGS, LogLine), (q.EVENTS, EventRow)])
def test_hot_queries_select_their_rows_fields_in_order(stmt: object, row: type) -> None:
    assert tuple(c.name for c in stmt.selected_columns) == _field_names(row)  # type: ignore[attr-defined]


def test_a_watched_job_carries_its_task_and_is_frozen(cp: ControlPlane) -> None:
    sub = cp.store.tasks.submit(new_task())
    [(_task, job)] = cp.store.jobs.claim_for_launch(sub.task.resource_class, capacity=1)
    assert cp.store.jobs.record_launch(job.job_id, {"job": "j-1"})
    watched = cp.store.jobs.watched()
    assert [w.task_id for w in watched] == [sub.task.task_id]
    w = watched[0]
    assert w.state is TaskState.SCHEDULED and w.job_state is JobState.ACTIVE and w.handle == {"job": "j-1"}
    with pytest.raises(AttributeError):  # frozen (a named tuple: the reconciler builds 100,000 a cycle)
        w.attempt = 2  # type: ignore[misc]


def test_a_row_built_by_position_equals_one_built_by_name(cp: ControlPlane) -> None:
    sub = cp.store.tasks.submit(new_task())
    [event] = cp.store.logs.events(sub.task.task_id)  # read by position (EVENTS selects in field order)
    columns = list(_field_names(EventRow))
    shuffled = columns[::-1]
    by_name = EventRow.many(shuffled, [tuple(getattr(event, c) for c in shuffled)])
    assert by_name == [event] and event.kind == "submitted"
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.kind = "other"  # type: ignore[misc]

