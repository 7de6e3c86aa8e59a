"""Running a call on the event loop when it cannot block, and in a worker thread when it might.

The MCP tools try their body on the event loop inside `inline()` (no thread hop: a status read
or a submit on SQLite costs less than the hop itself). Code that would block there calls
`must_not_block()`, or, for database writes, finds the write lock taken: both raise
`WouldBlock`, nothing has been written, and the tool runs the body again in a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

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
