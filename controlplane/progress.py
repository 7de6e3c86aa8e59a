"""Pushed progress: task updates fanned out to whoever watches a task.

`ProgressHub` hears from the store after every committed change to a task (its state or its
progress), made by this process or, on PostgreSQL, by another replica (`store.changes.ChangeFeed`), and hands the task's latest row to whoever subscribed to it. A subscription keeps
only the newest update (older ones are coalesced away), so a slow watcher never holds up the
others or the store. A sweep's followers subscribe to the sweep's id: a change of one of its
shards pokes them (one point read of the shard, whose sweep is then remembered), and they read the
sweep's aggregate themselves, throttled (`controlplane.mcp.sweep_wait`). What a watcher makes of it (MCP progress notifications, resource updates)
lives in `controlplane.mcp`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Any

from controlplane import blocking
from controlplane.store.rows import TaskRow

log = logging.getLogger("controlplane.progress")



SWEEP_PREFIX = "swp_"
KNOWN_SHARDS = 100_000  # how many tasks' sweeps the hub remembers (then it forgets them all)


class Subscription:
    def __init__(self, hub: ProgressHub, task_id: str):
        self.hub = hub
        self.task_id = task_id  # a task's id, or a sweep's (then the updates are its shards')
        self._latest: TaskRow | None = None
        self._event = asyncio.Event()

    def _offer(self, task: TaskRow | None) -> None:
        self._latest = task
        self._event.set()

    async def next(self, timeout: float) -> TaskRow | None:
        """The newest update since the last call (for a sweep: the shard that changed last), or
        None if none came within `timeout`."""
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            return None
        self._event.clear()
        latest, self._latest = self._latest, None
        return latest

    def close(self) -> None:
        self.hub._unsubscribe(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


@dataclass(frozen=True)
class Seen:
    """One sighting of a watched task: pushed by a change, or read after a quiet spell."""

    task: Any  # the task row, or None (gone, or nothing read: a watch without `read`)
    quiet: bool  # True: no change came within the spell (then `task` is a fresh read, if any)


class ProgressHub:
    """Fans committed task changes out to subscriptions. A change is heard from any thread; the
    task's row is read once per burst of changes (one read in flight per task, a change during
    the read triggers one more), through `blocking.call` so that a networked database's read
    never stalls the event loop, and in commit order, so a subscriber never sees a state go back."""

    def __init__(self, fetch: Callable[[str], TaskRow | None]):
        self._fetch = fetch  # the task row by id (a cheap point read)
        self._subs: dict[str, set[Subscription]] = defaultdict(set)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._readers: dict[str, asyncio.Task[None]] = {}  # the read in flight, per task
        self._stale: set[str] = set()  # tasks that changed again during their read
        self._sweep_of: dict[str, str | None] = {}  # task id -> its sweep (None: not a shard)
        self._sweeps_followed = 0  # how many subscriptions are a sweep's

    def attach(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._loop = loop

    def subscribe(self, task_id: str) -> Subscription:
        sub = Subscription(self, task_id)
        self._subs[task_id].add(sub)
        self._sweeps_followed += task_id.startswith(SWEEP_PREFIX)
        return sub

    async def watch(self, task_id: str, *, read: Callable[[], Any] | None,
                    quiet_s: float | Callable[[], float]) -> AsyncGenerator[Seen, None]:
        """Watch a task: the one way the MCP surface follows one (wait_task, tasks/result,
        resource subscriptions). Yields the task as `read()` gives it now (after subscribing, so
        no change slips in between), then after each committed change (changes during a slow
        consumer coalesce into the newest), and after each quiet spell of `quiet_s` seconds
        (a number, or asked anew each time) the task read again, so that an update the hub
        failed to deliver costs one spell, not the rest of the watch. Without `read` nothing is
        read: the first sighting is the first change, and a quiet spell yields `task=None`.
        The consumer stops iterating when it has seen enough (use `contextlib.aclosing`)."""
        with self.subscribe(task_id) as sub:
            if read is not None:
                yield Seen(await blocking.call(read), quiet=False)
            while True:
                update = await sub.next(timeout=quiet_s() if callable(quiet_s) else quiet_s)
                if update is not None:
                    yield Seen(update, quiet=False)
                else:
                    yield Seen(await blocking.call(read) if read is not None else None, quiet=True)

    def _unsubscribe(self, sub: Subscription) -> None:
        subs = self._subs.get(sub.task_id)
        if subs is not None and sub in subs:
            subs.discard(sub)
            self._sweeps_followed -= sub.task_id.startswith(SWEEP_PREFIX)
            if not subs:
                self._subs.pop(sub.task_id, None)

    def on_change(self, task_id: str) -> None:
        """From any thread, after a commit: deliver the task's new state to its subscribers (and
        to its sweep's)."""
        loop = self._loop
        if loop is None or loop.is_closed() or not self._wanted(task_id):
            return
        loop.call_soon_threadsafe(self._changed, task_id)

    def refresh(self) -> None:
        """From any thread: read every watched task again and deliver what changed. Called when
        changes may have gone unheard (the cross-replica change feed reconnected)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        loop.call_soon_threadsafe(self._refresh_all)

    def _refresh_all(self) -> None:
        for task_id in list(self._subs):
            self._changed(task_id)

    def _wanted(self, task_id: str) -> bool:
        """Whether anyone follows the task, or may follow its sweep (unknown yet: one read says)."""
        if task_id in self._subs:
            return True
        if not self._sweeps_followed:
            return False
        sweep = self._sweep_of.get(task_id, "")
        return sweep == "" or (sweep is not None and sweep in self._subs)

    def _changed(self, task_id: str) -> None:
        if task_id.startswith(SWEEP_PREFIX):  # a refresh: poke the sweep's followers
            for sub in list(self._subs.get(task_id, ())):
                sub._offer(None)  # (its followers read the aggregate)
            return
        if not self._wanted(task_id):
            return
        if task_id in self._readers:
            self._stale.add(task_id)  # read again once the read in flight is done
            return
        self._readers[task_id] = asyncio.get_running_loop().create_task(self._deliver(task_id))

    async def _deliver(self, task_id: str) -> None:
        try:
            while self._wanted(task_id):
                self._stale.discard(task_id)
                task = await blocking.call(self._fetch, task_id)
                if task is not None:
                    if len(self._sweep_of) >= KNOWN_SHARDS:
                        self._sweep_of.clear()
                    sweep = getattr(task, "sweep_id", None)  # (a row; a test's fetch may give less)
                    self._sweep_of[task_id] = sweep  # never changes
                    for sub in [*self._subs.get(task_id, ()), *self._subs.get(sweep or "", ())]:
                        sub._offer(task)
                if task_id not in self._stale:
                    break
        except Exception:  # a failed read loses one update, never the subscriber's next one
            log.exception("progress: reading task %s failed", task_id)
        finally:
            del self._readers[task_id]  # in the task's last step: no change can fall in between
            self._stale.discard(task_id)
