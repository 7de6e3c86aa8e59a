"""SQLite's per-thread read connections: a thread's connection is its own for as long as the
thread lives, however many threads read (the server's worker threads come and go for ever)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from controlplane.store.engines import Engines


@pytest.mark.sqlite_only("SQLite's read pool")
def test_many_reading_threads_never_close_a_live_threads_connection(tmp_path: Path) -> None:
    engines = Engines(f"sqlite:///{tmp_path / 'cp.db'}")
    n = 100  # more than the pool keeps: it used to close other threads' connections, even in use
    holding = threading.Barrier(n)
    failed: list[BaseException] = []

    def reader() -> None:
        with engines.read_engine.connect() as conn:
            conn.exec_driver_sql("select 1")
            holding.wait(30)  # every thread has its connection open now
            try:
                conn.exec_driver_sql("select 1")
            except Exception as e:  # noqa: BLE001 - what the test counts
                failed.append(e)

    threads = [threading.Thread(target=reader) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert failed == []

    for _ in range(100):  # threads that have ended leave nothing open behind them
        t = threading.Thread(target=lambda: engines.read_engine.connect().exec_driver_sql("select 1").close())
        t.start()
        t.join(10)
    pool = engines.read_engine.pool
    assert len(pool._all_conns) <= pool.size  # type: ignore[attr-defined]
    engines.dispose()
