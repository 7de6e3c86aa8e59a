"""Restart safety: a control plane killed with SIGKILL at any moment, and restarted, loses no
task and launches no job twice, while agents keep submitting and jobs keep running."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import anyio
import pytest
from fastmcp import Client
from sqlalchemy import text

from controlplane.settings import Settings
from controlplane.store.db import Database
from tests.conftest import ServerProcess, fast_env, runner_starts, write_catalog

pytestmark = pytest.mark.anyio

N_TASKS = 24
N_KILLS = 6


class Chaos:
    """Kills the server with SIGKILL at random moments and starts it again."""

    def __init__(self, srv: ServerProcess, kills: int, seed: int = 7):
        self.srv = srv
        self.kills = kills
        self.rng = random.Random(seed)
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def url(self) -> str:
        with self.lock:
            assert self.srv.url
            return self.srv.url

    def _run(self) -> None:
        for _ in range(self.kills):
            time.sleep(self.rng.uniform(0.4, 1.5))
            with self.lock:
                self.srv.kill()
                self.srv.start()
        self.done.set()


async def submit_until_accepted(chaos: Chaos, key: str, inputs: dict) -> str:
    """What a careful agent does: retry the same idempotency key until the server answers."""
    while True:
        try:
            async with Client(chaos.url(), timeout=10) as c:
                r = await c.call_tool("submit_task", {"tool_name": "exercise", "inputs": inputs,
                                                      "idempotency_key": key}, raise_on_error=False)
            data = json.loads(r.content[0].text)
            assert not r.is_error, data
            return data["task_id"]
        except AssertionError:
            raise
        except Exception:  # noqa: BLE001 - the server was killed under us: try again
            await anyio.sleep(0.2)


async def status(chaos: Chaos, task_id: str) -> str | None:
    try:
        async with Client(chaos.url(), timeout=10) as c:
            r = await c.call_tool("get_task_status", {"task_id": task_id}, raise_on_error=False)
        return json.loads(r.content[0].text)["state"]
    except Exception:  # noqa: BLE001
        return None


async def test_sigkill_restarts_lose_nothing_and_double_nothing(home: Path) -> None:
    write_catalog(home, concurrency=4)
    srv = ServerProcess(home, env=fast_env(home)).start()
    chaos = Chaos(srv, N_KILLS)
    rng = random.Random(3)
    submitted: dict[str, str] = {}
    inputs_of: dict[str, dict] = {}
    try:
        chaos.thread.start()
        for i in range(N_TASKS):
            inputs = {"sleep_s": round(rng.uniform(0.2, 1.2), 2), "progress_steps": 3, "log_lines": 20}
            inputs_of[f"key-{i}"] = inputs
            submitted[f"key-{i}"] = await submit_until_accepted(chaos, f"key-{i}", inputs)
            await anyio.sleep(rng.uniform(0, 0.2))
        chaos.thread.join(timeout=120)
        assert chaos.done.is_set(), "the chaos thread did not finish"

        deadline = time.monotonic() + 120
        pending = set(submitted.values())
        while pending and time.monotonic() < deadline:
            for tid in list(pending):
                if await status(chaos, tid) in ("succeeded", "failed", "cancelled", "timed_out"):
                    pending.discard(tid)
            await anyio.sleep(0.3)
        assert not pending, f"tasks not finished: {pending}"
        for key, tid in submitted.items():  # resubmitting any key returns the same task
            assert await submit_until_accepted(chaos, key, inputs_of[key]) == tid
    finally:
        srv.stop()

    on_file = Database(Settings(home=home).resolved_database_url)  # what the last server left
    db = on_file.engine.connect()
    rows = db.execute(text("select task_id, idempotency_key, state, attempt from tasks")).all()
    assert len(rows) == N_TASKS  # nothing doubled, nothing lost
    assert {r[1]: r[0] for r in rows} == submitted
    assert {r[2] for r in rows} == {"succeeded"}, rows
    assert {r[3] for r in rows} == {1}

    jobs = db.execute(text("select task_id, count(*) from jobs group by task_id")).all()
    assert sorted(n for _, n in jobs) == [1] * N_TASKS
    launched = db.execute(text("select task_id, count(*) from task_events where kind = 'launched' "
                               "group by task_id")).all()
    assert sorted(n for _, n in launched) == [1] * N_TASKS
    # the local provider saw exactly one launch per job
    job_dirs = list((home / "jobs").iterdir())
    assert len(job_dirs) == N_TASKS
    for d in job_dirs:
        assert runner_starts(d) == 1, d.name
    # every log line arrived exactly once, in order, across all the restarts
    for task_id, _key, _state, _attempt in rows:
        msgs = [m for (m,) in db.execute(text("select message from task_logs where task_id = :t order by seq"),
                                         {"t": task_id})]
        assert msgs == [f"line {i}" for i in range(20)], task_id
    db.close()
    on_file.dispose()
