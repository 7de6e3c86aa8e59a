"""The folded page of list_tasks (`whole_sweeps`): each sweep one row, at a cost that does not grow
with its shards. Two walks side by side, merged by (submitted_at, pk) newest first: the owner's
tasks of no sweep (ix_tasks_owner_plain, which holds no shard) and the owner's sweeps
(ix_sweeps_owner), each sweep's row its lowest shard on file (one probe of its shard index; of
the shards in `states_`, one probe per state). Every shard of a sweep is submitted at the
sweep's created_at, so the sweeps come in the order of their rows' times. The rows are those of
`queries.lowest_shard`'s walk, so a cursor of either pages the other."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from controlplane.store import queries as q
from controlplane.store import sweep_queries as sq
from controlplane.store.rows import TaskSummary


def answers(tags_any: Sequence[str] | None, parent: str | None, sweep: str | None) -> bool:
    """Whether the merge answers a folded page with these filters: not with tags (a sweep's tags
    are its shards', in task_tags), `parent` or `sweep`, which walk the tasks shard by shard."""
    return not tags_any and parent is None and sweep is None


def page(c: Connection, owner: str, *, teams: Sequence[str] | None, states_: Sequence[str] | None,
         tool_name: str | None, submitted_after: float | None, submitted_before: float | None,
         after: tuple[float, int] | None, limit: int) -> list[TaskSummary]:
    """Up to `limit` rows newest first after the (submitted_at, pk) `after`: the owner's tasks of
    no sweep, and for each sweep its lowest shard on file (in `states_`, when given; a sweep with
    none there has no row). Reads a page of tasks, and the sweeps down to the page's last row,
    a probe (per state) each: a sweep whose shards were all purged costs its probe too."""
    plain = newest(c, q.list_page(owner, teams=teams, states_=states_, tool_name=tool_name, tags_any=None,
                                  submitted_after=submitted_after, submitted_before=submitted_before, after=after,
                                  limit=limit, outside_sweeps=True), limit)
    floor = plain[-1].submitted_at if len(plain) == limit else None  # an older sweep cannot enter
    folded: list[TaskSummary] = []
    last: tuple[float, int] | None = None
    while True:
        batch = c.execute(sq.owner_sweeps(owner, teams=teams, tool_name=tool_name, submitted_after=submitted_after,
                                          submitted_before=submitted_before, until=after[0] if after else None,
                                          after=last, limit=limit)).all()
        for found in batch:
            sweep_id, created_at, pk = str(found[0]), float(found[1]), int(found[2])
            if (floor is not None and created_at < floor) or \
                    (len(folded) >= limit and created_at < folded[limit - 1].submitted_at):
                return _merged(plain, folded, limit)
            row = _lowest(c, sweep_id, states_)
            if row is not None and (after is None or _key(row) < after):
                folded.append(row)
            last = (created_at, pk)
        if len(batch) < limit:
            return _merged(plain, folded, limit)


def newest(c: Connection, stmts: Sequence[Any], limit: int) -> list[TaskSummary]:
    """The rows of a list page's statements (`queries.list_page`: one walk per tag or state), each
    once, newest first by (submitted_at, pk), the first `limit`."""
    rows: dict[int, TaskSummary] = {}
    for stmt in stmts:
        result = c.execute(stmt)
        for r in TaskSummary.many(list(result.keys()), result.all()):
            rows.setdefault(r.pk, r)
    return sorted(rows.values(), key=_key, reverse=True)[:limit]


def _lowest(c: Connection, sweep_id: str, states_: Sequence[str] | None) -> TaskSummary | None:
    """A sweep's lowest shard on file (of those in `states_`, when given), or None."""
    if not states_:
        found = c.execute(sq.LOWEST_SHARD, {"sweep_id": sweep_id})
        return next(iter(TaskSummary.many(list(found.keys()), found.all())), None)
    best: TaskSummary | None = None
    for state in dict.fromkeys(states_):
        found = c.execute(sq.LOWEST_SHARD_IN, {"sweep_id": sweep_id, "state": state})
        for r in TaskSummary.many(list(found.keys()), found.all()):
            if best is None or _key(r) < _key(best):
                best = r
    return best


def _key(r: TaskSummary) -> tuple[float, int]:
    return r.submitted_at, r.pk


def _merged(plain: list[TaskSummary], folded: list[TaskSummary], limit: int) -> list[TaskSummary]:
    return sorted(plain + folded, key=_key, reverse=True)[:limit]
