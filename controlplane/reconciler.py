"""The reconciler: makes the task table agree with what the providers say about their jobs.

One cycle:
1. stops the jobs of tasks whose cancel was requested, and of running tasks past their
   `timeout_at` (max_runtime_s); repeats the stop until the provider confirms the job is gone;
2. polls every watched job, in batches of the provider's `poll_batch_size` (one call per batch);
3. ends attempts whose job finished or vanished (`controlplane.attempts`: the outcome comes
   from the runner's events, already ingested through the callback or read now from the object
   store, else from the provider's own status; a lost job is recovered per the tool's policy or
   fails `WORKER_LOST`);
4. stops a job whose runner has stopped heartbeating, and treats it as lost once the provider
   confirms it is gone (a retry never runs beside the job it replaces); jobs whose task has
   moved on ("draining") are stopped until the provider confirms it; a job that does not confirm
   it stopped within `stop_confirm_timeout_s` no longer holds its task: the task ends, the job is
   recorded as "abandoned" (`controlplane jobs --state abandoned`) and is still stopped every
   ABANDONED_RESEND_S until the provider says it ended (some runners ignore a stop). A job whose
   runner reported the attempt's end drains too: done once the provider says it ended, stopped
   if it still runs `kill_grace_s` plus a poll interval after that report (a container can
   outlive its runner);
5. stops the extra executions of an attempt whose claim was refused to one of them
   (`controlplane.reconciling.extras`), and moves to the tool's next placement an attempt whose
   job waits to start past its placement's patience (`controlplane.reconciling.moves`);
6. settles the waiting children a parent's end (or cascading cancel) left to settle, when it had
   more than one transaction settles (`store.releases`): a batch per transaction, for at most
   `release_cycle_s` of the cycle;
7. expires finished tasks past their ttl and purges the tombstones and the audit after their
   retention periods (`controlplane.retention`: in bounded batches, within a budget per cycle;
   a failed deletion is retried on the next pass, never skipped).

Provider API errors never fail a task: a poll that fails is retried with backoff (tenacity).

Across replicas only the leader reconciles, and every write of its cycle is fenced by the lease
epoch it held when the cycle began (`Store.fenced`, `store.leases`): a leader paused past its
lease (after reading its jobs and polling them) wakes to find every write refused, and the cycle
ends at the first one (`leases.Fenced`). No transition, retry or end is made from what it read
before the pause. A stop is recorded before it is sent, in a transaction that also asks for
`stop_margin_s` of lease to spare, so a stop decided on a stale read (a heartbeat that has since
come back through another replica) is never sent either. Heartbeats are not the leader's
decisions: they are written unfenced, by every replica, before the fenced part of a cycle.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from controlplane.attempts import Attempts
from controlplane.ids import AttemptRef
from controlplane.objectstore.claim import nonce_digest
from controlplane.objectstore.registry import ObjectStores
from controlplane.ops import logs, metrics
from controlplane.ops.health import ProviderHealth
from controlplane.reconciling.cycle import ALIVE, CycleStats, call
from controlplane.reconciling.extras import ExtraExecutions
from controlplane.reconciling.moves import Moves, moving
from controlplane.retention import Retention
from controlplane.settings import Settings
from controlplane.states import JobState, TaskState
from controlplane.store import Store
from controlplane.store.leases import Fence
from controlplane.store.rows import JobRow, TaskRow, WatchedJob
from controlplane_providers.base import Handle, JobPhase, JobStatus, LaunchSpec, MalformedHandle, Provider

log = logging.getLogger("controlplane.reconciler")
S = TaskState
STOP_RESEND_S = 5.0
ABANDONED_RESEND_S = 60.0  # an abandoned job is still asked to stop, less often


def _random_mover() -> Callable[[AttemptRef], str]:
    """A claim digest per attempt that no runner can make (a process without the server's key)."""
    key = secrets.token_hex(32)
    return lambda ref: nonce_digest(f"{key}:{ref.task_id}:{ref.number}")


def _by_provider(jobs: list[WatchedJob], due: set[str]) -> dict[str, list[WatchedJob]]:
    """The jobs of the providers in `due`, by provider."""
    out: dict[str, list[WatchedJob]] = {}
    for j in jobs:
        if j.provider in due:
            group = out.get(j.provider)
            if group is None:
                group = out[j.provider] = []
            group.append(j)
    return out


class Reconciler:
    page_size = 500  # watched jobs read at a time (a cycle holds about 1 MB of them)
    status_batch = 2000  # provider statuses recorded per write transaction
    # Provider statuses recorded per cycle at most: what the providers' words are for is the
    # operator's view and a waiting task's reason; nothing the cycle decides (a job's end, a stop)
    # reads them. A burst of first statuses (jobs launched since the last poll) is recorded over
    # the next cycles, each cycle's writes bounded (at 100k first statuses, recording them all in
    # one cycle took half its CPU: bench/inflight.py).
    status_budget = 20_000

    def __init__(self, store: Store, providers: dict[str, Provider[Any]], object_stores: ObjectStores, attempts: Attempts,
                 settings: Settings, fence: Callable[[], Fence | None] = lambda: None, stop_margin_s: float = 0.0,
                 build_spec: Callable[[TaskRow, JobRow], LaunchSpec] | None = None,
                 mover: Callable[[AttemptRef], str] | None = None):
        self.store = store
        self.fence = fence  # the leader's lease fence now (None: unfenced, a single process)
        self.stop_margin_s = stop_margin_s  # lease to spare before a stop is sent
        self._fence: Fence | None = None  # the fence of the cycle under way
        self.providers = providers
        self.object_stores = object_stores
        self.attempts = attempts
        self.settings = settings
        self.started_at = time.time()
        self._last_poll: dict[str, float] = {}
        self._stop_sent: dict[str, float] = {}  # this cycle's stops, by job id
        # Watched jobs whose stored handle did not decode (said once), by job id: their provider.
        self._unreadable: dict[str, str] = {}
        self._unreadable_now: dict[str, str] = {}  # ... seen so in this cycle
        # The extra executions of attempts (build_spec None: not looked up).
        self.extras = ExtraExecutions(store, providers, settings, build_spec, self._handle, lambda: self._fence,
                                      stop_margin_s)
        self._status_room = self.status_budget  # statuses this cycle may still record
        # Attempts whose job waits past its placement's patience, moved (mover: the digest of the
        # control plane's own claim on an attempt; None, a process without a key: a random one).
        self.moves = Moves(store, providers, object_stores, attempts, settings, lambda: self._fence,
                           mover or _random_mover(), self._send_stop, self._sent_at)
        self.retention = Retention(store, object_stores, providers, settings)
        self.health = ProviderHealth()  # what the polls looked like, for the operator (ops/health.py)

    async def cycle(self, force_poll: bool = False) -> CycleStats:
        return await anyio.to_thread.run_sync(self.cycle_sync, force_poll)

    def cycle_sync(self, force_poll: bool = False) -> CycleStats:
        """One cycle (see the module docstring). The watched jobs are read `page_size` at a time
        (`JobStore.watched_pages`), so what a cycle holds is bounded by a page, not by the jobs
        in flight: each page's stops are sent, its handles decoded and its jobs queued for their
        poll by (provider, poll key); a queue is polled and its statuses applied as soon as it
        fills a batch, and what is left once every page is read, so the calls are the same as
        over all jobs at once (ceil(n / poll_batch_size) per group)."""
        started = time.perf_counter()
        self.attempts.flush_beats()
        self._fence = self.fence()
        try:
            with self.store.fenced(self._fence):
                return self._cycle(force_poll)
        finally:
            metrics.RECONCILE.observe(time.perf_counter() - started)

    def _cycle(self, force_poll: bool) -> CycleStats:
        stats = CycleStats()
        now = time.time()
        self._stop_sent = {}
        due = {name for name, p in self.providers.items()
               if force_poll or now - self._last_poll.get(name, 0) >= p.poll_interval_s}
        said, self._unreadable_now = self._unreadable, {}
        self.extras.begin_cycle()
        self.moves.begin_cycle()
        queued: dict[tuple[str, Any], tuple[list[WatchedJob], list[Handle]]] = {}  # by (provider, poll key)
        changed: list[tuple[str, str, str | None]] = []  # provider statuses to record
        self._status_room = self.status_budget
        polled: set[str] = set()
        for page in self.store.jobs.watched_pages(self.page_size, now):
            stats.jobs += len(page)
            self._stops(page, now, stats)
            self.extras.look(page, now, stats)
            for name, group in _by_provider(page, due).items():
                provider = self.providers[name]
                polled.add(name)
                size, poll_key = max(1, provider.poll_batch_size), provider.poll_key
                for j, handle in zip(group, provider.handles([j.handle_json or "" for j in group]), strict=False):
                    if isinstance(handle, MalformedHandle):
                        self._unreadable_handle(j, handle)
                        continue
                    key = (name, poll_key(handle))
                    batch = queued.get(key)
                    if batch is None:
                        batch = queued[key] = ([], [])
                    batch[0].append(j)
                    batch[1].append(handle)
                    if len(batch[0]) >= size:
                        del queued[key]
                        self._poll_batch(provider, key[1], *batch, now, stats, changed)
            if len(changed) >= self.status_batch:
                self.store.jobs.set_provider_status(changed)
                changed = []
        for (name, key), batch in queued.items():
            self._poll_batch(self.providers[name], key, *batch, now, stats, changed)
        self.store.jobs.set_provider_status(changed)
        for name in polled:
            self._last_poll[name] = now
        # A polled provider's watched jobs were all decoded: those it no longer has are forgotten.
        self._unreadable = {w: p for w, p in said.items() if p not in polled} | self._unreadable_now
        self.extras.end_cycle()
        self._release(stats)
        self.moves.end_cycle()
        self._expire(now, stats)
        return stats

    def _release(self, stats: CycleStats) -> None:
        """What ends left to settle, a batch a transaction within the cycle's budget: waiting
        children to release, then stopped sweeps' shards to cancel."""
        deadline = time.monotonic() + self.settings.release_cycle_s
        for follow_up in (self.store.tasks.settle_left, self.store.sweeps.stop_left):
            while (settled := follow_up()) is not None:
                stats.released += settled
                if time.monotonic() >= deadline:
                    stats.releases_left = True
                    return

    # ---- stopping -----------------------------------------------------------------------------
    def _stops(self, jobs: list[WatchedJob], now: float, stats: CycleStats) -> None:
        for j in jobs:
            if j.draining:
                continue
            if j.state == S.CANCEL_REQUESTED:
                self._send_stop(j, "cancel", stats)
                self.store.tasks.begin_stop(j.task_id, "cancel")
            elif j.state == S.RUNNING and j.timeout_at is not None and j.timeout_at < now:
                if self.store.tasks.begin_stop(j.task_id, "timeout"):
                    self._send_stop(j, "timeout", stats)
            elif j.state == S.CANCELLING and now - self._sent_at(j) >= STOP_RESEND_S:
                self._send_stop(j, j.stop_reason or "cancel", stats)

    def _sent_at(self, j: WatchedJob) -> float:
        return self._stop_sent.get(j.job_id, j.stop_sent_at or 0)

    def _send_stop(self, j: WatchedJob, reason: str, stats: CycleStats) -> None:
        if j.job_id in self._stop_sent:
            return  # stopped once this cycle already (e.g. timed out and silent)
        provider = self.providers.get(j.provider)
        if provider is None or not j.handle_json:
            return
        handle = self._handle(provider, j)
        if handle is None:
            return
        # Recorded first, fenced with lease to spare: a leader that lost its lease sends no stop.
        self._stop_sent[j.job_id] = self.store.jobs.mark_stop_sent(j.job_id, self._fence, self.stop_margin_s)
        try:
            call(provider, "cancel", handle, reason)
            stats.provider_calls[f"{provider.name}.cancel"] += 1
            stats.stops += 1
            log.info("stopped %s (%s)", j.job_name, reason, extra=logs.of_job(j, "stop", reason=reason))
        except Exception as e:  # noqa: BLE001 - retried next cycle
            log.warning("cancel of %s failed: %s", j.job_name, e, extra=logs.of_job(j, "stop_failed", reason=reason))

    # ---- polling ------------------------------------------------------------------------------
    def _poll_batch(self, provider: Provider[Any], key: Any, jobs: list[WatchedJob], handles: list[Handle], now: float,
                    stats: CycleStats, changed: list[tuple[str, str, str | None]]) -> None:
        """One poll call for a batch of jobs with one poll key (a provider that lists per job,
        Cloud Run, answers each job's executions with one paged list), then what it said."""
        try:
            statuses = call(provider, "poll", handles)
            self.health.polled(provider.name, len(jobs))
        except Exception as e:  # noqa: BLE001 - a failed poll changes nothing
            log.warning("poll of %d %s jobs (%s) failed: %s", len(jobs), provider.name, key, e,
                        extra={"provider": provider.name, "action": "poll_failed"})
            self.health.polled(provider.name, len(jobs), e)
            statuses = [None] * len(jobs)
        stats.provider_calls[f"{provider.name}.poll"] += 1
        self._apply(jobs, statuses, now, stats, changed)

    def _handle(self, provider: Provider[Any], j: WatchedJob) -> Handle | None:
        """The job's handle; None (the job is skipped, its status unknown) when the stored handle
        is not one of this provider's (written by another version, or damaged): one job's
        unreadable handle must not stop the cycle for every other job. Said once per job."""
        try:
            handle: Handle = provider.handle(j.handle_json or "")
        except MalformedHandle as e:
            self._unreadable_handle(j, e)
            return None
        return handle

    def _unreadable_handle(self, j: WatchedJob, e: MalformedHandle) -> None:
        if j.job_id not in self._unreadable and j.job_id not in self._unreadable_now:
            log.error("job %s of task %s cannot be polled or stopped: %s", j.job_name, j.task_id, e,
                      extra=logs.of_job(j, "unreadable_handle"))
        self._unreadable_now[j.job_id] = j.provider

    def _apply(self, jobs: list[WatchedJob], statuses: list[JobStatus | None], now: float,
               stats: CycleStats, changed: list[tuple[str, str, str | None]]) -> None:
        for j, st in zip(jobs, statuses, strict=False):
            if st is None:
                continue
            alive = st.phase in ALIVE
            if not j.draining and moving(j) is not None:  # its provider status is the move's until it ends
                self.moves.step(j, alive, now, stats)
                continue
            if st.phase == JobPhase.PENDING and j.state == S.SCHEDULED and not j.draining:
                due = self.moves.due(j, st, now)
                if due is not None:
                    self.moves.begin(j, *due, now, stats)
                    continue
            reason = st.waiting_reason or st.reason
            if (st.raw_status != j.provider_status or reason != j.provider_reason) and self._status_room > 0:
                self._status_room -= 1
                changed.append((j.job_id, st.raw_status or st.phase.value, reason))
            if j.draining:
                self._drain(j, alive, now, stats)
            elif not alive:
                if j.extra_claims and self.extras.follow_holder(j, stats):
                    continue  # it lost its attempt's claim to another execution, which runs the tool
                outcome = self.attempts.end_from_provider(j, st)
                if outcome == "lost":
                    stats.lost += 1
                elif outcome == "finished":
                    stats.finished += 1
            elif st.phase == JobPhase.PENDING and st.give_up_reason and j.state == S.SCHEDULED:
                self._give_up_waiting(j, st.give_up_reason, stats)
            else:
                if st.phase == JobPhase.RUNNING and j.state == S.SCHEDULED:
                    self.attempts.mark_running(j.ref, st.started_at)
                if j.state == S.CANCELLING:
                    self._stop_overdue(j, now, stats)
                elif j.state == S.RUNNING:
                    self._check_heartbeat(j, now, stats)

    def _drain(self, j: WatchedJob, alive: bool, now: float, stats: CycleStats) -> None:
        """A job whose task has moved on: done once it ended; stopped until then; abandoned if it
        has not confirmed it stopped within stop_confirm_timeout_s."""
        if not alive:
            self.store.jobs.move(j.job_id, JobState.DONE)
            return
        provider = self.providers.get(j.provider)
        grace = self.settings.kill_grace_s + (provider.poll_interval_s if provider is not None else 0.0)
        if j.job_state == JobState.DRAINING and j.stop_requested_at is None and now - (j.seen_at or 0) < grace:
            return  # its runner reported the end just now: the job may end by itself (and be seen to) first
        abandoned = j.job_state == JobState.ABANDONED
        if not abandoned and now - (j.stop_requested_at or now) >= self.settings.stop_confirm_timeout_s:
            log.warning("job %s did not confirm it stopped within %.0f s: abandoned (still stopped now and then)",
                        j.job_name, self.settings.stop_confirm_timeout_s, extra=logs.of_job(j, "abandoned"))
            self.store.jobs.move(j.job_id, JobState.ABANDONED)
            abandoned = True
        if now - self._sent_at(j) >= (ABANDONED_RESEND_S if abandoned else STOP_RESEND_S):
            self._send_stop(j, "superseded", stats)

    def _check_heartbeat(self, j: WatchedJob, now: float, stats: CycleStats) -> None:
        """A runner that reported before and then went silent is stopped and, once the provider
        confirms the job is gone, treated as lost (so a retry never runs beside it)."""
        if j.stop_requested_at is not None:  # already stopping it
            if now - j.stop_requested_at >= self.settings.stop_confirm_timeout_s:
                self._lost_unconfirmed(j, "the silent job did not confirm it stopped", stats)
            elif now - self._sent_at(j) >= STOP_RESEND_S:
                self._send_stop(j, "heartbeat lost", stats)
            return
        if j.seen_at is None:
            return  # a runner that never called back (store-only mode) is judged by the provider alone
        last = max(j.seen_at, self.started_at)  # a restart is not the runner's silence
        if now - last > self.settings.heartbeat_timeout_s:
            log.warning("job %s silent for %.0f s: stopping it, then treating it as lost", j.job_name, now - last,
                        extra=logs.of_job(j, "silent"))
            self._send_stop(j, "heartbeat lost", stats)

    def _give_up_waiting(self, j: WatchedJob, reason: str, stats: CycleStats) -> None:
        """The provider's policy gave up on a job that never started (no capacity): stop it and
        fail the attempt, or retry it if the tool retries launch failures. The job is drained:
        stopped until the provider confirms it is gone, and refused if it starts after all."""
        log.warning("job %s: %s", j.job_name, reason, extra=logs.of_job(j, "gave_up_waiting"))
        self._send_stop(j, "gave up waiting", stats)
        self.attempts.end_unlaunched(j.ref, reason, job_state=JobState.DRAINING)
        stats.lost += 1

    def _stop_overdue(self, j: WatchedJob, now: float, stats: CycleStats) -> None:
        """A job that will not confirm it stopped must not hold its slot for ever."""
        if now - (j.stop_requested_at or now) >= self.settings.stop_confirm_timeout_s:
            self._lost_unconfirmed(j, "the job did not confirm it stopped", stats)

    def _lost_unconfirmed(self, j: WatchedJob, reason: str, stats: CycleStats) -> None:
        log.warning("job %s: %s within %.0f s; its task ends, the job is abandoned (and still stopped now and then)",
                    j.job_name, reason, self.settings.stop_confirm_timeout_s, extra=logs.of_job(j, "abandoned"))
        self.attempts.end_lost(j.ref, reason)
        stats.lost += 1

    # ---- retention ----------------------------------------------------------------------------
    def _expire(self, now: float, stats: CycleStats) -> None:
        swept = self.retention.sweep(now)
        stats.expired, stats.purged, stats.retention = swept.expired, swept.purged, swept
