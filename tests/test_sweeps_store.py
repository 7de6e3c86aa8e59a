"""The store-side edges of sweeps, on both engines: a scheduler tick that finds only shards of a
sweep at its `max_parallel` writes nothing; a queued sweep's status reads no running shards or
failures; a `fail_fast` stop cancels the shards left a batch per transaction, the rest by the
reconciler's follow-up, losing none across a restart, and a stop once done costs the reconciler's
look for what stops left nothing (it reads only the stops not done)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.settings import Settings
from controlplane.states import TaskState as S
from controlplane.store import sweep_queries as sq
from tests.conftest import FAST, query_plan, record_statements
from tests.postgres import Meeting
from tests.test_releases import events_per_task

pytestmark = pytest.mark.anyio


def control_plane(home: Path, **settings: Any) -> ControlPlane:
    """A control plane whose loops are not started: the test drives its scheduler itself."""
    return ControlPlane(Settings(home=home, **{**FAST, **settings}))


def submit(cp: ControlPlane, shards: int, **kw: Any) -> str:
    req = api.SubmitSweep.model_validate({"tool_name": "exercise", "vary": {"list": [{"sleep_s": 30}] * shards},
                                          **kw})
    return str(cp.service.submit_sweep("alice", req)["sweep_id"])


def count_writes(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """One entry per write transaction the database opens from now on."""
    opened: list[str] = []
    write, on_loop = cp.db.write, cp.db.write_on_loop
    monkeypatch.setattr(cp.db, "write", lambda: (opened.append("write"), write())[1])

    async def write_on_loop(fn: Any) -> Any:
        opened.append("write_on_loop")
        return await on_loop(fn)

    monkeypatch.setattr(cp.db, "write_on_loop", write_on_loop)
    return opened


async def test_a_tick_that_finds_only_shards_of_a_full_sweep_writes_nothing(
        home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = control_plane(home)
    try:
        sweep_id = submit(cp, 3, max_parallel=1)
        (task, job), = cp.store.jobs.claim_for_launch("cpu_small", 2)
        assert task.sweep_id == sweep_id
        assert cp.store.jobs.record_launch(job.job_id, {"pid": 0})  # launched: no intent left to launch
        assert cp.store.jobs.has_work("cpu_small", 2) == "idle"  # a slot is free, but the sweep is at its limit

        writes, seen = count_writes(cp, monkeypatch), record_statements(cp, monkeypatch)
        await cp.scheduler.tick()
        assert writes == [] and "cpu_small" not in seen  # no transaction, no queue lock
        assert sum(st.value == "queued" for st in cp.store.sweeps.state_counts(sweep_id)) == 1

        cp.service.submit("alice", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 30}))
        assert cp.store.jobs.has_work("cpu_small", 2) == "ready"  # a task of its own is claimed past them
        claimed = cp.store.jobs.claim_for_launch("cpu_small", 2)
        assert [t.sweep_id for t, _ in claimed] == [None]
    finally:
        cp.db.dispose()


def test_a_queued_sweeps_status_reads_no_running_shards_or_failures(home: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    cp = control_plane(home)
    try:
        sweep_id = submit(cp, 50)
        seen = record_statements(cp, monkeypatch)
        st = cp.service.sweep_status("alice", api.GetSweepStatus(sweep_id=sweep_id))
        assert st["counts"] == {"queued": 50} and st["failures"] == [] and st["percent"] == 0.0
        assert sq.RUNNING_SHARDS not in seen and sq.FIRST_FAILURES not in seen
        assert sq.STATE_COUNTS in seen
    finally:
        cp.db.dispose()


SHARDS, BATCH = 301, 50


def states(cp: ControlPlane, sweep_id: str) -> dict[str, int]:
    return {st.value: n for st, n in cp.store.sweeps.state_counts(sweep_id).items()}


def test_a_fail_fast_stop_cancels_a_batch_a_transaction_and_a_restart_half_way_loses_none(
        home: Path) -> None:
    cp = control_plane(home, release_batch=BATCH, release_cycle_s=0.3)
    sweep_id = submit(cp, SHARDS, fail_fast=1)
    first = cp.store.sweeps.page(sweep_id, 0, 1)[0].task_id
    for step in (S.SCHEDULED, S.RUNNING, S.FAILED):
        cp.store.tasks.transition(first, step)
    # The transaction that tripped the policy moved one batch, not every shard.
    assert states(cp, sweep_id) == {"failed": 1, "cancelled": BATCH, "queued": SHARDS - 1 - BATCH}
    assert cp.store.jobs.has_work("cpu_small", 2) == "ready"
    assert cp.store.jobs.claim_for_launch("cpu_small", 2, lookahead=5) == []  # the claim cancels, never launches
    assert cp.store.sweeps.stop_left() == BATCH  # one follow-up: one batch
    left = states(cp, sweep_id)["queued"]
    assert 0 < left < SHARDS - 1 - 2 * BATCH
    assert cp.store.sweeps.get(sweep_id).stop_done_at is None  # type: ignore[union-attr]

    cp.db.dispose()  # the server stops half way; the next one's reconciler finishes the stop
    cp = control_plane(home, release_batch=BATCH, release_cycle_s=0.3)
    try:
        for _ in range(50):
            cp.reconciler.cycle_sync()
            if cp.store.sweeps.stop_left() is None:
                break
        assert states(cp, sweep_id) == {"failed": 1, "cancelled": SHARDS - 1}
        assert cp.store.sweeps.get(sweep_id).stop_done_at is not None  # type: ignore[union-attr]
        cancelled = events_per_task(cp, "cancelled")
        assert len(cancelled) == SHARDS - 1 and set(cancelled.values()) == {1}, "each shard cancelled once"
        with cp.db.engine.connect() as c:
            assert c.execute(text("SELECT COUNT(*) FROM jobs")).scalar_one() == 0, "no shard launched"
        st = cp.service.sweep_status("alice", api.GetSweepStatus(sweep_id=sweep_id))
        assert st["done"] and st["stop_reason"] == "stopped by its failure policy (fail_fast: 1 failed shard)"
    finally:
        cp.db.dispose()


def test_a_finished_stop_costs_the_reconcilers_look_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cp = control_plane(home, release_batch=BATCH)
    try:
        stopped = [submit(cp, 3) for _ in range(5)]
        for sweep_id in stopped:
            assert cp.service.cancel_sweep("alice", api.CancelSweep(sweep_id=sweep_id))["cancelled"] == 3
            assert cp.store.sweeps.get(sweep_id).stop_done_at is not None  # type: ignore[union-attr]
        # A stop from before `stop_done_at` was kept (a migrated database): looked at once, then done.
        with cp.db.engine.begin() as c:
            c.execute(text("UPDATE sweeps SET stop_done_at = NULL WHERE sweep_id = :s"), {"s": stopped[0]})
        assert cp.store.sweeps.stop_left() == 0
        assert cp.store.sweeps.get(stopped[0]).stop_done_at is not None  # type: ignore[union-attr]

        seen = record_statements(cp, monkeypatch)
        assert cp.store.sweeps.stop_left() is None
        assert seen == [sq.NEXT_STOP_LEFT]
        with cp.db.engine.connect() as c:
            if not cp.db.is_sqlite:
                c.execute(text("SET enable_seqscan = off"))  # a few rows: show what the planner can use
            plan = " ".join(query_plan(cp.db, c, sq.NEXT_STOP_LEFT, {}))
        assert "ix_sweeps_stop_left" in plan and "tasks" not in plan, plan  # no shard is probed
    finally:
        cp.db.dispose()


def test_two_replicas_finishing_one_stop_at_once_cancel_each_shard_once_and_mark_it_done(home: Path) -> None:
    import threading

    replicas = [control_plane(home, release_batch=BATCH) for _ in range(2)]
    try:
        sweep_id = submit(replicas[0], SHARDS, fail_fast=1)
        first = replicas[0].store.sweeps.page(sweep_id, 0, 1)[0].task_id
        for step in (S.SCHEDULED, S.RUNNING, S.FAILED):
            replicas[0].store.tasks.transition(first, step)
        assert replicas[1].store.sweeps.get(sweep_id).stop_done_at is None  # type: ignore[union-attr]
        go, errors = threading.Barrier(2), []

        def follow_up(cp: ControlPlane) -> None:
            try:
                go.wait()
                while cp.store.sweeps.stop_left() is not None:
                    pass
            except Exception as e:  # (said by the assertion below)
                errors.append(e)

        threads = [threading.Thread(target=follow_up, args=(cp,)) for cp in replicas]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert errors == [] and not any(t.is_alive() for t in threads)
        assert states(replicas[1], sweep_id) == {"failed": 1, "cancelled": SHARDS - 1}
        cancelled = events_per_task(replicas[0], "cancelled")
        assert len(cancelled) == SHARDS - 1 and set(cancelled.values()) == {1}, "each shard cancelled once"
        assert all(cp.store.sweeps.get(sweep_id).stop_done_at is not None for cp in replicas)  # type: ignore[union-attr]
    finally:
        for cp in replicas:
            cp.db.dispose()



def pause_after_the_first_move(cp: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> Meeting:
    """A meeting whose first call pauses just after its first transition of a task (a stop's
    first shard moved: a queued one's depth row written)."""
    meeting, transition = Meeting(cp.db.engine), cp.store.sweeps.w.transition

    def pausing(*args: Any, **kw: Any) -> Any:
        moved = transition(*args, **kw)
        meeting.pause()
        return moved

    monkeypatch.setattr(cp.store.sweeps.w, "transition", pausing)
    return meeting


@pytest.mark.parametrize("stopper", ["cancel_sweep", "stop_left"])
def test_a_stop_and_a_claim_at_once_never_deadlock(engine: str, home: Path, stopper: str,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """One replica's stop has cancelled a queued shard (so it holds its queue's depth row) when
    another replica's scheduler claims from that queue (taking the next shards, and cancelling
    them as the sweep is stopped): the stop goes on to the shards the claim holds. Both must
    finish, each shard cancelled once, where the stop could wait for the claim while the claim
    waited for the depth row, which PostgreSQL ends by failing one of them (a cancel_sweep that
    answered INTERNAL)."""
    if engine != "postgres":
        pytest.skip("the race needs writers that are not serialised (PostgreSQL)")
    one, two = (control_plane(home, release_batch=BATCH) for _ in range(2))
    try:
        shards = 20
        if stopper == "cancel_sweep":
            sweep_id = submit(one, shards)
        else:  # a fail_fast stop that left shards for the reconciler's follow-up
            sweep_id = submit(one, shards + BATCH, fail_fast=1)
            first = one.store.sweeps.page(sweep_id, 0, 1)[0].task_id
            for step in (S.SCHEDULED, S.RUNNING, S.FAILED):
                one.store.tasks.transition(first, step)
            assert states(one, sweep_id)["queued"] == shards - 1
        meeting = pause_after_the_first_move(one, monkeypatch)
        stop = (lambda: one.store.sweeps.stop(sweep_id, "cancelled by its owner", {"code": "CANCELLED"})) \
            if stopper == "cancel_sweep" else one.store.sweeps.stop_left
        _, errors = meeting.run(stop, lambda: two.store.jobs.claim_for_launch("cpu_small", 8))
        assert errors == []
        while one.store.sweeps.stop_left() is not None:
            pass
        counts = states(two, sweep_id)
        assert counts.get("queued", 0) == 0 and counts.get("scheduled", 0) == 0, counts
        cancelled = events_per_task(one, "cancelled")
        assert set(cancelled.values()) == {1} and len(cancelled) == counts["cancelled"], "each shard cancelled once"
    finally:
        for cp in (one, two):
            cp.db.dispose()


@pytest.mark.parametrize("other", ["cancel_task", "submit_after"])
def test_a_stop_and_a_write_on_one_of_its_shards_at_once_never_deadlock(engine: str, home: Path, other: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """One replica's stop has cancelled its first queued shard (it holds its queue's depth row)
    when another replica writes on one of the sweep's last shards:
    cancels it (its row, then the depth row), or submits a task after it (its row shared, then
    the queue's lock). The stop then reaches that shard. Both must finish, where each waited for
    the other and PostgreSQL failed one of them (an INTERNAL answer)."""
    if engine != "postgres":
        pytest.skip("the race needs writers that are not serialised (PostgreSQL)")
    one, two = (control_plane(home) for _ in range(2))
    try:
        sweep_id = submit(one, 20)
        last = one.store.sweeps.page(sweep_id, 19, 1)[0].task_id
        meeting = pause_after_the_first_move(one, monkeypatch)

        def write() -> Any:
            if other == "cancel_task":
                return two.service.cancel("alice", api.CancelTask(task_id=last, reason="mine"))
            return two.service.submit("alice", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 1},
                                                              after=[last]))

        (_, wrote), errors = meeting.run(lambda: one.store.sweeps.stop(
            sweep_id, "cancelled by its owner", {"code": "CANCELLED", "message": "cancelled by its owner"}), write)
        assert errors == []
        assert states(two, sweep_id) == {"cancelled": 20}
        cancelled = events_per_task(one, "cancelled")
        assert set(cancelled.values()) == {1} and len(cancelled) == 20, "each shard cancelled once"
        if other == "submit_after":  # its parent was cancelled: it ends at once, as it would after
            child = two.store.tasks.get(wrote["task_id"])
            assert child is not None and child.state == S.FAILED
    finally:
        for cp in (one, two):
            cp.db.dispose()
