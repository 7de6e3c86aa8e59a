"""One attempt's writes, in one transaction: its log lines, progress and heartbeat, its start,
and its end (a terminal state, or a retry as a new attempt), its artifacts and its job's end.

`AttemptStore.open` locks the task and reads the attempt's job; the `AttemptTx` it yields
holds the primitives that `controlplane.attempts` (which decides what they should be) calls.
Nothing here reads runner events or decides an outcome.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy.engine import Connection

from controlplane import ids
from controlplane.states import FINAL, REPORTING, JobState, TaskState
from controlplane.store import job_queries as jq
from controlplane.store import queries as q
from controlplane.store.models import Artifact, table_of
from controlplane.store.rows import JobRow, TaskRow
from controlplane.store.writer import Writer

S = TaskState
_BUDGETS = {"failure": "failures", "recovery": "recoveries"}  # a retry "elsewhere" spends neither
_RESET_ON_RETRY = dict(job_id=None, started_at=None, timeout_at=None, scheduled_at=None, heartbeat_at=None,
                       progress_json=None, stop_reason=None)


class StaleAttempt(Exception):
    """A runner reported for an attempt that is no longer the task's current one."""


class AttemptTx:
    """The attempt's task and job, locked for one transaction. `current` is False when the task
    has moved on (another attempt, or it ended): then only `retire_job` makes sense."""

    def __init__(self, w: Writer, c: Connection, task: TaskRow | None, job: JobRow | None, attempt: int):
        self.w, self.c = w, c
        self.task, self.job = task, job
        self.now = w.clock()
        self.current = (task is not None and job is not None and task.attempt == attempt
                        and task.state not in FINAL)
        self._pending: dict[str, Any] = {}  # task columns to write with the next transition, or at the end

    # ---- while it runs ------------------------------------------------------------------------
    def append_logs(self, lines: Sequence[tuple[float | None, str, str, str]], cap: int) -> None:
        """(ts, stream, level, message) lines, numbered after the task's last; the oldest lines
        beyond `cap` (plus a tenth, so trimming is rare) are dropped."""
        assert self.task is not None
        seq = self._pending.get("log_seq", self.task.log_seq)
        rows = []
        for ts, stream, level, message in lines:
            seq += 1
            rows.append({"task_id": self.task.task_id, "seq": seq, "attempt": self.task.attempt,
                         "ts": ts if ts is not None else self.now, "stream": stream, "level": level,
                         "message": message})
        if not rows:
            return
        self.c.execute(q.INSERT_LOGS, rows)
        self._pending["log_seq"] = seq
        first = self._pending.get("log_first_seq", self.task.log_first_seq)
        if seq - first + 1 > cap * 1.1:
            self.w.db.run(self.c, q.TRIM_LOGS, {"task_id": self.task.task_id, "first": seq - cap + 1})
            self._pending["log_first_seq"] = seq - cap + 1

    def set_progress(self, progress: dict[str, Any]) -> None:
        assert self.task is not None
        self._pending["progress_json"] = json.dumps(progress)
        self.w.changed(self.task.task_id)

    def acknowledge(self, seq: int) -> None:
        """The runner's events up to `seq` are applied; it was alive just now."""
        assert self.job is not None
        self.w.db.run(self.c, jq.UPDATE_JOB, {"_jid": self.job.job_id, "event_seq": seq, "seen_at": self.now})
        self.job = self.job.but(event_seq=seq, seen_at=self.now)
        self._pending["heartbeat_at"] = self.now

    def start(self, detail: dict[str, Any], started_at: float | None = None) -> None:
        """scheduled -> running (the runner or the provider says it runs)."""
        assert self.task is not None
        if self.task.state != S.SCHEDULED:
            return
        start = max(started_at, self.task.scheduled_at or 0.0) if started_at else self.now
        self._move(S.RUNNING, kind="running", detail=detail,
                   values={"started_at": start, "timeout_at": start + self.task.max_runtime_s})

    # ---- its end ------------------------------------------------------------------------------
    def end(self, to: TaskState, *, error: dict[str, Any] | None = None, result: Any = None,
            note: str | None = None, retry: str | None = None, not_before: float = 0.0,
            artifacts: Sequence[dict[str, Any]] = (), job_state: JobState = JobState.DONE) -> TaskRow:
        """End the attempt: its job leaves the watched states, its artifacts are registered, and
        the task moves to `to` (a terminal state), or with `retry` ("failure": the tool failed;
        "recovery": the job was lost, preempted or not launched) back to queued as the next
        attempt, counted against that budget ("elsewhere": its placement had no room, no budget)."""
        assert self.task is not None and self.job is not None
        task, job = self.task, self.job
        if job.state == JobState.LAUNCHING and job_state == JobState.DONE and task.started_at is not None:
            # Its runner started and ended before the launch was recorded (a restart between the
            # provider call and its record): the launch happened, and the audit says so once.
            self.w.launched(self.c, job, self.now)
        if job.state in REPORTING or job_state == JobState.ABANDONED:
            self.job = self.w.move_job(self.c, job, job_state, self.now)
        if artifacts:
            self.c.execute(self.w.db.insert_ignore(table_of(Artifact)), [
                {"artifact_id": ids.new_artifact_id(), "task_id": task.task_id, "attempt": task.attempt,
                 "name": a["name"], "kind": a.get("kind") or "file", "size_bytes": int(a["size_bytes"]),
                 "sha256": a["sha256"], "content_type": a.get("content_type") or "application/octet-stream",
                 "store_url": task.store_url, "storage_key": a["key"], "created_at": self.now}
                for a in artifacts])
        detail: dict[str, Any] = {"job_id": job.job_id}
        if job_state == JobState.ABANDONED:
            detail["job"] = "abandoned"  # the task ends without the job's confirmation that it stopped
        if note:
            detail["note"] = note
        vals: dict[str, Any] = {}
        if error:
            vals["error_json"] = json.dumps(error)
            detail["error"] = error.get("code")
        if retry is not None:
            detail["retry"] = retry
            if retry == "elsewhere":  # the move, in the audit: off which placement, and why
                detail.update(placement=job.placement, provider=job.provider, reason=job.provider_reason)
            vals.update(_RESET_ON_RETRY, attempt=task.attempt + 1, not_before=not_before)
            counter = _BUDGETS.get(retry)
            if counter is not None:
                vals[counter] = getattr(task, counter) + 1
            self._pending.pop("progress_json", None)
            return self._move(S.QUEUED, kind="retry", detail=detail, values=vals)
        if result is not None:
            vals["result_json"] = json.dumps(result)
        return self._move(to, detail=detail, values=vals)

    def refused(self, status: str, reason: str) -> None:
        """What the provider said when it refused to launch the attempt's job (its status word
        and reason, kept on the job: where the next attempt runs is chosen from them)."""
        assert self.job is not None
        self.w.db.run(self.c, jq.UPDATE_JOB, {"_jid": self.job.job_id, "provider_status": status[:32],
                                             "provider_reason": reason})
        self.job = self.job.but(provider_status=status[:32], provider_reason=reason)

    def record_usage(self, values: dict[str, Any]) -> None:
        """What the attempt used (an `attempt_usage` row, without the task's own columns); once
        per attempt."""
        assert self.task is not None
        t = self.task
        self.c.execute(self.w.db.insert_ignore(q.USAGE), [{
            **values, "task_id": t.task_id, "attempt": t.attempt, "task_pk": t.pk, "owner": t.owner,
            "tool_name": t.tool_name, "provider": self.job.provider if self.job is not None else t.provider}])

    def retire_job(self, to: JobState = JobState.DONE) -> None:
        """The task moved on: a job still marked as reporting leaves that state."""
        if self.job is not None and self.job.state in REPORTING:
            self.job = self.w.move_job(self.c, self.job, to, self.now)

    def _move(self, to: TaskState, *, kind: str | None = None, detail: dict[str, Any] | None = None,
              values: dict[str, Any]) -> TaskRow:
        assert self.task is not None
        values = {**self._pending, **values}
        self._pending = {}
        self.task = self.w.transition(self.c, self.task, to, kind=kind, detail=detail, values=values, now=self.now)
        return self.task

    def _flush(self) -> None:
        if self._pending and self.task is not None:
            self.task = self.w.update_task(self.c, self.task, self._pending)
            self._pending = {}


class AttemptStore:
    def __init__(self, writer: Writer):
        self.w = writer
        self.db = writer.db

    @contextmanager
    def open(self, ref: ids.AttemptRef, *, reporting: bool = False) -> Iterator[AttemptTx]:
        """The attempt, locked. With `reporting` (a runner's events) an attempt that is not the
        task's current one, or whose job no longer reports, raises StaleAttempt."""
        with self.w.tx() as c:
            task = self.w.lock_task(c, ref.task_id)
            job = self.w.job(c, ref) if task is not None else None
            a = AttemptTx(self.w, c, task, job, ref.number)
            if reporting and (not a.current or job is None or job.state not in REPORTING):
                raise StaleAttempt(ref.task_id)
            yield a
            a._flush()

    def touch(self, beats: dict[ids.AttemptRef, float]) -> None:
        """Record heartbeats (runner calls without events), many at once, each the latest of its attempt."""
        if not beats:
            return
        with self.w.tx() as c:
            for ref, ts in beats.items():
                params = {"_tid": ref.task_id, "_att": ref.number, "_ts": ts}
                self.db.run(c, jq.JOB_HEARTBEAT, params)
                self.db.run(c, q.HEARTBEAT, params)
