"""The statements of sweeps (`store.sweeps`), apart from `queries.py` only for its length: built
once at import like those, over the `sweeps` table and a sweep's shards in `tasks` (along
ix_tasks_sweep_shard and ix_tasks_sweep_state, partial indexes that hold only shards). Every read
of a sweep is an aggregate or a page: none loads all its shards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, delete, exists, func, insert, or_, select, tuple_, update

from controlplane import states
from controlplane.states import TaskState
from controlplane.store.models import Sweep, table_of
from controlplane.store.queries import _USAGE_SUMS, LIST_FIELDS, SLOT_HOLDING, USAGE, T

SW = table_of(Sweep)
S = TaskState
_bp = bindparam

# The states of a shard a stop still has to end: the ones cancel_task would move (a shard
# already being stopped is left to the reconciler).
STOPPABLE = (S.WAITING.value, S.QUEUED.value, S.SCHEDULED.value, S.RUNNING.value)
FAILED = (S.FAILED.value, S.TIMED_OUT.value)
ENDED = [s.value for s in states.FINAL]

GET_SWEEP = select(SW).where(SW.c.sweep_id == _bp("sweep_id"))
GET_OWNED_SWEEP = select(SW).where(SW.c.sweep_id == _bp("sweep_id"), SW.c.owner == _bp("owner"))
GET_IDEMPOTENT_SWEEP = select(SW).where(SW.c.owner == _bp("owner"), SW.c.tool_name == _bp("tool_name"),
                                        SW.c.idempotency_key == _bp("key"))
INSERT_SWEEP = insert(SW).returning(SW.c.pk)
# A stop is recorded only on a sweep that has a shard left to stop (one that has ended is done,
# not stopped).
STOP_SWEEP = (update(SW).where(SW.c.sweep_id == _bp("_sid"), SW.c.stopped_at.is_(None),
                               exists().where(T.c.sweep_id == SW.c.sweep_id,
                                              or_(*(T.c.state == s for s in STOPPABLE))))
              .values(stopped_at=_bp("_at"), stop_reason=_bp("_why")))

# The shards, written in one executemany (no RETURNING), then their keys read back in shard order.
INSERT_SHARD = insert(T)
SHARD_KEYS = select(T.c.pk, T.c.task_id).where(T.c.sweep_id == _bp("sweep_id")).order_by(T.c.shard)

# get_sweep_status: counts by state (the index alone), the running shards' progress (no more than
# hold slots), the first failures, and what the shards' recorded attempts used.
STATE_COUNTS = (select(T.c.state, func.count().label("n")).where(T.c.sweep_id == _bp("sweep_id"))
                .group_by(T.c.state))
RUNNING_SHARDS = select(T).where(T.c.sweep_id == _bp("sweep_id"), T.c.state == S.RUNNING.value)
FIRST_FAILURES = (select(T.c.shard, T.c.task_id, T.c.state, T.c.error_json)
                  .where(T.c.sweep_id == _bp("sweep_id"), or_(*(T.c.state == s for s in FAILED)))
                  .order_by(T.c.completed_at, T.c.shard).limit(_bp("lim")))
FAILURE_COUNT = (select(func.count().label("n")).select_from(T)
                 .where(T.c.sweep_id == _bp("sweep_id"), or_(*(T.c.state == s for s in FAILED))))
SWEEP_USAGE = (select(*_USAGE_SUMS).select_from(T.join(USAGE, USAGE.c.task_id == T.c.task_id))
               .where(T.c.sweep_id == _bp("sweep_id")))

# get_sweep_result: a page of shards in shard order from a shard index.
SHARD_PAGE = (select(T).where(T.c.sweep_id == _bp("sweep_id"), T.c.shard >= _bp("from_shard"))
              .order_by(T.c.shard).limit(_bp("lim")))
# A stop: the shards it still has to end, in shard order, a batch at a time.
STOPPABLE_SHARDS = (select(T.c.task_id).where(T.c.sweep_id == _bp("sweep_id"),
                                              or_(*(T.c.state == s for s in STOPPABLE)))
                    .order_by(T.c.shard).limit(_bp("lim")))

# What stops left: the oldest stopped sweep whose stop is not yet done (along ix_sweeps_stop_left,
# which holds only those: a finished stop costs no read).
NEXT_STOP_LEFT = (select(SW.c.sweep_id, SW.c.stop_reason)
                  .where(SW.c.stopped_at.is_not(None), SW.c.stop_done_at.is_(None))
                  .order_by(SW.c.stopped_at).limit(1))
# A stop is done once none of its shards is in a state a stop ends (none returns to one).
STOP_DONE = (update(SW).where(SW.c.sweep_id == _bp("_sid"), SW.c.stopped_at.is_not(None), SW.c.stop_done_at.is_(None),
                              ~exists().where(T.c.sweep_id == SW.c.sweep_id,
                                              or_(*(T.c.state == s for s in STOPPABLE))))
             .values(stop_done_at=_bp("_at")))

# The scheduler's claim: per sweep with shards holding a slot of the class, how many, with its
# limit and whether it was stopped (along ix_tasks_dispatch: no more rows than the class's slots).
SWEEPS_BUSY = (select(T.c.sweep_id, SW.c.max_parallel, SW.c.stopped_at, SW.c.stop_reason, func.count().label("busy"))
               .select_from(T.join(SW, SW.c.sweep_id == T.c.sweep_id))
               .where(T.c.resource_class == _bp("rc"), or_(*(T.c.state == s for s in SLOT_HOLDING)),
                      T.c.sweep_id.is_not(None))
               .group_by(T.c.sweep_id, SW.c.max_parallel, SW.c.stopped_at, SW.c.stop_reason))

# Retention: a sweep goes once none of its shards is on file (each purged as any tombstone), `lim`
# at a time; only sweeps older than `before`, so none is looked at while its shards are written.
DUE_SWEEPS = (select(SW.c.pk).where(SW.c.created_at <= _bp("before"), ~exists().where(T.c.sweep_id == SW.c.sweep_id))
              .limit(_bp("lim")))
DELETE_SWEEP = delete(SW).where(SW.c.pk == _bp("pk"))

# A folded list's row of a sweep (`store.folded`): its lowest shard on file, one probe of
# ix_tasks_sweep_shard; of those in one state, one probe of ix_tasks_sweep_state.
_LISTED = [T.c[f] for f in LIST_FIELDS]
LOWEST_SHARD = select(*_LISTED).where(T.c.sweep_id == _bp("sweep_id")).order_by(T.c.shard).limit(1)
LOWEST_SHARD_IN = (select(*_LISTED).where(T.c.sweep_id == _bp("sweep_id"), T.c.state == _bp("state"))
                   .order_by(T.c.shard).limit(1))


def sweep_limits(sweep_ids: Sequence[str]) -> Any:
    """(sweep_id, max_parallel, stopped_at, stop_reason) of these sweeps (an IN list: run through
    SQLAlchemy)."""
    return select(SW.c.sweep_id, SW.c.max_parallel, SW.c.stopped_at, SW.c.stop_reason).where(SW.c.sweep_id.in_(list(sweep_ids)))


def owner_sweeps(owner: str, *, teams: Sequence[str] | None, tool_name: str | None, submitted_after: float | None,
                 submitted_before: float | None, until: float | None, after: tuple[float, int] | None,
                 limit: int) -> Any:
    """(sweep_id, created_at, pk) of up to `limit` of an owner's sweeps, newest first along
    ix_sweeps_owner: created at `until` or before, after the (created_at, pk) `after` of a
    previous batch, of `tool_name` and `teams` and created in [submitted_after, submitted_before)
    when given (a shard's submitted_at is its sweep's created_at)."""
    q = select(SW.c.sweep_id, SW.c.created_at, SW.c.pk).where(SW.c.owner == owner)
    if tool_name:
        q = q.where(SW.c.tool_name == tool_name)
    if teams is not None:
        q = q.where(SW.c.team.in_(list(teams)))
    if submitted_after is not None:
        q = q.where(SW.c.created_at >= submitted_after)
    if submitted_before is not None:
        q = q.where(SW.c.created_at < submitted_before)
    if until is not None:
        q = q.where(SW.c.created_at <= until)
    if after is not None:
        q = q.where(tuple_(SW.c.created_at, SW.c.pk) < tuple_(after[0], after[1]))
    return q.order_by(SW.c.created_at.desc(), SW.c.pk.desc()).limit(limit)
