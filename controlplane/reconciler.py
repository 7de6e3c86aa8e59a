"""The reconciler: makes the task table agree with what the providers say about their jobs.

One cycle:
1. stops the jobs of tasks whose cancel was requested, and of running tasks past their
   `timeout_at` (max_runtime_s); repeats the stop until the provider confirms the job is gone;
2. polls every watched job, in batches of the provider's `poll_batch_size` (one call per batch);
3. ends attempts whose job finished or vanished: the outcome comes from the runner's events
   (already ingested through the callback, or read now from the object store), else from the
   provider's own status; a lost job is retried per the tool's policy or fails `WORKER_LOST`;
4. stops a job whose runner has stopped heartbeating, and treats it as lost once the provider
   confirms it is gone (a retry never runs beside the job it replaces); jobs whose task has
   moved on ("draining") are stopped until the provider confirms it; a job that does not confirm
   it stopped within `stop_confirm_timeout_s` no longer holds its task: the task ends, the job is
   recorded as "abandoned" (`controlplane jobs --state abandoned`) and is still stopped every
   ABANDONED_RESEND_S until the provider says it ended (some runners ignore a stop);
5. expires finished tasks past their ttl: their objects are deleted first, then their logs and
   artifact rows; a failed deletion is retried next cycle, never skipped.

Provider API errors never fail a task: a poll that fails is retried with backoff (tenacity).
"""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from tenacity import Retrying, retry_if_not_exception_type, stop_after_attempt, wait_exponential

from controlplane.ingest import Ingestor
from controlplane.objectstore.base import task_prefix
from controlplane.objectstore.registry import StoreRegistry
from controlplane.outcomes import decide, decide_launch_failure, decide_lost, decide_provider_failure
from controlplane.settings import Settings
from controlplane.states import TaskState
from controlplane.store.store import StaleAttempt, Store
from providers.base import JobPhase, JobStatus, PermanentProviderError, Provider

log = logging.getLogger("controlplane.reconciler")
STOP_RESEND_S = 5.0
ABANDONED_RESEND_S = 60.0  # an abandoned job is still asked to stop, less often


@dataclass
class CycleStats:
    jobs: int = 0
    provider_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    finished: int = 0
    lost: int = 0
    stops: int = 0
    expired: int = 0


class Reconciler:
    def __init__(self, store: Store, providers: dict[str, Provider], stores: StoreRegistry, ingestor: Ingestor,
                 settings: Settings):
        self.store = store
        self.providers = providers
        self.stores = stores
        self.ingestor = ingestor
        self.settings = settings
        self.started_at = time.time()
        self._last_poll: dict[str, float] = {}

    async def cycle(self, force_poll: bool = False) -> CycleStats:
        return await anyio.to_thread.run_sync(self.cycle_sync, force_poll)

    def cycle_sync(self, force_poll: bool = False) -> CycleStats:
        stats = CycleStats()
        self.ingestor.flush_beats()
        now = time.time()
        jobs = self.store.active_jobs()
        stats.jobs = len(jobs)
        self._stops(jobs, now, stats)
        by_provider: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for j in jobs:
            by_provider[j["provider"]].append(j)
        for name, group in by_provider.items():
            provider = self.providers.get(name)
            if provider is None:
                continue
            due = force_poll or now - self._last_poll.get(name, 0) >= provider.poll_interval_s
            if not due:
                continue
            self._last_poll[name] = now
            statuses = self._poll(provider, group, stats)
            self._apply(provider, group, statuses, now, stats)
        self._expire(now, stats)
        return stats

    # ---- stopping -----------------------------------------------------------------------------
    @staticmethod
    def _draining(j: dict[str, Any]) -> bool:
        """The task has moved on (finished, or a later attempt) but this job may still run."""
        return j["job_state"] in ("draining", "abandoned") or j["attempt"] != j["task_attempt"]

    def _stops(self, jobs: list[dict[str, Any]], now: float, stats: CycleStats) -> None:
        for j in jobs:
            if self._draining(j):
                continue
            state = TaskState(j["state"])
            if state == TaskState.CANCEL_REQUESTED:
                self._send_stop(j, "cancel", stats)
                self.store.begin_stop(j["task_id"], "cancel")
            elif state == TaskState.RUNNING and j["timeout_at"] is not None and j["timeout_at"] < now:
                if self.store.begin_stop(j["task_id"], "timeout"):
                    self._send_stop(j, "timeout", stats)
            elif state == TaskState.CANCELLING and now - (j["stop_sent_at"] or 0) >= STOP_RESEND_S:
                self._send_stop(j, j["stop_reason"] or "cancel", stats)

    def _send_stop(self, j: dict[str, Any], reason: str, stats: CycleStats) -> None:
        provider = self.providers.get(j["provider"])
        if provider is None or not j["handle_json"]:
            return
        try:
            self._call(provider.cancel, provider.handle(json.loads(j["handle_json"])), reason)
            stats.provider_calls[f"{provider.name}.cancel"] += 1
            stats.stops += 1
        except Exception as e:  # noqa: BLE001 - retried next cycle
            log.warning("cancel of %s failed: %s", j["job_name"], e)
        self.store.mark_stop_sent(j["worker_id"])
        j["stop_sent_at"] = time.time()

    # ---- polling ------------------------------------------------------------------------------
    def _poll(self, provider: Provider, jobs: list[dict[str, Any]], stats: CycleStats) -> list[JobStatus | None]:
        """Statuses in the order of `jobs` (None: unknown this cycle). Handles are grouped by the
        provider's `poll_key` and handed over `poll_batch_size` at a time, so a provider that
        lists per job (Cloud Run) answers each job's executions with one paged list."""
        handles = [provider.handle(json.loads(j["handle_json"])) for j in jobs]
        groups: dict[Any, list[int]] = defaultdict(list)
        for i, h in enumerate(handles):
            groups[provider.poll_key(h)].append(i)
        out: list[JobStatus | None] = [None] * len(jobs)
        size = max(1, provider.poll_batch_size)
        for key, members in groups.items():
            for i in range(0, len(members), size):
                chunk = members[i : i + size]
                try:
                    statuses = self._call(provider.poll, [handles[k] for k in chunk])
                except Exception as e:  # noqa: BLE001 - a failed poll changes nothing
                    log.warning("poll of %d %s jobs (%s) failed: %s", len(chunk), provider.name, key, e)
                    statuses = [None] * len(chunk)
                for k, st in zip(chunk, statuses):
                    out[k] = st
                stats.provider_calls[f"{provider.name}.poll"] += 1
        return out

    @staticmethod
    def _call(fn: Any, *args: Any) -> Any:
        for attempt in Retrying(stop=stop_after_attempt(3), wait=wait_exponential(multiplier=0.2, max=2),
                                retry=retry_if_not_exception_type(PermanentProviderError), reraise=True):
            with attempt:
                return fn(*args)
        return None  # pragma: no cover

    def _apply(self, provider: Provider, jobs: list[dict[str, Any]], statuses: list[JobStatus | None], now: float,
               stats: CycleStats) -> None:
        changed = []
        for j, st in zip(jobs, statuses):
            if st is None:
                continue
            reason = st.waiting_reason or st.reason
            if st.raw_status != j["provider_status"] or reason != j["provider_reason"]:
                changed.append({"worker_id": j["worker_id"], "status": st.raw_status or st.phase.value,
                                "reason": reason})
            alive = st.phase in (JobPhase.RUNNING, JobPhase.PENDING)
            if self._draining(j):
                self._drain(j, alive, now, stats)
                continue
            if not alive:
                self._finalize(j, st, stats)
                continue
            state = TaskState(j["state"])
            if st.phase == JobPhase.RUNNING and state == TaskState.SCHEDULED:
                self.store.mark_running(j["task_id"], j["attempt"], st.started_at)
            if st.phase == JobPhase.PENDING and st.give_up_reason and state == TaskState.SCHEDULED:
                self._give_up_waiting(j, st.give_up_reason, stats)
            elif state == TaskState.CANCELLING:
                self._stop_overdue(j, now, stats)
            elif state == TaskState.RUNNING:
                self._check_heartbeat(j, now, stats)
        self.store.set_provider_status(changed)

    def _drain(self, j: dict[str, Any], alive: bool, now: float, stats: CycleStats) -> None:
        """A job whose task has moved on: done once it ended; stopped until then; abandoned if it
        has not confirmed it stopped within stop_confirm_timeout_s."""
        if not alive:
            self.store.set_job_state(j["worker_id"], "done")
            return
        abandoned = j["job_state"] == "abandoned"
        if not abandoned and now - (j["stop_requested_at"] or now) >= self.settings.stop_confirm_timeout_s:
            log.warning("job %s did not confirm it stopped within %.0f s: abandoned (still stopped now and then)",
                        j["job_name"], self.settings.stop_confirm_timeout_s)
            self.store.set_job_state(j["worker_id"], "abandoned")
            abandoned = True
        if now - (j["stop_sent_at"] or 0) >= (ABANDONED_RESEND_S if abandoned else STOP_RESEND_S):
            self._send_stop(j, "superseded", stats)

    def _check_heartbeat(self, j: dict[str, Any], now: float, stats: CycleStats) -> None:
        """A runner that reported before and then went silent is stopped and, once the provider
        confirms the job is gone, treated as lost (so a retry never runs beside it)."""
        if j["stop_requested_at"] is not None:  # already stopping it
            if now - j["stop_requested_at"] >= self.settings.stop_confirm_timeout_s:
                self._lost_unconfirmed(j, "the silent job did not confirm it stopped", stats)
            elif now - (j["stop_sent_at"] or 0) >= STOP_RESEND_S:
                self._send_stop(j, "heartbeat lost", stats)
            return
        if j["seen_at"] is None:
            return  # a runner that never called back (store-only mode) is judged by the provider alone
        last = max(j["seen_at"], self.started_at)  # a restart is not the runner's silence
        if now - last > self.settings.heartbeat_timeout_s:
            log.warning("job %s silent for %.0f s: stopping it, then treating it as lost", j["job_name"], now - last)
            self._send_stop(j, "heartbeat lost", stats)

    def _give_up_waiting(self, j: dict[str, Any], reason: str, stats: CycleStats) -> None:
        """The provider's policy gave up on a job that never started (no capacity): stop it and
        fail the attempt, or retry it if the tool retries launch failures. The job is drained:
        stopped until the provider confirms it is gone, and refused if it starts after all."""
        log.warning("job %s: %s", j["job_name"], reason)
        self._send_stop(j, "gave up waiting", stats)
        task = self.store.get(j["task_id"])
        if task is None:
            return
        decision = decide_launch_failure(task, reason, self.ingestor.policy(task["tool_name"]))
        self.store.finish_attempt(j["task_id"], j["attempt"], decision, ran=False, job_state="draining")
        stats.lost += 1

    def _stop_overdue(self, j: dict[str, Any], now: float, stats: CycleStats) -> None:
        """A job that will not confirm it stopped must not hold its slot for ever."""
        began = j["stop_requested_at"] or now
        if now - began >= self.settings.stop_confirm_timeout_s:
            self._lost_unconfirmed(j, "the job did not confirm it stopped", stats)

    def _lost_unconfirmed(self, j: dict[str, Any], reason: str, stats: CycleStats) -> None:
        log.warning("job %s: %s within %.0f s; its task ends, the job is abandoned (and still stopped now and then)",
                    j["job_name"], reason, self.settings.stop_confirm_timeout_s)
        task = self.store.get(j["task_id"])
        if task is None:
            return
        d = decide_lost(task, reason, self.ingestor.policy(task["tool_name"]))
        self.store.finish_attempt(j["task_id"], j["attempt"], d, job_state="abandoned")
        stats.lost += 1

    # ---- finishing ----------------------------------------------------------------------------
    def _finalize(self, j: dict[str, Any], st: JobStatus, stats: CycleStats) -> None:
        task_id, attempt = j["task_id"], j["attempt"]
        # Events the runner could not deliver by callback are in the object store.
        try:
            spilled = self.ingestor.read_spilled(j["store_url"], task_id, attempt, j["event_seq"] + 1)
            if spilled:
                r = self.ingestor.apply(task_id, attempt, spilled)
                if r.finished:
                    stats.finished += 1
                    return
        except StaleAttempt:
            self.store.set_job_state(j["worker_id"], "done")
            return
        task = self.store.get(task_id)
        if task is None or task["attempt"] != attempt or TaskState(task["state"]) not in (
            TaskState.SCHEDULED, TaskState.RUNNING, TaskState.CANCEL_REQUESTED, TaskState.CANCELLING
        ):
            self.store.set_job_state(j["worker_id"], "done")
            return
        policy = self.ingestor.policy(task["tool_name"])
        outcome = self.ingestor.read_outcome(task["store_url"], task_id, attempt)
        if outcome is not None:
            arts = self.ingestor.artifact_checker(task_id, attempt)(outcome.get("artifacts") or [])
            self.store.finish_attempt(task_id, attempt, decide(task, outcome, policy), arts)
            stats.finished += 1
        elif st.phase == JobPhase.GONE:
            self.store.finish_attempt(task_id, attempt, decide_lost(task, st.reason or "the job vanished", policy))
            stats.lost += 1
        else:
            d = decide_provider_failure(task, st.reason, st.exit_code, policy, started=st.started_at is not None)
            self.store.finish_attempt(task_id, attempt, d)
            stats.finished += 1

    # ---- retention ----------------------------------------------------------------------------
    def _expire(self, now: float, stats: CycleStats) -> None:
        for t in self.store.due_for_expiry(now):
            try:
                self.stores.get(t["store_url"]).delete_prefix(task_prefix(t["task_id"]))
            except Exception as e:  # noqa: BLE001 - retried next cycle; the task stays until it works
                log.warning("deleting the objects of %s failed (will retry): %s", t["task_id"], e)
                continue
            if self.store.expire(t["task_id"]):
                stats.expired += 1
