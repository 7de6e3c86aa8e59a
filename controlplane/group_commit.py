"""Group commit: concurrent writes of the same kind share one transaction and one fsync.

A durable commit costs an fsync (SQLite WAL with synchronous=FULL, or PostgreSQL's WAL flush);
done per call it costs each call an fsync, and done in a worker thread per call a thread hop each.
Here the calls that arrive while a commit is in flight, or while its leader gathers (`gather_s`),
wait for the next one, which takes all of them at once: its statements on the loop when the write
lock is free at once (else all of it in a worker thread), its commit on the loop while commits are
quick or in a worker thread (`Database.write_on_loop`). One fsync per batch, however many callers.
Each caller is answered only after the commit that holds its item (durability unchanged); an
item's own error (a full queue) is its caller's alone.

Leadership, not a background task: the first caller that finds no commit in flight runs the
batch (`leader`), and when it is done hands leadership to the oldest caller still waiting, so
nothing needs starting or stopping with the server and no caller waits behind others' batches
longer than one commit. The batch runs shielded from cancellation: a caller that goes away
mid-commit (a client disconnecting) does not abort the others' writes. A caller cancelled while
its item still waits takes the item back: it is not written.

Written here rather than taken from a library: the ones that batch (aiostream, asyncio queues)
need a consumer task with a lifecycle of its own, which this avoids, and the hand-off is the
whole of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import anyio
import anyio.to_thread

from controlplane.blocking import WouldBlock

I = TypeVar("I")  # noqa: E741 - an item to write
R = TypeVar("R")  # its outcome

_LEAD = object()  # resolves a waiter's future: it leads the next batch


@dataclass(eq=False)
class _Entry(Generic[I]):
    item: I
    fut: asyncio.Future[object] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class GroupCommit(Generic[I, R]):
    """`await gc.run(item)`: the item written with the other items waiting, in one batch
    (`write_many_on_loop` on the event loop when it can, else `write_many` in a worker thread);
    returns the item's outcome, or raises it when it is an exception. Must run on the loop."""

    def __init__(self, write_many: Callable[[Sequence[I]], Sequence[R | Exception]], max_batch: int = 256, *,
                 write_many_on_loop: Callable[[Sequence[I]], Awaitable[Sequence[R | Exception]]] | None = None,
                 gather_s: float = 0.0, in_progress: Callable[[], int] | None = None):
        self.write_many = write_many
        # How long at most a leader waits for others to join before it takes its batch. A commit
        # that runs off the loop gathers the next batch while it is in flight; one made on the loop
        # (SQLite on a quick disk: `Database.write_on_loop`) is over before anyone else could join.
        # The wait ends early once every call in progress (`in_progress()`: the server's, counted
        # by `blocking.Load`) is waiting here: nobody else could join, and the loop would idle.
        self.gather_s = gather_s
        self.in_progress = in_progress
        self._gathering: asyncio.Event | None = None
        # Tried first: the batch on the loop (`Database.write_on_loop`); WouldBlock (the lock
        # taken, a networked engine) -> write_many in a worker thread.
        self.write_many_on_loop = write_many_on_loop
        self.max_batch = max_batch
        self._waiting: list[_Entry[I]] = []
        self._leading = False
        self.batches = 0  # commits made, and the items they held
        self.items = 0

    @property
    def busy(self) -> bool:
        """A commit is in flight or items are waiting for the next."""
        return self._leading or bool(self._waiting)

    async def run(self, item: I) -> R:
        entry = _Entry(item)
        self._waiting.append(entry)
        self.poke()
        while True:
            if self._leading or entry.fut.done():  # wait for the outcome, or for our turn to lead
                try:
                    got = await asyncio.shield(entry.fut)  # (raises the item's own error)
                except asyncio.CancelledError:
                    self._abandon(entry)
                    raise
                if got is not _LEAD:
                    return got  # type: ignore[return-value]
                entry.fut = asyncio.get_running_loop().create_future()  # leadership is reserved for us
            await self._lead()

    def poke(self) -> None:
        """Someone joined, or a call was answered: a gathering leader stops waiting once all are in."""
        if self._gathering is not None and self._all_in():
            self._gathering.set()

    def _all_in(self) -> bool:
        if len(self._waiting) >= self.max_batch:
            return True
        return self.in_progress is not None and len(self._waiting) >= self.in_progress()

    def _abandon(self, entry: _Entry[I]) -> None:
        """A cancelled caller: its item is taken back if still waiting (else its outcome is
        dropped); if it had just been made leader, leadership passes on."""
        if entry in self._waiting:
            self._waiting.remove(entry)
        fut = entry.fut
        if not fut.done():
            fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # nobody will read it
        elif not fut.cancelled() and fut.exception() is None and fut.result() is _LEAD:
            self._leading = False
            self._hand_over()

    async def _lead(self) -> None:
        self._leading = True
        try:
            with anyio.CancelScope(shield=True):
                if self.gather_s > 0 and not self._all_in():
                    self._gathering = asyncio.Event()
                    try:
                        with anyio.move_on_after(self.gather_s):
                            await self._gathering.wait()
                    finally:
                        self._gathering = None
                batch, self._waiting = self._waiting[: self.max_batch], self._waiting[self.max_batch:]
                try:
                    outcomes = await self._write([e.item for e in batch])
                except Exception as e:  # noqa: BLE001 - the whole batch failed: every caller hears why
                    outcomes = [e] * len(batch)
                self.batches += 1
                self.items += len(batch)
                for entry, outcome in zip(batch, outcomes, strict=True):
                    if not entry.fut.done():
                        if isinstance(outcome, Exception):
                            entry.fut.set_exception(outcome)
                        else:
                            entry.fut.set_result(outcome)
        finally:
            self._leading = False
            self._hand_over()

    async def _write(self, items: list[I]) -> Sequence[R | Exception]:
        if self.write_many_on_loop is not None:
            try:
                return await self.write_many_on_loop(items)
            except WouldBlock:
                pass
        return await anyio.to_thread.run_sync(self.write_many, items)

    def _hand_over(self) -> None:
        for entry in self._waiting:
            if not entry.fut.done():
                self._leading = True  # reserved for it until it wakes
                entry.fut.set_result(_LEAD)
                return
