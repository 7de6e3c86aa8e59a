"""The task store: every read and write of task metadata, as named, transactional operations,
split by aggregate. Persistence without policy: it enforces the state machines
(`controlplane.states`) on every write and writes each transition's task_event in the same
transaction; it never decides an outcome and never touches providers, object stores or the
network.

    store.tasks      submit, reads, pages, cancel requests, stops     (tasks.py)
                     what a submit's guards may count                 (counts.py)
                     the tasks a task waits for (`after`)              (parents.py)
                     their release, a batch a transaction             (releases.py)
    store.jobs       launch intents, handles, watched jobs, secrets   (jobs.py)
    store.attempts   an attempt's logs, progress, start and end        (attempts.py)
    store.logs       log lines and the audit of events                 (logs.py)
    store.artifacts  artifact metadata                                 (artifacts.py)
    store.leases     leader leases                                     (leases.py)
    store.retention  expiry and purging                                (retention.py)
    store.callers    limits per caller, open streams                   (callers.py)
    store.usage      usage per attempt, its sums and reports, budgets  (usage.py)
    store.uploads    files callers bring                               (uploads.py)
    store.sweeps     sweeps: their shards written at once, aggregates,  (sweeps.py)
                     pages and stops

Statements live in `queries.py`, rows come back as the frozen types of `rows.py`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from controlplane.store.artifacts import ArtifactStore
from controlplane.store.attempts import AttemptStore, AttemptTx, StaleAttempt
from controlplane.store.callers import CallerStore
from controlplane.store.db import Database
from controlplane.store.jobs import JobStore
from controlplane.store.leases import Fence, LeaseStore
from controlplane.store.logs import LogStore
from controlplane.store.retention import RetentionStore
from controlplane.store.sweeps import SweepStore
from controlplane.store.tasks import NewTask, Submitted, TaskStore
from controlplane.store.uploads import UploadStore
from controlplane.store.usage import UsageStore
from controlplane.store.writer import Writer, _now

__all__ = ["AttemptTx", "NewTask", "StaleAttempt", "Store", "Submitted"]


class Store:
    def __init__(self, db: Database, clock: Callable[[], float] = _now, release_batch: int = 500):
        self.db = db
        self.writer = Writer(db, clock, release_batch)
        self.tasks = TaskStore(self.writer)
        self.jobs = JobStore(self.writer)
        self.attempts = AttemptStore(self.writer)
        self.logs = LogStore(db)
        self.artifacts = ArtifactStore(db)
        self.leases = LeaseStore(self.writer)
        self.retention = RetentionStore(self.writer)
        self.callers = CallerStore(self.writer)
        self.usage = UsageStore(self.writer)
        self.uploads = UploadStore(self.writer)
        self.sweeps = SweepStore(self.writer)
        self.writer.on_shard_end = self.sweeps.shard_ended

    @contextmanager
    def fenced(self, fence: Fence | None) -> Iterator[None]:
        """Every write transaction this thread opens inside first checks that `fence` still
        holds (`LeaseStore.check`; raises `leases.Fenced`, the transaction writes nothing).
        None: unfenced (a single process)."""
        if fence is None:
            yield
            return
        with self.writer.guarded(lambda c: self.leases.check(c, fence)):
            yield

    @property
    def on_change(self) -> Callable[[str], None] | None:
        """Called with a task id after each committed change to the task (the progress hub)."""
        return self.writer.on_change

    @on_change.setter
    def on_change(self, fn: Callable[[str], None] | None) -> None:
        self.writer.on_change = fn
