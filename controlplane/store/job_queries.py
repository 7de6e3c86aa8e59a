"""The statements of jobs (`store.jobs`, and the attempt's writes in `store.attempts`), apart
from `queries.py` only for its length: built once at import like those, over the `jobs` table and
what a job needs of its task's row."""

from __future__ import annotations

from sqlalchemy import and_, bindparam, func, insert, or_, select, text, tuple_, update

from controlplane.states import JobState, TaskState
from controlplane.store.db import likely
from controlplane.store.models import WATCHED_JOBS_WHERE
from controlplane.store.queries import JOBS, T

S = TaskState
_bp = bindparam

GET_JOB = select(JOBS).where(JOBS.c.task_id == _bp("task_id"), JOBS.c.attempt == _bp("attempt"))
JOBS_OF_TASK = select(JOBS).where(JOBS.c.task_id == _bp("task_id")).order_by(JOBS.c.attempt)
MOVES_BY_PLACEMENT = (select(T.c.tool_name, JOBS.c.placement, JOBS.c.provider, func.count().label("moves"))
                      .select_from(JOBS.join(T, T.c.task_id == JOBS.c.task_id))
                      .where(JOBS.c.provider_status == _bp("status"))
                      .group_by(T.c.tool_name, JOBS.c.placement, JOBS.c.provider)
                      .order_by(T.c.tool_name, JOBS.c.placement))
GET_JOB_BY_ID = select(JOBS).where(JOBS.c.job_id == _bp("job_id"))
INSERT_JOB = insert(JOBS)
UPDATE_JOB = update(JOBS).where(JOBS.c.job_id == _bp("_jid"))
# A tool's jobs not ended (launching, active, draining, abandoned) at one of its placements.
BUSY_AT_PLACEMENT = (select(func.count().label("busy")).select_from(JOBS.join(T, T.c.task_id == JOBS.c.task_id))
                     .where(T.c.tool_name == _bp("tool"), JOBS.c.placement == _bp("placement"),
                            or_(*(JOBS.c.state == s.value for s in JobState if s not in (JobState.DONE,
                                                                                         JobState.DROPPED)))))
LAUNCH_INTENTS = (select(JOBS, T.c.state.label("task_state"))
                  .join(T, and_(T.c.task_id == JOBS.c.task_id, T.c.attempt == JOBS.c.attempt))
                  .where(JOBS.c.state == JobState.LAUNCHING.value))
# The jobs the reconciler watches, a page at a time, in (created_at, job_id) order from a
# cursor, along the partial index of the watched jobs alone (its WHERE repeated word for word).
# `likely` keeps SQLite from reading every watched job through ix_jobs_state and sorting them
# all, for every page. No join: see ATTENTION_TASKS.
WATCHED_PAGE = (select(JOBS.c.job_id, JOBS.c.task_id, JOBS.c.attempt, JOBS.c.provider, JOBS.c.event_seq,
                       JOBS.c.handle_json, JOBS.c.seen_at, JOBS.c.stop_requested_at, JOBS.c.stop_sent_at,
                       JOBS.c.provider_status, JOBS.c.provider_reason, JOBS.c.created_at,
                       JOBS.c.extra_claims, JOBS.c.extra_checked, JOBS.c.placement, JOBS.c.launched_at,
                       JOBS.c.state.label("job_state"))
                .where(likely(text(f"jobs.{WATCHED_JOBS_WHERE}")),
                       tuple_(JOBS.c.created_at, JOBS.c.job_id) > tuple_(_bp("after_ts"), _bp("after_jid")))
                .order_by(JOBS.c.created_at, JOBS.c.job_id).limit(_bp("lim")))
# The tasks whose job needs more of the reconciler than a poll: not yet seen running, being
# cancelled, or running past their timeout (ranges of ix_tasks_state_timeout). Every other task
# with an active job is running that job's attempt (`JobStore.watched_pages`): reading each
# watched job's task row instead (a join) cost more than all the rest of a cycle.
ATTENTION_TASKS = (select(T.c.task_id, T.c.attempt, T.c.timeout_at, T.c.stop_reason, T.c.state)
                   .where(or_(T.c.state == S.SCHEDULED.value, T.c.state == S.CANCEL_REQUESTED.value,
                              T.c.state == S.CANCELLING.value,
                              and_(T.c.state == S.RUNNING.value, T.c.timeout_at < _bp("now")))))
SET_PROVIDER_STATUS = (update(JOBS).where(JOBS.c.job_id == _bp("jid"))
                       .values(provider_status=_bp("st"), provider_reason=_bp("rs")))
MARK_STOP_SENT = update(JOBS).where(JOBS.c.job_id == _bp("jid")).values(
    stop_sent_at=_bp("now"), stop_requested_at=func.coalesce(JOBS.c.stop_requested_at, _bp("now")))
CLAIM_SECRET = (update(JOBS).where(JOBS.c.task_id == _bp("_tid"), JOBS.c.attempt == _bp("_att"),
                                   or_(JOBS.c.secret_claim.is_(None), JOBS.c.secret_claim == _bp("_digest")))
                .values(secret_claim=_bp("_digest")))
# A claim refused to an extra execution of the attempt, counted on the attempt's job; what the
# reconciler did about those it looked into (`_seen`: the refused claims it read).
NOTE_REFUSED_CLAIM = (update(JOBS).where(JOBS.c.task_id == _bp("_tid"), JOBS.c.attempt == _bp("_att"))
                      .values(extra_claims=JOBS.c.extra_claims + 1))
EXTRA_CHECKED = (update(JOBS).where(JOBS.c.job_id == _bp("_jid"))
                 .values(extra_checked=_bp("_seen"), extra_stopped=JOBS.c.extra_stopped + _bp("_stopped")))
JOB_HEARTBEAT = update(JOBS).where(JOBS.c.task_id == _bp("_tid"), JOBS.c.attempt == _bp("_att"),
                                   JOBS.c.state == JobState.ACTIVE.value).values(seen_at=_bp("_ts"))
