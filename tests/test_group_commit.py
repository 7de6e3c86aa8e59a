"""Group commit: concurrent submits share one transaction and one fsync, and each caller still
gets its own answer only once its task is on disk; one task refused leaves the others in; a
caller that goes away does not take the others' writes with it."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.group_commit import GroupCommit
from controlplane.guards import QueueFull, QueueLength
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane.store import NewTask, Submitted
from controlplane.store.db import Database
from tests.conftest import FAST, Agent, write_catalog
from tests.test_states import new_task

pytestmark = pytest.mark.anyio


class Recorder:
    """A write_many that records its batches and can be held at a gate."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, items: Sequence[int]) -> list[int | Exception]:
        self.gate.wait(10)
        self.batches.append(list(items))
        return [ValueError(f"odd {i}") if i % 2 else i * 10 for i in items]


async def test_concurrent_items_share_batches_and_each_caller_gets_its_own_outcome() -> None:
    rec = Recorder()
    gc: GroupCommit[int, int] = GroupCommit(rec)
    rec.gate.clear()  # hold the first batch so that the others pile up behind it
    results: dict[int, object] = {}

    async def one(i: int) -> None:
        try:
            results[i] = await gc.run(i)
        except ValueError as e:
            results[i] = str(e)

    async with anyio.create_task_group() as tg:
        for i in range(20):
            tg.start_soon(one, i)
        await anyio.sleep(0.2)
        rec.gate.set()
    assert results == {i: (f"odd {i}" if i % 2 else i * 10) for i in range(20)}
    assert sorted(i for b in rec.batches for i in b) == list(range(20))  # every item written once
    assert len(rec.batches) <= 3 and gc.batches == len(rec.batches)  # the first alone, the rest together


async def test_more_waiting_than_one_batch_holds_are_written_in_turn() -> None:
    rec = Recorder()
    rec.gate.clear()
    gc: GroupCommit[int, int] = GroupCommit(rec, max_batch=2)
    answers: list[int] = []

    async def one(i: int) -> None:
        answers.append(await gc.run(i))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in range(0, 14, 2):
                tg.start_soon(one, i)
            await anyio.sleep(0.1)
            rec.gate.set()
    assert sorted(answers) == [i * 10 for i in range(0, 14, 2)]
    assert all(len(b) <= 2 for b in rec.batches) and sorted(i for b in rec.batches for i in b) == list(range(0, 14, 2))


async def test_a_gathering_leader_waits_for_every_call_in_progress_and_no_longer() -> None:
    """A leader gathers (here for up to a minute) until as many items wait as calls are in
    progress; a call answered meanwhile (not a submit) lowers that count and ends the wait too.
    All three items go in one batch, long before the minute is up."""
    rec = Recorder()
    calls = 4  # three submits and a read in progress
    gc: GroupCommit[int, int] = GroupCommit(rec, gather_s=60.0, in_progress=lambda: calls)
    answers: list[int] = []

    async def one(i: int) -> None:
        answers.append(await gc.run(i))

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            for i in (0, 2, 4):
                tg.start_soon(one, i)
            await anyio.sleep(0.2)
            assert answers == [] and rec.batches == []  # still gathering: the read is in progress
            calls -= 1  # the read is answered
            gc.poke()
    assert sorted(answers) == [0, 20, 40] and rec.batches == [[0, 2, 4]]


def held() -> tuple[Recorder, list[int], Callable[[int], Awaitable[None]]]:
    """A group commit whose first batch is held at the gate; `one(i)` runs item i and keeps its answer."""
    rec = Recorder()
    rec.gate.clear()
    gc: GroupCommit[int, int] = GroupCommit(rec)
    answers: list[int] = []

    async def one(i: int) -> None:
        answers.append(await gc.run(i))

    return rec, answers, one


async def test_a_caller_cancelled_while_waiting_takes_its_item_back_and_the_rest_go_on() -> None:
    rec, answers, one = held()

    async with anyio.create_task_group() as tg:
        tg.start_soon(one, 0)  # leads the first batch, held at the gate
        await anyio.sleep(0.05)
        async with anyio.create_task_group() as waiting:
            waiting.start_soon(one, 2)  # waits for the next batch ...
            await anyio.sleep(0.05)
            waiting.cancel_scope.cancel()  # ... and goes away before it
        tg.start_soon(one, 4)
        await anyio.sleep(0.05)
        rec.gate.set()
    assert sorted(answers) == [0, 40]
    assert sorted(i for b in rec.batches for i in b) == [0, 4]  # 2 was never written


async def test_a_leader_cancelled_mid_commit_still_answers_the_others() -> None:
    rec, answers, one = held()

    leader = anyio.CancelScope()

    async def lead() -> None:
        with leader:
            await one(0)

    async with anyio.create_task_group() as tg:
        tg.start_soon(lead)
        await anyio.sleep(0.05)
        for i in (2, 4):
            tg.start_soon(one, i)
        await anyio.sleep(0.05)
        leader.cancel()  # the leader's caller goes away while its batch is in flight
        await anyio.sleep(0.05)
        rec.gate.set()
    assert {20, 40} <= set(answers)  # (the leader's own answer is in as well if it was back first)
    assert sorted(i for b in rec.batches for i in b) == [0, 2, 4]  # the leader's item was written too


def test_one_task_refused_in_a_batch_leaves_the_others_in(cp: ControlPlane) -> None:
    a, b, c = new_task(), new_task(), new_task()
    out = cp.store.tasks.submit_many([(a, [QueueLength(10)]), (b, [QueueLength(1)]), (c, [QueueLength(10)])])  # b: a queue of one already holds a
    assert isinstance(out[0], Submitted) and isinstance(out[2], Submitted)
    assert isinstance(out[1], QueueFull)
    assert [t.task_id for t in cp.store.tasks.list("alice")] == [out[2].task.task_id, out[0].task.task_id]


@pytest.mark.sqlite_only("SQLite writes a batch without savepoints; PostgreSQL always with them")
@pytest.mark.parametrize("on_loop", [False, True])
async def test_a_database_error_in_a_batch_written_without_savepoints_costs_only_its_own_item(
        cp: ControlPlane, on_loop: bool) -> None:
    """On SQLite a batch is written without a savepoint per item (an item refused by a check has
    written nothing). Should the database refuse one item's row all the same (here a trigger
    raising a constraint error, as a corrupt index or a schema drift might), the batch is rolled
    back and written again item by item: only that item fails, the others are in once each."""
    from dataclasses import replace

    from sqlalchemy.exc import IntegrityError

    with cp.db.write() as c:
        c.exec_driver_sql("CREATE TRIGGER refuse_13 BEFORE INSERT ON tasks WHEN NEW.inputs_json = '{\"n\":13}' "
                          "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END")
    items = [(replace(new_task(), inputs_json=f'{{"n":{n}}}'), [QueueLength(10)]) for n in (12, 13, 14)]
    if on_loop:
        out = await cp.store.tasks.submit_many_on_loop(items)
    else:
        out = cp.store.tasks.submit_many(items)
    assert isinstance(out[0], Submitted) and isinstance(out[2], Submitted)
    assert isinstance(out[1], IntegrityError)
    stored = cp.store.tasks.list("alice")
    assert sorted(t.task_id for t in stored) == sorted([out[0].task.task_id, out[2].task.task_id])


def test_a_batch_counts_its_own_tasks_into_their_queue_as_it_writes_them(cp: ControlPlane) -> None:
    """A batch reads a queue's depth once and counts on: each new task's position is where it
    stood when written, the queue's limit holds even when the batch itself filled the queue, a
    task the database refused (rolled back) is not counted, and each task written, and only
    those, has its one "submitted" event."""
    from dataclasses import replace

    with cp.db.write() as c:
        c.exec_driver_sql("CREATE TRIGGER refuse_13 BEFORE INSERT ON tasks WHEN NEW.inputs_json = '{\"n\":13}' "
                          "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END" if cp.db.is_sqlite else
                          "CREATE FUNCTION refuse_13() RETURNS trigger AS $$ BEGIN "
                          "IF NEW.inputs_json = '{\"n\":13}' THEN RAISE unique_violation; END IF; RETURN NEW; END $$ "
                          "LANGUAGE plpgsql; CREATE TRIGGER refuse_13 BEFORE INSERT ON tasks "
                          "FOR EACH ROW EXECUTE FUNCTION refuse_13()")
    cp.store.tasks.submit(new_task(), [QueueLength(100)])  # one waiting already, at priority 0

    def at(priority: int, n: int = 0) -> NewTask:
        return replace(new_task(), priority=priority, inputs_json=f'{{"n":{n}}}')

    out = cp.store.tasks.submit_many([
        (at(0), [QueueLength(5)]),      # 2nd: behind the one waiting
        (at(5), [QueueLength(5)]),      # 1st: ahead of every priority-0 task
        (at(0, 13), [QueueLength(5)]),  # refused by the database: not counted
        (at(0), [QueueLength(5)]),      # 4th
        (at(0), [QueueLength(4)]),      # the queue holds 4 already: QueueFull
        (at(0), [QueueLength(5)]),      # 5th, and the queue is full
        (at(9), [QueueLength(5)]),      # QueueFull, whatever its priority
    ])
    kinds = ["QueueFull" if isinstance(o, QueueFull) else "refused" if isinstance(o, Exception) else o.position
             for o in out]
    assert kinds == [2, 1, "refused", 4, "QueueFull", 5, "QueueFull"]
    with cp.db.read() as c:
        depth = dict(c.exec_driver_sql("SELECT priority, waiting FROM queue_depth WHERE resource_class = 'cpu_small' "
                                       "AND waiting > 0").all())
        queued = c.exec_driver_sql("SELECT count(*) FROM tasks WHERE state = 'queued'").scalar()
    assert depth == {0: 4, 5: 1} and queued == 5
    written = [o.task.task_id for o in out if isinstance(o, Submitted)]
    for task_id in written:
        assert [e.kind for e in cp.store.logs.events(task_id)] == ["submitted"]
    with cp.db.read() as c:
        assert c.exec_driver_sql("SELECT count(*) FROM task_events WHERE kind = 'submitted'").scalar() == 5  # with the one before


def test_a_repeated_idempotency_key_in_one_batch_answers_the_first_task(cp: ControlPlane) -> None:
    from dataclasses import replace

    first = replace(new_task(), idempotency_key="k-1")
    out = cp.store.tasks.submit_many([(first, [QueueLength(10)]), (first, [QueueLength(10)])])
    assert isinstance(out[0], Submitted) and isinstance(out[1], Submitted)
    assert out[0].created and not out[1].created and out[1].task.task_id == out[0].task.task_id


async def test_concurrent_submits_over_mcp_are_each_on_disk_when_answered(home: Path) -> None:
    write_catalog(home, queue_length=1000)
    cp = ControlPlane(Settings(home=home, **FAST))
    fresh = Database(cp.settings.resolved_database_url)  # another connection: what a restart would find
    on_disk: list[bool] = []

    async with Client(build_server(cp)) as client:
        agent = Agent(client)

        async def submit(i: int) -> None:
            tid = await agent.submit(inputs={"sleep_s": 0}, tags=[f"n{i}"])
            with fresh.engine.connect() as c:
                found = c.execute(text("select count(*) from tasks where task_id = :t"), {"t": tid}).scalar()
            on_disk.append(found == 1)

        await asyncio.gather(*(submit(i) for i in range(24)))
    fresh.dispose()
    assert on_disk == [True] * 24
    stored = cp.store.tasks.list(cp.settings.default_owner, limit=100)
    assert len(stored) == 24 and len({t.task_id for t in stored}) == 24
    grouped = cp.service.commits
    assert 0 < grouped.batches < grouped.items <= 24  # submits that came together shared commits


@pytest.mark.sqlite_only("on a networked engine every write leaves the event loop: each submit is a group commit")
async def test_a_submit_alone_is_written_at_once_without_a_group_commit(cp: ControlPlane) -> None:
    req = api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 0})
    for _ in range(3):
        tid = (await cp.service.submit_grouped("alice", req))["task_id"]
        assert cp.store.tasks.get(tid) is not None
    assert cp.service.commits.items == 0  # one at a time, the lock free: no batch to join, no thread hop
    with cp.db.write():  # another writer holds the lock: the submit waits for it in a group commit
        pending = asyncio.ensure_future(cp.service.submit_grouped("alice", req))
        await asyncio.sleep(0.05)
        assert not pending.done()
    assert (await pending)["state"] == "queued" and cp.service.commits.items == 1


async def test_the_service_maps_a_full_queue_in_a_group_commit_to_queue_overloaded(home: Path) -> None:
    write_catalog(home, concurrency=1, queue_length=1)
    cp = ControlPlane(Settings(home=home, **FAST))
    req = api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 30})
    outcomes = await asyncio.gather(*(cp.service.submit_grouped("alice", req) for _ in range(3)),
                                    return_exceptions=True)
    codes = sorted(getattr(o, "code", "ok") for o in outcomes)
    assert codes == ["QUEUE_OVERLOADED", "QUEUE_OVERLOADED", "ok"]  # nothing runs yet: one fits the queue


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 and 2025-11-25
async def test_over_http_submits_made_while_others_wait_are_grouped_and_a_lone_one_is_not(home: Path, mode: str) -> None:
    """Over HTTP the server counts the calls waiting for their answer (`blocking.Load`): a submit
    made while others wait joins a group commit (its fsync off the loop), a submit alone is
    written at once; once everything is answered nothing is left counted, in either era."""
    from tests.conftest import serving

    write_catalog(home, queue_length=1000)
    cp = ControlPlane(Settings(home=home, **FAST))
    load, commits = cp.service.load, cp.service.commits
    async with serving(cp) as server:
        clients = [Client(server.url, mode=mode) for _ in range(12)]
        for c in clients:
            await c.__aenter__()
        try:
            args = {"tool_name": "exercise", "inputs": {"sleep_s": 0}}
            answers = await asyncio.gather(*(c.call_tool("submit_task", args) for c in clients for _ in range(2)))
            assert all(not a.is_error for a in answers)
            assert commits.items >= 12  # most of the 24 waited behind others and were grouped
            assert commits.batches < commits.items  # ... sharing commits
            assert load.calls == 0
            tried_alone: list[bool] = []
            write_alone = cp.service._submit_alone
            cp.service._submit_alone = lambda *a: tried_alone.append(True) or write_alone(*a)  # type: ignore[method-assign]
            for _ in range(3):
                assert not (await clients[0].call_tool("submit_task", args)).is_error
            assert tried_alone == [True] * 3  # alone: tried on the loop (unless the scheduler held the lock)
            assert load.calls == 0
        finally:
            for c in clients:
                await c.__aexit__(None, None, None)
    assert len(cp.store.tasks.list(cp.settings.default_owner, limit=100)) == 27


@pytest.mark.sqlite_only("a networked engine writes the whole batch in a worker thread: no transaction on the loop")
async def test_while_a_batch_commits_off_the_loop_other_writes_wait_their_turn(cp: ControlPlane) -> None:
    """On a disk whose commits are slow, a batch's statements run on the event loop and its commit
    in a worker thread; while that commit is in flight, a write tried on the loop goes to a worker
    thread and waits for it (it cannot take the loop's open transaction), and every write lands
    once. A blocking write on the loop at that moment would wait for ever: it is refused at once
    instead."""
    from controlplane import blocking

    req = api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 0})
    cp.service.load.calls = 16  # as if other calls waited: submits go to a group commit
    cp.db.commit_s = 1.0  # as if commits took a second: the next one goes off the loop
    seen: list[str] = []
    real_commit = cp.db.write_on_loop

    async def observed(fn: Callable[..., object]) -> object:
        def body(conn: object) -> object:
            seen.append("statements on the loop thread" if threading.current_thread() is threading.main_thread()
                        else "statements elsewhere")
            return fn(conn)
        task = asyncio.ensure_future(real_commit(body))
        await asyncio.sleep(0)  # the statements are in, the commit is in flight
        if not task.done():
            cancel = blocking.call(cp.service.cancel, "alice", api.CancelTask(task_id=first_id))
            with pytest.raises(RuntimeError, match="blocking write"):
                with cp.db.write():
                    pass
            seen.append((await cancel)["state"])
        return await task

    first_id = (await cp.service.submit_grouped("alice", req))["task_id"]
    cp.db.write_on_loop = observed  # type: ignore[method-assign]
    out = await cp.service.submit_grouped("alice", req)
    assert seen == ["statements on the loop thread", "cancelled"]
    assert cp.store.tasks.get(out["task_id"]).state == "queued"
    assert cp.store.tasks.get(first_id).state == "cancelled"


@pytest.mark.sqlite_only("a networked engine commits in a worker thread always")
async def test_group_commits_run_on_the_loop_while_commits_are_quick_and_leave_it_when_slow(cp: ControlPlane) -> None:
    """A group commit's fsync costs the loop less than a hop to a worker thread, on a disk whose
    commits are quick; on one whose commits are slow (a network volume, here a commit listener that
    sleeps 5 ms), doing it there would stall every call for each: commits move to a worker thread
    once they average over the limit, and back once the disk is quick again. Every submit lands."""
    from sqlalchemy import event

    req = api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 0})
    cp.service.load.calls = 16  # as if other calls waited: submits go to a group commit
    committed_on: list[str] = []
    slow = True

    def on_commit(_conn: object) -> None:
        committed_on.append("loop" if threading.current_thread() is threading.main_thread() else "worker")
        if slow:
            time.sleep(0.005)

    engine = cp.db.nonblocking_engine
    event.listen(engine, "commit", on_commit)
    try:
        ids = [(await cp.service.submit_grouped("alice", req))["task_id"] for _ in range(12)]
        assert committed_on[0] == "loop" and committed_on[-1] == "worker", committed_on
        assert cp.db.commit_s > 0.002  # what moved them
        slow = False
        committed_on.clear()
        ids += [(await cp.service.submit_grouped("alice", req))["task_id"] for _ in range(40)]
        assert committed_on[0] == "worker" and committed_on[-1] == "loop", committed_on
    finally:
        event.remove(engine, "commit", on_commit)
    assert len(set(ids)) == 52
    assert all(cp.store.tasks.get(t).state == "queued" for t in ids)


def test_batches_that_touch_the_same_queues_in_opposite_orders_never_deadlock(cp: ControlPlane) -> None:
    """On PostgreSQL each submit locks its queue (and, with limits, its caller) until its batch
    commits. Two replicas' batches naming two queues in opposite orders would each hold one
    lock and wait for the other's, and the server would abort one batch (every caller in it
    answered with an error); a batch takes all its locks first, in one order."""
    ab = [new_task("alice"), dataclasses.replace(new_task("bob"), resource_class="cpu_standard")]
    errors: list[BaseException] = []
    created = []

    def submitter(items: list[NewTask]) -> None:
        try:
            for _ in range(40):
                outs = cp.store.tasks.submit_many([(t, [QueueLength(10**6)]) for t in items])
                created.extend(o for o in outs if not isinstance(o, Exception))
                errors.extend(o for o in outs if isinstance(o, Exception))
        except Exception as e:  # noqa: BLE001 - the whole batch failed
            errors.append(e)

    threads = [threading.Thread(target=submitter, args=(order,)) for order in (ab, ab[::-1])]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == [] and len(created) == 160
