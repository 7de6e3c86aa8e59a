"""The extra executions of an attempt: a step of the reconciler's cycle.

A job whose attempt had a claim refused (another execution of it asked,
`JobStore.note_refused_claim`) is looked up by its marker (`Provider.find_all`) once the refused
runner has had `kill_grace_s` plus a poll interval to exit by itself, and every execution of it
that is not the job's own and still runs is stopped, logged and counted (`jobs.extra_stopped`,
`controlplane_extra_executions_total`). A job whose own execution ended while another of its
attempt runs follows that one (it holds the claim) instead of ending the attempt.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from controlplane.ops import logs, metrics
from controlplane.reconciling.cycle import ALIVE, CycleStats, call
from controlplane.settings import Settings
from controlplane.store import Store
from controlplane.store.leases import Fence, Fenced
from controlplane.store.rows import JobRow, TaskRow, WatchedJob
from controlplane_providers.base import Handle, LaunchSpec, PermanentProviderError, Provider

log = logging.getLogger("controlplane.reconciler")


class ExtraExecutions:
    """Stops (or follows) the other executions of watched jobs' attempts; runs in the cycle's
    thread, its writes fenced by the cycle's fence."""

    def __init__(self, store: Store, providers: dict[str, Provider[Any]], settings: Settings,
                 build_spec: Callable[[TaskRow, JobRow], LaunchSpec] | None,
                 handle: Callable[[Provider[Any], WatchedJob], Handle | None], fence: Callable[[], Fence | None],
                 stop_margin_s: float):
        self.store = store
        self.providers = providers
        self.settings = settings
        self.build_spec = build_spec  # an attempt's LaunchSpec, as the scheduler builds it (None: not looked up)
        self.handle = handle  # a watched job's decoded handle (None: unreadable, said by the reconciler)
        self.fence = fence  # the fence of the cycle under way
        self.stop_margin_s = stop_margin_s  # lease to spare before a stop is sent
        # Jobs with refused claims not yet looked into, by job id: (refused claims, when this
        # process first saw that many); and those seen so in the cycle under way.
        self._since: dict[str, tuple[int, float]] = {}
        self._since_now: dict[str, tuple[int, float]] = {}

    def begin_cycle(self) -> None:
        self._since_now = {}

    def end_cycle(self) -> None:
        """Forget the jobs this cycle did not see with refused claims to look into."""
        self._since = self._since_now

    def look(self, jobs: list[WatchedJob], now: float, stats: CycleStats) -> None:
        """Jobs with refused claims not looked into yet: each looked into once the refused runner
        has had the time to exit by itself (an execution that ends on its own is not stopped, and
        keeps the exit status that says why it ended)."""
        for j in jobs:
            if j.extra_claims > j.extra_checked:
                seen = self._since.get(j.job_id)
                since = seen[1] if seen is not None and seen[0] == j.extra_claims else now  # a new refusal: a new grace
                self._since_now[j.job_id] = (j.extra_claims, since)
                provider = self.providers.get(j.provider)
                grace = self.settings.kill_grace_s + (provider.poll_interval_s if provider is not None else 0.0)
                if now - since >= grace and self._stop(j, stats):
                    del self._since_now[j.job_id]

    def _stop(self, j: WatchedJob, stats: CycleStats) -> bool:
        """Another execution of the job's attempt asked for its claim (and was refused): stop
        every execution of the attempt the provider has, other than the job's own, that still
        runs, unless the job's own ended while its attempt is current (it may be the execution that
        was refused: `follow_holder`). A provider error leaves it for the next cycle; a stop is sent
        only while the lease has `stop_margin_s` to spare; what was done is recorded fenced. True
        once recorded."""
        looked = self._lookable(j)
        if looked is None:
            return False
        provider, own = looked
        try:
            others = self._other_executions(j, provider, own)
            *statuses, own_status = call(provider, "poll", [*others, own])
        except PermanentProviderError as e:  # (the tool left the catalog): nothing to look up by
            log.warning("the executions of %s cannot be looked up: %s", j.job_name, e,
                        extra=logs.of_job(j, "extra_lookup_failed"))
            others, statuses, own_status = [], [], None
        except Exception as e:  # noqa: BLE001 - looked into again next cycle
            log.warning("looking up the executions of %s failed: %s", j.job_name, e,
                        extra=logs.of_job(j, "extra_lookup_failed"))
            return False
        if not j.draining and own_status is not None and own_status.phase not in ALIVE:
            return False  # the job's own execution may be the one refused: the holder is followed, not stopped
        running = [h for h, st in zip(others, statuses, strict=False) if st.phase in ALIVE]
        fence = self.fence()
        if running and fence is not None and not self.store.jobs.leases.holds(fence, self.stop_margin_s):
            raise Fenced("the lease has too little time left to stop an extra execution")
        for h in running:
            try:
                call(provider, "cancel", h, "an extra execution of the attempt")
            except Exception as e:  # noqa: BLE001 - found and stopped again next cycle
                log.warning("stopping an extra execution of %s failed: %s", j.job_name, e,
                            extra=logs.of_job(j, "extra_stop_failed"))
                return False
            stats.provider_calls[f"{provider.name}.cancel"] += 1
            log.warning("stopped an extra execution of task %s attempt %d (%s, %s)", j.task_id, j.attempt,
                        provider.name, j.job_name, extra=logs.of_job(j, "extra_stopped"))
        self.store.jobs.extra_checked(j.job_id, j.extra_claims, len(running), fence)
        stats.extra_stopped += len(running)
        metrics.extra_executions(provider.name, "stopped", len(running))
        return True

    def follow_holder(self, j: WatchedJob, stats: CycleStats) -> bool:
        """The job's execution ended, and its attempt had a claim refused: the execution that was
        refused may be this one, racing a late launch that claimed first. Then an execution of the
        attempt still runs (the claim's holder; a refused one exits at once): the job follows the
        newest such execution instead of ending the attempt. False: none runs (or none can be
        looked up now), and the job ends as its provider says."""
        looked = self._lookable(j)
        if looked is None:
            return False
        provider, own = looked
        try:
            others = self._other_executions(j, provider, own)
            statuses = call(provider, "poll", others) if others else []
        except Exception as e:  # noqa: BLE001 - the job ends as its provider says
            log.warning("looking up the other executions of %s failed: %s", j.job_name, e,
                        extra=logs.of_job(j, "extra_lookup_failed"))
            return False
        running = [h for h, st in zip(others, statuses, strict=False) if st.phase in ALIVE]
        if not running or not self.store.jobs.follow(j.job_id, running[0].encode(), self.fence()):
            return False
        stats.provider_calls[f"{provider.name}.find_all"] += 1
        log.warning("job %s ended refused its claim; following the execution of task %s attempt %d that holds it",
                    j.job_name, j.task_id, j.attempt, extra=logs.of_job(j, "followed"))
        return True

    def _lookable(self, j: WatchedJob) -> tuple[Provider[Any], Handle] | None:
        """The job's provider and own handle, when its attempt's executions can be looked up."""
        provider = self.providers.get(j.provider)
        own = self.handle(provider, j) if provider is not None and j.handle_json else None
        if provider is None or own is None or self.build_spec is None:
            return None
        return provider, own

    def _other_executions(self, j: WatchedJob, provider: Provider[Any], own: Handle) -> list[Handle]:
        """The attempt's executions other than the job's own (`find_all`; raises what it raises)."""
        spec = self._spec_of(j)
        found = [] if spec is None else call(provider, "find_all", spec)
        return [h for h in found if not provider.same_job(h, own)]

    def _spec_of(self, j: WatchedJob) -> LaunchSpec | None:
        """The job's LaunchSpec as the scheduler built it (for a draining job, of its attempt)."""
        assert self.build_spec is not None
        task, job = self.store.tasks.get(j.task_id), self.store.jobs.get(j.ref)
        if task is None or job is None:
            return None
        if task.attempt != j.attempt:
            task = dataclasses.replace(task, attempt=j.attempt)
        return self.build_spec(task, job)
