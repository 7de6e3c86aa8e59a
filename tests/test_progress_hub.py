"""The progress hub reads a changed task where the database allows it: inline on SQLite, in a
worker thread for a database reached over the network, once per burst of changes, in order.
The progress sender's values rise with every notification, whatever the task's percent does."""

from __future__ import annotations

import asyncio
import threading
import time
from itertools import pairwise
from typing import Any

from controlplane import blocking
from controlplane.mcp.progress import NUDGE, ProgressSender
from controlplane.progress import ProgressHub


class Rows:
    """A task table behind a networked database: reads refuse to run on the event loop."""

    def __init__(self, networked: bool, delay_s: float = 0.0):
        self.networked = networked
        self.delay_s = delay_s
        self.version = 0
        self.reads: list[str] = []  # the thread each read ran in

    def fetch(self, task_id: str) -> dict[str, Any]:
        if self.networked:
            blocking.must_not_block()
        seen = self.version
        time.sleep(self.delay_s)
        self.reads.append(threading.current_thread().name)
        return {"task_id": task_id, "version": seen}


async def _run(rows: Rows, changes: int) -> tuple[ProgressHub, list[int]]:
    hub = ProgressHub(rows.fetch)
    hub.attach(asyncio.get_running_loop())
    seen: list[int] = []
    with hub.subscribe("t1") as sub:

        def writer() -> None:  # commits from another thread, as the reconciler and ingestor do
            for _ in range(changes):
                rows.version += 1
                hub.on_change("t1")
                time.sleep(0.002)

        await asyncio.to_thread(writer)
        while not seen or seen[-1] != changes:
            update = await sub.next(timeout=5)
            assert update is not None, f"the last change never arrived; saw {seen}"
            seen.append(update["version"])
    return hub, seen


def test_a_networked_database_is_read_off_the_event_loop() -> None:
    rows = Rows(networked=True)
    _, seen = asyncio.run(_run(rows, changes=3))
    loop_thread = threading.main_thread().name
    assert rows.reads and loop_thread not in rows.reads
    assert seen == sorted(seen) and seen[-1] == 3


def test_sqlite_reads_stay_on_the_loop() -> None:
    rows = Rows(networked=False)
    asyncio.run(_run(rows, changes=3))
    assert set(rows.reads) == {threading.main_thread().name}


def test_a_burst_of_changes_costs_few_reads_and_never_goes_back() -> None:
    rows = Rows(networked=True, delay_s=0.05)
    hub, seen = asyncio.run(_run(rows, changes=100))
    assert seen == sorted(seen) and seen[-1] == 100
    # ~0.2 s of changes, 50 ms per read, one read in flight: a handful of reads, not 100
    assert len(rows.reads) < 20, len(rows.reads)
    assert not hub._readers and not hub._stale


async def _after_unsubscribe(rows: Rows) -> ProgressHub:
    hub = ProgressHub(rows.fetch)
    hub.attach(asyncio.get_running_loop())
    with hub.subscribe("t1"):
        pass
    hub.on_change("t1")
    await asyncio.sleep(0.05)
    return hub


def test_no_reads_for_a_task_nobody_follows() -> None:
    rows = Rows(networked=True)
    asyncio.run(_after_unsubscribe(rows))
    assert rows.reads == []


# ---- the sender's values ------------------------------------------------------------------------
def test_the_value_rises_with_every_notification_whatever_the_percent_does() -> None:
    sent: list[tuple[float, float | None, str | None]] = []

    async def send(value: float, total: float | None, message: str | None) -> None:
        sent.append((value, total, message))

    async def run() -> None:
        sender = ProgressSender(send, min_interval_s=0)
        await sender.update(None, "queued")  # no percent yet
        await sender.update(None, "running")  # the state changed, the percent did not
        await sender.keepalive("running")
        for word in ("reading", "parsing", "parsing"):  # one percent, several messages
            await sender.update(20, word)
        await sender.update(60, "attempt 1")
        await sender.update(10, "attempt 2")  # a retry starts again from zero
        await sender.update(59.9999999, "attempt 2")  # below the value already sent
        await sender.keepalive("attempt 2")
        await sender.update(100, "done")
        await sender.update(250, "overshoot")  # a tool's nonsense is capped at 100
        await sender.keepalive("done")
        sender.close()
        await sender.update(100, "after the answer")

    asyncio.run(run())
    values = [v for v, _, _ in sent]
    assert all(b > a for a, b in pairwise(values)), values
    assert [round(v, 3) for v in values] == [0, 0, 0, 20, 20, 20, 60, 60, 60, 60, 100, 100, 100]
    assert values[1] - values[0] == NUDGE and max(values) < 100 + 1e-5
    assert {t for _, t, _ in sent} == {100.0} and sent[-1][2] == "done"


def test_values_reach_the_client_in_order_when_a_send_is_slow() -> None:
    """A slow send (a client reading slowly) and the throttle's trailing notification overlap:
    the value is chosen when it is sent and sends take turns, so the client sees them in order."""
    arrived: list[float] = []
    calls = 0

    async def send(value: float, total: float | None, message: str | None) -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05 if calls == 1 else 0)  # the first send is slow
        arrived.append(value)

    async def run() -> None:
        sender = ProgressSender(send, min_interval_s=0.01)
        first = asyncio.create_task(sender.update(30, "a"))
        await asyncio.sleep(0.001)
        await sender.update(30, "b")  # within the interval: the trailing notification
        await first
        await asyncio.sleep(0.1)
        sender.close()

    asyncio.run(run())
    assert len(arrived) == 2 and arrived[1] > arrived[0], arrived


def test_a_watch_sees_the_task_now_each_change_and_a_fresh_read_after_a_quiet_spell() -> None:
    """`ProgressHub.watch`: the one way the MCP surface follows a task."""
    rows = Rows(networked=False)

    async def go() -> list[tuple[int | None, bool]]:
        hub = ProgressHub(rows.fetch)
        hub.attach(asyncio.get_running_loop())
        out: list[tuple[int | None, bool]] = []
        watch = hub.watch("t1", read=lambda: rows.fetch("t1"), quiet_s=0.2)
        async for seen in watch:
            out.append((seen.task["version"] if seen.task else None, seen.quiet))
            if len(out) == 1:
                rows.version = 1
                hub.on_change("t1")  # a commit: pushed at once
            elif len(out) == 2:
                rows.version = 2  # a change the hub never heard of: the quiet spell's read finds it
            else:
                break
        await watch.aclose()
        assert "t1" not in hub._subs  # closing the watch ends its subscription
        blind = hub.watch("t1", read=None, quiet_s=0.05)  # without read: nothing is read
        first = await blind.__anext__()
        await blind.aclose()
        out.append((first.task, first.quiet))
        return out

    assert asyncio.run(go()) == [(0, False), (1, False), (2, True), (None, True)]


def test_a_shards_change_pokes_its_sweeps_followers_and_other_tasks_cost_one_read() -> None:
    """A sweep's follower hears of every change of its shards; a task outside any followed sweep
    is read once (to learn it is none's) and never again; nothing is read while no sweep is followed."""
    from types import SimpleNamespace

    reads: list[str] = []

    def fetch(task_id: str) -> Any:
        reads.append(task_id)
        return SimpleNamespace(task_id=task_id, sweep_id="swp_a" if task_id.startswith("shard") else None)

    async def main() -> None:
        hub = ProgressHub(fetch)
        hub.attach(asyncio.get_running_loop())
        hub.on_change("shard1")
        await asyncio.sleep(0.05)
        assert reads == []  # no follower, no read
        with hub.subscribe("swp_a") as sub:
            for task_id in ("lone", "shard1", "shard2"):
                hub.on_change(task_id)
                await asyncio.sleep(0.05)
            seen = await sub.next(timeout=1)
            assert seen is not None and seen.task_id == "shard2"
            hub.on_change("lone")
            hub.on_change("shard1")
            assert await sub.next(timeout=1) is not None
            await asyncio.sleep(0.05)
            assert reads == ["lone", "shard1", "shard2", "shard1"]  # "lone" once: not a shard

    asyncio.run(main())
