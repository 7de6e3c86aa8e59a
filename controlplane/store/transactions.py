"""Transactions: reads, writes, the group commit's write on the event loop, and advisory locks.

SQLite has one writer at a time (an in-process lock, then BEGIN IMMEDIATE), so a write may run
on the event loop when the lock is free; on PostgreSQL every read and write leaves the loop
(`WouldBlock`) and a guarded write (a submit, a claim of a queue's slots) takes advisory locks.
docs/design/store.md says why.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import anyio.to_thread
from sqlalchemy import text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import OperationalError

from controlplane.blocking import WouldBlock, is_inline, must_not_block
from controlplane.store.engines import Engines

T = TypeVar("T")
# A group commit's commit runs on the event loop while commits average no longer than this (a
# local disk's fsync), in a worker thread when they take longer (`Transactions.write_on_loop`).
LOOP_COMMIT_MAX_S = 0.002


class Transactions:
    """Opens the transactions of one database; `commit_s` is the moving average of how long a
    group commit's commit takes."""

    def __init__(self, engines: Engines):
        self.engines = engines
        self._loop_tx: int | None = None  # the thread of the event loop while write_on_loop's tx is open
        self.commit_s = 0.0

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction. On SQLite it takes the write lock up front (BEGIN IMMEDIATE) so
        that read-then-write sequences never deadlock and are serialised across processes.

        On the event loop (`blocking.inline()`) it never waits: it raises `WouldBlock` when the
        lock is taken (SQLite), or at once on an engine reached over the network. A blocking
        write on the loop while its group commit is open is a RuntimeError."""
        engines = self.engines
        nonblocking = is_inline()
        if nonblocking and not engines.is_sqlite:
            raise WouldBlock()
        if self._loop_tx is not None and self._loop_tx == threading.get_ident():
            # The loop's own transaction is open (write_on_loop) and commits only when the loop runs
            # again: an inline write goes to a worker thread and waits there; a blocking one here
            # would wait for ever.
            if nonblocking:
                raise WouldBlock()
            raise RuntimeError("a blocking write on the event loop while its group commit is open")
        lock = engines.write_lock
        if lock is not None and not lock.acquire(blocking=not nonblocking):
            raise WouldBlock()
        try:
            with (engines.nonblocking_engine if nonblocking else engines.engine).connect() as conn:
                with _begin_write(conn, nonblocking):
                    yield conn
        finally:
            if lock is not None:
                lock.release()

    async def write_on_loop(self, fn: Callable[[Connection], T]) -> T:
        """`fn(conn)` in a write transaction whose statements run here, on the event loop, and so
        does its commit while commits average under LOOP_COMMIT_MAX_S (else in a worker thread);
        raises `WouldBlock`, having done nothing, when the write lock is taken, or on an engine
        reached over the network."""
        lock = self.engines.write_lock
        if lock is None or self._loop_tx is not None or not lock.acquire(blocking=False):
            raise WouldBlock()
        self._loop_tx = threading.get_ident()
        try:
            with self.engines.nonblocking_engine.connect() as conn:
                tx = _begin_write(conn, nonblocking=True)
                try:
                    out = fn(conn)
                except BaseException:
                    tx.rollback()
                    raise
                # (a failed commit is rolled back by close)
                if self.commit_s <= LOOP_COMMIT_MAX_S:
                    self._timed_commit(tx)
                else:
                    await anyio.to_thread.run_sync(self._timed_commit, tx)
                return out
        finally:
            self._loop_tx = None
            lock.release()

    def _timed_commit(self, tx: Any) -> None:
        """Commit, and keep a moving average of how long commits take (`commit_s`)."""
        t0 = time.perf_counter()
        tx.commit()
        self.commit_s += (time.perf_counter() - t0 - self.commit_s) * 0.1

    def read(self) -> Connection:
        """A connection for reads (`with db.read() as c:`); it never writes. WAL readers never
        wait, so SQLite reads may run on the event loop; a networked engine's may not (WouldBlock)."""
        if not self.engines.is_sqlite:
            must_not_block()
        return self.engines.read_engine.connect()

    def lock(self, conn: Connection, keys: Iterable[str]) -> None:
        """Hold a lock per key until `conn`'s transaction ends, so that transactions naming one
        key run one at a time across processes: PostgreSQL takes a transaction-scoped advisory
        lock per key, always in one order (sorted) so that two transactions never wait for each
        other; SQLite already serialises writers. A transaction takes all of its locks in one call."""
        if self.engines.is_sqlite:
            return
        for name in sorted(set(keys)):
            key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": key})


def _begin_write(conn: Connection, nonblocking: bool) -> Any:
    """Begin a write transaction on `conn` (BEGIN IMMEDIATE on SQLite: `engines._install_sqlite_hooks`).
    On a connection that must not wait, another process holding SQLite's write lock is WouldBlock."""
    conn.execution_options(cp_write=True)
    try:
        return conn.begin()
    except OperationalError as e:
        if nonblocking and "locked" in str(e.orig):
            raise WouldBlock() from None
        raise
