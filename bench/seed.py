"""Bulk loading of realistic store contents for the benchmarks, straight through SQL.

Going through MCP (or even `Store.submit`) would take minutes for 100k tasks and a million log
lines; these functions write the same rows the store writes, in a few large transactions:

* `seed_history`: N tasks submitted over the last ten days, as a busy deployment accumulates
  them. Mostly one owner, two tools, a few tags; older than the ttl means expired (a tombstone),
  otherwise succeeded / failed / cancelled / timed_out with results or errors, and at the newest
  end a few running tasks (holding every slot of their class) and a queue of waiting tasks.
  Every task has its `submitted` event (and its final one), finished tasks their `done` job.
* `seed_log`: a long log for one task (task_logs rows plus `tasks.log_seq`).
* `seed_inflight`: N tasks running with an active job each, as the reconciler sees them.

Rows are consistent with the state machine, the ttl, the timeouts and the catalog's slots, so a
server started on them stays quiet: nothing times out, expires, or gets scheduled meanwhile.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, update

from controlplane import ids
from controlplane.store.db import Database
from controlplane.store.queries import EV, JOBS, LOGS, TAGS, T

DAY = 86_400.0
TTL_S = 7 * 24 * 3600  # the default ttl (Settings.default_ttl_s)
MAIN_OWNER = "local"  # Settings.default_owner: the identity of an unauthenticated loopback caller
PROJECTS = ["project:alpha", "project:beta", "project:gamma", "project:delta"]
RARE_TAG = "needs-review"  # about one task in a thousand
CHUNK = 20_000  # rows per executemany


@dataclass
class Seeded:
    n: int = 0
    by_state: dict[str, int] = field(default_factory=dict)
    running_ids: list[str] = field(default_factory=list)
    queued_ids: list[str] = field(default_factory=list)
    log_task_id: str | None = None
    sweep_tag: str | None = None  # a tag on one batch of ~500 tasks
    window: tuple[float, float] | None = None  # a one-day submission window five days back
    mid_pk: int | None = None  # a list cursor halfway down the history: this task's pk ...
    mid_submitted_at: float | None = None  # ... and submission time


def _insert(c: Any, table: Any, rows: list[dict[str, Any]]) -> None:
    for i in range(0, len(rows), CHUNK):
        c.execute(insert(table), rows[i : i + CHUNK])


def _inputs(tool: str, rng: random.Random) -> str:
    if tool == "lj_relax":
        d = {"n_atoms": rng.choice([13, 38, 55, 75, 100, 147]), "fmax": 0.001, "max_steps": 2000,
             "seed": rng.randrange(10_000)}
    else:
        d = {"sleep_s": round(rng.uniform(0, 30), 1), "progress_steps": rng.choice([0, 10, 100]),
             "log_lines": rng.choice([0, 100, 1000])}
    return json.dumps(d, separators=(",", ":"), sort_keys=True)


def _task_row(task_id: str, *, owner: str, tool: str, rc: str, state: str, submitted: float, rng: random.Random,
              tags: list[str], max_runtime_s: int) -> dict[str, Any]:
    """A tasks row with the columns `Store._submit` writes, in state `state`."""
    return dict(
        task_id=task_id, owner=owner, tool_name=tool, inputs_json=_inputs(tool, rng), input_size=None,
        provider="local", resource_class=rc, priority=0, ttl_s=TTL_S, idempotency_key=None,
        tags_json=json.dumps(tags), resources_json="{}", max_runtime_s=max_runtime_s, state=state, attempt=1,
        max_attempts=2 if tool == "lj_relax" else 1, not_before=0.0, submitted_at=submitted,
        scheduled_at=None, started_at=None, heartbeat_at=None, updated_at=submitted, completed_at=None,
        expires_at=None, timeout_at=None, job_id=None, cancel_requested=False, cancel_reason=None,
        stop_reason=None, progress_json=None, result_json=None, error_json=None, metrics_json=None,
        estimate_s=8.0 if tool == "lj_relax" else 1.0, log_seq=0, log_first_seq=1, version=1,
    )


def _event(task_id: str, ts: float, kind: str, frm: str | None, to: str | None, detail: dict | None = None) -> dict:
    return dict(task_id=task_id, ts=ts, kind=kind, from_state=frm, to_state=to, attempt=1,
                detail_json=json.dumps(detail) if detail else None)


def _job(task_id: str, rc: str, state: str, created: float, **extra: Any) -> dict[str, Any]:
    row = dict(job_id=ids.new_job_id(), task_id=task_id, attempt=1, provider="local", resource_class=rc,
               job_name=ids.AttemptRef(task_id, 1).job_name, state=state, handle_json=None, created_at=created,
               launched_at=created, seen_at=None, finished_at=None, stop_sent_at=None, event_seq=0,
               provider_status=None, provider_reason=None)
    row.update(extra)
    return row


def seed_history(db: Database, n: int, *, seed: int = 7, now: float | None = None, running: dict[str, int] | None = None,
                 queued: int = 200) -> Seeded:
    """Insert `n` tasks as described in the module docstring. `running` maps a resource class to
    the number of its running tasks (default: every slot of the default catalog's classes).

    Rows are made and written CHUNK tasks at a time, in one transaction on one connection whose
    fsyncs are off until it commits (a crash while seeding leaves nothing worth keeping), so a
    million tasks take a minute and a bounded amount of memory."""
    now = now or time.time()
    out = Seeded(n=n)
    raw = db.engine.raw_connection()
    try:
        c = raw.driver_connection
        c.execute("PRAGMA synchronous=OFF")
        c.execute("PRAGMA cache_size=-262144")  # 256 MiB while seeding
        c.execute("BEGIN IMMEDIATE")
        try:
            first_pk = (c.execute("SELECT COALESCE(MAX(pk), 0) FROM tasks").fetchone()[0] or 0) + 1
            chunk: list[tuple[dict[str, Any], list[str], list[dict[str, Any]], list[dict[str, Any]]]] = []
            for item in _history(n, first_pk, rng=random.Random(seed), now=now, queued=queued, out=out,
                                 running=running if running is not None else {"cpu_small": 2, "cpu_standard": 4}):
                chunk.append(item)
                if len(chunk) == CHUNK:
                    _write_chunk(c, chunk)
                    chunk = []
            _write_chunk(c, chunk)
            c.execute("COMMIT")
        except BaseException:
            c.execute("ROLLBACK")
            raise
        finally:
            c.execute("PRAGMA synchronous=FULL")  # as the store's connections have it (db.py)
            c.execute("PRAGMA cache_size=-2000")
        # Handy targets for the list_tasks filters
        sweep = n // 2 // 500
        out.sweep_tag = f"sweep:{sweep:04d}"
        five_days = now - 5 * DAY
        out.window = (five_days, five_days + DAY)
        out.mid_pk = first_pk + n // 2
        out.mid_submitted_at = c.execute("SELECT submitted_at FROM tasks WHERE pk = ?", (out.mid_pk,)).fetchone()[0]
    finally:
        raw.close()
    return out


def _write_chunk(c: Any, chunk: list[tuple[dict[str, Any], list[str], list[dict[str, Any]], list[dict[str, Any]]]]) -> None:
    """One executemany per table, straight through the driver (named parameters)."""
    tasks = [t for t, _, _, _ in chunk]
    tags = [{"task_pk": t["pk"], "tag": tag, "owner": t["owner"], "submitted_at": t["submitted_at"]}
            for t, task_tags, _, _ in chunk for tag in task_tags]
    for table, rows in ((T, tasks), (TAGS, tags), (EV, [e for _, _, evs, _ in chunk for e in evs]),
                        (JOBS, [j for _, _, _, js in chunk for j in js])):
        if rows:
            cols = list(rows[0])
            c.executemany(f"INSERT INTO {table.name} ({', '.join(cols)}) VALUES ({', '.join(':' + k for k in cols)})",
                          rows)


def _history(n: int, first_pk: int, *, rng: random.Random, now: float, running: dict[str, int], queued: int,
             out: Seeded) -> Iterator[tuple[dict[str, Any], list[str], list[dict[str, Any]], list[dict[str, Any]]]]:
    """(tasks row, its tags, its events, its jobs) of each of the `n` tasks, oldest first; the
    rows carry their pk (first_pk + i) so that tags need no read-back."""
    n_running = sum(running.values())
    span = 10 * DAY
    rc_running = [rc for rc, k in running.items() for _ in range(k)]

    for i in range(n):
        events: list[dict[str, Any]] = []
        jobs: list[dict[str, Any]] = []
        submitted = now - span + span * i / n + rng.uniform(0, 0.5)
        from_end = n - i  # 1 = newest
        owner = MAIN_OWNER if rng.random() < 0.95 else rng.choice(["alice", "bob"])
        tool = "lj_relax" if rng.random() < 0.55 else "exercise"
        task_tags = []
        if rng.random() < 0.7:
            task_tags.append(rng.choice(PROJECTS))
        if rng.random() < 0.3:
            task_tags.append(f"sweep:{i // 500:04d}")
        if rng.random() < 0.001:
            task_tags.append(RARE_TAG)
        task_id = ids.new_task_id(int(submitted * 1000))  # as a submit at that time would have named it
        rc = "cpu_small"
        if from_end <= queued:
            state = "queued"
            owner = MAIN_OWNER
        elif from_end <= queued + n_running:
            state = "running"
            owner = MAIN_OWNER
            rc = rc_running[from_end - queued - 1]
        else:
            r = rng.random()
            state = ("succeeded" if r < 0.85 else "failed" if r < 0.94 else "cancelled" if r < 0.99
                     else "timed_out")
        row = _task_row(task_id, owner=owner, tool=tool, rc=rc, state=state, submitted=submitted, rng=rng,
                        tags=task_tags, max_runtime_s=3600 if state == "running" else 600)
        events.append(_event(task_id, submitted, "submitted", None, "queued", {"priority": 0, "queue": rc}))
        if state == "running":
            started = now - rng.uniform(5, 60)
            row.update(scheduled_at=started - 0.2, started_at=started, updated_at=started, heartbeat_at=None,
                       timeout_at=started + 3600, version=3, job_id=ids.new_job_id(),
                       progress_json=json.dumps({"percent": round(rng.uniform(0, 99), 1), "step": 40,
                                                 "step_total": 100, "phase": "relax", "ts": now - 1}))
            # seen_at stays None: a job the runner never called back for is judged by its provider
            # alone, so the (double's) RUNNING answer keeps it running for the whole benchmark.
            jobs.append(_job(task_id, rc, "active", started - 0.2, job_id=row["job_id"],
                             handle_json=json.dumps({"job": ids.AttemptRef(task_id, 1).job_name, "double": True}),
                             provider_status="running"))
            events.append(_event(task_id, started, "running", "scheduled", "running", {"source": "provider"}))
            out.running_ids.append(task_id)
        elif state == "queued":
            out.queued_ids.append(task_id)
        else:
            started = submitted + rng.uniform(0.5, 30)
            done = started + (rng.uniform(2, 60) if tool == "lj_relax" else rng.uniform(0.1, 30))
            row.update(scheduled_at=started - 0.3, started_at=started, updated_at=done, completed_at=done,
                       expires_at=done + TTL_S, timeout_at=started + 600, version=4, job_id=ids.new_job_id(),
                       log_seq=rng.choice([0, 12, 100, 1000]))
            if state == "succeeded":
                row["result_json"] = json.dumps({"energy": round(rng.uniform(-500, -20), 6),
                                                 "steps": rng.randrange(50, 2000), "converged": True})
            else:
                code = {"failed": "TOOL_FAILED", "cancelled": "CANCELLED", "timed_out": "TOOL_TIMEOUT"}[state]
                row["error_json"] = json.dumps({"code": code, "message": f"the task ended {state}"})
            events.append(_event(task_id, done, state, "running", state, {"job_id": row["job_id"]}))
            if done + TTL_S <= now:  # past its ttl: the reconciler has expired it (a tombstone)
                row.update(state="expired", inputs_json="{}", result_json=None, progress_json=None,
                           updated_at=done + TTL_S, version=5)
                events.append(_event(task_id, done + TTL_S, "expired", state, "expired"))
            else:
                jobs.append(_job(task_id, rc, "done", started - 0.3, job_id=row["job_id"],
                                 finished_at=done, seen_at=done, provider_status="succeeded"))
        row["pk"] = first_pk + i
        out.by_state[row["state"]] = out.by_state.get(row["state"], 0) + 1
        if row["state"] == "succeeded" and row["owner"] == MAIN_OWNER:
            out.log_task_id = task_id  # the log task: the newest succeeded task of the main owner
        yield row, task_tags, events, jobs


def seed_log(db: Database, task_id: str, lines: int, *, now: float | None = None) -> None:
    """Give `task_id` a log of `lines` lines (seq 1..lines), as ingestion would have stored it."""
    now = now or time.time()
    start = now - 3600
    step = 3600 / max(lines, 1)
    with db.write() as c:
        c.execute(LOGS.delete().where(LOGS.c.task_id == task_id))
        for lo in range(1, lines + 1, CHUNK * 5):
            hi = min(lines, lo + CHUNK * 5 - 1)
            c.execute(insert(LOGS), [
                {"task_id": task_id, "seq": s, "attempt": 1, "ts": start + s * step, "stream": "stdout",
                 "level": "info", "message": f"step {s:>9}  E = {-173.928427 + (s % 977) * 1e-4:.6f}  fmax = "
                                             f"{1.0 / (1 + s % 311):.6e}"}
                for s in range(lo, hi + 1)])
        c.execute(update(T).where(T.c.task_id == task_id).values(log_seq=lines, log_first_seq=1))


def seed_inflight(db: Database, n: int, *, seed: int = 11, now: float | None = None,
                  rc: str = "cpu_small", provider: str = "local",
                  handles: list[dict[str, Any]] | None = None) -> list[str]:
    """`n` running tasks, each with an active job holding a handle (the i-th of `handles` when
    given); a fresh heartbeat each and no provider status recorded yet (the first poll after
    their launch). Returns their ids."""
    rng = random.Random(seed)
    now = now or time.time()
    tasks, events, jobs = [], [], []
    for i in range(n):
        tool = "lj_relax" if i % 2 else "exercise"
        submitted = now - 120 + 60 * i / n
        task_id = ids.new_task_id(int(submitted * 1000))
        started = submitted + rng.uniform(1, 30)
        wid = ids.new_job_id()
        row = _task_row(task_id, owner=MAIN_OWNER, tool=tool, rc=rc, state="running", submitted=submitted, rng=rng,
                        tags=[PROJECTS[i % len(PROJECTS)]], max_runtime_s=3600)
        row["provider"] = provider
        row.update(scheduled_at=started - 0.5, started_at=started, updated_at=now, heartbeat_at=now,
                   timeout_at=started + 3600, version=3, job_id=wid, log_seq=rng.randrange(0, 500),
                   progress_json=json.dumps({"percent": round(100 * i / n, 1), "step": i % 100, "step_total": 100,
                                             "ts": now}))
        tasks.append(row)
        name = ids.AttemptRef(task_id, 1).job_name
        handle = handles[i] if handles else {"job": name, "double": True, "arn": f"arn:bench:job/{name}"}
        jobs.append(_job(task_id, rc, "active", started - 0.5, job_id=wid, seen_at=now,
                         event_seq=rng.randrange(1, 200), handle_json=json.dumps(handle), provider=provider))
        events += [
            _event(task_id, submitted, "submitted", None, "queued", {"priority": 0, "queue": rc}),
            _event(task_id, started - 0.5, "scheduled", "queued", "scheduled", {"job_id": wid, "job_name": name}),
            _event(task_id, started - 0.4, "launched", None, None, {"job_id": wid, "job_name": name}),
            _event(task_id, started, "running", "scheduled", "running", {"job_id": wid}),
        ]
    jobs.sort(key=lambda j: j["created_at"])  # in the order they were launched, as a server writes them
    with db.write() as c:
        _insert(c, T, tasks)
        _insert(c, EV, events)
        _insert(c, JOBS, jobs)
    return [t["task_id"] for t in tasks]


# ---- the list_tasks filters measured over a seeded store (bench/run.py, bench/scale.py) -----------
def list_cursor(submitted_at: float, pk: int) -> str:
    """A list_tasks cursor continuing below the task (submitted_at, pk), as the service makes them."""
    from controlplane.service.listing import encode_cursor

    return encode_cursor(submitted_at, pk)


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def list_variants(seeded: Seeded) -> dict[str, dict[str, Any]]:
    assert seeded.window and seeded.mid_pk and seeded.sweep_tag
    return {
        "newest page": {},
        "states=[failed]": {"states": ["failed"]},
        "tool_name=exercise": {"tool_name": "exercise"},
        "tags_any common": {"tags_any": ["project:alpha"]},
        "tags_any rare": {"tags_any": [RARE_TAG]},
        "tags_any old batch": {"tags_any": [seeded.sweep_tag]},
        "1-day window 5 days ago": {"submitted_after": iso(seeded.window[0]), "submitted_before": iso(seeded.window[1])},
        "cursor halfway down": {"cursor": list_cursor(seeded.mid_submitted_at, seeded.mid_pk)},
        "limit=200": {"limit": 200},
    }
