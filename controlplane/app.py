"""The composition root: builds the control plane from settings and runs its loops.

`ControlPlane(settings)` opens the database (applying migrations), loads the catalog, opens the
object store and the providers the catalog names, and wires the task service, the attempts
(where runner events and job ends go), the scheduler and the reconciler. `async with cp.running():` starts:

* the internal HTTP listener for runner callbacks and artifact downloads, unless the MCP HTTP
  app already serves those routes (`cp.public_url` set before entering);
* the leader lease: several processes may share one database (stdio clients each start their
  own server), and only the lease holder schedules and reconciles;
* the scheduler and reconciler loops, woken early by submits, cancels and finished jobs;
* a loop that reads the operators' limits per caller and budgets again (`controlplane.limits`,
  `controlplane.budgets`);
* a loop that looks whether the catalog file changed and takes the new one whole, or keeps the
  old and says why (`reload_catalog`, docs/design/catalog-reload.md).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import anyio
import anyio.to_thread

from controlplane.attempts import Attempts
from controlplane.breakers import Breakers
from controlplane.catalog import Catalog, CatalogError, ensure_catalog
from controlplane.catalog_open import open_for, prepare
from controlplane.catalog_watch import CatalogStatus, CatalogWatch
from controlplane.estimates import Estimator
from controlplane.http.listener import Listener
from controlplane.http.routes import RouteDeps, routes
from controlplane.launch import build_launch_spec, mover_nonce
from controlplane.objectstore.claim import nonce_digest
from controlplane.objectstore.registry import ObjectStores
from controlplane.ops import metrics, traces
from controlplane.prices import PriceError, PriceTable, Pricing
from controlplane.progress import ProgressHub
from controlplane.reconciler import Reconciler
from controlplane.scheduler import Scheduler
from controlplane.service import TaskService
from controlplane.settings import Settings
from controlplane.store import Store
from controlplane.store.db import ChangeFeed, Database
from controlplane.store.leases import Fence, Fenced
from controlplane.store.rows import JobRow, TaskRow
from controlplane_providers.base import LaunchSpec, PermanentProviderError, Provider

log = logging.getLogger("controlplane")
SCHEDULER_MIN_GAP_S = 0.02
LEADER_LEASE = "leader"


class ControlPlane:
    def __init__(self, settings: Settings | None = None, *, catalog: Catalog | None = None,
                 providers: dict[str, Provider[Any]] | None = None, migrate: bool = True):
        self.settings = settings or Settings()
        self.settings.ensure_home()
        if self.settings.metrics:  # process-wide (ops/metrics.py)
            metrics.enable()
        else:
            metrics.disable()
        traces.configure(self.settings.otel)
        self.db = Database(self.settings.resolved_database_url)
        if migrate and self.settings.migrate_on_start:
            self.db.upgrade()
        elif migrate:
            self.db.require_current()
        self.store = Store(self.db, release_batch=self.settings.release_batch)
        # A catalog file is watched (and taken again when it changes) unless the catalog is given
        # inline or by the caller: those change only with a restart.
        self.catalog = catalog or (
            Catalog.parse(self.settings.catalog_json, source="CONTROLPLANE_CATALOG_JSON", fmt="yaml")
            if self.settings.catalog_json else ensure_catalog(self.settings.resolved_catalog_path))
        watched = catalog is None and not self.settings.catalog_json and self.settings.catalog_reload_s > 0
        self.catalog_watch = CatalogWatch(self.settings.resolved_catalog_path) if watched else None
        self.catalog_status = CatalogStatus(self.catalog.source, reloads=watched)
        # Called (on the event loop) after a new catalog was taken: the MCP server's tool list.
        self.catalog_listeners: list[Callable[[], Awaitable[None]]] = []
        self.secret_key = self.settings.secret_key()
        self.object_stores = ObjectStores(self.settings.resolved_object_store_url, self.secret_key)
        self.providers: dict[str, Provider[Any]] = dict(providers or {})
        self.providers.update(open_for(self.catalog, self.settings, self.object_stores, self.providers))
        self.estimator = Estimator(self.store.tasks.runtimes)
        try:  # prices of what attempts use: the defaults, and the operator's file over them
            self.pricing = Pricing(PriceTable.load(self.settings.resolved_prices_path), self.catalog, self.providers)
        except PriceError as e:
            raise CatalogError(str(e)) from None
        self.attempts = Attempts(self.store, self.catalog, self.object_stores, self.settings, self.pricing)
        self.service = TaskService(self.settings, self.store, self.catalog, self.object_stores, self.estimator, self.providers,
                                   wake=self.wake, pricing=self.pricing)
        st = self.settings
        self.breakers = Breakers(st.placement_breaker_failures, st.placement_breaker_window_s,
                                 st.placement_breaker_cooldown_s, st.placement_breaker_max_cooldown_s)
        self.scheduler = Scheduler(self.store, self.catalog, self.providers, self.object_stores, self.attempts,
                                   self.build_spec, fence=lambda: self.fence,
                                   launch_margin_s=self.settings.leader_lease_s / 3, breakers=self.breakers,
                                   pricing=self.pricing, wake=lambda: self.wake(reconciler=False))
        self.reconciler = Reconciler(self.store, self.providers, self.object_stores, self.attempts, self.settings,
                                     fence=lambda: self.fence, stop_margin_s=self.settings.leader_lease_s / 3,
                                     build_spec=self.build_spec,
                                     mover=lambda ref: nonce_digest(mover_nonce(self.secret_key, ref)))
        self.reconciler.health.on_error = self.breakers.provider_failed  # a failed poll counts at its sites
        self.service.limits.refresh()  # operators' limits per caller; read again by the loop below
        self.service.budgets.refresh()  # and their budgets, likewise
        self.hub = ProgressHub(self.store.tasks.get)  # pushes task changes to connected clients
        self.store.on_change = self.hub.on_change
        self.store.writer.class_scratch_mb = self.class_scratch_mb  # a released task's inputs checked
        self.store.writer.tool_max_input_mb = self.tool_max_input_mb
        self.change_feed: ChangeFeed | None = None  # set while running, on PostgreSQL
        self.public_url: str | None = self.settings.public_url
        self.serves_http_routes = False  # True when the MCP HTTP app carries the runner/download routes
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self.is_leader = False
        self.fence: Fence | None = None  # the leader lease's fence while this process leads
        self._lease_until = 0.0  # (monotonic) when the lease this process holds runs out
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sched_wake: anyio.Event | None = None
        self._recon_wake: anyio.Event | None = None
        self._running = 0

    # ---- the catalog ---------------------------------------------------------------------------
    async def reload_catalog(self) -> bool:
        """Take the catalog file again if it changed: validated off to the side, then swapped in
        whole (True). A file with problems leaves the catalog as it was: every problem is logged
        and kept in `catalog_status` until the file changes again."""
        watch = self.catalog_watch
        if watch is None:
            return False
        text = await anyio.to_thread.run_sync(watch.changed)
        if text is None:
            return False
        try:
            new, opened = await anyio.to_thread.run_sync(prepare, text, self.settings, self.object_stores, self.providers)
        except CatalogError as e:
            self.catalog_status = replace(self.catalog_status, refused_at=time.time(), problems=e.problems)
            log.error("the catalog file changed, but the server keeps revision %d: %d problem(s)\n%s",
                      self.catalog_status.revision, len(e.problems), "\n".join(e.problems))
            return False
        self.providers.update(opened)
        self.catalog.adopt(new)
        self.estimator.forget()
        self.catalog_status = CatalogStatus(new.source, revision=self.catalog_status.revision + 1, reloads=True)
        log.info("catalog revision %d taken from %s: tools %s", self.catalog_status.revision, new.source,
                 ", ".join(sorted(new.tools)))
        for listener in list(self.catalog_listeners):
            try:
                await listener()
            except Exception:  # noqa: BLE001
                log.exception("a listener of catalog changes failed")
        self._set_wake()
        return True

    # ---- wiring -------------------------------------------------------------------------------
    @property
    def callback_url(self) -> str | None:
        return f"{self.public_url.rstrip('/')}/runner/v1" if self.public_url else None

    def class_scratch_mb(self, name: str) -> int | None:
        """The scratch_mb cap of a resource class in the catalog as it is now (None: no cap)."""
        rc = self.catalog.resource_classes.get(name)
        return rc.scratch_mb if rc is not None else None

    def tool_max_input_mb(self, name: str) -> int | None:
        """The largest input file (MiB) a tool of the catalog as it is now takes (None: no such tool)."""
        tool = self.catalog.tools.get(name)
        return tool.max_input_file_mb if tool is not None else None

    def build_spec(self, task: TaskRow, job: JobRow) -> LaunchSpec:
        """The task's job as its tool was when the task was admitted, at its job's placement
        (PermanentProviderError when this process never knew that tool: removed from the catalog
        before a restart)."""
        python, store_url = self.providers[job.provider].python, self.object_stores.get(task.store_url).url
        try:
            return build_launch_spec(task, job, self.catalog, self.settings, secret_key=self.secret_key,
                                     callback_url=self.callback_url, store_url=store_url, python=python)
        except LookupError as e:
            raise PermanentProviderError(str(e)) from None

    def wake(self, *, scheduler: bool = True, reconciler: bool = True, queued_in: str | None = None) -> None:
        """Run the scheduler and/or the reconciler soon (callable from any thread). `queued_in`: a
        task was queued in this class; if its slots were all busy at the scheduler's last look,
        the task waits for one to free, which wakes the scheduler itself (`Scheduler.full`), so a
        stream of submits into a full class does not tick a scheduler that could claim nothing."""
        if queued_in is not None and queued_in in self.scheduler.full:
            scheduler = False
            if not reconciler:
                return
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            here = asyncio.get_running_loop() is loop
        except RuntimeError:
            here = False
        if here:  # (every submit on the loop: no write to the loop's wake-up pipe and no extra turn)
            self._set_wake(scheduler, reconciler)
        else:
            loop.call_soon_threadsafe(self._set_wake, scheduler, reconciler)

    def _set_wake(self, scheduler: bool = True, reconciler: bool = True) -> None:
        for ev, wanted in ((self._sched_wake, scheduler), (self._recon_wake, reconciler)):
            if wanted and ev is not None:
                ev.set()

    # ---- running ------------------------------------------------------------------------------
    @asynccontextmanager
    async def running(self) -> AsyncIterator[ControlPlane]:
        self._running += 1
        if self._running > 1:  # already running (nested lifespans share one runtime)
            try:
                yield self
            finally:
                self._running -= 1
            return
        self._loop = asyncio.get_running_loop()
        self.hub.attach(self._loop)
        self._sched_wake, self._recon_wake = anyio.Event(), anyio.Event()
        # Everything built so far (SDKs, schemas, the app) lives as long as the process: keep it
        # out of the collector's full passes, which otherwise pause the server now and then.
        gc.collect()
        gc.freeze()
        # The loops run in their own task so that whichever task enters and leaves this context
        # (lifespans are not always left by the task that entered them) can stop them.
        internal = None if self.serves_http_routes else self._bind_internal_http()
        self._write_endpoint_file()
        background = asyncio.create_task(self._background())
        listener_task = asyncio.create_task(internal[0].serve(internal[1])) if internal else None
        try:
            yield self
        finally:
            self._running -= 1
            with anyio.CancelScope(shield=True):
                if internal is not None and listener_task is not None:
                    # A graceful stop: a cancelled uvicorn leaves its socket registered with the
                    # event loop, and a later listener reusing the fd number would never answer.
                    internal[0].stop()
                    with anyio.move_on_after(5):
                        await asyncio.shield(listener_task)
                    listener_task.cancel()
                background.cancel()
                for t in (background, listener_task):
                    if t is None:
                        continue
                    try:
                        await t
                    except asyncio.CancelledError:
                        pass
                if self.is_leader:
                    await anyio.to_thread.run_sync(self.store.leases.release, LEADER_LEASE, self.holder)
                    self.is_leader = False
            self.hub.attach(None)
            self._loop = None

    async def _background(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._leader_loop)
            tg.start_soon(self._scheduler_loop)
            tg.start_soon(self._reconciler_loop)
            tg.start_soon(self._limits_loop)
            if self.catalog_watch is not None:
                tg.start_soon(self._catalog_loop)
            # Changes committed by other replicas (PostgreSQL's LISTEN/NOTIFY); None on SQLite.
            # This process's own changes come back through it too: the hub then reads a watched
            # task once more (bursts coalesce), a cost kept for the sake of one path that does not
            # depend on telling our own notifications from others'.
            self.change_feed = self.db.change_feed(self.hub.on_change, self.hub.refresh)
            if self.change_feed is not None:
                tg.start_soon(self.change_feed.run)

    def _bind_internal_http(self) -> tuple[Listener, Any]:
        """Bind the runner/download listener now (so its URL is known), serve it later."""
        from starlette.applications import Starlette

        listener = Listener(self.settings.internal_host, self.settings.internal_port)
        if self.public_url is None:
            self.public_url = listener.url
        self.object_stores.set_base_url(self.public_url)
        self.service.same_host = True  # links served only while this process lives: add file URLs
        return listener, Starlette(routes=routes(self.route_deps()))

    def route_deps(self) -> RouteDeps:
        """What the runner and download routes use."""
        return RouteDeps(secret_key=self.secret_key, store=self.store, attempts=self.attempts, object_stores=self.object_stores,
                         wake=self.wake, grant_ttl_s=self.settings.grant_url_ttl_s,
                         grant_run_margin_s=self.settings.grant_run_margin_s)

    def set_public_url(self, url: str) -> None:
        """The MCP HTTP app serves the runner and download routes at `url`."""
        self.public_url = url
        self.serves_http_routes = True
        self.object_stores.set_base_url(url)

    def _write_endpoint_file(self) -> None:
        if not self.callback_url:
            return
        path = self.settings.endpoint_file
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"callback_url": self.callback_url, "pid": os.getpid()}))
        os.replace(tmp, path)

    # ---- loops --------------------------------------------------------------------------------
    def leads(self) -> bool:
        """This process holds the leader lease, by its own clock too: a process paused past its
        lease (SIGSTOP, a frozen VM) wakes with `is_leader` still set and its loops due at once;
        the monotonic clock ran on meanwhile, so they stand down before the lease is asked again.
        (The fence in the store refuses what slips past this: `store.leases`.)"""
        return self.is_leader and time.monotonic() < self._lease_until

    async def _leader_loop(self) -> None:
        lease = self.settings.leader_lease_s
        while True:
            try:
                was = self.is_leader
                asked = time.monotonic()
                epoch = await anyio.to_thread.run_sync(self.store.leases.acquire, LEADER_LEASE, self.holder, lease)
                self.is_leader = epoch is not None
                self.fence = Fence(LEADER_LEASE, self.holder, epoch) if epoch is not None else None
                self._lease_until = asked + lease if epoch is not None else 0.0
                if self.is_leader and not was:
                    log.info("this process leads scheduling and reconciling (%s, epoch %s)", self.holder, epoch)
                    self.reconciler.started_at = time.time()
                    self._set_wake()
            except Exception:  # noqa: BLE001
                log.exception("leader lease renewal failed")
                self.is_leader = False
                self.fence = None
            await anyio.sleep(lease / 3)

    async def _wait(self, which: str, interval: float) -> None:
        ev = self._sched_wake if which == "sched" else self._recon_wake
        assert ev is not None
        with anyio.move_on_after(interval):
            await ev.wait()
        if which == "sched":
            self._sched_wake = anyio.Event()
        else:
            self._recon_wake = anyio.Event()

    async def _scheduler_loop(self) -> None:
        while True:
            await self._wait("sched", self.settings.scheduler_interval_s)
            if not self.leads():
                continue
            try:
                await self.scheduler.tick()
            except Exception:  # noqa: BLE001
                log.exception("scheduler tick failed")
            # Every submit wakes the scheduler; under a stream of submits the wakes that arrive
            # within this gap share the next tick (a tick costs a few reads whatever it finds).
            await anyio.sleep(SCHEDULER_MIN_GAP_S)

    async def _limits_loop(self) -> None:
        """Operators change limits per caller and budgets in the database (`controlplane limits`,
        `controlplane budgets`): every replica reads them again this often, so that no call has to."""
        while True:
            await anyio.sleep(self.settings.limits_refresh_s)
            try:
                await anyio.to_thread.run_sync(self.service.limits.refresh)
                await anyio.to_thread.run_sync(self.service.budgets.refresh)
            except Exception:  # noqa: BLE001
                log.exception("reading the limits per caller and the budgets failed")

    async def _catalog_loop(self) -> None:
        while True:
            await anyio.sleep(self.settings.catalog_reload_s)
            try:
                await self.reload_catalog()
            except Exception:  # noqa: BLE001
                log.exception("looking at the catalog file failed")

    async def _reconciler_loop(self) -> None:
        while True:
            await self._wait("recon", self.settings.reconcile_interval_s)
            try:
                if self.leads():
                    stats = await self.reconciler.cycle()
                    if (stats.finished or stats.lost or stats.expired or stats.released) and self._sched_wake is not None:
                        self._sched_wake.set()
                    if stats.releases_left:  # children still to settle: the next cycle at once
                        self._set_wake(scheduler=False)
                else:
                    await anyio.to_thread.run_sync(self.attempts.flush_beats)
            except Fenced as e:  # no longer the leader: the cycle wrote nothing more
                log.warning("reconcile cycle left to the new leader: %s", e)
            except Exception:  # noqa: BLE001
                log.exception("reconcile cycle failed")

