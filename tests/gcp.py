"""Google Cloud Run Jobs and Cloud Logging offline: one local HTTP server (tests/fakehttp.py,
127.0.0.1 only) that speaks the REST wire of Cloud Run Admin API v2 and of
Cloud Logging v2 `entries.list`, plus an executor thread that plays Cloud Run: it runs each
execution's container command as a local process (the real in-job runner, for the provider
tests) and forwards its output lines to the logging fake as Cloud Run's log agent does.

The real SDK clients talk to it unchanged:

    fake = FakeCloudRun()
    fake.create_job("proj", "us-central1", "cp-exercise", command=["python", "-m", "controlplane_runner"])
    jobs = run_v2.JobsClient(transport="rest", client_options=ClientOptions(api_endpoint=fake.url),
                             credentials=AnonymousCredentials())
    op = jobs.run_job(request={"name": ".../jobs/cp-exercise", "overrides": {...}})
    op.metadata.name             # the Execution; never block on op.result()
    logging.Client(project="proj", _use_grpc=False, credentials=AnonymousCredentials(),
                   client_options={"api_endpoint": fake.url}).list_entries(filter_=...)

Cloud Run routes (all under /v2, answers in proto3 JSON with enums as ints, which is what the
clients ask for with `$alt=json;enum-encoding=int`): jobs/{job}:run, operations/{id},
jobs/{job}/executions (paged, newest first), executions/{id}, executions/{id}:cancel, jobs/{job}.
Errors use Google's JSON error shape, so the clients raise google.api_core.exceptions (404 ->
NotFound, 429 -> TooManyRequests, 503 -> ServiceUnavailable, 400 -> BadRequest).

Where it differs from the real services:
- Jobs are created with `fake.create_job(...)` (there is no CreateJob route). One container per
  job; whatever `taskCount` says, one task (index 0) runs; a failed task is run again up to the
  job's maxRetries (`max_retries=None` leaves it unset: the service's default of 3), as attempt
  1, 2, ...; no parallelism, no resources, no volumes, no IAM.
- Requests are strict, as the service's JSON transcoding is: a body or query field the proto
  does not have answers 400 INVALID_ARGUMENT ("Unknown name ..."), as does a pageSize above 1000
  for entries.list.
- Levers for the edges: `list_lag_s` (an execution is listed only this long after it was
  created; GetExecution sees it at once), `ambiguous_runs` (the next n RunJob calls create their
  execution, then answer 503), `reconcile_s` (after its task ended, an execution's Completed
  condition stays RECONCILING this long, no task running), `unfinished_searches` (the next n
  entries.list calls answer no entries and a nextPageToken: "the search did not finish").
- A task that exceeds its timeout is SIGKILLed and the execution fails with a message saying so
  (no executionReason: the real service's exact reason for this case is not modelled).
- The run_job Operation finishes (done, `response` = the Execution) when the execution finishes,
  whatever its outcome; it never carries an `error`. The operation of a forgotten execution is
  gone too (404).
- stdout and stderr are merged into the log `run.googleapis.com%2Fstdout`; no request logs, and
  system logs (`run.googleapis.com%2Fvarlog%2Fsystem`) only with `fake.system_logs = True`.
- The logging filter language is a subset: comparisons `field op value` (op in = != > >= < <=)
  joined by AND (or whitespace/newlines) and OR, NOT and parentheses, OR binding tighter than
  AND as the service documents; anything else (`:`, regular expressions, functions, unknown
  fields) answers 400 INVALID_ARGUMENT rather than matching wrongly. String comparisons are
  exact (case-sensitive). Timestamps are stamped in nanoseconds and answered as proto3 JSON
  writes them (0, 3, 6 or 9 fractional digits); entries are ordered by timestamp, then insertId.
- Quotas are off unless set (`logging_quota_per_min`); fault injection is random per request.
"""

from __future__ import annotations

import json
import random
import re
import signal
import string
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tests.fakehttp import (
    Answer,
    FakeCloud,
    Request,
    forward_lines,
    killpg,
    page_token,
    play,
    read_page_token,
)

EXECUTION_TYPE = "type.googleapis.com/google.cloud.run.v2.Execution"

# google.cloud.run.v2.Condition.State
CONDITION_PENDING, CONDITION_RECONCILING, CONDITION_FAILED, CONDITION_SUCCEEDED = 1, 2, 3, 4
# google.cloud.run.v2.Condition.ExecutionReason
NON_ZERO_EXIT_CODE, CANCELLED, CANCELLING = 2, 3, 4

TERMINAL = {"succeeded", "failed", "cancelled"}

STDOUT_LOG = "run.googleapis.com%2Fstdout"
SYSTEM_LOG = "run.googleapis.com%2Fvarlog%2Fsystem"


# ---- time helpers ------------------------------------------------------------------------------

def rfc3339(t: float | None) -> str | None:
    """Seconds since the epoch -> RFC3339 UTC with microseconds and Z (as Cloud Run answers)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339_ns(ns: int) -> str:
    """Nanoseconds since the epoch -> RFC3339 UTC as proto3 JSON writes a Timestamp (and Cloud
    Logging answers): Z, and 0, 3, 6 or 9 fractional digits, as few as the value needs."""
    secs, frac = divmod(ns, 1_000_000_000)
    text = datetime.fromtimestamp(secs, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    if frac == 0:
        return text + "Z"
    digits = f"{frac:09d}"
    for width in (3, 6):
        if digits[width:] == "0" * (9 - width):
            return f"{text}.{digits[:width]}Z"
    return f"{text}.{digits}Z"


_RFC3339 = re.compile(r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?"
                      r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))$")


def parse_rfc3339_ns(text: str) -> int:
    """RFC3339 (Z, +hh:mm or +hhmm, up to 9 fractional digits) -> nanoseconds since the epoch."""
    m = _RFC3339.match(text.strip())
    if not m:
        raise ValueError(f"not an RFC3339 timestamp: {text!r}")
    y, mo, d, h, mi, s, frac, z, sign, oh, om = m.groups()
    dt = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s), tzinfo=UTC)
    ns = int(dt.timestamp()) * 1_000_000_000 + int((frac or "0").ljust(9, "0"))
    if not z:
        offset = (int(oh) * 60 + int(om)) * 60 * 1_000_000_000
        ns -= offset if sign == "+" else -offset
    return ns


def parse_duration(text: Any) -> float:
    """Protobuf Duration JSON ("123s", "1.5s") -> seconds."""
    if isinstance(text, (int, float)):
        return float(text)
    if not isinstance(text, str) or not text.endswith("s"):
        raise ValueError(f"not a duration: {text!r}")
    return float(text[:-1])


def duration(seconds: float) -> str:
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{seconds:.9f}".rstrip("0") + "s"


class ApiError(Exception):
    """Answered as Google's JSON error: {"error": {"code", "message", "status"}}, with "details"
    (google.rpc.ErrorInfo and the like) when it has any."""

    def __init__(self, code: int, status: str, message: str, details: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.code, self.status, self.message, self.details = code, status, message, details or []


def quota_refused(reason: str, project: str) -> ApiError:
    """Google's 429 for a quota: RESOURCE_EXHAUSTED, its kind in the ErrorInfo reason
    (google/api/error_reason.proto: RATE_LIMIT_EXCEEDED for a rate, RESOURCE_QUOTA_EXCEEDED for
    an allocation)."""
    info = {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": reason, "domain": "googleapis.com",
            "metadata": {"consumer": f"projects/{project}", "service": "run.googleapis.com"}}
    return ApiError(429, "RESOURCE_EXHAUSTED", "Quota exceeded for the project in this region.", [info])


def not_found(message: str) -> ApiError:
    return ApiError(404, "NOT_FOUND", message)


def invalid(message: str) -> ApiError:
    return ApiError(400, "INVALID_ARGUMENT", message)


# Request fields, as the protos name them in JSON (google/logging/v2/logging.proto,
# google/cloud/run/v2/job.proto and execution.proto); a dict value lists a message's own fields.
LIST_ENTRIES_FIELDS: dict[str, Any] = {"resourceNames": None, "projectIds": None, "filter": None, "orderBy": None,
                                       "pageSize": None, "pageToken": None}
_ENV_VAR = {"name": None, "value": None, "valueSource": None}
RUN_JOB_FIELDS: dict[str, Any] = {"name": None, "validateOnly": None, "etag": None, "overrides": {
    "containerOverrides": {"name": None, "args": None, "env": _ENV_VAR, "clearArgs": None},
    "taskCount": None, "timeout": None}}
CANCEL_FIELDS: dict[str, Any] = {"name": None, "validateOnly": None, "etag": None}
QUERY_FIELDS = {"_list_executions": {"pageSize", "pageToken", "showDeleted"}}
SYSTEM_QUERY = {"$alt", "alt", "prettyPrint", "key"}


def strict(body: Any, fields: dict[str, Any], where: str = "") -> None:
    """ApiError(400) for a field the message does not have, as the service's JSON transcoding
    answers it ("Invalid JSON payload received. Unknown name ...")."""
    for item in body if isinstance(body, list) else [body]:
        if not isinstance(item, dict):
            continue
        for name, value in item.items():
            if name not in fields:
                raise invalid(f'Invalid JSON payload received. Unknown name "{name}" at \'{where}\': Cannot find field.'
                              if where else f'Invalid JSON payload received. Unknown name "{name}": Cannot find field.')
            if isinstance(fields[name], dict):
                strict(value, fields[name], f"{where}.{name}" if where else name)


def _read_page_token(token: str) -> Any:
    try:
        return read_page_token(token)
    except ValueError as e:
        raise invalid(f"Invalid page token: {token!r}") from e


# ---- state ---------------------------------------------------------------------------------------

@dataclass
class _Job:
    project: str
    region: str
    name: str  # short name
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    timeout_s: float
    task_count: int
    labels: dict[str, str]
    max_retries: int | None = 0  # None: unset, the service's default (3)
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    create_time: float = field(default_factory=time.time)
    execution_count: int = 0
    latest: str | None = None  # full name of the latest execution

    @property
    def full_name(self) -> str:
        return f"projects/{self.project}/locations/{self.region}/jobs/{self.name}"

    @property
    def retries(self) -> int:
        return 3 if self.max_retries is None else self.max_retries


@dataclass
class _Execution:
    job: _Job
    short: str
    seq: int
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    task_count: int
    timeout_s: float
    synthetic: bool = False
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    state: str = "pending"  # pending, running, cancelling, succeeded, failed, cancelled
    create_time: float = field(default_factory=time.time)
    created_mono: float = field(default_factory=time.monotonic)
    start_time: float | None = None
    started_mono: float | None = None
    completion_time: float | None = None
    transition_time: float = field(default_factory=time.time)
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    exited_mono: float | None = None
    message: str = ""
    reason: int = 0  # Condition.ExecutionReason of "Completed"
    cancel_requested: bool = False
    sigterm_mono: float | None = None
    timed_out: bool = False
    output_done: threading.Event = field(default_factory=threading.Event)
    generation: int = 1
    max_retries: int = 0
    task_attempt: int = 0  # the task's current attempt (0, then 1.. for each retry)
    ended_mono: float | None = None  # when the task ended for good (the execution then reconciles)
    outcome: tuple[str, str | None, int | None] | None = None  # (state, message, reason) once reconciled

    @property
    def name(self) -> str:
        return f"{self.job.full_name}/executions/{self.short}"


# ---- Cloud Logging ------------------------------------------------------------------------------

_KEYWORD = re.compile(r"(AND|OR|NOT)(?=[\s()]|$)")
_COMPARISON = re.compile(r"""
    (?P<field>[A-Za-z_]\w*(?:\.(?:[A-Za-z_][\w-]*|"(?:[^"\\]|\\.)*"))*)
    \s*(?P<op>>=|<=|!=|=|>|<)\s*
    (?P<value>"(?:[^"\\]|\\.)*"|[^\s"()]+)
""", re.X)
_SEGMENT = re.compile(r'"(?:[^"\\]|\\.)*"|[^.]+')
_STRING_FIELDS = {("resource", "type"), ("insertId",), ("logName",), ("severity",), ("textPayload",)}
_TIME_FIELDS = {("timestamp",), ("receiveTimestamp",)}
Filter = Callable[[dict[str, Any]], bool]


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        return re.sub(r"\\(.)", r"\1", text[1:-1])
    return text


def _tokens(text: str) -> list[tuple[str, Any]]:
    """("(" | ")" | "AND" | "OR" | "NOT", None) and ("cmp", (path, op, value)) tokens."""
    out: list[tuple[str, Any]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        if text[pos] in "()":
            out.append((text[pos], None))
            pos += 1
            continue
        if m := _KEYWORD.match(text, pos):
            out.append((m.group(1), None))
            pos = m.end()
            continue
        m = _COMPARISON.match(text, pos)
        if not m:
            raise invalid(f"Unsupported filter (the fake understands `field op \"value\"` with AND, OR, NOT and "
                          f"parentheses) near: {text[pos:pos + 40]!r}")
        pos = m.end()
        path = tuple(_unquote(s) for s in _SEGMENT.findall(m.group("field")))
        op, raw = m.group("op"), _unquote(m.group("value"))
        if path in _TIME_FIELDS:
            try:
                value: Any = parse_rfc3339_ns(raw)
            except ValueError as e:
                raise invalid(f"Invalid timestamp in filter: {raw!r}") from e
        elif path in _STRING_FIELDS or (len(path) == 3 and path[:2] == ("resource", "labels")) \
                or (len(path) == 2 and path[0] == "labels"):
            value = raw
        else:
            raise invalid(f"Unsupported field in filter: {m.group('field')!r}")
        out.append(("cmp", (path, op, value)))


def parse_filter(text: str) -> Filter:
    """A filter -> a predicate on stored entries; ApiError(400) if unsupported or malformed.
    Precedence as Cloud Logging documents it: NOT, then OR, then AND (or juxtaposition)."""
    tokens = _tokens(text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos][0] if pos < len(tokens) else None

    def conjunction() -> Filter:
        nonlocal pos
        parts = [disjunction()]
        while peek() not in (None, ")"):
            if peek() == "AND":
                pos += 1
            parts.append(disjunction())
        return lambda e: all(p(e) for p in parts)

    def disjunction() -> Filter:
        nonlocal pos
        parts = [negation()]
        while peek() == "OR":
            pos += 1
            parts.append(negation())
        return lambda e: any(p(e) for p in parts)

    def negation() -> Filter:
        nonlocal pos
        if peek() == "NOT":
            pos += 1
            inner = primary()
            return lambda e: not inner(e)
        return primary()

    def primary() -> Filter:
        nonlocal pos
        if pos >= len(tokens):
            raise invalid(f"Filter ends early: {text!r}")
        kind, value = tokens[pos]
        pos += 1
        if kind == "(":
            inner = conjunction()
            if peek() != ")":
                raise invalid(f"Unbalanced parentheses in filter: {text!r}")
            pos += 1
            return inner
        if kind != "cmp":
            raise invalid(f"Unexpected {kind} in filter: {text!r}")
        path, op, wanted = value
        return lambda e: _compare(_field_value(e, path), op, wanted)

    if not tokens:
        return lambda e: True
    predicate = conjunction()
    if pos != len(tokens):
        raise invalid(f"Unbalanced parentheses in filter: {text!r}")
    return predicate


def _field_value(entry: dict[str, Any], path: tuple[str, ...]) -> Any:
    if path in _TIME_FIELDS:
        return entry["_ts_ns"] if path == ("timestamp",) else entry["_recv_ns"]
    node: Any = entry
    for key in path:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _compare(actual: Any, op: str, wanted: Any) -> bool:
    if actual is None:
        return op == "!="
    return {"=": actual == wanted, "!=": actual != wanted, ">": actual > wanted, ">=": actual >= wanted,
            "<": actual < wanted, "<=": actual <= wanted}[op]


class FakeCloudLogging:
    """The entries of the log store, and `POST /v2/entries:list`. Served by FakeCloudRun's server
    (so `url` is the same); its controls are also reachable as attributes of FakeCloudRun."""

    def __init__(self, lock: threading.RLock):
        self._lock = lock
        self.url = ""
        self.log_delay_s = 0.0  # ingestion delay: an entry is listed only this long after it is written
        self.logging_quota_per_min: int | None = None  # entries.list calls per rolling 60 s; None: no limit
        self.unfinished_searches = 0  # the next n entries.list calls answer no entries and a nextPageToken
        self._entries: list[dict[str, Any]] = []
        self._last_ns = 0
        self._seq = 0
        self._calls: list[float] = []  # monotonic times of accepted entries.list calls

    def add_log(self, project: str, region: str, job: str, execution: str, text: str, ts: datetime | float | str | None = None,
                *, log: str = STDOUT_LOG, severity: str = "DEFAULT", insert_id: str | None = None) -> dict[str, Any]:
        """Write an entry as Cloud Run's agent would for a line of `execution` (short name).
        `ts`: a datetime, epoch seconds or RFC3339 text (up to nanoseconds); default now.
        `insert_id`: default a fresh one (insertIds need not grow with time)."""
        with self._lock:
            now_ns = time.time_ns()
            if ts is None:
                ts_ns = max(now_ns, self._last_ns + 1)
                self._last_ns = ts_ns
            elif isinstance(ts, datetime):
                ts_ns = int(ts.timestamp()) * 1_000_000_000 + ts.microsecond * 1000
            elif isinstance(ts, str):
                ts_ns = parse_rfc3339_ns(ts)
            else:
                ts_ns = int(ts * 1_000_000_000)
            self._seq += 1
            entry = {
                "logName": f"projects/{project}/logs/{log}",
                "resource": {"type": "cloud_run_job", "labels": {"project_id": project, "job_name": job, "location": region}},
                "labels": {"run.googleapis.com/execution_name": execution, "run.googleapis.com/task_index": "0",
                           "run.googleapis.com/task_attempt": "0"},
                "timestamp": rfc3339_ns(ts_ns),
                "receiveTimestamp": rfc3339_ns(max(now_ns, ts_ns)),
                "insertId": insert_id or f"{self._seq:012x}{random.getrandbits(24):06x}",
                "textPayload": text,
                "severity": severity,
                "_ts_ns": ts_ns, "_recv_ns": max(now_ns, ts_ns), "_project": project,
                "_visible_at": time.monotonic() + self.log_delay_s,
            }
            self._entries.append(entry)
            return _public(entry)

    def log_entries(self, execution: str | None = None) -> list[dict[str, Any]]:
        """Every entry written so far (visible or not), in timestamp order; `execution` is a short
        or full execution name."""
        short = execution.rsplit("/", 1)[-1] if execution else None
        with self._lock:
            found = [e for e in self._entries
                     if short is None or e["labels"].get("run.googleapis.com/execution_name") == short]
            found.sort(key=lambda e: (e["_ts_ns"], e["insertId"]))
            return [_public(e) for e in found]

    def entries_list(self, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            now = time.monotonic()
            if self.logging_quota_per_min is not None:
                self._calls = [t for t in self._calls if now - t < 60]
                if len(self._calls) >= self.logging_quota_per_min:
                    raise ApiError(429, "RESOURCE_EXHAUSTED",
                                   "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per minute' "
                                   "of service 'logging.googleapis.com'.")
                self._calls.append(now)
            strict(body, LIST_ENTRIES_FIELDS)
            names = body.get("resourceNames") or []
            if not names:
                raise invalid("resourceNames is required")
            projects = set()
            for n in names:
                m = re.fullmatch(r"projects/([^/]+)", n)
                if not m:
                    raise invalid(f"Unsupported resource name (the fake knows projects/ID only): {n!r}")
                projects.add(m.group(1))
            matches = parse_filter(body.get("filter") or "")
            order = " ".join((body.get("orderBy") or "timestamp asc").lower().split())
            if order not in ("timestamp", "timestamp asc", "timestamp desc"):
                raise invalid(f"Unsupported orderBy: {body.get('orderBy')!r}")
            desc = order == "timestamp desc"
            try:
                size = int(body.get("pageSize") or 50)
            except (TypeError, ValueError) as e:
                raise invalid(f"Invalid pageSize: {body.get('pageSize')!r}") from e
            if size < 0 or size > 1000:
                raise invalid(f"pageSize must be between 0 and 1000, not {size}")
            if self.unfinished_searches > 0:  # searched for a while, found nothing yet, not done
                self.unfinished_searches -= 1
                return {"nextPageToken": page_token(body.get("pageToken") or None)}
            found = [e for e in self._entries if e["_project"] in projects and e["_visible_at"] <= now
                     and matches(e)]
            found.sort(key=lambda e: (e["_ts_ns"], e["insertId"]), reverse=desc)
            cursor = _read_page_token(body["pageToken"]) if body.get("pageToken") else None
            while isinstance(cursor, str):  # the token of an unfinished search: where it stood
                cursor = _read_page_token(cursor) if cursor else None
            if cursor is not None:
                try:
                    after = (int(cursor[0]), str(cursor[1]))
                except (TypeError, ValueError, IndexError, KeyError) as e:
                    raise invalid("Invalid page token") from e
                found = [e for e in found if ((e["_ts_ns"], e["insertId"]) < after if desc else (e["_ts_ns"], e["insertId"]) > after)]
            page = found[:size]
            out: dict[str, Any] = {"entries": [_public(e) for e in page]}
            if len(found) > size and page:
                out["nextPageToken"] = page_token([page[-1]["_ts_ns"], page[-1]["insertId"]])
            return out


def _public(entry: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in entry.items() if not k.startswith("_")}))


# ---- Cloud Run -------------------------------------------------------------------------------------

_P = r"projects/(?P<p>[^/]+)/locations/(?P<r>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("POST", re.compile(rf"/v2/{_P}/jobs/(?P<j>[^/:]+):run"), "_run_job"),
    ("GET", re.compile(rf"/v2/{_P}/jobs/(?P<j>[^/:]+)"), "_get_job"),
    ("GET", re.compile(rf"/v2/{_P}/jobs/(?P<j>[^/:]+)/executions"), "_list_executions"),
    ("GET", re.compile(rf"/v2/{_P}/jobs/(?P<j>[^/:]+)/executions/(?P<e>[^/:]+)"), "_get_execution"),
    ("POST", re.compile(rf"/v2/{_P}/jobs/(?P<j>[^/:]+)/executions/(?P<e>[^/:]+):cancel"), "_cancel_execution"),
    ("GET", re.compile(rf"/v2/{_P}/operations/(?P<o>[^/:]+)"), "_get_operation"),
    ("POST", re.compile(r"/v2/entries:list"), "_entries_list"),
]


class FakeCloudRun(FakeCloud):
    """Cloud Run Admin API v2 (jobs, executions, operations) and Cloud Logging entries.list on one
    local port, with an executor thread that runs executions as local processes. See the module
    docstring; every control is a plain attribute or method and is safe to use from any thread."""

    def __init__(self, *, pending_s: float = 0.05, start_jobs: bool = True, seed: int | None = None,
                 cancel_grace_s: float = 10.0):
        super().__init__(seed=seed)
        self.start_jobs = start_jobs  # False: executions stay pending (no capacity)
        self.pending_s = pending_s  # how long an execution is pending before its process starts
        self.ignore_cancel = False  # True: :cancel answers 200 and nothing happens
        self.cancel_grace_s = cancel_grace_s  # SIGTERM -> SIGKILL delay after a cancel (Cloud Run: 10 s)
        self.system_logs = False  # True: also write run.googleapis.com/varlog/system entries (start, exit)
        self.fault_rate = 0.0  # share of all requests answered 429/503 before doing anything
        self.list_lag_s = 0.0  # ListExecutions shows an execution only this long after its creation
        self.ambiguous_runs = 0  # the next n RunJob calls create their execution, then answer 503
        # The next n RunJob calls answer 429 RESOURCE_EXHAUSTED (creating nothing) for an allocation
        # quota (RESOURCE_QUOTA_EXCEEDED) or for the rate (RATE_LIMIT_EXCEEDED).
        self.quota_refusals = 0
        self.rate_refusals = 0
        self.reconcile_s = 0.0  # an ended task's execution stays RECONCILING this long before it completes
        # Called in a RunJob's own thread, outside the fake's lock: "received" before the execution is
        # made, "created" after (before the answer). A hook that waits holds that call alone.
        self.launch_hook: Callable[[str], None] | None = None
        # Called with (method, path) after a request's answer is made and before it is sent, outside
        # the lock: what the caller reads is what was true before the hook ran (a poll that saw an
        # execution pending, and the execution started meanwhile).
        self.answer_hook: Callable[[str, str], None] | None = None
        self.logging = FakeCloudLogging(self._lock)
        self._names = random.Random()
        self._jobs: dict[str, _Job] = {}
        self._executions: dict[str, _Execution] = {}  # full name -> execution (forgotten ones removed)
        self._operations: dict[str, str] = {}  # operation full name -> execution full name
        self._seq = 0
        self._synthetic = 0
        self._serve("fake-cloud-run")
        self.logging.url = self.url

    # -- setup and inspection (tests) -------------------------------------------------------------

    def create_job(self, project: str, region: str, job: str, *, command: list[str], args: list[str] | None = None,
                   env: dict[str, str] | None = None, image: str = "runner:1", timeout_s: float = 600,
                   task_count: int = 1, labels: dict[str, str] | None = None, max_retries: int | None = 0) -> str:
        """Create (or replace) a job; returns its full name. `max_retries=None` leaves it unset, as
        a job made without it (the console, `gcloud run jobs create`): Cloud Run's default, 3."""
        j = _Job(project, region, job, image, list(command), list(args or []), dict(env or {}), float(timeout_s),
                 task_count, dict(labels or {}), max_retries)
        with self._lock:
            self._jobs[j.full_name] = j
        return j.full_name

    def executions(self, job: str | None = None) -> list[dict[str, Any]]:
        """Server-side state of the executions (of `job`, a short or full name), oldest first."""
        short = job.rsplit("/", 1)[-1] if job else None
        with self._lock:
            return [{"name": e.name, "short": e.short, "job": e.job.name, "project": e.job.project,
                     "region": e.job.region, "state": e.state, "env": dict(e.env), "args": list(e.args),
                     "command": list(e.command), "pid": e.proc.pid if e.proc else None, "exit_code": e.exit_code,
                     "message": e.message, "task_count": e.task_count, "timeout_s": e.timeout_s,
                     "synthetic": e.synthetic, "cancel_requested": e.cancel_requested}
                    for e in sorted(self._executions.values(), key=lambda e: e.seq)
                    if short is None or e.job.name == short]

    def execution_json(self, name: str) -> dict[str, Any]:
        """The Execution as the API answers it (full or short name)."""
        with self._lock:
            return self._execution_json(self._find(name))

    def forget(self, execution: str) -> None:
        """The execution disappears (Cloud Run prunes past 1,000 per job); its process is killed."""
        with self._lock:
            e = self._find(execution)
            del self._executions[e.name]
            self._active.discard(e.name)
            for op in [o for o, n in self._operations.items() if n == e.name]:
                del self._operations[op]
            proc = e.proc
        if proc is not None:
            killpg(proc, signal.SIGKILL)

    def add_executions(self, project: str, region: str, job: str, n: int, state: str = "running") -> list[str]:
        """Insert n synthetic executions that run no process, with env CONTROLPLANE_JOB_NAME=synthetic-{i}
        (i counts on across calls); they stay `state` (pending or running) until `finish` (a :cancel
        ends them at once, unless ignore_cancel). Creates the job if needed. Returns their full names."""
        if state not in ("pending", "running"):
            raise ValueError("state must be pending or running")
        full = f"projects/{project}/locations/{region}/jobs/{job}"
        with self._lock:
            if full not in self._jobs:
                self.create_job(project, region, job, command=["python", "-m", "controlplane_runner"])
            j = self._jobs[full]
            names = []
            for _ in range(n):
                i = self._synthetic
                self._synthetic += 1
                e = self._new_execution(j, args=list(j.args), env={**j.env, "CONTROLPLANE_JOB_NAME": f"synthetic-{i}"},
                                        task_count=j.task_count, timeout_s=j.timeout_s, synthetic=True)
                if state == "running":
                    e.state, e.start_time, e.started_mono = "running", e.create_time, e.created_mono
                names.append(e.name)
            return names

    # logging controls, reachable on the Cloud Run fake too
    @property
    def log_delay_s(self) -> float:
        return self.logging.log_delay_s

    @log_delay_s.setter
    def log_delay_s(self, value: float) -> None:
        self.logging.log_delay_s = value

    @property
    def logging_quota_per_min(self) -> int | None:
        return self.logging.logging_quota_per_min

    @logging_quota_per_min.setter
    def logging_quota_per_min(self, value: int | None) -> None:
        self.logging.logging_quota_per_min = value

    @property
    def unfinished_searches(self) -> int:
        return self.logging.unfinished_searches

    @unfinished_searches.setter
    def unfinished_searches(self, value: int) -> None:
        self.logging.unfinished_searches = value

    def log_entries(self, execution: str | None = None) -> list[dict[str, Any]]:
        return self.logging.log_entries(execution)

    def add_log(self, project: str, region: str, job: str, execution: str, text: str, ts: Any = None, **kw: Any) -> dict[str, Any]:
        return self.logging.add_log(project, region, job, execution.rsplit("/", 1)[-1], text, ts, **kw)

    # -- HTTP dispatch -------------------------------------------------------------------------------

    def start(self, execution: str) -> None:
        """A pending execution (full or short name) starts now, whether or not `start_jobs`."""
        with self._lock:
            e = self._find(execution)
            if e.state == "pending":
                self._start(e)

    def _respond(self, r: Request) -> Answer:
        if self._stop.is_set():
            status, payload = _error(ApiError(503, "UNAVAILABLE", "The fake is shutting down."))
        else:
            status, payload = self.handle(r.method, r.path, r.query, r.body)
            hook = self.answer_hook
            if hook is not None:
                hook(r.method, r.path)
        return status, payload, {}

    def handle(self, method: str, path: str, query: dict[str, list[str]], body: bytes) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append((time.monotonic(), method, path))
            if self.fault_rate > 0 and self.rng.random() < self.fault_rate:
                self.faults += 1
                if self.rng.random() < 0.5:
                    return _error(ApiError(429, "RESOURCE_EXHAUSTED", "Quota exceeded (injected fault)."))
                return _error(ApiError(503, "UNAVAILABLE", "The service is currently unavailable (injected fault)."))
        try:
            for verb, pattern, handler in _ROUTES:
                m = pattern.fullmatch(path)
                if m and verb == method:
                    try:
                        payload = json.loads(body) if body.strip() else {}
                    except ValueError as e:
                        raise invalid(f"Invalid JSON payload: {e}") from e
                    for name in query.keys() - SYSTEM_QUERY - QUERY_FIELDS.get(handler, set()):
                        raise invalid(f'Invalid JSON payload received. Unknown name "{name}": Cannot bind query '
                                      "parameter.")
                    strict(payload, {"_run_job": RUN_JOB_FIELDS, "_cancel_execution": CANCEL_FIELDS,
                                     "_entries_list": LIST_ENTRIES_FIELDS}.get(handler, {}))
                    return 200, getattr(self, handler)(query=query, body=payload, **m.groupdict())
            raise not_found(f"The requested URL {path} was not found on this server ({method}).")
        except ApiError as e:
            return _error(e)

    def _run_job(self, p: str, r: str, j: str, query: Any, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            for kind, reason in (("quota_refusals", "RESOURCE_QUOTA_EXCEEDED"), ("rate_refusals", "RATE_LIMIT_EXCEEDED")):
                if getattr(self, kind) > 0:
                    setattr(self, kind, getattr(self, kind) - 1)
                    raise quota_refused(reason, p)
        hook = None if body.get("validateOnly") else self.launch_hook
        if hook is not None:
            hook("received")
        answer = self._make_execution(p, r, j, body)
        if hook is not None:
            hook("created")
        return answer

    def _make_execution(self, p: str, r: str, j: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            job = self._job(p, r, j)
            overrides = body.get("overrides") or {}
            args, env = list(job.args), dict(job.env)
            containers = overrides.get("containerOverrides") or []
            if len(containers) > 1:
                raise invalid("The job has one container; at most one container override is allowed.")
            for c in containers:
                if c.get("clearArgs"):
                    args = []
                elif c.get("args"):
                    args = list(c["args"])
                for var in c.get("env") or []:
                    if "name" not in var:
                        raise invalid("An env override needs a name.")
                    env[var["name"]] = var.get("value", "")
            try:
                timeout_s = parse_duration(overrides["timeout"]) if overrides.get("timeout") else job.timeout_s
            except ValueError as e:
                raise invalid(str(e)) from e
            task_count = int(overrides.get("taskCount") or job.task_count)
            if body.get("validateOnly"):
                e = _Execution(job, f"{job.name}-xxxxx", 0, job.image, job.command, args, env, task_count, timeout_s)
                return self._operation(p, r, e, register=False)
            e = self._new_execution(job, args=args, env=env, task_count=task_count, timeout_s=timeout_s)
            self._active.add(e.name)
            if self.ambiguous_runs > 0:  # created, and then the answer is lost in a 5xx
                self.ambiguous_runs -= 1
                raise ApiError(503, "UNAVAILABLE", "The service is currently unavailable.")
            return self._operation(p, r, e)

    def _get_job(self, p: str, r: str, j: str, **_: Any) -> dict[str, Any]:
        with self._lock:
            job = self._job(p, r, j)
            out: dict[str, Any] = {
                "name": job.full_name, "uid": job.uid, "generation": "1", "labels": job.labels,
                "createTime": rfc3339(job.create_time), "updateTime": rfc3339(job.create_time),
                "launchStage": 4,  # GA
                "template": {"taskCount": job.task_count, "parallelism": 0, "template": {
                    "containers": [_container(job.image, job.command, job.args, job.env)],
                    "maxRetries": job.retries, "timeout": duration(job.timeout_s)}},
                "observedGeneration": "1", "executionCount": job.execution_count, "reconciling": False,
                "etag": f'"{job.uid[:8]}"',
            }
            latest = self._executions.get(job.latest or "")
            if latest is not None:
                out["latestCreatedExecution"] = {"name": latest.name, "createTime": rfc3339(latest.create_time),
                                                 **({"completionTime": rfc3339(latest.completion_time)} if latest.completion_time else {})}
            return out

    def _list_executions(self, p: str, r: str, j: str, query: dict[str, list[str]], **_: Any) -> dict[str, Any]:
        try:
            size = int((query.get("pageSize") or ["0"])[0] or 0)
        except ValueError as e:
            raise invalid("Invalid pageSize") from e
        if size < 0:
            raise invalid("pageSize must not be negative")
        size = min(size or 100, 1000)
        token = (query.get("pageToken") or [""])[0]
        before = None
        if token:
            cursor = _read_page_token(token)
            if not isinstance(cursor, int):
                raise invalid(f"Invalid page token: {token!r}")
            before = cursor
        with self._lock:
            job = self._job(p, r, j)
            now = time.monotonic()
            found = sorted((e for e in self._executions.values() if e.job is job and (before is None or e.seq < before)
                            and now - e.created_mono >= self.list_lag_s), key=lambda e: -e.seq)
            out: dict[str, Any] = {"executions": [self._execution_json(e) for e in found[:size]]}
            if len(found) > size:
                out["nextPageToken"] = page_token(found[size - 1].seq)
            return out

    def _get_execution(self, p: str, r: str, j: str, e: str, **_: Any) -> dict[str, Any]:
        with self._lock:
            return self._execution_json(self._execution(p, r, j, e))

    def _cancel_execution(self, p: str, r: str, j: str, e: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        with self._lock:
            ex = self._execution(p, r, j, e)
            if body.get("validateOnly") or self.ignore_cancel or ex.state in TERMINAL or ex.state == "ending" \
                    or ex.cancel_requested:
                return self._operation(p, r, ex)
            ex.cancel_requested = True
            if ex.state == "pending" or (ex.synthetic and ex.proc is None):
                self._complete(ex, "cancelled")
            else:
                ex.state, ex.reason, ex.transition_time = "cancelling", CANCELLING, time.time()
                ex.message = "The execution is being cancelled."
            return self._operation(p, r, ex)

    def _get_operation(self, p: str, r: str, o: str, **_: Any) -> dict[str, Any]:
        name = f"projects/{p}/locations/{r}/operations/{o}"
        with self._lock:
            ex = self._executions.get(self._operations.get(name, ""))
            if ex is None:
                raise not_found(f"Operation {name} not found.")
            return self._operation_json(name, ex)

    def _entries_list(self, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        return self.logging.entries_list(body)

    # -- helpers ------------------------------------------------------------------------------------

    def _job(self, p: str, r: str, j: str) -> _Job:
        job = self._jobs.get(f"projects/{p}/locations/{r}/jobs/{j}")
        if job is None:
            raise not_found(f"Resource '{j}' of kind 'JOB' in region '{r}' in project '{p}' does not exist.")
        return job

    def _execution(self, p: str, r: str, j: str, e: str) -> _Execution:
        ex = self._executions.get(f"projects/{p}/locations/{r}/jobs/{j}/executions/{e}")
        if ex is None:
            raise not_found(f"Resource '{e}' of kind 'EXECUTION' in region '{r}' in project '{p}' does not exist.")
        return ex

    def _ended(self, e: _Execution) -> bool:
        return e.state in TERMINAL

    def _exited(self, e: _Execution, exit_code: int) -> None:
        self._complete(e, "succeeded" if exit_code == 0 else "failed")

    def _find(self, name: str) -> _Execution:
        if name in self._executions:
            return self._executions[name]
        for e in self._executions.values():
            if e.short == name:
                return e
        raise KeyError(name)

    def _new_execution(self, job: _Job, *, args: list[str], env: dict[str, str], task_count: int, timeout_s: float,
                       synthetic: bool = False) -> _Execution:
        while True:
            short = f"{job.name}-" + "".join(self._names.choices(string.ascii_lowercase + string.digits, k=5))
            if f"{job.full_name}/executions/{short}" not in self._executions:
                break
        self._seq += 1
        e = _Execution(job, short, self._seq, job.image, list(job.command), args, env, task_count, timeout_s, synthetic=synthetic,
                       max_retries=job.retries)
        self._executions[e.name] = e
        job.execution_count += 1
        job.latest = e.name
        return e

    def _operation(self, p: str, r: str, e: _Execution, register: bool = True) -> dict[str, Any]:
        name = f"projects/{p}/locations/{r}/operations/{uuid.uuid4()}"
        if register:
            self._operations[name] = e.name
        return self._operation_json(name, e)

    def _operation_json(self, name: str, e: _Execution) -> dict[str, Any]:
        body = {"@type": EXECUTION_TYPE, **self._execution_json(e)}
        op: dict[str, Any] = {"name": name, "metadata": body, "done": e.state in TERMINAL}
        if e.state in TERMINAL:
            op["response"] = body
        return op

    def _execution_json(self, e: _Execution) -> dict[str, Any]:
        done = e.state in TERMINAL
        started = e.start_time is not None
        completed: dict[str, Any] = {"type": "Completed", "lastTransitionTime": rfc3339(e.transition_time)}
        if e.state == "pending":
            completed.update(state=CONDITION_PENDING, message="Waiting for the execution to start.")
        elif e.state in ("running", "cancelling"):
            completed.update(state=CONDITION_RECONCILING, message=e.message or "Execution is running.")
        elif e.state == "ending":
            completed.update(state=CONDITION_RECONCILING, message="Execution is completing.")
        elif e.state == "succeeded":
            completed.update(state=CONDITION_SUCCEEDED, message="Execution completed successfully in "
                             f"{(e.completion_time or 0) - (e.start_time or 0):.1f}s.")
        else:
            completed.update(state=CONDITION_FAILED, message=e.message)
        if e.reason:
            completed["executionReason"] = e.reason
        conditions = [
            {"type": "ResourcesAvailable", "state": CONDITION_SUCCEEDED if started else CONDITION_PENDING,
             "lastTransitionTime": rfc3339(e.start_time or e.create_time),
             **({} if started else {"message": "Provisioning resources."})},
            {"type": "Started", "state": CONDITION_SUCCEEDED if started else CONDITION_PENDING,
             "lastTransitionTime": rfc3339(e.start_time or e.create_time)},
            completed,
        ]
        state = e.state
        ended = e.outcome[0] if state == "ending" and e.outcome else state
        j = e.job
        log_filter = (f'resource.type = "cloud_run_job"\nresource.labels.job_name = "{j.name}"\n'
                      f'resource.labels.location = "{j.region}"\nlabels."run.googleapis.com/execution_name" = "{e.short}"')
        out: dict[str, Any] = {
            "name": e.name, "uid": e.uid, "generation": str(e.generation),
            "labels": {"run.googleapis.com/jobUid": j.uid, **j.labels},
            "createTime": rfc3339(e.create_time), "updateTime": rfc3339(e.transition_time),
            "launchStage": 4, "job": j.name, "parallelism": 0, "taskCount": e.task_count,
            "template": {"containers": [_container(e.image, e.command, e.args, e.env)], "maxRetries": e.max_retries,
                         "timeout": duration(e.timeout_s)},
            "reconciling": not done, "conditions": conditions, "observedGeneration": str(e.generation),
            "runningCount": 1 if state in ("running", "cancelling") else 0,
            "succeededCount": 1 if ended == "succeeded" else 0,
            "failedCount": 1 if ended == "failed" else 0,
            "cancelledCount": 1 if ended == "cancelled" else 0,
            "retriedCount": e.task_attempt,
            "logUri": (f"https://console.cloud.google.com/logs/viewer?project={quote(j.project)}"
                       f"&advancedFilter={quote(log_filter, safe='')}"),
            "etag": f'"{e.uid[:8]}-{e.generation}"',
        }
        if e.start_time is not None:
            out["startTime"] = rfc3339(e.start_time)
        if e.completion_time is not None:
            out["completionTime"] = rfc3339(e.completion_time)
        return out

    # -- the executor: plays Cloud Run -----------------------------------------------------------------

    def _step(self, e: _Execution) -> None:
        now = time.monotonic()
        with self._lock:
            state = e.state
            if state in TERMINAL:
                self._active.discard(e.name)
                return
            if state == "pending":
                if self.start_jobs and now - e.created_mono >= self.pending_s:
                    self._start(e)
                return
            if state == "ending":  # the task ended; the execution's Completed condition catches up
                if e.outcome is not None and e.ended_mono is not None and now - e.ended_mono >= self.reconcile_s:
                    self._complete(e, *e.outcome)
                return
        assert e.proc is not None
        code = play(e, stopping=e.cancel_requested, grace_s=self.cancel_grace_s, now=now)
        if code is None:
            return
        with self._lock:
            if e.state in TERMINAL:
                return
            e.exit_code = code
            if self.system_logs:
                self.logging.add_log(e.job.project, e.job.region, e.job.name, e.short,
                                     f"Container called exit({code}).", log=SYSTEM_LOG)
            if e.cancel_requested:
                self._complete(e, "cancelled")
            elif code != 0 and e.task_attempt < e.max_retries:  # the task is run again: attempt n+1
                e.task_attempt += 1
                e.proc, e.exited_mono, e.sigterm_mono, e.timed_out = None, None, None, False
                e.output_done = threading.Event()
                self._start(e)
            elif e.timed_out:
                self._end(e, "failed", f"Task {e.short}-task0 exceeded the configured timeout of "
                                       f"{duration(e.timeout_s)} and was stopped; the execution failed.", 0)
            elif code == 0:
                self._end(e, "succeeded")
            else:
                self._end(e, "failed")

    def _end(self, e: _Execution, state: str, message: str | None = None, reason: int | None = None) -> None:
        """The task has ended for good: the execution completes now, or after `reconcile_s`."""
        if self.reconcile_s <= 0:
            self._complete(e, state, message, reason)
            return
        e.state, e.ended_mono, e.outcome, e.transition_time = "ending", time.monotonic(), (state, message, reason), time.time()

    def _start(self, e: _Execution) -> None:
        cmd = [*e.command, *e.args]
        env = {"CLOUD_RUN_EXECUTION": e.short, "CLOUD_RUN_JOB": e.job.name,
               "CLOUD_RUN_TASK_INDEX": "0", "CLOUD_RUN_TASK_ATTEMPT": str(e.task_attempt), "CLOUD_RUN_TASK_COUNT": str(e.task_count),
               **e.env}
        if e.start_time is None:
            e.start_time = time.time()
        e.started_mono, e.transition_time = time.monotonic(), time.time()
        try:
            proc = self.spawn(cmd, env, self.hidden_env)
        except OSError as exc:
            e.exit_code = 127
            self._complete(e, "failed", f"Task {e.short}-task0 failed to start: {exc}", reason=0)
            return
        e.proc, e.state = proc, "running"
        self._started(e.name, proc, e.env.get("CONTROLPLANE_JOB_NAME", e.job.name))
        forward_lines(proc, lambda line: self.logging.add_log(e.job.project, e.job.region, e.job.name, e.short, line),
                      e.output_done, name=f"logs-{e.short}")

    def _complete(self, e: _Execution, state: str, message: str | None = None, reason: int | None = None) -> None:
        e.state = state
        e.completion_time = e.transition_time = time.time()
        if state == "succeeded":
            e.reason, e.message = 0, ""
        elif state == "cancelled":
            e.reason, e.message = CANCELLED, message or "The execution was cancelled."
        else:
            e.reason = NON_ZERO_EXIT_CODE if reason is None else reason
            e.message = message or (f"Task {e.short}-task0 failed with exit code {e.exit_code}; "
                                    "the execution failed (1 task failed to complete).")
        self._active.discard(e.name)


def _container(image: str, command: list[str], args: list[str], env: dict[str, str]) -> dict[str, Any]:
    return {"image": image, "command": list(command), "args": list(args),
            "env": [{"name": k, "value": v} for k, v in env.items()],
            "resources": {"limits": {"cpu": "1000m", "memory": "512Mi"}}}


def _error(e: ApiError) -> tuple[int, dict[str, Any]]:
    error: dict[str, Any] = {"code": e.code, "message": e.message, "status": e.status}
    if e.details:
        error["details"] = e.details
    return e.code, {"error": error}


# ---- clients (the real SDKs pointed at the fake) ---------------------------------------------------

def run_clients(url: str) -> tuple[Any, Any]:
    """(JobsClient, ExecutionsClient) of google.cloud.run_v2 over REST against `url`."""
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import run_v2

    opts = ClientOptions(api_endpoint=url)
    return (run_v2.JobsClient(transport="rest", client_options=opts, credentials=AnonymousCredentials()),
            run_v2.ExecutionsClient(transport="rest", client_options=opts, credentials=AnonymousCredentials()))


def logging_client(url: str, project: str) -> Any:
    """google.cloud.logging.Client over its JSON REST API against `url`."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import logging as gcl

    return gcl.Client(project=project, credentials=AnonymousCredentials(), _use_grpc=False,
                      client_options={"api_endpoint": url})


# ---- the catalog the tests and the benchmark use ------------------------------------------------
PROJECT, REGION, JOB = "cp-proj", "us-central1", "cp-exercise"
RUNNER = ["python", "-m", "controlplane_runner", "--"]  # the runner image's entrypoint


def cloud_run_catalog(home: Path, *, job: str = JOB, retry: str = "{ max_attempts = 1 }") -> None:
    """The default catalog with `exercise` on Cloud Run (the fake's job) in its own resource class."""
    from tests.cloud import exercise_catalog

    exercise_catalog(home, provider="cloud_run", resource_class="cloudrun", retry=retry,
                     options=f'project = "{PROJECT}", region = "{REGION}", job = "{job}"',
                     resources="max_concurrency = 4\nmax_queue_length = 100\ncpu = 1\nmemory_mb = 512")
