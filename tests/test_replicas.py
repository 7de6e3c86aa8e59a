"""Several replicas on one PostgreSQL (issue 14): a change committed through one replica reaches
the watchers of another within a fraction of a second (LISTEN/NOTIFY feeding each replica's
progress hub), the feed survives a dropped connection, and a real MCP client waiting on one
replica follows a task submitted to, launched and reported by another.

PostgreSQL only: on SQLite there is one process and the in-process path is the whole story
(tests/test_progress_hub.py, tests/test_streaming.py)."""

from __future__ import annotations

import secrets
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
import pytest
from fastmcp import Client

from controlplane import api
from controlplane.app import ControlPlane
from controlplane.settings import Settings
from tests.conftest import FAST, Agent, ServerProcess, closing_databases, fast_env, reap_jobs, runner_start_times
from tests.postgres import Cluster, require_or_skip

pytestmark = pytest.mark.anyio
SLOW_LOOPS = dict(scheduler_interval_s=3600, reconcile_interval_s=3600)  # nothing moves but what a test does


@pytest.fixture
def pg_url(pg: Cluster | None, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh PostgreSQL database shared by the test's replicas (CONTROLPLANE_DATABASE_URL)."""
    if pg is None:
        require_or_skip("its binaries (initdb, postgres) were not found")
    assert pg is not None
    with pg.database() as url, closing_databases(monkeypatch):
        monkeypatch.setenv("CONTROLPLANE_DATABASE_URL", url)
        yield url


def _submit_queued(cp: ControlPlane) -> str:
    return cp.service.submit("local", api.SubmitTask(tool_name="exercise", inputs={"sleep_s": 30}))["task_id"]


def _cancel(cp: ControlPlane, task_id: str) -> float:
    """Cancel through `cp` (a committed change on that replica); when the commit was done."""
    out = cp.service.cancel("local", api.CancelTask(task_id=task_id))
    assert out["state"] == "cancelled", out
    return time.perf_counter()


async def _started(b: ControlPlane) -> None:
    deadline = time.monotonic() + 10
    while b.change_feed is None or not b.change_feed.connected.is_set() or not b.is_leader:
        assert time.monotonic() < deadline, "replica B never listened (or never led)"
        await anyio.sleep(0.02)
    await anyio.sleep(0.3)  # B's first scheduler pass (at taking the lease) is over: what A submits stays queued


async def test_a_change_committed_on_one_replica_wakes_a_watcher_on_another(pg_url: str, tmp_path: Path) -> None:
    # A only writes (a replica answering a call); B runs (its loops and its change feed) and watches.
    a = ControlPlane(Settings(home=tmp_path / "a", **FAST))
    b = ControlPlane(Settings(home=tmp_path / "b", **{**FAST, **SLOW_LOOPS}))
    latencies = []
    async with b.running():
        await _started(b)
        for _ in range(20):
            tid = await anyio.to_thread.run_sync(_submit_queued, a)
            with b.hub.subscribe(tid) as sub:
                async with anyio.create_task_group() as tg:
                    committed: list[float] = []
                    tg.start_soon(_record, committed, a, tid)
                    seen = await sub.next(timeout=2.0)
                    seen_at = time.perf_counter()
            assert seen is not None, "the watcher on B never heard of the cancel committed on A"
            assert seen.state == "cancelled"
            latencies.append(seen_at - committed[0])
    print(f"\ncross-replica change latency over {len(latencies)}: p50 {statistics.median(latencies) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms")
    assert max(latencies) < 2.0


async def _record(out: list[float], cp: ControlPlane, task_id: str) -> None:
    out.append(await anyio.to_thread.run_sync(_cancel, cp, task_id))


async def test_the_change_feed_reconnects_and_reads_watched_tasks_again(pg_url: str, tmp_path: Path) -> None:
    a = ControlPlane(Settings(home=tmp_path / "a", **FAST))
    b = ControlPlane(Settings(home=tmp_path / "b", **{**FAST, **SLOW_LOOPS}))
    async with b.running():
        await _started(b)
        assert b.change_feed is not None
        tid = await anyio.to_thread.run_sync(_submit_queued, a)
        with b.hub.subscribe(tid) as sub:
            with psycopg.connect(pg_url, autocommit=True) as admin:  # the server drops the feed's connection
                killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE application_name = 'controlplane-changes' "
                                       "AND datname = current_database()").fetchone()
            assert killed == (1,)
            # On reconnecting, the hub reads every watched task again (changes may have been missed).
            again = await sub.next(timeout=5.0)
            assert again is not None and again.state == "queued"
            assert b.change_feed.connects == 2
            await anyio.to_thread.run_sync(_cancel, a, tid)
            seen = await sub.next(timeout=2.0)
            assert seen is not None and seen.state == "cancelled"


def _replica(home: Path, key: str, **extra: Any) -> ServerProcess:
    # keepalive_s: a waiter re-reads its task after this long without a pushed change. Long here, so
    # that only a change pushed across replicas can end the wait in time.
    return ServerProcess(home, env=fast_env(home, secret_key=key, keepalive_s=120, **extra))


def _leader_pid(url: str) -> int | None:
    with psycopg.connect(url) as c:
        row = c.execute("SELECT holder FROM leases WHERE name = %(name)s AND expires_at > %(now)s",
                        {"name": "leader", "now": time.time()}).fetchone()
    return int(row[0].split(":")[1]) if row else None


async def test_wait_task_on_one_replica_follows_a_task_running_on_another(pg_url: str, tmp_path: Path) -> None:
    key = secrets.token_hex(32)
    a = _replica(tmp_path / "a", key)
    b = _replica(tmp_path / "b", key)
    try:
        a.start()
        deadline = time.monotonic() + 10
        while _leader_pid(pg_url) != a.proc.pid:  # A leads: it launches, and the runner reports to A
            assert time.monotonic() < deadline, "replica A never took the leader lease"
            await anyio.sleep(0.05)
        b.start()
        progress: list[tuple[float, float]] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append((time.monotonic(), value))

        async with Client(a.url) as ca, Client(b.url) as cb:
            tid = await Agent(ca).submit(inputs={"sleep_s": 3, "progress_steps": 6, "result": {"k": "v"}})
            started = time.monotonic()
            res = await cb.call_tool("wait_task", {"task_id": tid, "timeout_s": 60}, progress_handler=on_progress)
            took = time.monotonic() - started
        out = res.structured_content
        assert out["state"] == "succeeded" and out["result"]["k"] == "v", out
        assert _leader_pid(pg_url) == a.proc.pid  # the task ran on A throughout
        values = [v for _, v in progress]
        assert len(values) >= 3 and values == sorted(values), progress  # steps came as they were reported
        assert took < 15, f"the wait on B ended {took:.1f}s after the submit on A (the task takes about 3s)"
        print(f"\nwait_task on B answered {took:.2f}s after the submit on A, with {len(values)} progress updates")
    finally:
        for srv in (a, b):
            srv.stop()
            reap_jobs(srv.home)


async def test_a_leader_stopped_past_its_lease_and_resumed_launches_nothing_twice(pg_url: str, tmp_path: Path) -> None:
    """A (the leader) is stopped with SIGSTOP somewhere in its launches of eight tasks submitted
    together, and resumed only once B took over and every launch is recorded. Each job was started
    once, all succeed. Where A stops is random: it may have recorded every launch already (the run
    then says B recorded none)."""
    import os
    import random
    import signal

    from tests.conftest import TERMINAL, write_catalog
    from tests.test_fencing import _launches

    key = secrets.token_hex(32)
    homes = [tmp_path / "a", tmp_path / "b"]
    for h in homes:
        write_catalog(h, concurrency=8)
    # One object store and one local jobs directory, as README's "Several replicas" asks: in a
    # directory of its own, B could not find a job A launched (and that ended) while A was stopped
    # before it recorded the launch, and would start it again.
    a, b = (_replica(h, key, leader_lease_s=1.5, object_store_url=(tmp_path / "objects").as_uri(),
                     local_jobs_dir=tmp_path / "jobs") for h in homes)
    try:
        a.start()
        deadline = time.monotonic() + 10
        while _leader_pid(pg_url) != a.proc.pid:
            assert time.monotonic() < deadline, "replica A never took the leader lease"
            await anyio.sleep(0.05)
        b.start()
        async with Client(b.url) as cb:
            agent = Agent(cb)
            tids: list[str] = []

            async def submit() -> None:
                tids.append(await agent.submit(inputs={"sleep_s": 1}))

            async with anyio.create_task_group() as tg:  # together: A claims them at once, launches 8 at once
                for _ in range(8):
                    tg.start_soon(submit)
            await anyio.sleep(random.uniform(0.0, 0.15))  # somewhere in A's launches
            os.kill(a.proc.pid, signal.SIGSTOP)
            try:
                deadline = time.monotonic() + 15
                while _leader_pid(pg_url) != b.proc.pid:  # B takes over once A's lease ran out
                    assert time.monotonic() < deadline, "replica B never took over"
                    await anyio.sleep(0.05)
                took_over = time.time()
                while _launches_recorded(pg_url, 0) < len(tids):  # B launches (or finds) what A left
                    assert time.monotonic() < deadline + 20, "replica B did not launch what A left"
                    await anyio.sleep(0.1)
            finally:
                resumed = time.time()
                os.kill(a.proc.pid, signal.SIGCONT)
            final = [await agent.wait(t, TERMINAL, timeout=60) for t in tids]
        launches = _launches(tmp_path)
        assert len(launches) == len(tids) and set(launches.values()) == {1}, launches
        # While A was stopped, only B can have started a runner, or recorded a launch (of a job
        # it started, or of one A had started and not recorded, which B found by its name).
        by_b = sum(1 for t in _launch_times(tmp_path) if took_over - 0.5 <= t <= resumed)
        recorded_by_b = _launches_recorded(pg_url, took_over - 0.5, resumed)
        states = [f["state"] for f in final]
        print(f"\nafter SIGSTOP/SIGCONT of the leader: {len(launches)} jobs, each started once "
              f"({len(launches) - by_b} by A, {by_b} by B; B recorded {recorded_by_b}); states {states}")
        assert all(s == "succeeded" for s in states), final
    finally:
        for srv in (a, b):
            if srv.proc is not None and srv.proc.poll() is None:
                os.kill(srv.proc.pid, signal.SIGCONT)
            srv.stop()
            reap_jobs(srv.home)


def _launches_recorded(url: str, since: float, until: float | None = None) -> int:
    """Launches the store recorded in [since, until]."""
    with psycopg.connect(url) as db:
        row = db.execute("SELECT count(*) FROM task_events WHERE kind = 'launched' AND ts BETWEEN %s AND %s",
                         (since, until if until is not None else time.time() + 60)).fetchone()
    return int(row[0]) if row else 0


def _launch_times(root: Path) -> list[float]:
    """When each runner under `root/jobs` started its job."""
    return [t for job_dir in (root / "jobs").iterdir() for t in runner_start_times(job_dir)]


def test_a_stopped_process_cannot_hold_its_locks_for_ever(pg_url: str) -> None:
    """Every PostgreSQL session of the store has the server end it once it sits idle inside a
    transaction (a process stopped mid-transaction): otherwise a paused leader holding the lease
    row would keep every other replica from taking over (see the SIGSTOP test above)."""
    from controlplane.store.db import IDLE_IN_TRANSACTION_S, Database

    db = Database(pg_url)
    try:
        with db.engine.connect() as c:
            shown = c.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar()
        assert shown == f"{int(IDLE_IN_TRANSACTION_S)}s"
        conn = db.engine.raw_connection()
        try:
            cur = conn.cursor()
            cur.execute("SET idle_in_transaction_session_timeout = '200ms'")  # (the same rule, faster)
            cur.execute("BEGIN")
            cur.execute("SELECT 1")
            time.sleep(0.6)  # stopped, mid-transaction
            with pytest.raises(psycopg.errors.IdleInTransactionSessionTimeout):
                cur.execute("SELECT 1")  # the server ended the session: its locks are gone
        finally:
            conn.invalidate()
    finally:
        db.dispose()


def test_reads_go_on_after_the_server_dropped_every_connection(pg_url: str, tmp_path: Path) -> None:
    """A restart or failover of the database (here: every session of the store ended by the server)
    costs a status read nothing: it is one autocommit statement, and on a dead connection it is
    tried once more on a fresh one. Reads leave no transaction open behind them."""
    cp = ControlPlane(Settings(home=tmp_path / "a", **{**FAST, **SLOW_LOOPS}))
    tid = _submit_queued(cp)
    for _ in range(3):  # the read pool holds a few connections now
        assert cp.service.status("local", api.GetTaskStatus(task_id=tid))["state"] == "queued"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        states = admin.execute("SELECT state FROM pg_stat_activity WHERE application_name = 'controlplane' "
                               "AND datname = current_database()").fetchall()
        assert states and all(s == ("idle",) for s in states), states  # not "idle in transaction"
        killed = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                               "WHERE application_name = 'controlplane' AND datname = current_database()").fetchone()
    assert killed is not None and killed[0] >= 1
    assert cp.service.status("local", api.GetTaskStatus(task_id=tid))["state"] == "queued"
    page = cp.service.list("local", api.ListTasks())
    assert [t["task_id"] for t in page["tasks"]] == [tid]
    cp.service.cancel("local", api.CancelTask(task_id=tid))  # writes find their pool fresh (pre-ping)
    assert cp.service.status("local", api.GetTaskStatus(task_id=tid))["state"] == "cancelled"
    cp.db.dispose()


def _wait_for_leader(url: str, pid: int, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while _leader_pid(url) != pid:
        assert time.monotonic() < deadline, f"replica {pid} never took the leader lease"
        time.sleep(0.05)


async def test_submit_on_one_follow_on_another_cancel_on_a_third(pg_url: str, tmp_path: Path) -> None:
    """Three replicas, each its own home and port, one database and key. The task is submitted to
    the leader (its job runs under the leader's home), followed with wait_task on the second and
    cancelled through the third: the cancel is only a row in the database, and the leader's
    reconciler stops the job from it. The whole process tree ends, and every replica then reads
    the task as cancelled."""
    from tests.conftest import all_dead, tree_pids

    key = secrets.token_hex(32)
    objects = (tmp_path / "objects").as_uri()
    one, two, three = (_replica(tmp_path / n, key, object_store_url=objects) for n in ("one", "two", "three"))
    try:
        one.start()
        await anyio.to_thread.run_sync(_wait_for_leader, pg_url, one.proc.pid)
        two.start()
        three.start()
        progress: list[float] = []

        async def on_progress(value: float, total: float | None, message: str | None) -> None:
            progress.append(value)

        async with Client(one.url) as c1, Client(two.url) as c2, Client(three.url) as c3:
            tid = await Agent(c1).submit(inputs={"sleep_s": 120, "progress_steps": 60, "spawn_children": 2})
            waited: list[Any] = []

            async def follow() -> None:
                waited.append(await c2.call_tool("wait_task", {"task_id": tid, "timeout_s": 90},
                                                 progress_handler=on_progress))

            async with anyio.create_task_group() as tg:
                tg.start_soon(follow)
                pids = await tree_pids(Agent(c2), tid, children=2)  # the job's tree, read on replica two
                deadline = time.monotonic() + 20
                while not progress:  # replica two is following the progress reported to replica one
                    assert time.monotonic() < deadline, "no progress reached the wait on replica two"
                    await anyio.sleep(0.05)
                cancelled = await Agent(c3).call("cancel_task", task_id=tid)
                assert cancelled["state"] in ("cancel_requested", "cancelling", "cancelled"), cancelled
            out = waited[0].structured_content
            assert out["state"] == "cancelled" and out["error"]["code"] == "CANCELLED", out
            assert await all_dead(pids), "the job's process tree outlived the cancel"
            for c in (c1, c2, c3):
                assert (await Agent(c).call("get_task_status", task_id=tid))["state"] == "cancelled"
        assert _leader_pid(pg_url) == one.proc.pid  # the cancel went from replica three to the leader
        assert list((tmp_path / "one" / "jobs").glob("*/runner.pid"))  # the job was the leader's
        assert not list((tmp_path / "three" / "jobs").glob("*/runner.pid"))
        print(f"\ncancel through replica three stopped a job of replica one ({len(pids)} processes); "
              f"replica two saw {len(progress)} progress updates and the end")
    finally:
        for srv in (one, two, three):
            srv.stop()
            reap_jobs(srv.home)


async def test_replicas_killed_at_random_lose_nothing_and_launch_nothing_twice(pg_url: str, tmp_path: Path) -> None:
    """Three replicas sharing one database, key, object store and local jobs directory (the
    deployment README's "Several replicas" describes). Three agents submit short tasks through
    whichever replica they pick, each submit with its own idempotency key and tried again on
    another replica when its answer was lost; meanwhile four replicas (every other one the leader)
    are killed with SIGKILL at random moments and started again. At the end: every task an agent
    was told of exists, each key made one task, no attempt's job was started twice, and every task
    succeeded. The seed of the random choices is printed (CONTROLPLANE_TEST_SEED sets it; the
    interleaving of the agents' calls still varies)."""
    import os
    import random

    from tests.conftest import TERMINAL, write_catalog
    from tests.test_fencing import _launches

    KILLS = 4
    seed = int(os.environ.get("CONTROLPLANE_TEST_SEED") or secrets.randbits(32))
    print(f"\nseed {seed}")
    rng = random.Random(seed)
    key = secrets.token_hex(32)
    shared = dict(object_store_url=(tmp_path / "objects").as_uri(), local_jobs_dir=tmp_path / "jobs",
                  leader_lease_s=1.5)
    homes = [tmp_path / n for n in ("r1", "r2", "r3")]
    for h in homes:
        write_catalog(h, concurrency=4)
    replicas = [_replica(h, key, **shared) for h in homes]
    told: dict[str, str] = {}  # idempotency key -> the task id an agent was told
    kills: list[str] = []
    try:
        for r in replicas:
            r.start()

        def alive() -> list[ServerProcess]:
            return [r for r in replicas if r.proc is not None and r.proc.poll() is None and r.url]

        async def submit(agent_no: int, n: int) -> None:
            ikey = f"agent{agent_no}-{n}"
            inputs = {"sleep_s": round(rng.uniform(0.1, 1.0), 2), "progress_steps": 2}
            for _ in range(100):
                srv = rng.choice(alive() or replicas)
                try:
                    with anyio.fail_after(15):
                        async with Client(srv.url) as c:
                            out = await Agent(c).call("submit_task", tool_name="exercise", inputs=inputs,
                                                      idempotency_key=ikey)
                    told[ikey] = out["task_id"]
                    return
                except Exception:  # noqa: BLE001 - a replica killed under the call: ask another
                    await anyio.sleep(0.2)
            raise AssertionError(f"no replica answered the submit of {ikey}")

        chaos_over = anyio.Event()

        async def agent_loop(agent_no: int) -> None:
            n = 0
            while not chaos_over.is_set() and n < 20:
                await submit(agent_no, n)
                n += 1
                await anyio.sleep(rng.uniform(0.1, 0.6))

        async def chaos() -> None:
            for k in range(KILLS):  # every other kill is the leader's (once there is one again)
                await anyio.sleep(rng.uniform(0.5, 2.0))
                up = alive()
                victim = rng.choice(up)
                if k % 2 == 0:
                    deadline = time.monotonic() + 10
                    while (leader := _leader_pid(pg_url)) not in [r.proc.pid for r in up]:
                        assert time.monotonic() < deadline, "no replica took the lease over"
                        await anyio.sleep(0.05)
                    victim = next(r for r in up if r.proc.pid == leader)
                kills.append(f"{victim.home.name}{' (leader)' if k % 2 == 0 else ''}")
                victim.kill()
                await anyio.sleep(rng.uniform(0.2, 1.5))
                await anyio.to_thread.run_sync(victim.start)
            chaos_over.set()

        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            tg.start_soon(chaos)
            for i in range(3):
                tg.start_soon(agent_loop, i)
        print(f"submitted {len(told)} tasks in {time.monotonic() - started:.1f}s; killed {', '.join(kills)}")
        final: dict[str, str] = {}
        deadline = time.monotonic() + 60
        async with Client(alive()[0].url) as c:
            agent = Agent(c)
            for tid in told.values():
                final[tid] = (await agent.wait(tid, TERMINAL, timeout=max(1.0, deadline - time.monotonic())))["state"]
        with psycopg.connect(pg_url) as db:
            tasks = db.execute("SELECT idempotency_key, task_id FROM tasks").fetchall()
            launched = db.execute("SELECT task_id, attempt, count(*) FROM task_events WHERE kind = 'launched' "
                                  "GROUP BY task_id, attempt").fetchall()
            jobs = db.execute("SELECT job_name FROM jobs WHERE handle_json IS NOT NULL").fetchall()
    finally:
        for r in replicas:
            r.stop()
        reap_jobs(tmp_path)
    print(f"took {time.monotonic() - started:.1f}s; final states {sorted(set(final.values()))}; "
          f"{len(kills)} kills")
    assert len(kills) == KILLS
    assert dict(tasks) == told  # none lost, none doubled: each key made exactly the task its agent was told
    assert all(n == 1 for _t, _a, n in launched), launched  # each attempt's launch recorded once
    starts = _launches(tmp_path)  # the runner starts, counted where the local provider starts them
    assert set(starts.values()) == {1}, starts
    assert set(starts) == {name for (name,) in jobs}  # every job the store knows was started, once
    assert set(final.values()) == {"succeeded"}, final
