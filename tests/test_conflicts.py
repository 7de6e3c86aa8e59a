"""Conflicts on PostgreSQL: a write transaction the database aborts for another's sake (a
deadlock) is run again, so the call that made it answers, once, as if it had run alone; other
database errors are not run again (`controlplane.store.conflicts`)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.settings import Settings
from controlplane.store.conflicts import is_conflict, rerun
from controlplane.store.counts import Counts
from tests.conftest import FAST
from tests.postgres import Meeting


def timeline(cp: ControlPlane, task_id: str) -> list[tuple[str, str | None, str | None]]:
    return [(e.kind, e.from_state, e.to_state) for e in cp.store.logs.events(task_id)]


def submit(cp: ControlPlane, after: list[str] | None = None) -> str:
    return str(cp.service.submit("alice", api.SubmitTask(tool_name="exercise", inputs={}, after=after or []))["task_id"])


@pytest.mark.parametrize("victim", ["submit", "cancel"])
def test_a_cancel_and_a_group_commit_caught_in_a_deadlock_both_answer(engine: str, home: Path, victim: str,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    """Replica one cancels a queued task whose child waits for it (its row, then its queue's depth
    row as it leaves the queue, then the child's row) while replica two's group commit holds two
    submits: one after that child (the child's row shared) and one into the same queue at the
    same priority (the depth row): the cycle docs/design/guards.md#lock-order leaves. PostgreSQL
    fails the side that waited first (`victim`); it is run again, so both calls answer and every
    task ends as the user expects, each event written once, where the victim answered INTERNAL."""
    if engine != "postgres":
        pytest.skip("the race needs writers that are not serialised (PostgreSQL)")
    caplog.set_level(logging.WARNING, "controlplane.store.conflicts")
    one = ControlPlane(Settings(home=home, **FAST))
    two = ControlPlane(Settings(home=home, **FAST))
    try:
        parent = submit(one)
        child = submit(one, [parent])
        meeting = Meeting(one.db.engine)
        if victim == "submit":  # the cancel waits last: it holds the depth row, then pauses
            releases = one.store.tasks.w.releases
            settle = releases.settle

            def pausing_settle(*args: Any, **kw: Any) -> int:
                meeting.pause()
                return settle(*args, **kw)

            monkeypatch.setattr(releases, "settle", pausing_settle)
        else:  # the submits wait last: they share the child's row, then pause
            lock_parents = Counts.lock_parents

            def pausing_lock(self: Counts, task_ids: list[str]) -> None:
                lock_parents(self, task_ids)
                if task_ids:
                    meeting.pause()

            monkeypatch.setattr(Counts, "lock_parents", pausing_lock)

        commits = two.service.submits.commits  # both submits in one batch: two calls in progress
        commits.gather_s = 30.0
        two.service.submits.load.begin()
        two.service.submits.load.begin()

        async def both() -> list[dict[str, Any]]:
            return list(await asyncio.gather(
                two.service.submit_grouped("alice", api.SubmitTask(tool_name="exercise", inputs={}, after=[child])),
                two.service.submit_grouped("alice", api.SubmitTask(tool_name="exercise", inputs={}))))

        def cancel() -> dict[str, Any]:
            return one.service.cancel("alice", api.CancelTask(task_id=parent, reason="not needed"))

        def submits() -> list[dict[str, Any]]:
            return asyncio.run(both())

        names = ("cancel", "submits") if victim == "submit" else ("submits", "cancel")
        outs, errors = meeting.run(*(cancel, submits) if victim == "submit" else (submits, cancel))
        assert errors == [], errors
        out = dict(zip(names, outs, strict=True))
        assert commits.batches == 1 and commits.items == 2
        assert out["cancel"]["acknowledged"] is True and out["cancel"]["state"] == "cancelled"
        after, alone = (a["task_id"] for a in out["submits"])
        assert one.store.tasks.get(parent).state == "cancelled"
        assert one.store.tasks.get(alone).state == "queued"
        for task_id in (child, after):
            task = one.store.tasks.get(task_id)
            assert task.state == "failed" and task.error["code"] == "DEPENDENCY_FAILED", task
        assert timeline(one, parent) == [("submitted", None, "queued"), ("cancelled", "queued", "cancelled")]
        assert timeline(one, child) == [("submitted", None, "waiting"), ("dependency_failed", "waiting", "failed")]
        assert timeline(one, after) == ([("submitted", None, "failed")] if victim == "submit" else  # run after the cancel
                                        [("submitted", None, "waiting"), ("dependency_failed", "waiting", "failed")])
        assert timeline(one, alone) == [("submitted", None, "queued")]
        reruns = [r for r in caplog.records if r.name == "controlplane.store.conflicts"]
        assert len(reruns) == 1 and reruns[0].__dict__["sqlstate"] == "40P01", "one deadlock, its victim run again"
        assert ("submit_many" if victim == "submit" else "request_cancel") in reruns[0].getMessage()
        assert "deadlock" not in reruns[0].getMessage().lower()  # the database's own text stays out
    finally:
        for cp in (one, two):
            cp.db.dispose()


def test_only_a_conflict_is_run_again(engine: str, home: Path) -> None:
    """A unit that fails with a unique violation runs once, its error raised as it was; on
    PostgreSQL one that fails with a serialization failure (40001) runs again, and commits."""
    cp = ControlPlane(Settings(home=home))
    try:
        with cp.db.write() as c:
            c.execute(text("CREATE TABLE t_conflicts (k INTEGER PRIMARY KEY)"))
        runs: list[int] = []

        def insert(base: int = 0, raises: str | None = None) -> int:
            runs.append(1)
            with cp.db.write() as c:
                c.execute(text("INSERT INTO t_conflicts (k) VALUES (:k)"), {"k": base + len(runs)})
                if raises is not None and len(runs) == 1:
                    c.execute(text(f"DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '{raises}'; END $$"))
            return len(runs)

        assert rerun(insert, "a test") == 1
        runs.clear()
        with pytest.raises(IntegrityError) as refused:  # k = 1 again
            rerun(insert, "a test")
        assert not is_conflict(refused.value) and len(runs) == 1
        assert not is_conflict(ValueError("40P01"))
        if engine == "postgres":
            runs.clear()
            assert rerun(lambda: insert(10, "40001"), "a test") == 2  # the first run rolled back, the second wrote
            with cp.db.read() as c:
                assert sorted(c.execute(text("SELECT k FROM t_conflicts")).scalars()) == [1, 12]
            with pytest.raises(OperationalError) as failed:
                with cp.db.write() as c:
                    c.execute(text("DO $$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40P01'; END $$"))
            assert is_conflict(failed.value)
    finally:
        cp.db.dispose()
