"""The tables (sqlmodel): tasks, task_tags, task_events, task_logs, artifacts, jobs, leases, queue_depth,
caller_limits, caller_streams, attempt_usage, budgets, task_parents, task_inputs, sweeps.

Times are UNIX epoch seconds (float) so that every engine stores and compares them alike.
JSON columns are text holding JSON. The schema itself is owned by the alembic migrations in
`migrations/versions`; these classes must stay in step with them (a test checks it).
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, String, Table, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

# The tasks in ix_tasks_state_expires: the ended ones. The queries that read it (`queries.
# DUE_FOR_EXPIRY`, `DUE_FOR_PURGE`) compare expires_at, which both engines take as implying it.
EXPIRES_WHERE = "expires_at IS NOT NULL"
# The tasks in the sweep indexes: a sweep's shards (a query naming a sweep implies it).
IN_SWEEP = "sweep_id IS NOT NULL"
# The tasks in ix_tasks_owner_plain: those of no sweep.
PLAIN = "sweep_id IS NULL"
# The sweeps in ix_sweeps_stop_left: stopped, with shards that may still be left to end.
STOP_LEFT = "stopped_at IS NOT NULL AND stop_done_at IS NULL"


class Task(SQLModel, table=True):
    __tablename__ = "tasks"
    __table_args__ = (
        UniqueConstraint("owner", "tool_name", "idempotency_key", name="uq_tasks_idempotency"),
        # Scheduler: next queued task of a class, priority first then FIFO.
        Index("ix_tasks_dispatch", "resource_class", "state", text("priority DESC"), "pk"),
        # list_tasks: newest first per owner (keyset on submitted_at, pk), optionally by state or tool.
        Index("ix_tasks_owner", "owner", "submitted_at", "pk"),
        Index("ix_tasks_owner_state", "owner", "state", "submitted_at", "pk"),
        Index("ix_tasks_owner_tool", "owner", "tool_name", "submitted_at", "pk"),
        # A list that folds sweeps (`store.folded`): the owner's tasks of no sweep (no shard in
        # them), optionally by state or tool.
        Index("ix_tasks_owner_plain", "owner", "submitted_at", "pk", sqlite_where=text(PLAIN),
              postgresql_where=text(PLAIN)),
        Index("ix_tasks_owner_state_plain", "owner", "state", "submitted_at", "pk", sqlite_where=text(PLAIN),
              postgresql_where=text(PLAIN)),
        Index("ix_tasks_owner_tool_plain", "owner", "tool_name", "submitted_at", "pk", sqlite_where=text(PLAIN),
              postgresql_where=text(PLAIN)),
        # Sweeps: timeouts and expiry (only ended tasks have an expires_at: migration 0014).
        Index("ix_tasks_state_timeout", "state", "timeout_at"),
        Index("ix_tasks_state_expires", "state", "expires_at", sqlite_where=text(EXPIRES_WHERE),
              postgresql_where=text(EXPIRES_WHERE)),
        # Runtime estimates: a tool's recent successful runs.
        Index("ix_tasks_tool_state", "tool_name", "state", "pk"),
        # A sweep's shards in shard order (its result's pages), and by state (its status's counts,
        # and a folded list's lowest shard in a state).
        Index("ix_tasks_sweep_shard", "sweep_id", "shard", unique=True, sqlite_where=text(IN_SWEEP),
              postgresql_where=text(IN_SWEEP)),
        Index("ix_tasks_sweep_state", "sweep_id", "state", "shard", sqlite_where=text(IN_SWEEP),
              postgresql_where=text(IN_SWEEP)),
    )

    pk: int | None = Field(default=None, primary_key=True)  # submission order (FIFO, cursors)
    task_id: str = Field(sa_column=Column(String(40), nullable=False, unique=True))
    owner: str = Field(sa_column=Column(String(200), nullable=False))
    tool_name: str = Field(sa_column=Column(String(128), nullable=False))
    inputs_json: str = Field(sa_column=Column(Text, nullable=False))
    input_size: float | None = None  # the catalog's size feature, for runtime estimates
    provider: str = Field(sa_column=Column(String(64), nullable=False))
    resource_class: str = Field(sa_column=Column(String(64), nullable=False))
    # The object store holding the task's inputs, results and artifacts ('' = the default one).
    store_url: str = Field(default="", sa_column=Column(Text, nullable=False, server_default=""))
    priority: int = 0
    ttl_s: int
    idempotency_key: str | None = Field(default=None, sa_column=Column(String(200)))
    tags_json: str = Field(default="[]", sa_column=Column(Text, nullable=False))
    resources_json: str = Field(default="{}", sa_column=Column(Text, nullable=False))
    max_runtime_s: int
    state: str = Field(sa_column=Column(String(20), nullable=False))
    attempt: int = 1
    max_attempts: int = 1
    not_before: float = 0.0  # a retried task waits for its backoff
    submitted_at: float
    scheduled_at: float | None = None
    started_at: float | None = None
    heartbeat_at: float | None = None
    updated_at: float
    completed_at: float | None = None
    expires_at: float | None = None
    timeout_at: float | None = None
    job_id: str | None = Field(default=None, sa_column=Column(String(40)))
    cancel_requested: bool = False
    cancel_reason: str | None = Field(default=None, sa_column=Column(String(500)))
    stop_reason: str | None = Field(default=None, sa_column=Column(String(20)))
    progress_json: str | None = Field(default=None, sa_column=Column(Text))
    result_json: str | None = Field(default=None, sa_column=Column(Text))
    error_json: str | None = Field(default=None, sa_column=Column(Text))
    metrics_json: str | None = Field(default=None, sa_column=Column(Text))
    estimate_s: float | None = None
    log_seq: int = 0  # highest log seq assigned
    log_first_seq: int = 1  # lowest log seq still stored (older lines were dropped by the cap)
    version: int = 1  # bumped on every write to the row
    # Retry budgets, counted apart: attempts the tool itself failed (against max_attempts) and
    # attempts lost, preempted or never launched (against max_recoveries).
    failures: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    recoveries: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    max_recoveries: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    # The team whose members may read the task (the submitter's, from its OAuth token), if any.
    team: str | None = Field(default=None, sa_column=Column(String(200)))
    # What the submit estimated the task would cost (`controlplane.prices`; None: unpriced), which
    # budgets count while the task has not ended.
    estimate_cost: float | None = None
    # The sweep the task is a shard of, and its 0-based index there (None: a task of its own).
    sweep_id: str | None = Field(default=None, sa_column=Column(String(40)))
    shard: int | None = None


class TaskTag(SQLModel, table=True):
    """A task's tags, with its owner and submission time so that list_tasks(tags_any=...) walks
    one index in page order instead of sorting every task that has the tag."""

    __tablename__ = "task_tags"
    __table_args__ = (Index("ix_task_tags_owner_tag", "owner", "tag", "submitted_at", "task_pk"),)

    task_pk: int = Field(primary_key=True)
    tag: str = Field(sa_column=Column(String(128), primary_key=True))
    owner: str = Field(sa_column=Column(String(200), nullable=False))
    submitted_at: float


class TaskEvent(SQLModel, table=True):
    """Append-only audit: every transition, retry, cancellation and job assignment."""

    __tablename__ = "task_events"
    __table_args__ = (Index("ix_task_events_task", "task_id", "pk"), Index("ix_task_events_ts", "ts"))

    pk: int | None = Field(default=None, primary_key=True)
    task_id: str = Field(sa_column=Column(String(40), nullable=False))
    ts: float
    kind: str = Field(sa_column=Column(String(32), nullable=False))
    from_state: str | None = Field(default=None, sa_column=Column(String(20)))
    to_state: str | None = Field(default=None, sa_column=Column(String(20)))
    attempt: int
    detail_json: str | None = Field(default=None, sa_column=Column(Text))


class TaskLog(SQLModel, table=True):
    __tablename__ = "task_logs"
    __table_args__ = {"sqlite_with_rowid": False}

    task_id: str = Field(sa_column=Column(String(40), primary_key=True))
    seq: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    attempt: int
    ts: float
    stream: str = Field(sa_column=Column(String(8), nullable=False))
    level: str = Field(sa_column=Column(String(8), nullable=False))
    message: str = Field(sa_column=Column(Text, nullable=False))


class Artifact(SQLModel, table=True):
    """Immutable artifact metadata; the bytes live in the object store under storage_key."""

    __tablename__ = "artifacts"
    __table_args__ = (
        UniqueConstraint("task_id", "attempt", "name", name="uq_artifacts_name"),
        Index("ix_artifacts_task", "task_id"),
    )

    artifact_id: str = Field(sa_column=Column(String(40), primary_key=True))
    task_id: str = Field(sa_column=Column(String(40), nullable=False))
    attempt: int
    name: str = Field(sa_column=Column(String(255), nullable=False))
    kind: str = Field(sa_column=Column(String(64), nullable=False))
    size_bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    sha256: str = Field(sa_column=Column(String(64), nullable=False))
    content_type: str = Field(sa_column=Column(String(128), nullable=False))
    store_url: str = Field(sa_column=Column(Text, nullable=False))
    storage_key: str = Field(sa_column=Column(Text, nullable=False))
    created_at: float


# The jobs the reconciler watches (`states.WATCHED`), word for word as the partial index
# ix_jobs_watched and the query that walks it (`job_queries.WATCHED_PAGE`) both say it: SQLite uses a
# partial index only for a query whose WHERE repeats the index's own.
WATCHED_JOBS_WHERE = "state IN ('abandoned', 'active', 'draining')"


class Job(SQLModel, table=True):
    """A provider job: one attempt of one task (docs/design/task-model.md).

    A row is written *before* the provider is asked to launch (state `launching`, the launch
    intent); the provider's handle is filled in once it answers. `job_name` is derived from
    (task_id, attempt) so that a restarted control plane can find a job it launched but whose
    handle it never recorded.
    """

    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("task_id", "attempt", name="uq_jobs_attempt"),
        Index("ix_jobs_state", "state"),
        # The reconciler walks the watched jobs in pages, in (created_at, job_id) order (about
        # the order they were written in), from a cursor; the index holds only those jobs.
        Index("ix_jobs_watched", "created_at", "job_id", sqlite_where=text(WATCHED_JOBS_WHERE),
              postgresql_where=text(WATCHED_JOBS_WHERE)),
    )

    job_id: str = Field(sa_column=Column(String(40), primary_key=True))
    task_id: str = Field(sa_column=Column(String(40), nullable=False))
    attempt: int
    provider: str = Field(sa_column=Column(String(64), nullable=False))
    resource_class: str = Field(sa_column=Column(String(64), nullable=False))
    job_name: str = Field(sa_column=Column(String(128), nullable=False, unique=True))
    # controlplane.states.JobState: launching -> active -> done, and the moves its table allows
    state: str = Field(sa_column=Column(String(16), nullable=False))
    handle_json: str | None = Field(default=None, sa_column=Column(Text))
    created_at: float
    launched_at: float | None = None
    seen_at: float | None = None  # last sign of life (callback or poll)
    finished_at: float | None = None
    stop_requested_at: float | None = None  # when we first asked the provider to stop it
    stop_sent_at: float | None = None  # when provider.cancel was last called
    event_seq: int = 0  # highest runner event seq ingested
    provider_status: str | None = Field(default=None, sa_column=Column(String(32)))
    provider_reason: str | None = Field(default=None, sa_column=Column(Text))
    # sha256 of the nonce of the runner that traded the bootstrap token for the attempt's secret.
    secret_claim: str | None = Field(default=None, sa_column=Column(String(64)))
    abandoned_at: float | None = None  # when the control plane stopped waiting for it to confirm it stopped
    # Extra executions of the attempt: claims refused to them, how many of those the reconciler
    # has looked into, and how many executions it stopped.
    extra_claims: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    extra_checked: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    extra_stopped: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))
    # Which of its tool's placements (an index into the list the task was admitted under) it runs on.
    placement: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))


class Lease(SQLModel, table=True):
    """Leader leases: only the holder runs the scheduler and reconciler loops."""

    __tablename__ = "leases"

    name: str = Field(sa_column=Column(String(64), primary_key=True))
    holder: str = Field(sa_column=Column(String(128), nullable=False))
    expires_at: float
    # Goes up by one at each takeover (another holder, or the first): the fencing token the
    # leader's writes carry (`leases.Fence`). A release keeps the row, so it never goes back.
    epoch: int = Field(default=0, sa_column=Column(Integer, nullable=False, server_default="0"))


class QueueDepth(SQLModel, table=True):
    """How many tasks wait in each queue, per priority: kept by triggers on `tasks` (SQLite:
    migration 0007, PostgreSQL: 0009), so that admitting a submit reads a few rows instead of counting
    the queue, whose cost grew with its length."""

    __tablename__ = "queue_depth"

    resource_class: str = Field(sa_column=Column(String(64), primary_key=True))
    priority: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    waiting: int = Field(sa_column=Column(Integer, nullable=False))


class CallerLimits(SQLModel, table=True):
    """An operator's limits for one caller (`controlplane limits`): NULL keeps the setting's
    default, -1 lifts the limit (`controlplane.limits`)."""

    __tablename__ = "caller_limits"

    owner: str = Field(sa_column=Column(String(200), primary_key=True))
    submits_per_minute: int | None = None
    submits_per_day: int | None = None
    tasks_in_flight: int | None = None
    streams: int | None = None
    updated_at: float


class CallerStream(SQLModel, table=True):
    """A streaming wait open now (wait_task, tasks/result), counted against its caller's limit
    on every replica; `expires_at` frees it should its server die without closing it."""

    __tablename__ = "caller_streams"
    __table_args__ = (Index("ix_caller_streams_owner", "owner", "expires_at"),)

    stream_id: str = Field(sa_column=Column(String(40), primary_key=True))
    owner: str = Field(sa_column=Column(String(200), nullable=False))
    task_id: str = Field(sa_column=Column(String(40), nullable=False))
    started_at: float
    expires_at: float


class AttemptUsage(SQLModel, table=True):
    """What one attempt used and its estimated cost at the prices of its end
    (`controlplane.prices`), written with the attempt's end. Kept when its task is purged (the
    owner and tool are copied here; tags are read from `task_tags` while the task is kept)."""

    __tablename__ = "attempt_usage"
    # Budgets sum a period's costs of one owner, or of every owner joined to a tag, from the
    # index alone (cost and task_pk in it: no row is read).
    __table_args__ = (Index("ix_attempt_usage_owner", "owner", "ended_at", "cost"),
                      Index("ix_attempt_usage_ended", "ended_at", "task_pk", "cost"))

    task_id: str = Field(sa_column=Column(String(40), primary_key=True))
    attempt: int = Field(sa_column=Column(Integer, primary_key=True, autoincrement=False))
    task_pk: int
    owner: str = Field(sa_column=Column(String(200), nullable=False))
    tool_name: str = Field(sa_column=Column(String(128), nullable=False))
    provider: str = Field(sa_column=Column(String(64), nullable=False))
    region: str | None = Field(default=None, sa_column=Column(String(64)))
    started_at: float
    ended_at: float
    cpu: float
    memory_mb: int
    gpu: int
    run_s: float
    vcpu_s: float
    memory_gib_s: float
    gpu_s: float
    cost: float | None = None  # None: a rate it needed is not in the price table
    currency: str = Field(sa_column=Column(String(8), nullable=False))


class Budget(SQLModel, table=True):
    """An operator's budget (`controlplane budgets`): at most `amount` (in the price table's
    currency) per calendar `period` (UTC day, week or month) for one caller or one tag."""

    __tablename__ = "budgets"

    scope: str = Field(sa_column=Column(String(8), primary_key=True))  # "owner" | "tag"
    subject: str = Field(sa_column=Column(String(200), primary_key=True))
    period: str = Field(sa_column=Column(String(8), nullable=False))
    amount: float
    updated_at: float


class Upload(SQLModel, table=True):
    """A file a caller brings (`create_upload`): pending until the control plane has verified
    its size and sha256 (`complete_upload`), deleted with its object once it expires."""

    __tablename__ = "uploads"
    __table_args__ = (Index("ix_uploads_owner", "owner", "sha256", "size_bytes", "name"),
                      Index("ix_uploads_expires", "expires_at"))

    upload_id: str = Field(sa_column=Column(String(40), primary_key=True))
    owner: str = Field(sa_column=Column(String(200), nullable=False))
    team: str | None = Field(default=None, sa_column=Column(String(200)))
    name: str = Field(sa_column=Column(String(255), nullable=False))
    size_bytes: int = Field(sa_column=Column(BigInteger, nullable=False))
    sha256: str = Field(sa_column=Column(String(64), nullable=False))
    content_type: str = Field(sa_column=Column(String(128), nullable=False))
    store_url: str = Field(sa_column=Column(Text, nullable=False))
    storage_key: str = Field(sa_column=Column(Text, nullable=False))
    session: str | None = Field(default=None, sa_column=Column(Text))  # the store's (an S3 multipart id)
    state: str = Field(sa_column=Column(String(16), nullable=False))  # "pending" | "complete"
    created_at: float
    expires_at: float
    completed_at: float | None = None


class TaskParent(SQLModel, table=True):
    """A task submitted with `after` waits for each of its parents: one row per (child, parent).
    A task can only name tasks that exist before it, so these edges never close a cycle."""

    __tablename__ = "task_parents"
    # A parent's end finds its children (the waiting ones, through their state).
    __table_args__ = (Index("ix_task_parents_parent", "parent_id", "child_id"),)

    child_id: str = Field(sa_column=Column(String(40), primary_key=True))
    parent_id: str = Field(sa_column=Column(String(40), primary_key=True))


class TaskRelease(SQLModel, table=True):
    """Children of a task still to settle after its end (or its cascading cancel), when there
    were more than one transaction settles: those waiting with ids above `after_id`. The
    reconciler continues from here in bounded batches (docs/design/dependencies.md)."""

    __tablename__ = "task_releases"

    parent_id: str = Field(sa_column=Column(String(40), primary_key=True))
    after_id: str = Field(sa_column=Column(String(40), nullable=False))  # "": from the first child
    ancestor: str | None = Field(default=None, sa_column=Column(String(40)))  # a cascade: the task cancelled
    cascade_json: str | None = Field(default=None, sa_column=Column(Text))  # ... and its descendants' error
    created_at: float


class TaskInput(SQLModel, table=True):
    """A file a task's inputs refer to (`controlplane.references`), as admission resolved it: the
    runner reads it from here, and retention keeps what a task that can still run refers to."""

    __tablename__ = "task_inputs"
    # Retention asks whether an upload is referred to (by `ref`).
    __table_args__ = (Index("ix_task_inputs_ref", "ref", "task_id"),)

    task_id: str = Field(sa_column=Column(String(40), primary_key=True))
    field: str = Field(sa_column=Column(String(200), primary_key=True))
    kind: str = Field(sa_column=Column(String(16), nullable=False))  # "upload" | "artifact" | "url"
    ref: str = Field(sa_column=Column(Text, nullable=False))  # as the caller wrote it
    store_url: str = Field(sa_column=Column(Text, nullable=False))  # '' for an https URL
    storage_key: str = Field(sa_column=Column(Text, nullable=False))  # the key, or the URL itself
    size_bytes: int | None = Field(default=None, sa_column=Column(BigInteger))  # None: unknown until read
    sha256: str | None = Field(default=None, sa_column=Column(String(64)))


class Sweep(SQLModel, table=True):
    """One submit of many tasks of one tool (its shards, each a task with `sweep_id`): the base
    inputs and how they vary (the JSON `vary` as given, from which each shard's override is
    derived), its limits and failure policy, when and why it was stopped (cancel_sweep, or its
    `fail_fast` tripped), and when that stop had no shard left to end (`stop_done_at`)."""

    __tablename__ = "sweeps"
    __table_args__ = (
        UniqueConstraint("owner", "tool_name", "idempotency_key", name="uq_sweeps_idempotency"),
        Index("ix_sweeps_owner", "owner", "created_at", "pk"),
        # The stops the reconciler still has to finish, oldest first (only those are indexed).
        Index("ix_sweeps_stop_left", "stopped_at", sqlite_where=text(STOP_LEFT),
              postgresql_where=text(STOP_LEFT)),
    )

    pk: int | None = Field(default=None, primary_key=True)
    sweep_id: str = Field(sa_column=Column(String(40), nullable=False, unique=True))
    owner: str = Field(sa_column=Column(String(200), nullable=False))
    team: str | None = Field(default=None, sa_column=Column(String(200)))
    tool_name: str = Field(sa_column=Column(String(128), nullable=False))
    resource_class: str = Field(sa_column=Column(String(64), nullable=False))
    base_inputs_json: str = Field(sa_column=Column(Text, nullable=False))
    vary_json: str = Field(sa_column=Column(Text, nullable=False))
    shards: int
    max_parallel: int | None = None  # shards holding a slot at once (None: as many as the queue gives)
    fail_fast: int | None = None  # stop after this many failed shards (None: run them all)
    priority: int
    tags_json: str = Field(sa_column=Column(Text, nullable=False))
    idempotency_key: str | None = Field(default=None, sa_column=Column(String(200)))
    estimate_s: float | None = None  # the whole sweep's, at submit
    estimate_cost: float | None = None
    created_at: float
    stopped_at: float | None = None
    stop_reason: str | None = Field(default=None, sa_column=Column(String(500)))
    stop_done_at: float | None = None  # no shard left to end: its stop costs the reconciler nothing


def table_of(model: type[SQLModel]) -> Table:
    """The table of a table model (SQLModel sets `__table__` on the class but does not declare it)."""
    table: Table = model.__table__  # type: ignore[attr-defined]
    return table
