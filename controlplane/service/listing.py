"""list_tasks: the caller's tasks, a teammate's shared ones, or (tasks:admin) anyone's or everyone's,
newest first, with an opaque cursor."""

from __future__ import annotations

import base64
import math

from controlplane import api
from controlplane.api import iso
from controlplane.errors import invalid
from controlplane.service.access import Access
from controlplane.service.answers import ListedTask, TaskList
from controlplane.service.logs import ASCII_DIGITS
from controlplane.service.times import epoch
from controlplane.store import Store
from controlplane.store.rows import TaskSummary

LIST_CURSOR_PREFIX = "lst_"


class Listing:
    def __init__(self, store: Store, access: Access):
        self.store = store
        self.access = access

    def list(self, caller: str, req: api.ListTasks) -> TaskList:
        """A page of `req`'s tasks. With `whole_sweeps` a sweep's shards take one row, its lowest
        shard on file (of those in `states`, when given), so a sweep shows on one page only; with
        `sweep` the filter wins and that sweep's shards are listed."""
        after = decode_cursor(req.cursor) if req.cursor else None
        whole_sweeps = folds(req)
        if req.parent is not None:
            self.access.readable(caller, req.parent)  # another's task answers NOT_FOUND, as an unknown one
        if req.sweep is not None:
            self.access.sweep(caller, req.sweep)  # likewise another's sweep
        if req.everyone:
            return self._everyone(caller, req, after, whole_sweeps)
        scope = self.access.list_scope(caller, req.owner)
        if scope.nothing:
            return page([], None)
        rows = self.store.tasks.list(
            scope.owner, teams=scope.teams, states_=[s.value for s in req.states] if req.states else None,
            tool_name=req.tool_name, tags_any=req.tags_any, submitted_after=epoch(req.submitted_after),
            submitted_before=epoch(req.submitted_before), after=after, limit=req.limit + 1, parent=req.parent,
            sweep=req.sweep, whole_sweeps=whole_sweeps)
        more = len(rows) > req.limit
        rows = rows[: req.limit]
        if scope.audited:
            self.access.audit.listed(caller, [(r, scope.owner) for r in rows])
        cursor = encode_cursor(rows[-1].submitted_at, rows[-1].pk) if more and rows else None
        return page([listed(r) for r in rows], cursor)

    def _everyone(self, caller: str, req: api.ListTasks, after: tuple[float, int] | None,
                  whole_sweeps: bool) -> TaskList:
        """Every owner's tasks for tasks:admin, each row with its owner (audited); anyone else is
        refused as usage_report refuses everyone's usage (FORBIDDEN)."""
        Access.everyone(caller, req.owner, "everyone's tasks need the tasks:admin scope",
                        hint="omit everyone to list your own tasks")
        found = self.store.tasks.list_everyone(
            states_=[s.value for s in req.states] if req.states else None, tool_name=req.tool_name,
            tags_any=req.tags_any, submitted_after=epoch(req.submitted_after),
            submitted_before=epoch(req.submitted_before), after_pk=after[1] if after else None,
            limit=req.limit + 1, parent=req.parent, sweep=req.sweep, whole_sweeps=whole_sweeps)
        more = len(found) > req.limit
        found = found[: req.limit]
        self.access.audit.listed(caller, found)
        last = found[-1][0] if more and found else None
        return page([listed(r, owner) for r, owner in found],
                    encode_cursor(last.submitted_at, last.pk) if last else None)


def folds(req: api.ListTasks) -> bool:
    """Whether a page of `req` takes each sweep as one row (whole_sweeps, unless it lists one sweep)."""
    return req.whole_sweeps and req.sweep is None


def listed(r: TaskSummary, owner: str | None = None) -> ListedTask:
    """A task as a row of list_tasks shows it (with its owner in a list of everyone's)."""
    progress = r.progress
    row: ListedTask = {
        "task_id": r.task_id, "state": r.state, "tool_name": r.tool_name, "priority": r.priority,
        "queue": r.resource_class, "attempt": r.attempt, "submitted_at": iso(r.submitted_at),
        "started_at": iso(r.started_at), "updated_at": iso(r.updated_at), "completed_at": iso(r.completed_at),
        "tags": r.tags, "percent": progress.get("percent") if progress else None,
    }
    if owner is not None:
        row["owner"] = owner
    if r.sweep_id is not None:
        row["sweep"] = r.sweep_id
    return row


def page(rows: list[ListedTask], cursor: str | None) -> TaskList:
    """A page of rows built here from the store's typed rows: not validated again (tests/test_answers.py
    holds them to the model)."""
    return TaskList.model_construct(tasks=rows, next_cursor=cursor)


def encode_cursor(submitted_at: float, pk: int) -> str:
    raw = f"v1:{submitted_at!r}:{pk}".encode()
    return LIST_CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, int]:
    """The (submitted_at, pk) a list_tasks cursor stands for; INVALID_REQUEST if malformed."""
    try:
        if not cursor.startswith(LIST_CURSOR_PREFIX):
            raise ValueError
        raw = cursor[len(LIST_CURSOR_PREFIX):]
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
        version, ts, pk = text.split(":")
        when = float(ts)
        if version != "v1" or not ASCII_DIGITS.fullmatch(pk) or not math.isfinite(when):
            raise ValueError
        return when, int(pk)
    except (ValueError, UnicodeDecodeError):
        raise invalid("malformed cursor", hint="pass the next_cursor of a previous list_tasks answer") from None
