"""The scheduler: moves queued tasks into free slots and launches their jobs.

Per resource class, `store.jobs.claim_for_launch` takes the next queued tasks (priority first, FIFO
within a priority) into free slots and records a launch intent for each, all in one
transaction. Only then is the provider called. An intent this process did not just create
(a restart, or a launch attempt that failed in an unknown way) is first looked up with
`provider.find(job_name)`, so a job is never launched twice for one attempt.

Each claim chooses the placement its attempt runs on (`controlplane.placement`), kept on its job:
the launch goes there. A placement that refuses a launch for capacity (`CapacityProviderError`)
is retried with backoff like any transient error when it is the tool's only one; when the tool
has others, the attempt ends and the task is queued again for the next attempt to run elsewhere
(`Attempts.end_elsewhere`), spending no retry budget. Every launch's outcome feeds the breaker of
its placement's site (`controlplane.breakers`), which the choice reads.

Across replicas, the leader's claims, its last look before each provider call and its record of
each launch are fenced by its lease epoch (`store.leases`, which says why claims alone are not
enough): a leader paused past its lease wakes to find its writes refused and launches nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from controlplane import blocking
from controlplane.attempts import Attempts
from controlplane.breakers import Breakers
from controlplane.catalog import Catalog
from controlplane.launch import with_file_inputs
from controlplane.objectstore.base import input_files_key, inputs_key
from controlplane.objectstore.registry import ObjectStores
from controlplane.ops import logs, metrics, traces
from controlplane.outcomes import cancelled_error, refusals_in_a_row
from controlplane.placement import NO_CAPACITY, Placer
from controlplane.prices import Pricing
from controlplane.states import JobState, TaskState
from controlplane.store import Store, inputs
from controlplane.store.leases import Fence, Fenced
from controlplane.store.rows import JobRow, TaskRow
from controlplane_providers.base import CapacityProviderError, Handle, LaunchSpec, PermanentProviderError, Provider


class JobNotFoundYet(Exception):
    """A job that reported from its runner is not listed by its provider yet: looked for again."""


log = logging.getLogger("controlplane.scheduler")

# What a move's reason says of a launch its placement refused for capacity, before the provider's words.
REFUSED = "the launch was refused for want of capacity or quota"
LAUNCH_CONCURRENCY = 8
# Queued tasks read past a class's free slots when a task may be left queued by its placements
# (all full or open): those behind it of other tools still get the slots.
CLAIM_LOOKAHEAD = 32


class Scheduler:
    def __init__(self, store: Store, catalog: Catalog, providers: dict[str, Provider[Any]], object_stores: ObjectStores,
                 attempts: Attempts, build_spec: Callable[[TaskRow, JobRow], LaunchSpec],
                 fence: Callable[[], Fence | None] = lambda: None, launch_margin_s: float = 0.0,
                 breakers: Breakers | None = None, pricing: Pricing | None = None,
                 wake: Callable[[], None] = lambda: None):
        self.store = store
        self.fence = fence  # the leader's lease fence now (None: unfenced, a single process)
        self.launch_margin_s = launch_margin_s  # lease to spare before a provider call
        self.catalog = catalog
        self.breakers = breakers or Breakers()
        self.wake = wake  # the next tick soon: a task moved elsewhere is queued again at once
        self.placer = Placer(catalog, self.breakers, providers, pricing)
        self.attempts = attempts
        self.providers = providers
        self.object_stores = object_stores
        self.build_spec = build_spec
        self._fresh: set[str] = set()  # intents this process created and has not tried yet
        self._inflight: set[str] = set()
        self._retry_at: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._limiter = anyio.CapacityLimiter(LAUNCH_CONCURRENCY)
        # The classes whose every slot was busy at the last tick: a submit into one of them need
        # not wake the scheduler (`ControlPlane.wake`); what frees a slot wakes it (a runner's
        # last callback, a reconciler cycle that ended attempts), and so does its interval.
        self.full: set[str] = set()
        # The classes whose last claim, with tasks ready, found them none a placement took (all
        # full or open): their next ticks read whether one would now before claiming.
        self._stalled: set[str] = set()
        self.ticks = 0

    async def tick(self) -> int:
        """Fill free slots and launch pending intents. Returns the number of launches tried."""
        self.ticks += 1
        for rc in self.catalog.queues():  # a class a reload removed still runs its tasks
            work = await blocking.call(self.store.jobs.has_work, rc.name, rc.max_concurrency)
            if work == "full":
                self.full.add(rc.name)
            else:
                self.full.discard(rc.name)
            if work != "ready":
                continue  # slots full or nothing ready: no write transaction
            skips = self.placer.may_skip(rc.name)
            lookahead = CLAIM_LOOKAHEAD if skips else 0
            if rc.name in self._stalled and not await blocking.call(
                    self.store.jobs.could_claim, rc.name, rc.max_concurrency, self.placer.peek, lookahead):
                continue  # still no placement with room or admitting: no write transaction
            try:
                claimed = await anyio.to_thread.run_sync(
                    self.store.jobs.claim_for_launch, rc.name, rc.max_concurrency, None, self.fence(), self.placer,
                    lookahead)
            except Fenced as e:
                log.warning("claims left to the new leader: %s", e, extra={"action": "fenced"})
                return 0
            if claimed or not skips:
                self._stalled.discard(rc.name)
            else:
                self._stalled.add(rc.name)
            self._fresh.update(job.job_id for _task, job in claimed)
            now = time.time()
            for task, _job in claimed:  # how long each waited for its slot
                metrics.QUEUE_WAIT.labels(rc.name).observe(max(0.0, now - max(task.submitted_at, task.not_before)))
                traces.queued(task, now)
        pending = await blocking.call(self.store.jobs.launch_intents)
        now = time.monotonic()
        todo = [j for j in pending if j.job_id not in self._inflight and self._retry_at.get(j.job_id, 0) <= now]
        if todo:
            async with anyio.create_task_group() as tg:
                for job in todo:
                    self._inflight.add(job.job_id)
                    tg.start_soon(self._launch_guarded, job)
        return len(todo)

    async def _launch_guarded(self, job: JobRow) -> None:
        jid = job.job_id
        try:
            async with self._limiter:
                await self._launch(job)
            self._forget(jid)
        except Fenced as e:  # no longer the leader: leave the intent to the one who is
            log.warning("launch of %s left to the new leader: %s", job.job_name, e, extra=logs.of_job(job, "fenced"))
            self._forget(jid)
        except PermanentProviderError as e:
            log.warning("launch of %s refused: %s", job.job_name, e, extra=logs.of_job(job, "launch_refused"))
            self._forget(jid)  # the attempt ends: nothing will retry it
            await anyio.to_thread.run_sync(self.attempts.end_unlaunched, job.ref,
                                           f"the provider refused to start the job: {e}")
        except CapacityProviderError as e:
            try:
                moved = await anyio.to_thread.run_sync(self._elsewhere, job, f"{REFUSED}: {e}")
            except Exception:  # noqa: BLE001 - the store: the launch is tried again, and refused again
                moved = False
            if moved:
                log.warning("launch of %s refused for capacity on %s, next attempt elsewhere: %s", job.job_name,
                            job.provider, e, extra=logs.of_job(job, "moved"))
                self._forget(jid)
                self.wake()
            else:  # the tool's only placement: wait for room there, as for any transient error
                self._back_off(job, e)
        except Exception as e:  # noqa: BLE001 - transient or unknown: retry with backoff, find first
            self._back_off(job, e)
        finally:
            self._inflight.discard(jid)

    def _back_off(self, job: JobRow, e: Exception) -> None:
        """Try the launch again later (the next try looks the job up first), sooner the fewer tries."""
        jid = job.job_id
        n = self._failures.get(jid, 0) + 1
        self._failures[jid] = n
        delay = min(60.0, 0.5 * 2 ** (n - 1))
        self._retry_at[jid] = time.monotonic() + delay
        log.warning("launch of %s failed (try %d, next in %.1fs): %s", job.job_name, n, delay, e,
                    extra=logs.of_job(job, "launch_failed", tries=n))

    def _elsewhere(self, job: JobRow, reason: str) -> bool:
        """The job's placement refused it for capacity: when its tool has other placements, end
        the attempt so that the next runs elsewhere (True); False when it has no other."""
        task = self.store.tasks.get(job.task_id)
        placements = self.placer.placements(task) if task is not None else ()
        if len(placements) < 2:
            return False
        earlier = [j for j in self.store.jobs.of_task(job.task_id) if j.attempt < job.attempt]
        self.attempts.end_elsewhere(job.ref, NO_CAPACITY, reason, refusals=refusals_in_a_row(earlier, NO_CAPACITY),
                                    placements=len(placements), why="refused")
        return True

    def _forget(self, jid: str) -> None:
        """Drop what a launch's retries kept (its backoff), once the launch is done either way."""
        self._retry_at.pop(jid, None)
        self._failures.pop(jid, None)

    async def _launch(self, job: JobRow) -> None:
        jid = job.job_id
        task = await anyio.to_thread.run_sync(self.store.tasks.get, job.task_id)
        if task is None or task.attempt != job.attempt or task.state not in (
            TaskState.SCHEDULED, TaskState.RUNNING, TaskState.CANCEL_REQUESTED, TaskState.CANCELLING
        ):
            await anyio.to_thread.run_sync(self.store.jobs.move, jid, JobState.DROPPED)
            return
        provider = self.providers[job.provider]
        spec = self.build_spec(task, job)
        handle: Handle | None = None
        fresh = jid in self._fresh
        self._fresh.discard(jid)
        if not fresh:  # a launch that may have happened is looked up before it is repeated
            handle = await anyio.to_thread.run_sync(metrics.provider_call, provider.name, "find", provider.find, spec)
        if task.state == TaskState.RUNNING:
            # Its runner reported before the launch was recorded: a launch whose answer was lost
            # (or a leader that died before recording it) started the job. It is watched from now
            # on; dropped, its end would go unseen and the task would stay running to its timeout.
            if handle is None:
                raise JobNotFoundYet(f"{job.job_name} reported that it runs, but {provider.name} does not list it yet")
            await anyio.to_thread.run_sync(self.store.jobs.record_launch, jid, handle.encode(), self.fence())
            return
        if task.state != TaskState.SCHEDULED:  # cancelled before its job started
            if handle is not None:
                await anyio.to_thread.run_sync(self.store.jobs.record_launch, jid, handle.encode())  # the reconciler stops it
            else:
                await anyio.to_thread.run_sync(self.store.jobs.drop_unlaunched, task.ref,
                                               cancelled_error(task.cancel_reason))
            return
        if handle is None:
            if await anyio.to_thread.run_sync(self._write_inputs, task):
                spec = with_file_inputs(spec)
            with traces.launching(task, provider.name, job.job_name):
                handle = await anyio.to_thread.run_sync(self._launch_if_leading, provider, spec)
        await anyio.to_thread.run_sync(self.store.jobs.record_launch, jid, handle.encode(), self.fence())
        log.info("launched %s (task %s attempt %d) on %s", job.job_name, job.task_id, job.attempt, job.provider,
                 extra=logs.of_job(job, "launch"))

    def _launch_if_leading(self, provider: Provider[Any], spec: LaunchSpec) -> Handle:
        """The last look at the lease and the provider call, back to back in one thread. A pause
        between the two is the window no fence closes (`store.leases`); as two calls to worker
        threads, a launch also waited there for a thread (up to LAUNCH_CONCURRENCY launches at
        once), and a leader stopped then launched on waking what its successor had launched."""
        fence = self.fence()
        if fence is not None and not self.store.leases.holds(fence, self.launch_margin_s):
            raise Fenced(f"lease epoch {fence.epoch} no longer held with {self.launch_margin_s}s to spare")
        started = time.perf_counter()
        site = self.placer.site(provider.name, spec.options)
        try:
            handle: Handle = metrics.provider_call(provider.name, "launch", provider.launch, spec)
        except PermanentProviderError:
            raise  # the request's fault, not the site's
        except Exception:
            self.breakers.failed(site)  # refused for capacity, or the provider's API failing
            raise
        self.breakers.succeeded(site)
        metrics.LAUNCH.labels(provider.name).observe(time.perf_counter() - started)
        return handle

    def _write_inputs(self, task: TaskRow) -> bool:
        """The attempt's inputs and, when they refer to files, where each file is (what the runner
        materializes before the tool starts). True: they refer to files."""
        objects = self.object_stores.get(task.store_url)
        objects.put_bytes(inputs_key(task.ref), task.inputs_json.encode(), content_type="application/json",
                          overwrite=True)
        files = {r.field: {"kind": r.kind, "store_url": r.store_url or (self.object_stores.default_url
                                                                        if r.kind != "url" else ""),
                           "key": r.storage_key, "size_bytes": r.size_bytes, "sha256": r.sha256}
                 for r in inputs.of(self.store.db, task.task_id)}
        if files:
            objects.put_bytes(input_files_key(task.ref), json.dumps(files).encode(),
                              content_type="application/json", overwrite=True)
        return bool(files)
