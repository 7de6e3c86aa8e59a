"""Who may read, list and cancel which task or sweep, and the audit of administrators' reads.

A caller is an owner string, or an `identity.Caller` with teams and tasks:admin (the rules
themselves, `may_read` and `may_cancel`, are `controlplane.identity`'s). Someone else's task a
caller may not read answers exactly like an unknown one (None here, NOT_FOUND to the client).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from controlplane.errors import ControlPlaneError, ErrorCode, invalid, not_found
from controlplane.identity import Caller, is_admin, may_cancel, may_read
from controlplane.store import Store
from controlplane.store.rows import SweepRow, TaskRow, TaskSummary


class AdminReads:
    """Admins' reads of other callers' tasks, in each task's audit (task_events, kind
    `admin_read`, or `admin_list` for a row of list_tasks, with who read it): at most once per
    admin and task every `every_s` per server, so that a tail followed page by page is one
    entry, not hundreds."""

    def __init__(self, store: Store, every_s: float = 600.0):
        self.store = store
        self.every_s = every_s
        self._seen: dict[tuple[str, ...], float] = {}

    def read(self, admin: str, task: TaskRow) -> None:
        now = time.monotonic()
        key = (str(admin), task.task_id)
        if now - self._seen.get(key, -math.inf) < self.every_s:
            return
        self.store.tasks.audit(task.task_id, "admin_read", {"by": str(admin)})  # (WouldBlock: before the write)
        self._remember([key], now)

    def sweep_read(self, admin: str, sweep: SweepRow) -> None:
        """An admin's read of another caller's sweep: an `admin_read` entry in the sweep's own
        audit (task_events under the sweep's id), as rarely as a task's."""
        now = time.monotonic()
        key = (str(admin), sweep.sweep_id)
        if now - self._seen.get(key, -math.inf) < self.every_s:
            return
        self.store.sweeps.audit(sweep.sweep_id, "admin_read", {"by": str(admin)})
        self._remember([key], now)

    def listed(self, admin: str, rows: list[tuple[TaskSummary, str]]) -> None:
        """A page of list_tasks showing others' tasks: an `admin_list` entry in each (who listed
        it), at most once per admin and task every `every_s`, written in one statement."""
        now = time.monotonic()
        due = [(r, (str(admin), r.task_id, "list")) for r, owner in rows if owner != str(admin)]
        due = [(r, key) for r, key in due if now - self._seen.get(key, -math.inf) >= self.every_s]
        if not due:
            return
        self.store.tasks.audit_reads([(r.task_id, r.state.value, r.attempt) for r, _ in due], "admin_list",
                                     {"by": str(admin)})  # (WouldBlock: before the write)
        self._remember([key for _, key in due], now)

    def _remember(self, keys: list[tuple[str, ...]], now: float) -> None:
        for key in keys:
            self._seen[key] = now
        if len(self._seen) > 10_000:
            self._seen = {k: t for k, t in self._seen.items() if now - t < self.every_s}


@dataclass(frozen=True)
class ListScope:
    """Whose tasks a page of list_tasks shows: `owner`'s (all of them, or with `teams` only
    those shared with one of these teams); `audited`: an administrator reading another owner's
    (each row audited); `nothing`: a caller asking for someone else's without rights."""

    owner: str
    teams: list[str] | None = None
    audited: bool = False
    nothing: bool = False


class Access:
    """The access rules applied to the task store, with their audit."""

    def __init__(self, store: Store, audit: AdminReads):
        self.store = store
        self.audit = audit

    def get(self, caller: str, task_id: str) -> TaskRow | None:
        """The caller's task, or None (unknown and someone else's alike). A caller with rights
        over others' tasks (a team, tasks:admin) also gets those it may read; an admin's read of
        a task neither its own nor its team's is audited."""
        if type(caller) is str:  # no rights beyond its own tasks
            return self.store.tasks.get(task_id, caller)
        task = self.store.tasks.get(task_id)
        if task is None or not may_read(caller, task.owner, task.team):
            return None
        if task.owner != caller and not (task.team is not None and task.team in caller.teams):  # type: ignore[attr-defined]
            self.audit.read(caller, task)
        return task

    def readable(self, caller: str, task_id: str) -> TaskRow:
        """`get`, or NOT_FOUND."""
        task = self.get(caller, task_id)
        if task is None:
            raise not_found()
        return task

    def cancel_target(self, caller: str, task_id: str) -> TaskRow | None:
        """The task a caller with rights over others' tasks may cancel, None when it may not
        read it; FORBIDDEN for a teammate's (it may read it, so it knows the task exists)."""
        found = self.store.tasks.get(task_id)
        if found is None or not may_read(caller, found.owner, found.team):
            return None
        if not may_cancel(caller, found.owner):
            raise ControlPlaneError(ErrorCode.FORBIDDEN, "this task is a teammate's: you may read it, not cancel it",
                                    hint="ask its owner, or an operator with tasks:admin")
        return found

    def sweep(self, caller: str, sweep_id: str) -> SweepRow:
        """The sweep if the caller may read it (as it may its shards: `may_read`), else NOT_FOUND,
        as for an unknown one."""
        found = self.store.sweeps.get(sweep_id)
        if found is None or not may_read(caller, found.owner, found.team):
            raise not_found("sweep")
        if isinstance(caller, Caller) and found.owner != caller and found.team not in caller.teams:
            self.audit.sweep_read(caller, found)  # an administrator's, as for a task
        return found

    def sweep_to_cancel(self, caller: str, sweep_id: str) -> SweepRow:
        """`sweep`, when the caller may also cancel it; FORBIDDEN for a teammate's."""
        found = self.sweep(caller, sweep_id)
        if not may_cancel(caller, found.owner):
            raise ControlPlaneError(ErrorCode.FORBIDDEN, "this sweep is a teammate's: you may read it, not cancel it",
                                    hint="ask its owner, or an operator with tasks:admin")
        return found

    @staticmethod
    def list_scope(caller: str, owner: str | None) -> ListScope:
        """Whose tasks list_tasks shows the caller when it names `owner` (None: its own)."""
        if owner is None or owner == caller:
            return ListScope(caller)
        if not isinstance(caller, Caller) or not (caller.admin or caller.teams):
            return ListScope(owner, nothing=True)  # as for a caller with no tasks
        if caller.admin:
            return ListScope(owner, audited=True)
        return ListScope(owner, teams=sorted(caller.teams))  # a teammate's: those shared with a team of ours

    @staticmethod
    def everyone(caller: str, owner: str | None, refusal: str, hint: str) -> None:
        """Everyone's tasks or usage: tasks:admin only (FORBIDDEN), and not with `owner`."""
        if owner is not None:
            raise invalid("give owner or everyone, not both")
        if not is_admin(caller):
            raise ControlPlaneError(ErrorCode.FORBIDDEN, refusal, hint=hint)

    @staticmethod
    def may_see_usage(caller: str, owner: str | None) -> bool:
        """Whether a usage report of `owner` (None: everyone's, checked by `everyone`) shows
        anything: its own, or anyone's for tasks:admin."""
        return is_admin(caller) or owner == str(caller)
