"""Reading a Cloud Run execution's log from Cloud Logging, one entries.list call a page.

Entries are read oldest first, cursor = timestamp (nanoseconds) + insertId, the service's own
order, both in the query. An answer "search not finished" is continued by the next read at that
cursor. Cloud Logging allows about 60 reads a minute per project: every HTTP request of the
logging client takes a place in a per-project limiter without waiting (a tail over the quota
answers "try again" with its cursor). Entries reach Cloud Logging seconds late (a line that
arrives later with an earlier timestamp than the cursor is not seen by this tail); the runner's
relay (the default log source) has every line.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from google.api_core import exceptions as gexc

from controlplane_providers import logtail, ratelimit
from controlplane_providers.errors import PermanentProviderError, TransientProviderError
from controlplane_providers.gcp.admin import TRANSIENT
from controlplane_providers.gcp.options import CloudRunSettings, job_parts
from controlplane_providers.jobs import LogLine, LogPage

LOGGING_SCOPE = "https://www.googleapis.com/auth/logging.read"


class LogReader:
    """Pages of executions' logs for one provider: a Cloud Logging client per project, pages
    shared by concurrent tails, unfinished searches continued."""

    def __init__(self, settings: Callable[[], CloudRunSettings], credentials: Any):
        self._settings, self.credentials = settings, credentials
        self._logging: dict[str, Any] = {}  # project -> its Cloud Logging client
        self._logging_lock = threading.Lock()
        self._pages = logtail.SharedPages()
        self._searches: dict[tuple[str, str, int], str] = {}  # (execution, cursor, size) -> an unfinished search's token

    @property
    def settings(self) -> CloudRunSettings:
        """The provider's settings as they are now (a test or an operator may replace them)."""
        return self._settings()

    def page(self, execution_name: str, job_path: str, created_at: float | None, cursor: str | None,
             limit: int) -> LogPage:
        """One page of the execution's log after `cursor` (see the module's doc)."""
        return self._pages.get((execution_name, cursor, limit),
                               lambda: self._read_logs(execution_name, job_path, created_at, cursor, limit))

    def _log_limiter(self, project: str) -> ratelimit.SlidingWindowLimiter:
        return ratelimit.shared(ratelimit.key("logging", account=project, endpoint=self.settings.logging_endpoint),
                                self.settings.log_reads_per_min, window_s=60.0)

    def _logging_client(self, project: str) -> Any:
        """The project's Cloud Logging client, whose every HTTP request takes a place in the
        project's read limiter without waiting (ratelimit.OverQuota when none is free)."""
        with self._logging_lock:
            client = self._logging.get(project)
            if client is None:
                import google.auth
                from google.auth.transport.requests import AuthorizedSession
                from google.cloud import logging as gcl

                credentials = self.credentials or google.auth.default(scopes=[LOGGING_SCOPE])[0]
                # (the ignores: google-auth and google-cloud-logging are untyped)
                session = ratelimit.limit_session(AuthorizedSession(credentials),  # type: ignore[no-untyped-call]
                                                  lambda: self._log_limiter(project))
                options = {"api_endpoint": self.settings.logging_endpoint} if self.settings.logging_endpoint else None
                client = self._logging[project] = gcl.Client(  # type: ignore[no-untyped-call]
                    project=project, credentials=credentials, _http=session, _use_grpc=False, client_options=options)
            return client

    def _read_logs(self, execution_name: str, job_path: str, created_at: float | None, cursor: str | None,
                   limit: int) -> LogPage:
        """One page: one entries.list call, from the cursor (the last entry returned: its
        timestamp to the nanosecond and its insertId, the service's own order) on."""
        project, region, job = job_parts(job_path)
        execution = execution_name.rsplit("/", 1)[-1]
        try:
            after = _log_cursor(cursor)
        except ValueError:
            return LogPage([], cursor, reason="malformed cursor: pass the next_cursor of a previous answer")
        terms = [
            'resource.type = "cloud_run_job"',
            f'resource.labels.job_name = "{job}"',
            f'resource.labels.location = "{region}"',
            f'labels."run.googleapis.com/execution_name" = "{execution}"',
        ]
        if after is None:
            # Always bound by time: without a timestamp term Cloud Logging searches the last 24 h only.
            terms.append(f'timestamp >= "{_ns_text(rfc3339((created_at or time.time()) - 60))}"')
        else:
            ts, insert_id = after
            terms.append(f'timestamp >= "{ts}"')
            terms.append(f'(timestamp > "{ts}" OR insertId > {_quoted(insert_id)})')
        body: dict[str, Any] = {"resourceNames": [f"projects/{project}"], "filter": "\n".join(terms),
                                "orderBy": "timestamp asc", "pageSize": limit}
        search = (execution_name, cursor or "", limit)
        token = self._searches.pop(search, None)
        if token:
            body["pageToken"] = token  # the same request, continuing a search that had not finished
        try:
            # The SDK's list_entries pager reads the next page before it looks at max_results (one
            # more call a read) and gives timestamps to the microsecond; its connection sends one
            # request, and answers the entries as the service wrote them.
            answer = self._logging_client(project)._connection.api_request(method="POST", path="/entries:list",
                                                                          data=body)
        except ratelimit.OverQuota as e:
            return logtail.over_quota(cursor, f"Cloud Logging allows {self.settings.log_reads_per_min} reads a "
                                      "minute per project", e.wait_s)
        except TRANSIENT as e:
            raise TransientProviderError(f"Cloud Logging: {type(e).__name__}") from e
        except gexc.GoogleAPICallError as e:
            raise PermanentProviderError(f"Cloud Logging: {e.message}") from e
        entries = answer.get("entries") or []
        if not entries and answer.get("nextPageToken"):
            self._searches[search] = answer["nextPageToken"]
            return LogPage([], cursor, reason="Cloud Logging has not finished searching; ask again to continue")
        keyed = []
        for entry in entries:
            try:
                ts = _ns_text(entry["timestamp"])
            except (KeyError, ValueError):
                continue  # the service stamps every entry; one it did not cannot be placed
            keyed.append(((ts, entry.get("insertId") or ""), LogLine(ts=_epoch(ts), message=_entry_text(entry))))
        page = logtail.after_cursor(keyed, None if after is None else f"{after[0]}|{after[1]}", limit)
        return LogPage(page.lines, page.next_cursor if page.lines else cursor)


def _entry_text(entry: dict[str, Any]) -> str:
    """A LogEntry's line: its textPayload, or its jsonPayload's message (else the whole payload)."""
    if "textPayload" in entry:
        return str(entry["textPayload"]).rstrip("\n")
    payload = entry.get("jsonPayload")
    if isinstance(payload, dict):
        return str(payload.get("message") or payload)
    return "" if payload is None else str(payload)


_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def _ns_text(text: str) -> str:
    """An RFC3339 timestamp as UTC with nine fractional digits and Z: the fixed-width form that
    sorts as the instants do. (proto3 JSON writes 0, 3, 6 or 9 digits.)"""
    m = _TIMESTAMP.fullmatch(text.strip())
    if not m:
        raise ValueError(f"not an RFC3339 timestamp: {text!r}")
    base, frac, zone = m.groups()
    if zone != "Z":
        base = datetime.fromisoformat(base + zone).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{base}.{(frac or '').ljust(9, '0')}Z"


def _epoch(ns_text: str) -> float:
    """Epoch seconds of a `_ns_text` timestamp (for display; cursors keep the text)."""
    return datetime.fromisoformat(ns_text[:19] + "+00:00").timestamp() + int(ns_text[20:29]) / 1e9


def _quoted(text: str) -> str:
    """A string value of the Logging query language."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _log_cursor(cursor: str | None) -> tuple[str, str] | None:
    """(timestamp, insertId) of a log cursor, the timestamp in `_ns_text` form (cursors written
    before nanoseconds were kept carry six digits); None for the start; ValueError if malformed."""
    if not cursor:
        return None
    ts, sep, insert_id = cursor.partition("|")
    if not sep:
        raise ValueError("no insertId")
    return _ns_text(ts), insert_id


def rfc3339(t: datetime | float) -> str:
    """A UTC instant in the one form cursors and filters use (microseconds, Z): equal instants
    give equal strings and the strings sort as the instants do."""
    dt = t if isinstance(t, datetime) else datetime.fromtimestamp(t, UTC)
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
