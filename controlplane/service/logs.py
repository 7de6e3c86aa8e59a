"""tail_task_logs: a page of a task's own log, or of its job runner's (source='provider')."""

from __future__ import annotations

import re
from typing import Any

from controlplane import api, blocking
from controlplane.api import iso
from controlplane.errors import ControlPlaneError, ErrorCode, invalid
from controlplane.service.access import Access
from controlplane.service.answers import LogLine, LogPage, ProviderLogLine, ProviderLogPage
from controlplane.settings import Settings
from controlplane.store import Store
from controlplane.store.rows import TaskRow
from controlplane_providers.base import Capability, Provider, TransientProviderError

LOG_CURSOR_PREFIX = "log_"
PROVIDER_CURSOR_PREFIX = "plog_"
ASCII_DIGITS = re.compile(r"[0-9]{1,18}")  # fits a 64-bit integer column on every engine


class Logs:
    def __init__(self, settings: Settings, store: Store, providers: dict[str, Provider[Any]], access: Access):
        self.settings = settings
        self.store = store
        self.providers = providers
        self.access = access

    def tail(self, caller: str, req: api.TailTaskLogs) -> LogPage | ProviderLogPage:
        task = self.access.readable(caller, req.task_id)
        if req.cursor is not None and req.from_end:
            raise invalid("give either cursor or from_end, not both")
        limit = min(req.limit, self.settings.max_log_page)
        if req.source == "provider":
            return self._provider_tail(task, req, limit)
        if req.from_end:
            lines = self.store.logs.last(task.task_id, limit)
            after = lines[0].seq - 1 if lines else task.log_seq
        else:
            after = log_cursor(req.cursor)
            lines = self.store.logs.tail(task.task_id, after, limit)
        last = lines[-1].seq if lines else max(after, 0)
        return LogPage(
            task_id=task.task_id, state=task.state,
            lines=[LogLine(seq=ln.seq, ts=iso(ln.ts), stream=ln.stream, level=ln.level, message=ln.message,
                           attempt=ln.attempt) for ln in lines],
            next_cursor=f"{LOG_CURSOR_PREFIX}{last:09d}",
            truncated=after + 1 < task.log_first_seq,  # older lines than asked for fell to the per-task log cap
            has_more=last < task.log_seq)

    def _provider_tail(self, task: TaskRow, req: api.TailTaskLogs, limit: int) -> ProviderLogPage:
        """A page of the job runner's own log (CloudWatch, the local console) for the current
        attempt; its cursor wraps the provider's (e.g. CloudWatch's forward token)."""
        job = self.store.jobs.get(task.ref)
        where = job.provider if job is not None else task.provider  # the attempt's placement's
        provider = self.providers.get(where)
        if provider is None or not provider.supports(Capability.LOGS):
            raise ControlPlaneError(ErrorCode.CAPABILITY_MISSING, f"the {where} provider keeps no log "
                                    "of its own", hint="use source='task'")
        if req.from_end:
            raise invalid("from_end is not available with source='provider'")
        cursor = None
        if req.cursor is not None:
            if not req.cursor.startswith(PROVIDER_CURSOR_PREFIX):
                raise invalid("malformed cursor", hint="pass the next_cursor of a previous answer with the same source")
            cursor = req.cursor[len(PROVIDER_CURSOR_PREFIX):] or None
        page: dict[str, Any] = {"task_id": task.task_id, "state": task.state, "source": "provider",
                                "attempt": task.attempt, "lines": [],
                                "next_cursor": req.cursor or PROVIDER_CURSOR_PREFIX}
        if job is None or not job.handle_json:
            return ProviderLogPage(**page, reason="the job has not been launched yet")
        blocking.must_not_block()  # a cloud logging API
        try:
            got = provider.logs(provider.handle(job.handle_json), cursor, limit)
        except TransientProviderError:
            return ProviderLogPage(**page, reason="the provider's log service did not answer (throttled or "
                                                  "unavailable); try again")
        page["lines"] = [ProviderLogLine(ts=iso(ln.ts), stream=ln.stream, message=ln.message) for ln in got.lines]
        page["next_cursor"] = PROVIDER_CURSOR_PREFIX + (got.next_cursor or cursor or "")
        return ProviderLogPage(**page, **({"reason": got.reason} if got.reason else {}))


def log_cursor(cursor: str | None) -> int:
    """The sequence number a tail_task_logs cursor stands for (0: none); INVALID_REQUEST if malformed."""
    if cursor is None:
        return 0
    digits = cursor.removeprefix(LOG_CURSOR_PREFIX)
    if not cursor.startswith(LOG_CURSOR_PREFIX) or not ASCII_DIGITS.fullmatch(digits):
        raise invalid("malformed cursor", hint="pass the next_cursor of a previous tail_task_logs answer")
    return int(digits)
