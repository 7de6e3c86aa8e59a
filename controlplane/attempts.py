"""One attempt, from the runner's first event to its end: the one home for ending an attempt.

Whoever learns something about an attempt calls here, and everything an attempt's end involves
happens here, in one transaction (`Store.attempts.open`):

* `apply(ref, events)`: the runner's events (by HTTP callback, or read from the
  object store where it spilled them), idempotent by sequence number: log lines, progress, the
  start, and `finished`, which ends the attempt with the runner's own outcome (its job is
  `draining` until the provider says it ended: a container can outlive its runner's report);
* `end_from_provider(job, status)`: the provider says the job ended (or vanished): the runner's
  events and `result.json` are read from the object store first; without them, the provider's
  word decides;
* `end_lost`, `end_unlaunched`: the reconciler gave up on a silent or unstoppable job, or on a
  job that waited too long for capacity; the scheduler's launch was refused.

Each end reads the outcome (`controlplane.outcomes`: the target state, the error, and which
retry budget a retry draws on), keeps the artifacts that belong to this attempt, records what the
attempt used and its estimated cost (`controlplane.prices`), and moves the task and its job
(`AttemptTx.end`). The HTTP callback route and the reconciler both call here.

An attempt's usage runs from its job's start to its end as the provider reports them when the
end comes from the provider (Batch's startedAt/stoppedAt, an execution's start and completion
times), else as the runner reports them in its outcome, else from when the task was seen
running to now (a lost job: it is counted until it was given up on).
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from controlplane.catalog import Catalog, RetryPolicy
from controlplane.ids import AttemptRef
from controlplane.objectstore.base import UnsafeKey, artifact_key, events_prefix, result_key, safe_artifact_name
from controlplane.objectstore.registry import ObjectStores
from controlplane.ops import logs, metrics, traces
from controlplane.outcomes import (
    Decision,
    decide,
    decide_elsewhere,
    decide_launch_failure,
    decide_lost,
    decide_provider_failure,
    with_output,
)
from controlplane.prices import Pricing
from controlplane.settings import Settings
from controlplane.states import TERMINAL, JobState, TaskState
from controlplane.store import AttemptTx, StaleAttempt, Store
from controlplane.store.rows import TaskRow, WatchedJob
from controlplane_providers.base import JobPhase, JobStatus
from controlplane_runner import events as ev

log = logging.getLogger("controlplane.attempts")
S = TaskState


@dataclass(frozen=True)
class Applied:
    ack_seq: int
    cancel: bool
    finished: bool = False


class Attempts:
    def __init__(self, store: Store, catalog: Catalog, object_stores: ObjectStores, settings: Settings, pricing: Pricing):
        self.store = store
        self.pricing = pricing
        self.catalog = catalog
        self.object_stores = object_stores
        self.settings = settings
        self._beats: dict[AttemptRef, float] = {}
        self._lock = threading.Lock()

    def policy(self, tool_name: str) -> RetryPolicy:
        tool = self.catalog.tool(tool_name)
        return tool.retry if tool else RetryPolicy()

    # ---- the runner's events ------------------------------------------------------------------
    def apply(self, ref: AttemptRef, events: list[dict[str, Any]],
              ran_at: tuple[float | None, float | None] = (None, None), *, job_ended: bool = False) -> Applied:
        """Apply a batch; if earlier events are missing (a batch starting past the job's last
        seq + 1), they are read from the object store first. Raises StaleAttempt for an
        attempt that is no longer current. `ran_at`: the job's start and end as its provider
        reports them (preferred to the runner's for its usage), when the provider ended it
        (`job_ended`: the job is then done; else a launched job drains until the provider says so)."""
        with self.store.attempts.open(ref, reporting=True) as a:
            assert a.task is not None and a.job is not None
            fresh = _fresh(events, a.job.event_seq)
            if not fresh or ev.seq_of(fresh[0]) == a.job.event_seq + 1:
                return self._apply(a, fresh, ran_at, job_ended)
            store_url, from_seq = a.task.store_url, a.job.event_seq + 1
        missing = self.read_spilled(store_url, ref, from_seq)
        with self.store.attempts.open(ref, reporting=True) as a:
            assert a.job is not None
            return self._apply(a, _fresh(missing + events, a.job.event_seq), ran_at, job_ended)

    def _apply(self, a: AttemptTx, fresh: list[dict[str, Any]], ran_at: tuple[float | None, float | None],
               job_ended: bool = False) -> Applied:
        assert a.task is not None and a.job is not None
        seq = before = a.job.event_seq
        lines: list[tuple[float | None, str, str, str]] = []
        outcome: ev.Finished | None = None
        for raw in fresh:  # contiguous from the job's last seq; a gap waits for its events
            if ev.seq_of(raw) != seq + 1:
                break
            seq += 1
            e = ev.parse(raw)
            if isinstance(e, ev.Log):
                lines.append((e.ts, e.stream, e.level, e.message[: self.settings.max_log_line_bytes]))
            elif isinstance(e, ev.Progress):
                a.set_progress({**e.as_dict(), "ts": e.ts if e.ts is not None else a.now})
            elif isinstance(e, ev.Finished):
                outcome = e
        a.append_logs(lines, self.settings.max_log_lines_per_task)
        a.acknowledge(seq)
        if seq > before:
            a.start({"job_id": a.job.job_id})
        cancel = a.task.cancel_requested
        if outcome is not None:
            # The runner's word ends the attempt, not its job: a launched job is watched (and
            # stopped if it lingers) until the provider says it ended.
            drain = not job_ended and a.job.state == JobState.ACTIVE
            self._end(a, decide(a.task, outcome.as_outcome(), self.policy(a.task.tool_name)),
                      self._artifacts(a.task, outcome.artifacts), ran_at=_run_times(ran_at, outcome),
                      job_state=JobState.DRAINING if drain else JobState.DONE)
        return Applied(ack_seq=seq, cancel=cancel, finished=outcome is not None)

    def read_spilled(self, store_url: str, ref: AttemptRef, from_seq: int) -> list[dict[str, Any]]:
        """Events a runner wrote to the object store (no callback, or callback unreachable)."""
        objects = self.object_stores.get(store_url)
        out: list[dict[str, Any]] = []
        for key in objects.list(events_prefix(ref)):
            for line in objects.get_bytes(key).splitlines():
                try:
                    e = json.loads(line)
                except ValueError:
                    continue
                if isinstance(e, dict) and ev.seq_of(e) >= from_seq:
                    out.append(e)
        return out

    def read_outcome(self, store_url: str, ref: AttemptRef) -> ev.Finished | None:
        try:
            data = json.loads(self.object_stores.get(store_url).get_bytes(result_key(ref)))
        except (FileNotFoundError, ValueError):
            return None
        return ev.parse_outcome(data)

    # ---- ends the runner did not report -------------------------------------------------------
    def end_from_provider(self, job: WatchedJob, status: JobStatus) -> str:
        """The provider says the job ended or vanished. Returns "finished", "lost" or "stale"."""
        ref = job.ref
        task = self.store.tasks.get(ref.task_id)  # its store (the reconciler does not read it for every job)
        outcome = None
        ran_at = (status.started_at, status.finished_at)  # the provider's record of the run
        try:  # events the runner could not deliver by callback are in the object store
            if task is not None:
                spilled = self.read_spilled(task.store_url, ref, job.event_seq + 1)
                if spilled and self.apply(ref, spilled, ran_at, job_ended=True).finished:
                    return "finished"
                outcome = self.read_outcome(task.store_url, ref)
        except StaleAttempt:
            outcome = None
        with self.store.attempts.open(ref) as a:
            if not a.current or a.task is None:
                a.retire_job()  # the task moved on: the job ended, nothing more to decide
                return "stale"
            policy = self.policy(a.task.tool_name)
            if outcome is not None:
                self._end(a, decide(a.task, outcome.as_outcome(), policy), self._artifacts(a.task, outcome.artifacts),
                          ran_at=_run_times(ran_at, outcome))
                return "finished"
            # The runner reported nothing: what the job printed is the only word on why (kept here,
            # as the local provider's console goes with its job directory).
            a.append_logs([(None, "stderr", "error", line[: self.settings.max_log_line_bytes])
                           for line in status.last_output], self.settings.max_log_lines_per_task)
            if status.phase == JobPhase.GONE:
                self._end(a, with_output(decide_lost(a.task, status.reason or "the job vanished", policy),
                                         status.last_output))
                return "lost"
            self._end(a, with_output(decide_provider_failure(a.task, status.reason, status.exit_code, policy,
                                                             started=status.started_at is not None),
                                     status.last_output), ran_at=ran_at)
            return "finished"

    def end_lost(self, ref: AttemptRef, reason: str, *, job_state: JobState = JobState.ABANDONED) -> None:
        """A job that went silent or will not confirm it stopped: the task no longer waits for it."""
        with self.store.attempts.open(ref) as a:
            if a.current and a.task is not None:
                self._end(a, decide_lost(a.task, reason, self.policy(a.task.tool_name)), job_state=job_state)

    def end_unlaunched(self, ref: AttemptRef, reason: str, *,
                       job_state: JobState = JobState.DONE) -> None:
        """The job never ran: the provider refused it, or it waited for capacity past its limit
        (then it is `draining`: stopped until the provider confirms it is gone)."""
        with self.store.attempts.open(ref) as a:
            if a.current and a.task is not None:
                self._end(a, decide_launch_failure(a.task, reason, self.policy(a.task.tool_name)),
                          ran=False, job_state=job_state)

    def end_elsewhere(self, ref: AttemptRef, status: str, reason: str, *, refusals: int,
                      placements: int, why: str, job_state: JobState = JobState.DONE) -> bool:
        """The job's placement had no room for it (nothing started): the provider's word is kept
        on the job and the task is queued again to run elsewhere (`outcomes.decide_elsewhere`).
        `why` says how the room was found missing ("refused": the launch; "patience": the job
        waited past its placement's patience; "stuck": its provider gave up on it), counted per
        tool and placement. False when the attempt had already ended (nothing done)."""
        with self.store.attempts.open(ref) as a:
            if not a.current or a.task is None or a.job is None:
                return False
            d = decide_elsewhere(a.task, reason, self.policy(a.task.tool_name), refusals=refusals,
                                 placements=placements)
            moved = d.retry == "elsewhere"  # (else a task cancelled meanwhile: it ends, and did not move)
            if moved:
                a.refused(status, reason)
            self._end(a, d, ran=False, job_state=job_state)
            if moved:
                metrics.moved(a.task.tool_name, a.job.placement, a.job.provider, why)
            return True

    def mark_running(self, ref: AttemptRef, started_at: float | None) -> None:
        """The provider says the job runs although the runner has not reported yet."""
        with self.store.attempts.open(ref) as a:
            if a.current:
                a.start({"source": "provider"}, started_at)

    # ---- the end itself -----------------------------------------------------------------------
    def _end(self, a: AttemptTx, d: Decision, artifacts: Sequence[dict[str, Any]] = (), *, ran: bool = True,
             job_state: JobState = JobState.DONE,
             ran_at: tuple[float | None, float | None] = (None, None)) -> TaskRow:
        assert a.task is not None
        if ran and a.task.state == S.SCHEDULED and not d.is_retry:  # it ran, unseen
            a.start({"source": "outcome"}, ran_at[0])
        if ran:
            self._record_usage(a, ran_at)
        row = a.end(d.state, error=d.error, result=d.result, note=d.note, retry=d.retry,
                    not_before=a.now + d.backoff_s, artifacts=artifacts, job_state=job_state)
        if row.state in TERMINAL:
            metrics.COMPLETIONS.labels(row.tool_name, row.state).inc()
        traces.ended(row)
        if a.job is not None:
            code = (d.error or {}).get("code")
            log.info("task %s attempt %d ended: %s%s", row.task_id, a.job.attempt, row.state,
                     f" ({code})" if code else "", extra=logs.of_job(a.job, "end", state=row.state, error=code))
        return row

    def _record_usage(self, a: AttemptTx, ran_at: tuple[float | None, float | None]) -> None:
        """What the attempt used, from its job's start and end (`ran_at`, the best record there
        is; the task's start and now where it has none) and its shape, and its cost at today's
        prices. Nothing for an attempt that never started."""
        task = a.task
        assert task is not None
        start = ran_at[0] or task.started_at
        if start is None:
            return
        end = ran_at[1] or a.now
        priced = self.pricing.of_attempt(task, a.job)
        used = priced.usage(end - start)
        region = priced.region[:64] if priced.region else None  # (the column's width)
        a.record_usage({"region": region, "started_at": start, "ended_at": max(start, end),
                        "cpu": priced.cpu, "memory_mb": priced.memory_mb, "gpu": priced.gpu,
                        "run_s": used.run_s, "vcpu_s": used.vcpu_s, "memory_gib_s": used.memory_gib_s,
                        "gpu_s": used.gpu_s, "cost": used.cost(priced.rate), "currency": self.pricing.currency})

    @staticmethod
    def _artifacts(task: TaskRow, reported: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The reported artifacts that belong to this attempt (a key outside its prefix, a bad
        name, size or digest is never registered), with only the fields the store keeps: a kind
        or content type that is not short printable text (the store's columns hold 64 and 128
        characters, and PostgreSQL enforces it) is replaced by the default."""
        good = []
        for a in reported:
            try:
                name = safe_artifact_name(a.get("name"))
                if a.get("key") != artifact_key(task.ref, name):
                    continue
                size = int(a["size_bytes"])
                if not 0 <= size < 2**63 or not isinstance(a.get("sha256"), str) or not SHA256.fullmatch(a["sha256"]):
                    continue
            except (UnsafeKey, KeyError, TypeError, ValueError, AttributeError):
                continue
            good.append({"name": name, "key": a["key"], "size_bytes": size, "sha256": a["sha256"],
                         "kind": _label(a.get("kind"), 64), "content_type": _label(a.get("content_type"), 128)})
        return good

    # ---- heartbeats: kept in memory, written in batches ---------------------------------------
    def beat(self, ref: AttemptRef, ts: float) -> None:
        with self._lock:
            self._beats[ref] = ts

    def flush_beats(self) -> None:
        with self._lock:
            beats, self._beats = self._beats, {}
        self.store.attempts.touch(beats)


SHA256 = re.compile(r"[0-9a-f]{64}")


def _label(v: Any, limit: int) -> str | None:
    """A runner's label (an artifact's kind or content type) if it is printable text of at most
    `limit` characters; else None (the default)."""
    return v if isinstance(v, str) and 0 < len(v) <= limit and v.isprintable() else None


def _fresh(events: list[dict[str, Any]], seq: int) -> list[dict[str, Any]]:
    """The events past `seq`, one per seq number, in order."""
    by_seq: dict[int, dict[str, Any]] = {}
    for e in events:
        n = ev.seq_of(e)
        if n > seq:
            by_seq.setdefault(n, e)
    return [by_seq[n] for n in sorted(by_seq)]


def _run_times(provider: tuple[float | None, float | None], outcome: ev.Finished) -> tuple[float | None, float | None]:
    """A job's start and end: as its provider recorded them where it did, else as its runner reported."""
    return provider[0] or outcome.started_at, provider[1] or outcome.finished_at
