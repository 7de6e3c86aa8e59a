"""Every SQL statement of the store, named, in one place (procrastinate's habit).

Statements are SQLAlchemy Core over the tables of `models`, portable across SQLite and
PostgreSQL. Most are built once at import with bind parameters, so that at run time the store
only binds values (building a statement per call costs more than the query itself on SQLite;
see `Database.fetch`/`run`, which take no IN lists: statements with one run through
SQLAlchemy's `Connection.execute`). The few whose shape depends on the call (a page of list_tasks) are
built by the functions at the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    and_,
    bindparam,
    case,
    delete,
    exists,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    update,
)

from controlplane import states
from controlplane.states import JobState, TaskState
from controlplane.store.models import (
    Artifact,
    AttemptUsage,
    Budget,
    CallerLimits,
    CallerStream,
    Job,
    Lease,
    QueueDepth,
    Task,
    TaskEvent,
    TaskInput,
    TaskLog,
    TaskParent,
    TaskRelease,
    TaskTag,
    Upload,
    table_of,
)

T = table_of(Task)
SIBLING = T.alias("sibling")  # another shard of the same sweep
TAGS = table_of(TaskTag)
EV = table_of(TaskEvent)
LOGS = table_of(TaskLog)
ART = table_of(Artifact)
JOBS = table_of(Job)
QD = table_of(QueueDepth)
LEASES = table_of(Lease)
CALLER_LIMITS_T = table_of(CallerLimits)
STREAMS = table_of(CallerStream)
USAGE = table_of(AttemptUsage)
BUDGETS = table_of(Budget)
UPLOADS = table_of(Upload)
TP = table_of(TaskParent)
TI = table_of(TaskInput)
TR = table_of(TaskRelease)

S = TaskState
_bp = bindparam
SLOT_HOLDING = [s.value for s in states.SLOT_HOLDING]
TERMINAL = [s.value for s in states.TERMINAL]
WATCHED = [s.value for s in states.WATCHED]
IN_FLIGHT_STATES = [s.value for s in TaskState if s not in states.TERMINAL and s != TaskState.EXPIRED]

# ==== tasks ====================================================================================
GET_TASK = select(T).where(T.c.task_id == _bp("task_id"))
GET_OWNED_TASK = select(T).where(T.c.task_id == _bp("task_id"), T.c.owner == _bp("owner"))
GET_IDEMPOTENT = select(T).where(T.c.owner == _bp("owner"), T.c.tool_name == _bp("tool_name"),
                                 T.c.idempotency_key == _bp("key"))
TASK_ATTEMPT = select(T.c.attempt, T.c.state).where(T.c.task_id == _bp("task_id"))
INSERT_TASK = insert(T).returning(T.c.pk)
INSERT_TAGS = insert(TAGS)
UPDATE_TASK_VERSIONED = update(T).where(T.c.pk == _bp("_pk"), T.c.version == _bp("_version"))
# A write outside a transition (progress, heartbeat, log counters): bumps the version.
UPDATE_TASK = update(T).where(T.c.pk == _bp("_pk")).values(version=T.c.version + 1)

# Admission into a queue: its waiting tasks by priority, from the depths the triggers keep
# (migrations 0007 and 0009), a few rows, not the queue; read once per group commit and counted
# on in the batch (`store.tasks._Batch`).
QUEUE_LEVELS = select(QD.c.priority, QD.c.waiting).where(QD.c.resource_class == _bp("rc"))
# Tasks ahead of one in its queue: one index range (the queued tasks of the class at or above its
# priority), counting those of higher priority and those of its own priority submitted earlier.
QUEUE_POSITION = (select(func.count().label("ahead")).select_from(T)
                  .where(T.c.resource_class == _bp("rc"), T.c.state == S.QUEUED.value,
                         T.c.priority >= _bp("prio"),
                         or_(T.c.priority > _bp("prio"), T.c.pk < _bp("pk"))))
SLOTS_BUSY = (select(func.count().label("busy")).select_from(T)  # no IN list: it runs on the prebuilt path
              .where(T.c.resource_class == _bp("rc"), or_(*(T.c.state == s for s in SLOT_HOLDING))))
READY_QUEUED = (select(T.c.pk, T.c.sweep_id).where(T.c.resource_class == _bp("rc"), T.c.state == S.QUEUED.value,
                                     T.c.not_before <= _bp("now")).limit(1))
NEXT_QUEUED = (select(T).where(T.c.resource_class == _bp("rc"), T.c.state == S.QUEUED.value,
                               T.c.not_before <= _bp("now"))
               .order_by(T.c.priority.desc(), T.c.pk).limit(_bp("lim")))
RECENT_RUNS = (select(T.c.input_size, T.c.started_at, T.c.completed_at)
               .where(T.c.tool_name == _bp("tool"), T.c.state == S.SUCCEEDED.value, T.c.started_at.is_not(None))
               .order_by(T.c.pk.desc()).limit(_bp("lim")))
RECENT_INPUTS = (select(T.c.inputs_json).where(T.c.owner == _bp("owner"), T.c.tool_name == _bp("tool"))
                 .order_by(T.c.submitted_at.desc(), T.c.pk.desc()).limit(_bp("lim")))
COUNT_BY_STATE = select(T.c.state, func.count().label("n")).group_by(T.c.state)
# The operator's view (/metrics, the dashboard): along ix_tasks_tool_state, and the few rows of queue_depth.
COUNT_BY_TOOL_STATE = select(T.c.tool_name, T.c.state, func.count().label("n")).group_by(T.c.tool_name, T.c.state)
QUEUE_DEPTHS = select(QD.c.resource_class, func.sum(QD.c.waiting).label("waiting")).group_by(QD.c.resource_class)
# A caller's limits (controlplane.limits): the off-th newest of its submits since a time (along
# ix_tasks_owner), and up to lim of its tasks in flight (ix_tasks_owner_state).
NTH_NEWEST_SUBMIT = (select(T.c.submitted_at).where(T.c.owner == _bp("owner"), T.c.submitted_at > _bp("since"))
                     .order_by(T.c.submitted_at.desc()).limit(1).offset(_bp("off")))
IN_FLIGHT = (select(T.c.started_at, T.c.estimate_s)
             .where(T.c.owner == _bp("owner"), or_(*(T.c.state == s for s in IN_FLIGHT_STATES)))
             .limit(_bp("lim")))
# (An UPDATE's bind names must not be column names: hence _tid, _att.)
HEARTBEAT = update(T).where(T.c.task_id == _bp("_tid"), T.c.attempt == _bp("_att")).values(
    heartbeat_at=_bp("_ts"), version=T.c.version + 1)

# ==== retention ================================================================================
# Due tasks of one terminal state, along ix_tasks_state_expires in (expires_at, pk) order from a
# cursor: a sweep resumes where its last batch stopped, and a task whose objects could not be
# deleted stays behind the cursor until the next pass instead of being fetched again at once.
DUE_FOR_EXPIRY = (select(T.c.pk, T.c.task_id, T.c.state, T.c.store_url, T.c.expires_at,
                         T.c.log_first_seq, T.c.log_seq)
                  .where(T.c.state == _bp("state"), T.c.expires_at <= _bp("now"),
                         tuple_(T.c.expires_at, T.c.pk) > tuple_(_bp("after_ts"), _bp("after_pk")))
                  .order_by(T.c.expires_at, T.c.pk).limit(_bp("lim")))
# Tombstones of tasks that expired long enough ago (expires_at is when they expired).
DUE_FOR_PURGE = (select(T.c.pk, T.c.task_id).where(T.c.state == S.EXPIRED.value, T.c.expires_at <= _bp("before"))
                 .limit(_bp("lim")))
DELETE_TASK_LOGS = delete(LOGS).where(LOGS.c.task_id == _bp("task_id"))
# A long log goes in slices (the primary key is (task_id, seq)), each its own transaction.
DELETE_TASK_LOGS_BELOW = delete(LOGS).where(LOGS.c.task_id == _bp("task_id"), LOGS.c.seq < _bp("below"))
DELETE_TASK_ARTIFACTS = delete(ART).where(ART.c.task_id == _bp("task_id"))
DELETE_TASK = delete(T).where(T.c.pk == _bp("pk"))
DELETE_TASK_TAGS = delete(TAGS).where(TAGS.c.task_pk == _bp("pk"))
DELETE_TASK_JOBS = delete(JOBS).where(JOBS.c.task_id == _bp("task_id"),  # no IN list: it runs as an executemany
                                      or_(JOBS.c.state == JobState.DONE.value, JOBS.c.state == JobState.DROPPED.value))
DELETE_JOB = delete(JOBS).where(JOBS.c.job_id == _bp("_jid"))
# The audit outlives the tasks it describes, for its own period; old events go `lim` at a time
# (pks found along ix_task_events_ts), so no one statement holds the write lock for long.
DELETE_OLD_EVENTS = delete(EV).where(EV.c.pk.in_(select(EV.c.pk).where(EV.c.ts < _bp("before")).limit(_bp("lim"))))

# ==== events and logs ==========================================================================
INSERT_EVENT = insert(EV)
EVENTS = select(EV.c.pk, EV.c.task_id, EV.c.ts, EV.c.kind, EV.c.attempt, EV.c.from_state, EV.c.to_state,
                EV.c.detail_json).where(EV.c.task_id == _bp("task_id")).order_by(EV.c.pk)
INSERT_LOGS = insert(LOGS)
_LOG_COLS = (LOGS.c.seq, LOGS.c.ts, LOGS.c.stream, LOGS.c.level, LOGS.c.message, LOGS.c.attempt)
TAIL_LOGS = (select(*_LOG_COLS).where(LOGS.c.task_id == _bp("task_id"), LOGS.c.seq > _bp("after"))
             .order_by(LOGS.c.seq).limit(_bp("lim")))
LAST_LOGS = (select(*_LOG_COLS).where(LOGS.c.task_id == _bp("task_id"))
             .order_by(LOGS.c.seq.desc()).limit(_bp("lim")))
TRIM_LOGS = delete(LOGS).where(LOGS.c.task_id == _bp("task_id"), LOGS.c.seq < _bp("first"))

# ==== artifacts ================================================================================
ARTIFACTS = select(ART).where(ART.c.task_id == _bp("task_id")).order_by(ART.c.name)
ATTEMPT_ARTIFACTS = (select(ART).where(ART.c.task_id == _bp("task_id"), ART.c.attempt == _bp("attempt"))
                     .order_by(ART.c.name))

# ==== leases ===================================================================================
LEASE_HOLDER = select(LEASES.c.holder, LEASES.c.epoch).where(LEASES.c.name == _bp("name"))
# A fence holds while its holder still has the lease, in the same epoch, for at least `until`.
LEASE_FENCE = select(LEASES.c.epoch).where(LEASES.c.name == _bp("name"), LEASES.c.holder == _bp("holder"),
                                           LEASES.c.epoch == _bp("epoch"), LEASES.c.expires_at > _bp("until"))
# A release ends the lease now and keeps the row (and its epoch, which must never go back).
RELEASE_LEASE = update(LEASES).where(LEASES.c.name == _bp("_name"), LEASES.c.holder == _bp("_holder")).values(
    expires_at=0.0)


# ==== callers ==================================================================================
CALLER_LIMITS = select(CALLER_LIMITS_T).order_by(CALLER_LIMITS_T.c.owner)
CALLER_LIMITS_OF = select(CALLER_LIMITS_T).where(CALLER_LIMITS_T.c.owner == _bp("owner"))
DELETE_CALLER_LIMITS = delete(CALLER_LIMITS_T).where(CALLER_LIMITS_T.c.owner == _bp("owner"))
OPEN_STREAMS = select(STREAMS.c.expires_at).where(STREAMS.c.owner == _bp("owner")).limit(_bp("lim"))
DELETE_EXPIRED_STREAMS = delete(STREAMS).where(STREAMS.c.owner == _bp("owner"), STREAMS.c.expires_at <= _bp("now"))
INSERT_STREAM = insert(STREAMS)
DELETE_STREAM = delete(STREAMS).where(STREAMS.c.stream_id == _bp("stream_id"))
RENEW_STREAM = update(STREAMS).where(STREAMS.c.stream_id == _bp("_sid")).values(expires_at=_bp("_exp"))


# ==== parents (`after`) ==========================================================================
INSERT_PARENT = insert(TP)
# A parent's state, read under FOR SHARE by a submit that names it (`Counts.lock_parents`).
PARENT_STATE = select(T.c.task_id, T.c.state).where(T.c.task_id == _bp("task_id"))
# A parent's waiting children after a child id (ix_task_parents_parent), in id order: the order
# their rows are locked; at most `lim`.
WAITING_CHILDREN = (select(T.c.task_id)
                    .select_from(TP.join(T, T.c.task_id == TP.c.child_id))
                    .where(TP.c.parent_id == _bp("parent_id"), TP.c.child_id > _bp("after"),
                           T.c.state == S.WAITING.value)
                    .order_by(TP.c.child_id).limit(_bp("lim")))
# Children still to settle (`store.releases`): one parent's, and the oldest parents'.
RELEASE_OF = select(TR).where(TR.c.parent_id == _bp("parent_id"))
NEXT_RELEASE = select(TR).order_by(TR.c.created_at, TR.c.parent_id).limit(_bp("lim"))
INSERT_RELEASE = insert(TR)
UPDATE_RELEASE = update(TR).where(TR.c.parent_id == _bp("_parent"))
DELETE_RELEASE = delete(TR).where(TR.c.parent_id == _bp("parent_id"))
# A task's parents and their states (None: purged).
PARENTS_OF = (select(TP.c.parent_id, T.c.state)
              .select_from(TP.outerjoin(T, T.c.task_id == TP.c.parent_id))
              .where(TP.c.child_id == _bp("child_id")))
DELETE_TASK_PARENTS = delete(TP).where(or_(TP.c.child_id == _bp("task_id"), TP.c.parent_id == _bp("task_id")))


# ==== inputs by reference ======================================================================
INSERT_TASK_INPUT = insert(TI)
TASK_INPUTS = select(TI).where(TI.c.task_id == _bp("task_id")).order_by(TI.c.field)
DELETE_TASK_INPUTS = delete(TI).where(TI.c.task_id == _bp("task_id"))
# Whether a task that can still run (not yet in a final state) refers to `ref` (ix_task_inputs_ref).
REF_HELD = (select(TI.c.task_id).select_from(TI.join(T, T.c.task_id == TI.c.task_id))
            .where(TI.c.ref == _bp("ref"), or_(*(T.c.state == s for s in IN_FLIGHT_STATES))).limit(1))
# Whether a task that can still run refers to an artifact of the task `task_id` (by the exact
# reference `artifact://<task>/<name>`: one lookup of ix_task_inputs_ref per artifact).
ARTIFACT_HELD = (select(TI.c.task_id)
                 .select_from(ART.join(TI, TI.c.ref == literal("artifact://") + ART.c.task_id + "/" + ART.c.name)
                              .join(T, T.c.task_id == TI.c.task_id))
                 .where(ART.c.task_id == _bp("task_id"), or_(*(T.c.state == s for s in IN_FLIGHT_STATES))).limit(1))
RESOLVE_TASK_INPUT = update(TI).where(TI.c.task_id == _bp("_task_id"), TI.c.field == _bp("_field")).values(
    store_url=_bp("_store_url"), storage_key=_bp("_storage_key"), size_bytes=_bp("_size"), sha256=_bp("_sha256"))


# ==== statements shaped by the call ============================================================
LIST_FIELDS = ("pk", "task_id", "tool_name", "state", "priority", "resource_class", "attempt", "submitted_at",
               "updated_at", "tags_json", "started_at", "completed_at", "progress_json", "sweep_id")


def list_page(owner: str, *, teams: Sequence[str] | None = None, states_: Sequence[str] | None, tool_name: str | None,
              tags_any: Sequence[str] | None, submitted_after: float | None, submitted_before: float | None,
              after: tuple[float, int] | None, limit: int, parent: str | None = None,
              sweep: str | None = None, whole_sweeps: bool = False, outside_sweeps: bool = False) -> list[Any]:
    """The statements of one page of list_tasks, newest first, each walking one index in order
    and stopping after `limit` rows: a filter with several values (tags, states) runs one walk
    per value, and the caller merges them, so that nothing sorts everything that matches.
    `whole_sweeps`: of a sweep's shards only one (`lowest_shard`), so that a sweep takes one row
    on one page; `outside_sweeps`: no shard at all (along ix_tasks_owner_plain without filters)."""
    if tags_any:
        drivers: list[tuple[Any, Any]] = [(TAGS, TAGS.c.tag == t) for t in dict.fromkeys(tags_any)]
    elif states_ and len(states_) > 1:
        drivers = [(T, T.c.state == st) for st in dict.fromkeys(states_)]
    else:
        drivers = [(T, None)]
    cols = [T.c[f] for f in LIST_FIELDS]  # in TaskSummary's order: rows are built by position
    out = []
    for table, cond in drivers:
        if table is TAGS:  # the tag index carries owner and submission time
            ts, pk = TAGS.c.submitted_at, TAGS.c.task_pk
            q = select(*cols).select_from(TAGS.join(T, T.c.pk == TAGS.c.task_pk)).where(TAGS.c.owner == owner, cond)
            if states_:
                q = q.where(T.c.state.in_(list(states_)))
        else:
            ts, pk = T.c.submitted_at, T.c.pk
            q = select(*cols).where(T.c.owner == owner)
            if cond is not None:
                q = q.where(cond)
            elif states_:
                q = q.where(T.c.state == states_[0])
        if tool_name:
            q = q.where(T.c.tool_name == tool_name)
        if teams is not None:  # a teammate's tasks: those shared with our teams
            q = q.where(T.c.team.in_(list(teams)))
        if parent is not None:
            q = q.where(children_of(parent))
        if sweep is not None:
            q = q.where(T.c.sweep_id == sweep)
        if whole_sweeps:
            q = q.where(lowest_shard(states_))
        if outside_sweeps:
            q = q.where(T.c.sweep_id.is_(None))
        if submitted_after is not None:
            q = q.where(ts >= submitted_after)
        if submitted_before is not None:
            q = q.where(ts < submitted_before)
        if after is not None:
            q = q.where(tuple_(ts, pk) < tuple_(after[0], after[1]))
        out.append(q.order_by(ts.desc(), pk.desc()).limit(limit))
    return out


def everyone_page(*, states_: Sequence[str] | None, tool_name: str | None, tags_any: Sequence[str] | None,
                  submitted_after: float | None, submitted_before: float | None, after_pk: int | None,
                  limit: int, parent: str | None = None, sweep: str | None = None, whole_sweeps: bool = False) -> Any:
    """One page of every owner's tasks (an administrator's list), newest first by submission
    order (`pk`), each row with its owner: a walk of the primary key, backwards, that stops after
    `limit` rows. Every filter is checked on the way, so an index of its own (one more write per
    submit, for a rare read) is not needed, and no page sorts what matches."""
    q = select(*[T.c[f] for f in LIST_FIELDS], T.c.owner)
    if states_:
        q = q.where(T.c.state.in_(list(states_)))
    if tool_name:
        q = q.where(T.c.tool_name == tool_name)
    if tags_any:
        q = q.where(exists().where(TAGS.c.task_pk == T.c.pk, TAGS.c.tag.in_(list(dict.fromkeys(tags_any)))))
    if submitted_after is not None:
        q = q.where(T.c.submitted_at >= submitted_after)
    if submitted_before is not None:
        q = q.where(T.c.submitted_at < submitted_before)
    if after_pk is not None:
        q = q.where(T.c.pk < after_pk)
    if parent is not None:
        q = q.where(children_of(parent))
    if sweep is not None:
        q = q.where(T.c.sweep_id == sweep)
    if whole_sweeps:
        q = q.where(lowest_shard(states_))
    return q.order_by(T.c.pk.desc()).limit(limit)


def lowest_shard(states_: Sequence[str] | None) -> Any:
    """The condition of a list that takes a sweep as one row: a task of no sweep, or the lowest
    shard of its sweep still on file (of those in `states_`, when given). It holds of a row
    whatever page it is on, so a cursor pages past a sweep once; without states it is one probe
    of the sweep's shard index per shard walked past (so `store.folded` walks this way only for
    the filters its merge cannot answer)."""
    lower = exists().where(SIBLING.c.sweep_id == T.c.sweep_id, SIBLING.c.shard < T.c.shard)
    if states_:
        lower = lower.where(SIBLING.c.state.in_(list(states_)))
    return or_(T.c.sweep_id.is_(None), ~lower)


def children_of(parent: str) -> Any:
    """The condition of list_tasks' `parent`: tasks submitted with `parent` in their `after`."""
    return T.c.task_id.in_(select(TP.c.child_id).where(TP.c.parent_id == parent))


def task_ids_by_prefix(owner: str, prefix: str, limit: int) -> tuple[Any, bool]:
    """(statement, filtered): a short prefix matches many tasks, so walk the owner's newest and
    stop after `limit`; a longer one matches few among all (ids are random), so range-scan the
    id index (`filtered`: the caller keeps the owner's and sorts those few)."""
    if len(prefix) <= 6:  # "tsk_" and up to two random characters
        return (select(T.c.task_id).where(T.c.owner == owner, T.c.task_id.startswith(prefix, autoescape=True))
                .order_by(T.c.submitted_at.desc(), T.c.pk.desc()).limit(limit)), False
    upper = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return (select(T.c.task_id, T.c.submitted_at, T.c.owner)
            .where(T.c.task_id >= prefix, T.c.task_id < upper).limit(10_000)), True


# ==== usage and budgets =========================================================================
INSERT_USAGE = insert(USAGE)
_USAGE_SUMS = (func.count().label("attempts"), func.coalesce(func.sum(USAGE.c.run_s), 0).label("run_s"),
               func.coalesce(func.sum(USAGE.c.vcpu_s), 0).label("vcpu_s"),
               func.coalesce(func.sum(USAGE.c.memory_gib_s), 0).label("memory_gib_s"),
               func.coalesce(func.sum(USAGE.c.gpu_s), 0).label("gpu_s"),
               func.sum(USAGE.c.cost).label("cost"),
               func.coalesce(func.sum(case((USAGE.c.cost.is_(None), 1), else_=0)), 0).label("unpriced"))
TASK_USAGE = select(*_USAGE_SUMS).where(USAGE.c.task_id == _bp("task_id"))
BUDGETS_ALL = select(BUDGETS).order_by(BUDGETS.c.scope, BUDGETS.c.subject)
BUDGET_OF = select(BUDGETS).where(BUDGETS.c.scope == _bp("scope"), BUDGETS.c.subject == _bp("subject"))
DELETE_BUDGET = delete(BUDGETS).where(BUDGETS.c.scope == _bp("scope"), BUDGETS.c.subject == _bp("subject"))
# What a budget has spent in its period (attempts that ended in it), and what the tasks not yet
# ended are expected to cost, of one owner (ix_attempt_usage_owner, ix_tasks_owner_state) or one
# tag (the period's usage rows, then each task's tag by task_tags' key; the tasks in flight by
# their state, ix_tasks_state_timeout, then likewise).
OWNER_SPENT = (select(func.coalesce(func.sum(USAGE.c.cost), 0))
               .where(USAGE.c.owner == _bp("subject"), USAGE.c.ended_at >= _bp("since")))
TAG_SPENT = (select(func.coalesce(func.sum(USAGE.c.cost), 0))
             .select_from(USAGE.join(TAGS, and_(TAGS.c.task_pk == USAGE.c.task_pk, TAGS.c.tag == _bp("subject"))))
             .where(USAGE.c.ended_at >= _bp("since")))
OWNER_RUNNING = (select(func.coalesce(func.sum(T.c.estimate_cost), 0))
                 .where(T.c.owner == _bp("subject"), or_(*(T.c.state == s for s in IN_FLIGHT_STATES))))
TAG_RUNNING = (select(func.coalesce(func.sum(T.c.estimate_cost), 0))
               .select_from(T.join(TAGS, and_(TAGS.c.task_pk == T.c.pk, TAGS.c.tag == _bp("subject"))))
               .where(or_(*(T.c.state == s for s in IN_FLIGHT_STATES))))


def usage_report(group_by: Sequence[str], owner: str | None, since: float, until: float) -> Any:
    """Usage of the attempts that ended in [since, until), summed per group (`tool`, `owner`,
    `tag`: a task counts once under each of its tags, and under None without any), of one
    owner or of everyone. Without a group, one row of the sums, or none when nothing ended."""
    columns = {"tool": USAGE.c.tool_name.label("tool"), "owner": USAGE.c.owner.label("owner"),
               "tag": TAGS.c.tag.label("tag")}
    keys = [columns[g] for g in group_by]
    source = USAGE.outerjoin(TAGS, TAGS.c.task_pk == USAGE.c.task_pk) if "tag" in group_by else USAGE
    q = (select(*keys, *_USAGE_SUMS, func.count(func.distinct(USAGE.c.task_id)).label("tasks"))
         .select_from(source).where(USAGE.c.ended_at >= since, USAGE.c.ended_at < until))
    if owner is not None:
        q = q.where(USAGE.c.owner == owner)
    return q.group_by(*keys).order_by(*keys) if keys else q.having(func.count() > 0)


def operator_jobs(job_states: Sequence[str] | None, limit: int) -> Any:
    q = select(JOBS).order_by(JOBS.c.created_at.desc()).limit(limit)
    return q.where(JOBS.c.state.in_(list(job_states))) if job_states else q


def count_by_state(resource_class: str | None) -> Any:
    return COUNT_BY_STATE.where(T.c.resource_class == resource_class) if resource_class else COUNT_BY_STATE

# ==== uploads ==================================================================================
INSERT_UPLOAD = insert(UPLOADS)
GET_UPLOAD = select(UPLOADS).where(UPLOADS.c.upload_id == _bp("upload_id"))
PENDING_UPLOAD = select(UPLOADS).where(
    UPLOADS.c.owner == _bp("owner"), UPLOADS.c.sha256 == _bp("sha256"), UPLOADS.c.size_bytes == _bp("size_bytes"),
    UPLOADS.c.name == _bp("name"), UPLOADS.c.state == "pending", UPLOADS.c.expires_at > _bp("now"),
).order_by(UPLOADS.c.created_at.desc()).limit(1)
SET_UPLOAD_SESSION = update(UPLOADS).where(UPLOADS.c.upload_id == _bp("_id")).values(session=_bp("_session"))
COMPLETE_UPLOAD = update(UPLOADS).where(UPLOADS.c.upload_id == _bp("_id"), UPLOADS.c.state == "pending").values(
    state="complete", completed_at=_bp("_now"))
DELETE_UPLOAD = delete(UPLOADS).where(UPLOADS.c.upload_id == _bp("upload_id"))
DUE_UPLOADS = select(UPLOADS).where(UPLOADS.c.expires_at <= _bp("now")).order_by(
    UPLOADS.c.expires_at, UPLOADS.c.upload_id).limit(_bp("lim"))
