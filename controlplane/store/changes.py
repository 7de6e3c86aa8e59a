"""Change notifications across processes: on PostgreSQL a write transaction NOTIFYs the ids of
the tasks it changed (`notify_changed`) and every replica LISTENs (`ChangeFeed`). SQLite runs in
one process (its writers share a file on one machine) and keeps the in-process path alone
(`Writer.on_change`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection

from controlplane.store.engines import Engines

# The PostgreSQL channel on which a committed change to a task is announced; the payload is the
# task's id (an `ids` id: far below NOTIFY's 8000-byte limit on a payload).
CHANGES_CHANNEL = "controlplane_task_changed"
log = logging.getLogger("controlplane.store.db")


def notify_changed(conn: Connection, task_ids: list[str]) -> None:
    """Inside a PostgreSQL write transaction, just before it commits: announce to every replica
    that these tasks changed. The NOTIFY is delivered only if the transaction commits, after the
    commit (a listener reads the new row), and once for identical ones of one transaction."""
    if task_ids:
        conn.execute(text("SELECT pg_notify(:channel, id) FROM unnest(CAST(:ids AS text[])) AS id"),
                     {"channel": CHANGES_CHANNEL, "ids": task_ids})


class ChangeFeed:
    """LISTEN on PostgreSQL for tasks changed by any replica (`notify_changed`) and hand each
    task id to `on_change` (the progress hub's, which reads the task again), from the event loop.

    One dedicated psycopg async connection outside the pool (a LISTEN belongs to a session), run
    as a task of the event loop (`run()`): stopping it is a cancellation. A lost connection is
    reconnected with exponential backoff, and `on_connect` is called after every (re)connect, as
    notifications sent meanwhile are lost. A connection quiet for `PING_S` is pinged; TCP
    keepalives find one that died without a word."""

    PING_S = 5.0
    BACKOFF_MIN_S = 0.1
    BACKOFF_MAX_S = 5.0

    def __init__(self, engines: Engines, on_change: Callable[[str], None], on_connect: Callable[[], None]):
        self.engines = engines
        self.on_change = on_change
        self.on_connect = on_connect
        self.connected = asyncio.Event()  # set while LISTENing (tests wait for it)
        self.connects = 0

    def _connect_args(self) -> tuple[list[Any], dict[str, Any]]:
        """SQLAlchemy's own connection arguments for the URL, so both connect alike."""
        engine = self.engines.engine
        cargs, cparams = engine.dialect.create_connect_args(engine.url)
        cparams = {**cparams, "application_name": "controlplane-changes", "autocommit": True,
                   "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5, "keepalives_count": 3}
        return list(cargs), cparams

    async def run(self) -> None:
        """Listen until cancelled, reconnecting whenever the connection is lost."""
        import psycopg

        cargs, cparams = self._connect_args()
        delay = self.BACKOFF_MIN_S
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(*cargs, **cparams)
            except psycopg.Error as e:
                log.warning("change feed: cannot connect (%s); again in %.1fs", type(e).__name__, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.BACKOFF_MAX_S)
                continue
            try:
                async with conn:
                    await conn.execute(f"LISTEN {CHANGES_CHANNEL}")
                    self.connects += 1
                    self.connected.set()
                    delay = self.BACKOFF_MIN_S
                    self.on_connect()  # what was missed while away (or before the first LISTEN)
                    while True:
                        async for note in conn.notifies(timeout=self.PING_S):
                            self.on_change(note.payload)
                        await conn.execute("SELECT 1")  # quiet for PING_S: is the server still there?
            except psycopg.Error as e:
                log.warning("change feed: connection lost (%s); reconnecting in %.1fs", type(e).__name__, delay)
            finally:
                self.connected.clear()
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.BACKOFF_MAX_S)
