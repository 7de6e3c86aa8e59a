"""Running a call on the event loop when it cannot block, and in a worker thread when it might.

The MCP tools try their body on the event loop inside `inline()` (no thread hop: a status read
or a submit on SQLite costs less than the hop itself). Code that would block there calls
`must_not_block()`, or, for database writes, finds the write lock taken: both raise
`WouldBlock`, nothing has been written, and the tool runs the body again in a worker thread.
`call()` does exactly that for any such function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeVar

import anyio.to_thread

T = TypeVar("T")

_inline: ContextVar[bool] = ContextVar("controlplane_inline", default=False)


class WouldBlock(Exception):
    """This call would block the event loop: run it in a worker thread instead."""


@contextmanager
def inline() -> Iterator[None]:
    token = _inline.set(True)
    try:
        yield
    finally:
        _inline.reset(token)


def is_inline() -> bool:
    return _inline.get()


def must_not_block() -> None:
    """Call before I/O that may wait (a cloud API, a lock): refuses to run on the event loop."""
    if _inline.get():
        raise WouldBlock()


async def call(fn: Callable[..., T], *args: object) -> T:
    """`fn(*args)` on the event loop if it cannot block there, else in a worker thread.

    `fn` must raise `WouldBlock` (through `must_not_block()` or a database write) before it has
    any effect: it is run again from the start in the thread."""
    try:
        with inline():
            return fn(*args)
    except WouldBlock:
        return await anyio.to_thread.run_sync(fn, *args)


class Load:
    """How many calls wait for the event loop at this moment (counted by the HTTP endpoint:
    `controlplane.http.load`).

    A durable write on the loop holds it for the write's fsync: worth it for a call alone (a hop
    to a worker thread and back costs more), not while other calls wait for the loop. A submit
    made while others are being served joins a group commit instead, whose fsync runs off the
    loop and is shared (docs/design/hot-path.md)."""

    def __init__(self) -> None:
        self.calls = 0
        self.on_answered: Callable[[], None] | None = None  # told after each call is answered

    def begin(self) -> None:
        self.calls += 1

    def answered(self) -> None:
        self.calls -= 1
        if self.on_answered is not None:
            self.on_answered()

    @property
    def others(self) -> bool:
        """Another call is in progress besides the one asking."""
        return self.calls > 1

