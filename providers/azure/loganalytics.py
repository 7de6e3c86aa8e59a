"""Reading a Container Apps execution's console log from Log Analytics.

The environment's "log-analytics" destination writes table
  `ContainerAppConsoleLogs_CL` (columns `..._s`), its "azure-monitor" destination (a diagnostic
  setting) `ContainerAppConsoleLogs` (`Log`, `Stream`, `ContainerGroupName`); `LOG_TABLE` names
  one, or `auto` takes the one the workspace has (the _CL one first; a workspace without it
  answers "failed to resolve table", and the other is used from then on). Rows of the replicas
  of the execution (`{execution}-...`), oldest first, in the service's order (TimeGenerated, then
  `_ItemId`); cursor = TimeGenerated as 100 ns ticks + `_ItemId`, both in the query, so any
  number of rows at one instant pages through. Times are read as text (`tostring`, whatever
  precision the service writes) and parsed to ticks, never compared as text. Rows reach Log Analytics 30 s to a few
  minutes after they are written (ingestion delay) and a row ingested late with an earlier
  TimeGenerated than the cursor would be skipped; so the tail holds back the newest
  `LOG_SETTLE_S` seconds (default 60), trading freshness for completeness. The runner's relay
  (the default log source) has every line at once. Queries take a place in a per-workspace
  limiter (`LOG_QUERIES_PER_MIN`) without waiting. log_link = the execution in the Azure portal.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from azure.core.exceptions import HttpResponseError

from controlplane_providers import logtail, ratelimit
from controlplane_providers.azure.arm import AZURE_ERRORS, classify
from controlplane_providers.azure.options import ContainerAppsSettings, job_parts
from controlplane_providers.jobs import LogLine, LogPage

LOG_TABLE = "ContainerAppConsoleLogs_CL"  # the "log-analytics" destination's table
MONITOR_TABLE = "ContainerAppConsoleLogs"  # the "azure-monitor" destination's (a diagnostic setting)
# Each table's columns for what a tail reads: (replica, message, stream).
LOG_COLUMNS = {LOG_TABLE: ("ContainerGroupName_s", "Log_s", "Stream_s"),
               MONITOR_TABLE: ("ContainerGroupName", "Log", "Stream")}
TICKS_PER_S = 10_000_000  # Log Analytics' datetime resolution: 100 ns


class LogReader:
    """Pages of executions' console logs for one provider: one query client, pages shared by
    concurrent tails, and the table each workspace has."""

    def __init__(self, settings: Callable[[], ContainerAppsSettings], credential: Any, tls: dict[str, str]):
        self._settings, self.credential, self._tls = settings, credential, tls
        self._logs_client: Any = None
        self._lock = threading.Lock()
        self._pages = logtail.SharedPages()
        self._tables: dict[str, str] = {}  # workspace -> the console-log table found there (LOG_TABLE auto)

    @property
    def settings(self) -> ContainerAppsSettings:
        """The provider's settings as they are now (a test or an operator may replace them)."""
        return self._settings()

    def page(self, execution: str, job_id: str, created_at: float | None, workspace_id: str | None,
             cursor: str | None, limit: int) -> LogPage:
        """One page of the execution's console after `cursor` (see the module's doc)."""
        return self._pages.get((execution, cursor, limit),
                               lambda: self.read(execution, job_id, created_at, workspace_id, cursor, limit))

    def _logs(self) -> Any:
        with self._lock:
            if self._logs_client is None:
                from azure.monitor.query import LogsQueryClient

                self._logs_client = LogsQueryClient(self.credential,
                                                    endpoint=self.settings.logs_endpoint or "https://api.loganalytics.io",
                                                    retry_total=2, **self._tls)
            return self._logs_client


    def read(self, execution: str, job_id: str, created_at: float | None, workspace_id: str | None,
             cursor: str | None, limit: int) -> LogPage:
        """One page read now, not shared."""
        workspace = workspace_id or self.settings.workspace_id
        if not workspace:
            return LogPage([], cursor, reason="no Log Analytics workspace is configured for this job (provider_options."
                                              "workspace_id or CONTROLPLANE_CONTAINER_APPS_WORKSPACE_ID)")
        _, _, job = job_parts(job_id)
        now = datetime.now(UTC)
        start = datetime.fromtimestamp((created_at or time.time()) - 60, UTC)
        until = now - timedelta(seconds=self.settings.log_settle_s)
        if until <= start:
            return LogPage([], cursor, reason=f"Log Analytics rows are read once {self.settings.log_settle_s:g} s old "
                                              "(ingestion delay)")
        table = self.settings.log_table if self.settings.log_table != "auto" else self._tables.get(workspace, LOG_TABLE)
        limiter = ratelimit.shared(ratelimit.key("loganalytics", account=workspace, endpoint=self.settings.logs_endpoint),
                                   self.settings.log_queries_per_min, window_s=60.0)

        def query(table: str) -> Any:
            return self._logs().query_workspace(workspace, kql(job, execution, cursor, until, limit, table),
                                                timespan=(start, now + timedelta(minutes=5)))

        def read() -> LogPage:
            nonlocal table
            try:
                try:
                    result = query(table)
                except HttpResponseError as e:
                    if self.settings.log_table != "auto" or not _no_table(e, table):
                        raise
                    table = self._tables[workspace] = MONITOR_TABLE if table == LOG_TABLE else LOG_TABLE
                    result = query(table)  # the workspace has the other destination's table
            except AZURE_ERRORS as e:
                raise classify(e, "Log Analytics") from e
            tables = getattr(result, "tables", None) or getattr(result, "partial_data", None) or []
            rows = [dict(zip(tables[0].columns, row, strict=True)) for row in tables[0].rows] if tables else []
            return _page(rows, cursor, limit)

        return logtail.within_quota(limiter, cursor, f"Log Analytics queries are limited to "
                                    f"{self.settings.log_queries_per_min} a minute per workspace here", read)


def kql(job: str, execution: str, cursor: str | None, until: datetime, take: int, table: str = LOG_TABLE) -> str:
    """The first `take` console rows of one execution after `cursor` (see `_cursor`), oldest
    first in the service's order: TimeGenerated, then _ItemId, with the cursor's tiebreak in the
    query. A job's replicas are named `{execution}-{suffix}`. The time is read as text
    (`tostring`: all 100 ns digits, which a Python datetime would cut to microseconds)."""
    replica, message, stream = LOG_COLUMNS[table]
    where = f"{replica} startswith {_q(execution + '-')}"
    if table == LOG_TABLE:
        where = f"ContainerJobName_s == {_q(job)} and {where}"
    lines = [table, f"| where {where}"]
    after = _cursor(cursor)
    if after is not None:
        at = f"datetime({_render_ticks(after[0])})"
        lines.append(f"| where TimeGenerated > {at} or (TimeGenerated == {at} and strcmp(_ItemId, {_q(after[1])}) > 0)")
    lines += [f"| where TimeGenerated <= datetime({_render_ticks(_ticks_of(until))})",
              "| extend t = tostring(TimeGenerated)",
              "| order by TimeGenerated asc, _ItemId asc",
              f"| take {int(take)}",
              f"| project t, _ItemId, {message}, {stream}"]
    return "\n".join(lines)


def _page(rows: list[dict[str, Any]], cursor: str | None, limit: int) -> LogPage:
    """A page of `limit` lines from query rows (in the query's order) after `cursor`; its cursor
    is the last line's (time in ticks | _ItemId), or the old one."""
    after = _cursor(cursor)
    lines: list[LogLine] = []
    last = None
    for r in rows:
        key = (_parse_ticks(str(r["t"])), str(r["_ItemId"]))
        if after is not None and key <= after:
            continue  # (the query already excludes them; a row at the cursor is never returned twice)
        if len(lines) >= limit:
            break
        message = r.get("Log_s", r.get("Log"))
        stream = r.get("Stream_s", r.get("Stream"))
        lines.append(LogLine(ts=key[0] / TICKS_PER_S, message=str(message or "").rstrip("\n"),
                             stream=str(stream or "stdout")))
        last = key
    return LogPage(lines, f"{_render_ticks(last[0])}|{last[1]}" if last else cursor)


def _cursor(cursor: str | None) -> tuple[int, str] | None:
    """(TimeGenerated in 100 ns ticks since the epoch, _ItemId) of a log cursor, None for the
    start. A cursor is `time|_ItemId`, its time written with 7 fractional digits (any ISO form
    is read, cursors of earlier versions too)."""
    if not cursor:
        return None
    ts, _, item = cursor.partition("|")
    try:
        return _parse_ticks(ts), item
    except ValueError:
        return None  # not a cursor of ours: from the start


_TIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,7})\d*)?(Z|[+-]\d{2}:?\d{2})?$")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _parse_ticks(text: str) -> int:
    """A time as Log Analytics writes it (any number of fractional digits, Z or an offset) ->
    100 ns ticks since the epoch, exactly (ValueError if it is not one)."""
    m = _TIME.match(text.strip())
    if not m:
        raise ValueError(f"not a time: {text!r}")
    y, mo, d, h, mi, s, frac, zone = m.groups()
    at = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=UTC)
    if zone and zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        at -= sign * timedelta(hours=int(zone[1:3]), minutes=int(zone[-2:]))
    return (at - _EPOCH) // timedelta(seconds=1) * TICKS_PER_S + int((frac or "0").ljust(7, "0"))


def _render_ticks(ticks: int) -> str:
    """100 ns ticks since the epoch -> `2026-11-23T10:00:00.1234567Z` (a KQL datetime literal)."""
    secs, frac = divmod(ticks, TICKS_PER_S)
    return (_EPOCH + timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:07d}Z"


def _ticks_of(t: datetime) -> int:
    return (t - _EPOCH) // timedelta(microseconds=1) * 10


def _no_table(e: HttpResponseError, table: str) -> bool:
    """Log Analytics' answer to a query of a table the workspace does not have."""
    return e.status_code == 400 and f"'{table}'" in str(e.message or e) and "resolve" in str(e.message or e)


def _q(text: str) -> str:
    """A KQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
