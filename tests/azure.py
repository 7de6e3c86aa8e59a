"""Azure Container Apps Jobs and Log Analytics offline: one local HTTPS server (tests/fakehttp.py,
127.0.0.1 only, a throwaway CA generated at start: `fake.ca_file`) that speaks the ARM REST wire of
Microsoft.App jobs and job executions and the Log Analytics query API, plus an executor thread that
plays Container Apps: it runs each execution's first container command as a local process (the
real in-job runner, for the provider tests) and forwards its output lines into the Log Analytics
table `ContainerAppConsoleLogs_CL`, as the environment's log agent does.

The real SDK clients talk to it unchanged (HTTPS is needed: azure-core refuses bearer tokens over
plain http):

    fake = FakeAzure()
    fake.create_job(RESOURCE_GROUP, "cp-exercise", command=RUNNER)
    arm = ContainerAppsAPIClient(FakeCredential(), SUBSCRIPTION, base_url=fake.url,
                                 connection_verify=fake.ca_file, polling_interval=0)
    name = arm.jobs.begin_start(RESOURCE_GROUP, "cp-exercise", template=JobExecutionTemplate(...),
                                polling=False).result().name     # the execution, at once
    arm.job_execution(RESOURCE_GROUP, "cp-exercise", name).properties.status
    LogsQueryClient(FakeCredential(), endpoint=fake.url, connection_verify=fake.ca_file).query_workspace(
        WORKSPACE, "ContainerAppConsoleLogs_CL | where ...", timespan=None)

ARM routes (api-version required and recorded, any value accepted), all under
/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.App/jobs/{job}:
- GET  ''                          the Job resource
- POST /start                      body: a JobExecutionTemplate, which REPLACES the job's containers
                                   (no body: the job's own template). 202, `Location` (an operation
                                   URL, below), `Retry-After: 0`, body {"name", "id"} of the execution.
- GET  /executions                 {"value": [...], "nextLink"}, newest first, `fake.page_size` a page;
                                   `$filter` of `properties/status eq '<Status>'` terms joined by
                                   and/or (parentheses allowed); anything else 400.
- GET  /executions/{name}          the JobExecution
- POST /executions/{name}/stop     202 + Location + `Retry-After: 0` while it has not ended (SIGTERM to
                                   the process group, SIGKILL after `stop_grace_s`, then "Stopped");
                                   200 once ended. With `fake.ignore_stop`: 202 and nothing happens.
- GET  /subscriptions/{sub}/providers/Microsoft.App/locations/{loc}/containerappsjobOperationResults/{id}
                                   the operation of a start or stop: 202 (+Location, Retry-After: 0)
                                   until its execution has ended, then 200 with the JobExecution.
Errors use ARM's shape {"error": {"code", "message"}} (404 ResourceNotFound -> ResourceNotFoundError,
401 AuthenticationFailed without `Authorization: Bearer ...`, 429 TooManyRequests, 400 BadRequest).

Log Analytics route: POST /v1/workspaces/{workspace}/query, body {"query", "timespan"}, answer
{"tables": [{"name": "PrimaryResult", "columns": [{"name", "type"}], "rows": [[...]]}]}. The
workspace has one console-log table, by `fake.log_destination`: "log-analytics" (the default)
ContainerAppConsoleLogs_CL with TimeGenerated (datetime), _ItemId, ContainerJobName_s,
ContainerGroupName_s (the replica: `{execution}-{5 chars}`), ContainerName_s, Log_s, Stream_s
(all string); "azure-monitor" ContainerAppConsoleLogs with TimeGenerated, _ItemId,
ContainerAppName, JobName, ContainerGroupName, ContainerName, Log, Stream (a subset of Azure
Monitor's table reference); querying the other is a SemanticError. Datetimes are rendered with
7 fractional digits and Z, also by tostring(); `fake.trim_datetimes` drops the fraction's
trailing zeros (`...:00.12Z`, `...:00Z`): a client must read any precision, never compare texts.

The KQL subset (parsed by a small recursive-descent parser; anything else answers 400
BadArgumentError rather than match wrongly), type-checked against the columns each operator sees,
as Kusto's binder does:
    ContainerAppConsoleLogs_CL ( '|' operator )*
    where <bool expr>                    and / or / parentheses over comparisons
    extend name = <expr> [, ...]
    project col [, ...]                  later operators see only these columns (as in Kusto)
    order by col [asc|desc] [, ...]      also `sort by`; default desc (as in Kusto)
    take N  |  limit N
    comparisons: == != (operands of one type: Kusto converts some mixes, the fake refuses them),
    =~ !~ (strings, case-insensitive), < <= > >= (datetime or long only: Kusto has no ordering
    operators on strings (Kusto.Language's signatures), use strcmp(a, b) > 0), startswith
    (case-insensitive, as in Kusto) and startswith_cs; literals 'str' "str" datetime(...) and
    integers; functions tostring(x) and strcmp(string, string).

Where it differs from the real services:
- Jobs are created with `fake.create_job(...)` (there is no PUT). One subscription
  (`fake.subscription`), one Log Analytics workspace (`fake.workspace`); resource group and job
  names match case-insensitively, as in ARM. No managed environment, secrets (an env var with a
  secretRef is a 400), registries, volumes, init containers (accepted and echoed, never run),
  parallelism, replica retries (replicaRetryLimit is 0) or RBAC: any bearer token is accepted.
- A container without `command` runs its image's entrypoint from `fake.images` (create_job
  registers the job's image with its command); an unknown image with no command fails the
  execution at once with exit code 127. cpu and memory are echoed, never checked.
- Execution status: "Processing" until its process starts, "Running" (also while stopping, and
  after its process exited with `fake.linger` until a stop),
  "Succeeded" (exit 0), "Failed" (non-zero exit or the job's replica timeout: SIGKILL), "Stopped".
  "Degraded" and "Unknown" happen only through `fake.set_status(...)`. startTime is set when the
  process starts, endTime when it ends. No detailedStatus, reason or message.
- The start/stop operation URL's shape is the fake's own; a start's operation completes when the
  execution has ended (whatever its outcome), a stop's when the execution has ended (never with
  `ignore_stop`); the operation of a forgotten execution is gone (404).
- The `$filter` status comparison is exact (case-sensitive). nextLink carries api-version and an
  opaque `$skipToken` that also holds the filter. `fake.list_lag_s` hides an execution from the
  list for that long after its start (a GET finds it at once); `fake.list_templates = False`
  leaves each execution's template out of the list (properties.template is optional in the spec).
- A start answers 202 with a body naming the execution; with `fake.start_body = False` a bare 202
  (`Location`, `Retry-After`, no body), which the 2026-07-01 spec also allows.
- Executions are kept for ever unless `fake.history_limit` is set (the real service keeps a
  limited history): then the oldest ended executions of a job beyond that many vanish.
- stdout and stderr are merged into one pipe: every forwarded line has Stream_s "stdout". Rows are
  visible `log_delay_s` after they are written (the ingestion delay). Results are not truncated
  (the real API stops at 500,000 rows or 64 MB with a partial error). `timespan` restricts
  TimeGenerated to [start, end); a bare duration ends now.
- Quotas are off unless set (`query_quota_per_min` answers 429 ThrottledError with no Retry-After,
  which azure-core does not retry for a POST); `fault_rate` answers 429 TooManyRequests with
  `Retry-After: 0` to a random share of authenticated requests before doing anything.

What the SDKs do on this wire (azure-core 1.41, checked against this fake):
- Any answer of 400 or more with a Retry-After header is retried, whatever the method (a POST
  /start too); without one a POST is retried only on 500/503/504. Retries of a status are capped
  by `retry_status` (3). `Retry-After: 0` counts as no header for the sleep: exponential backoff
  applies instead (0 s, then 1.6 s, 3.2 s, ... with the default factor 0.8).
- LRO polling (`polling=True`) with `polling_interval=0` and `Retry-After: 0` polls the Location
  URL in a tight loop until it answers 200.
- nextLink is followed with its own query string, api-version replaced by the client's.
- LogsQueryClient turns datetime columns into Python datetimes cut to microseconds (the 7th digit
  is lost): read times as text with `extend t = tostring(TimeGenerated)`. Its token is asked for
  the scope `{endpoint}/.default`; ContainerAppsAPIClient's for https://management.azure.com/.default
  whatever base_url is.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import string
import subprocess
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

from tests.fakehttp import (
    Answer,
    FakeCloud,
    Request,
    forward_lines,
    killpg,
    page_token,
    play,
    read_page_token,
    self_signed_tls,
)

TERMINAL = {"Succeeded", "Failed", "Stopped"}
STATUSES = {"Running", "Processing", "Stopped", "Degraded", "Failed", "Unknown", "Succeeded"}
TABLE = "ContainerAppConsoleLogs_CL"  # the environment's "log-analytics" destination
MONITOR_TABLE = "ContainerAppConsoleLogs"  # its "azure-monitor" destination (a diagnostic setting)
COLUMNS: dict[str, str] = {"TimeGenerated": "datetime", "_ItemId": "string", "ContainerJobName_s": "string",
                           "ContainerGroupName_s": "string", "ContainerName_s": "string", "Log_s": "string",
                           "Stream_s": "string"}
# ContainerAppConsoleLogs as Azure Monitor's table reference lists it (a subset: no _BilledSize,
# _IsBillable, SourceSystem, Type, ...), each from the row the fake keeps in the _CL shape.
MONITOR_COLUMNS: dict[str, tuple[str, str]] = {
    "TimeGenerated": ("datetime", "TimeGenerated"), "_ItemId": ("string", "_ItemId"),
    "ContainerAppName": ("string", "ContainerJobName_s"), "JobName": ("string", "ContainerJobName_s"),
    "ContainerGroupName": ("string", "ContainerGroupName_s"), "ContainerName": ("string", "ContainerName_s"),
    "Log": ("string", "Log_s"), "Stream": ("string", "Stream_s")}
TABLES: dict[str, dict[str, str]] = {TABLE: COLUMNS, MONITOR_TABLE: {c: t for c, (t, _) in MONITOR_COLUMNS.items()}}
TICKS = 10_000_000  # 100 ns ticks a second: Kusto's datetime resolution
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_ALNUM = string.ascii_lowercase + string.digits


# ---- time helpers ------------------------------------------------------------------------------

def rfc3339(t: float | None) -> str | None:
    """Seconds since the epoch -> RFC3339 UTC with microseconds (ARM's startTime/endTime)."""
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat()


def render_ticks(ticks: int) -> str:
    """100 ns ticks since the epoch -> `2026-11-23T10:00:00.1234567Z` (how Log Analytics renders a
    datetime, and what tostring() of one gives)."""
    secs, frac = divmod(ticks, TICKS)
    return (_EPOCH + timedelta(seconds=secs)).strftime("%Y-%m-%dT%H:%M:%S") + f".{frac:07d}Z"


def render_trimmed(ticks: int) -> str:
    """The same instant with the fraction's trailing zeros (and a bare point) dropped:
    `2026-11-23T10:00:00.12Z`, `2026-11-23T10:00:00Z` (`fake.trim_datetimes`)."""
    head, frac = render_ticks(ticks)[:-1].split(".")
    frac = frac.rstrip("0")
    return f"{head}.{frac}Z" if frac else f"{head}Z"


_DATETIME = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:\.(\d{1,7}))?)?)?"
                       r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))?$")


def parse_ticks(text: str) -> int:
    """ISO 8601 / RFC 3339 (date only, or with time; up to 7 fractional digits; Z, an offset or
    none for UTC) -> 100 ns ticks since the epoch. ValueError otherwise."""
    m = _DATETIME.match(text.strip())
    if not m:
        raise ValueError(f"not a datetime: {text!r}")
    y, mo, d, h, mi, s, frac, _z, sign, oh, om = m.groups()
    day = datetime(int(y), int(mo), int(d), tzinfo=UTC)
    secs = (day - _EPOCH) // timedelta(seconds=1) + int(h or 0) * 3600 + int(mi or 0) * 60 + int(s or 0)
    if sign:
        offset = (int(oh) * 60 + int(om)) * 60
        secs -= offset if sign == "+" else -offset
    return secs * TICKS + int((frac or "0").ljust(7, "0"))


def _to_ticks(ts: datetime | float | str | None) -> int:
    if ts is None:
        return time.time_ns() // 100
    if isinstance(ts, datetime):
        aware = ts if ts.tzinfo else ts.replace(tzinfo=UTC)
        return (aware - _EPOCH) // timedelta(microseconds=1) * 10
    if isinstance(ts, str):
        return parse_ticks(ts)
    # via the shortest decimal text of the float: 1795428000.1234567 is tick ...567 (ts * TICKS would give
    # ...568). Epoch floats are ~0.24 us apart today, so ts + 1e-7 may well be the same float: use text
    # or datetimes for tick-exact times.
    return int((Decimal(repr(float(ts))) * TICKS).to_integral_value())


_DURATION = re.compile(r"P(?:(\d+(?:\.\d+)?)W)?(?:(\d+(?:\.\d+)?)D)?"
                       r"(?:T(?:(\d+(?:\.\d+)?)H)?(?:(\d+(?:\.\d+)?)M)?(?:(\d+(?:\.\d+)?)S)?)?$", re.I)


def parse_iso_duration(text: str) -> int:
    """ISO 8601 duration without years or months (PT1H, P1DT2H, PT3600.0S, P2W) -> ticks."""
    m = _DURATION.match(text.strip())
    if not m or not any(m.groups()) or text.strip().upper().endswith("T"):
        raise ValueError(f"not a duration: {text!r}")
    w, d, h, mi, s = (float(g or 0) for g in m.groups())
    return round((((w * 7 + d) * 24 + h) * 60 + mi) * 60 * TICKS + s * TICKS)


def parse_timespan(text: str, now_ticks: int) -> tuple[int, int]:
    """Log Analytics' `timespan`: start/end, start/duration, duration/end or a duration ending now
    -> [start, end) in ticks."""
    parts = text.split("/")
    if len(parts) == 1:
        return now_ticks - parse_iso_duration(parts[0]), now_ticks
    if len(parts) != 2:
        raise ValueError(f"not an ISO 8601 interval: {text!r}")
    a, b = parts
    if a.strip().upper().startswith("P"):
        end = parse_ticks(b)
        return end - parse_iso_duration(a), end
    start = parse_ticks(a)
    return start, (start + parse_iso_duration(b) if b.strip().upper().startswith("P") else parse_ticks(b))


# ---- errors -------------------------------------------------------------------------------------------

class ArmError(Exception):
    """Answered as {"error": {"code", "message", ...}} with an HTTP status (and extra headers)."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers, self.extra = headers or {}, extra or {}

    def answer(self) -> Answer:
        return self.status, {"error": {"code": self.code, "message": self.message, **self.extra}}, self.headers


def bad_request(message: str) -> ArmError:
    return ArmError(400, "BadRequest", message)


class KqlError(ArmError):
    """A query the fake's KQL subset rejects: 400 BadArgumentError as Log Analytics answers."""

    def __init__(self, message: str, kind: str = "SyntaxError"):
        super().__init__(400, "BadArgumentError", f"The request had some invalid properties: {message}",
                         extra={"correlationId": str(uuid.uuid4()),
                                "innererror": {"code": kind, "message": message}})


def semantic(message: str) -> KqlError:
    return KqlError(message, "SemanticError")


# ---- state ---------------------------------------------------------------------------------------

@dataclass
class _Job:
    resource_group: str
    name: str
    image: str
    command: list[str]
    args: list[str]
    env: dict[str, str]
    replica_timeout_s: float
    cpu: float
    memory: str
    created: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str]:
        return self.resource_group.lower(), self.name.lower()

    def template(self) -> dict[str, Any]:
        return {"containers": [{"image": self.image, "name": self.name, "command": list(self.command),
                                "args": list(self.args),
                                "env": [{"name": k, "value": v} for k, v in self.env.items()],
                                "resources": {"cpu": self.cpu, "memory": self.memory}}]}


@dataclass
class _Execution:
    job: _Job
    name: str
    seq: int
    replica: str
    template: dict[str, Any]
    timeout_s: float
    synthetic: bool = False
    status: str = "Processing"
    forced: str | None = None  # set_status(): what the API reports instead of `status`
    created_mono: float = field(default_factory=time.monotonic)
    start_time: float | None = None
    started_mono: float | None = None
    end_time: float | None = None
    proc: subprocess.Popen[bytes] | None = None
    exit_code: int | None = None
    exited_mono: float | None = None
    stop_requested: bool = False
    sigterm_mono: float | None = None
    timed_out: bool = False
    output_done: threading.Event = field(default_factory=threading.Event)

    @property
    def container(self) -> dict[str, Any]:
        return self.template["containers"][0]

    @property
    def env(self) -> dict[str, str]:
        return {v["name"]: v.get("value", "") for v in self.container.get("env") or []}

    @property
    def reported(self) -> str:
        return self.forced or self.status

    @property
    def ended(self) -> bool:
        return self.reported in TERMINAL


# ---- KQL subset ----------------------------------------------------------------------------------

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<dt>datetime\s*\(\s*(?P<dtv>[^)]*?)\s*\))
  | (?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
  | (?P<num>\d+(?![\w.]))
  | (?P<id>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|=~|!~|>=|<=|>|<|=|\||\(|\)|,)
""", re.X)
_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r"}

Row = dict[str, Any]
Fn = Callable[[Row], Any]


def _unescape(text: str) -> str:
    out, i = [], 1
    while i < len(text) - 1:
        c = text[i]
        if c == "\\":
            nxt = text[i + 1]
            if nxt not in _ESCAPES:
                raise KqlError(f"Unsupported escape sequence \\{nxt} in string literal {text}")
            out.append(_ESCAPES[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def tokenize(query: str) -> list[tuple[str, Any]]:
    tokens: list[tuple[str, Any]] = []
    pos = 0
    while pos < len(query):
        m = _TOKEN.match(query, pos)
        if not m:
            raise KqlError(f"Query could not be parsed at {query[pos:pos + 20]!r} (offset {pos})")
        pos = m.end()
        kind = m.lastgroup
        if kind == "space":
            continue
        if kind == "dt":
            raw = m.group("dtv")
            if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
                raw = raw[1:-1]
            try:
                tokens.append(("dt", parse_ticks(raw)))
            except ValueError:
                raise KqlError(f"Invalid datetime literal: {m.group(0)!r}") from None
        elif kind == "str":
            tokens.append(("str", _unescape(m.group("str"))))
        elif kind == "num":
            tokens.append(("int", int(m.group("num"))))
        else:
            tokens.append((kind or "", m.group(0)))
    tokens.append(("end", None))
    return tokens


def _cmp(a: str, b: str) -> int:
    return (a > b) - (a < b)


_FUNCTIONS = {"tostring", "strcmp"}


class _Compiler:
    """Recursive descent over the tokens, type-checking against the columns each operator sees and
    building a list of row-set transformations."""

    def __init__(self, query: str, tables: set[str] | None = None, render: Callable[[int], str] = render_ticks):
        self.tokens = tokenize(query)
        self.i = 0
        self.schema: dict[str, str] = {}
        self.tables = {TABLE} if tables is None else tables  # the tables this workspace has
        self.render = render
        self.table = TABLE

    # token helpers
    def peek(self, offset: int = 0) -> tuple[str, Any]:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def take(self) -> tuple[str, Any]:
        tok = self.tokens[self.i]
        self.i += 1
        return tok

    def at(self, kind: str, value: Any = None) -> bool:
        k, v = self.peek()
        return k == kind and (value is None or v == value)

    def expect(self, kind: str, value: Any = None, what: str = "") -> Any:
        if not self.at(kind, value):
            got = self.peek()
            raise KqlError(f"Expected {what or value or kind} but found {got[1]!r}" if got[0] != "end"
                           else f"Expected {what or value or kind} but the query ended")
        return self.take()[1]

    # query
    def compile(self) -> tuple[list[Callable[[list[Row]], list[Row]]], dict[str, str]]:
        table = self.expect("id", what="a table name")
        if table not in self.tables:
            raise semantic(f"Failed to resolve table or column expression named '{table}'")
        self.table = table
        self.schema = dict(TABLES[table])
        steps: list[Callable[[list[Row]], list[Row]]] = []
        while self.at("op", "|"):
            self.take()
            steps.append(self.operator())
        if not self.at("end"):
            raise KqlError(f"Unexpected {self.peek()[1]!r} after the end of an operator (the fake knows "
                           "where, extend, project, order by, sort by, take and limit)")
        return steps, dict(self.schema)

    def operator(self) -> Callable[[list[Row]], list[Row]]:
        name = self.expect("id", what="a query operator")
        if name == "where":
            typ, pred = self.expr()
            if typ != "bool":
                raise semantic(f"'where' operator: the predicate must be a boolean expression, not {typ}")
            return lambda rows: [r for r in rows if pred(r)]
        if name == "extend":
            adds: list[tuple[str, Fn]] = []
            while True:
                col = self.expect("id", what="a column name")
                self.expect("op", "=")
                typ, fn = self.expr()
                adds.append((col, fn))
                self.schema[col] = typ
                if not self.at("op", ","):
                    break
                self.take()
            return lambda rows: [{**r, **{c: f(r) for c, f in adds}} for r in rows]
        if name == "project":
            cols = [self.column()]
            while self.at("op", ","):
                self.take()
                cols.append(self.column())
            self.schema = {c: self.schema[c] for c in cols}
            return lambda rows: [{c: r[c] for c in cols} for r in rows]
        if name in ("order", "sort"):
            if self.expect("id", what="'by'") != "by":
                raise KqlError(f"Expected 'by' after '{name}'")
            keys: list[tuple[str, bool]] = []
            while True:
                col = self.column()
                desc = True  # Kusto's default order is descending
                if self.at("id", "asc") or self.at("id", "desc"):
                    desc = self.take()[1] == "desc"
                if self.at("id", "nulls"):
                    raise KqlError("The fake does not know 'nulls first/last'")
                keys.append((col, desc))
                if not self.at("op", ","):
                    break
                self.take()

            def order(rows: list[Row]) -> list[Row]:
                out = list(rows)
                for col, desc in reversed(keys):
                    out.sort(key=lambda r: r[col], reverse=desc)
                return out
            return order
        if name in ("take", "limit"):
            n = self.expect("int", what="a row count")
            return lambda rows: rows[:n]
        raise KqlError(f"Unsupported query operator '{name}' (the fake knows where, extend, project, "
                       "order by, sort by, take and limit)")

    def column(self) -> str:
        col = self.expect("id", what="a column name")
        if col not in self.schema:
            raise semantic(f"Failed to resolve scalar expression named '{col}'")
        return col

    # expressions: or < and < comparison < operand
    def expr(self) -> tuple[str, Fn]:
        typ, fn = self.conj()
        while self.at("id", "or"):
            self.take()
            typ2, fn2 = self.conj()
            self._bools("or", typ, typ2)
            fn = (lambda a, b: lambda r: a(r) or b(r))(fn, fn2)
        return typ, fn

    def conj(self) -> tuple[str, Fn]:
        typ, fn = self.comparison()
        while self.at("id", "and"):
            self.take()
            typ2, fn2 = self.comparison()
            self._bools("and", typ, typ2)
            fn = (lambda a, b: lambda r: a(r) and b(r))(fn, fn2)
        return typ, fn

    @staticmethod
    def _bools(op: str, a: str, b: str) -> None:
        if a != "bool" or b != "bool":
            raise semantic(f"'{op}' takes boolean operands, not {a} and {b}")

    def comparison(self) -> tuple[str, Fn]:
        lt, lf = self.operand()
        k, v = self.peek()
        if k == "op" and v in ("==", "!=", "=~", "!~", "<", "<=", ">", ">="):
            op = self.take()[1]
        elif k == "id" and v in ("startswith", "startswith_cs"):
            op = self.take()[1]
        else:
            return lt, lf
        rt, rf = self.operand()
        if op in ("==", "!="):
            if lt != rt:
                raise semantic(f"Cannot compare values of types {lt} and {rt}. Try adding explicit casts")
            eq = op == "=="
            return "bool", lambda r: (lf(r) == rf(r)) == eq
        if op in ("=~", "!~", "startswith", "startswith_cs"):
            if lt != "string" or rt != "string":
                raise semantic(f"'{op}' takes string operands, not {lt} and {rt}")
            if op == "startswith_cs":
                return "bool", lambda r: lf(r).startswith(rf(r))
            if op == "startswith":
                return "bool", lambda r: lf(r).lower().startswith(rf(r).lower())
            eq = op == "=~"
            return "bool", lambda r: (lf(r).lower() == rf(r).lower()) == eq
        if lt != rt or lt not in ("long", "datetime"):
            raise semantic(f"Cannot compare values of types {lt} and {rt} with '{op}'"
                           + (f" (Kusto has no ordering operators on strings: use strcmp(a, b) {op} 0)"
                              if lt == rt == "string" else ""))
        fn = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
              ">": lambda a, b: a > b, ">=": lambda a, b: a >= b}[op]
        return "bool", lambda r: fn(lf(r), rf(r))

    def operand(self) -> tuple[str, Fn]:
        k, v = self.take()
        if k == "op" and v == "(":
            typ, fn = self.expr()
            self.expect("op", ")")
            return typ, fn
        if k == "str":
            return "string", lambda r: v
        if k == "int":
            return "long", lambda r: v
        if k == "dt":
            return "datetime", lambda r: v
        if k == "id":
            if self.at("op", "("):
                return self.call(v)
            if v in ("and", "or", "startswith", "startswith_cs"):
                raise KqlError(f"Unexpected '{v}'")
            if v not in self.schema:
                raise semantic(f"Failed to resolve scalar expression named '{v}'")
            typ = self.schema[v]
            return typ, lambda r: r[v]
        raise KqlError(f"Expected an expression but found {v!r}" if k != "end" else "The query ended inside an expression")

    def call(self, name: str) -> tuple[str, Fn]:
        if name not in _FUNCTIONS:
            raise semantic(f"Unknown function: '{name}' (the fake knows tostring and strcmp)")
        self.expect("op", "(")
        args = [self.expr()]
        while self.at("op", ","):
            self.take()
            args.append(self.expr())
        self.expect("op", ")")
        if name == "tostring":
            if len(args) != 1:
                raise semantic("tostring() takes one argument")
            typ, fn = args[0]
            if typ == "datetime":
                return "string", lambda r: self.render(fn(r))
            if typ == "bool":
                return "string", lambda r: "true" if fn(r) else "false"
            return "string", lambda r: str(fn(r))
        if len(args) != 2 or any(t != "string" for t, _ in args):
            raise semantic("strcmp() takes two string arguments")
        (_, a), (_, b) = args
        return "long", lambda r: _cmp(a(r), b(r))


def run_kql(query: str, rows: list[Row], tables: set[str] | None = None,
            render: Callable[[int], str] = render_ticks) -> dict[str, Any]:
    """Evaluate `query` (the subset above) over `rows` of the console-log table (kept in the _CL
    shape; `tables`: the ones the workspace has, default the _CL one) -> the API's table.
    `render` writes datetimes (in results and by tostring())."""
    compiler = _Compiler(query, tables, render)
    steps, schema = compiler.compile()
    if compiler.table == MONITOR_TABLE:
        rows = [{c: r[src] for c, (_, src) in MONITOR_COLUMNS.items()} for r in rows]
    for step in steps:
        rows = step(rows)
    return {"name": "PrimaryResult",
            "columns": [{"name": c, "type": t} for c, t in schema.items()],
            "rows": [[render(r[c]) if t == "datetime" else r[c] for c, t in schema.items()] for r in rows]}


# ---- $filter of executions list ------------------------------------------------------------------

_ODATA = re.compile(r"\s*(?:(?P<lp>\()|(?P<rp>\))|(?P<kw>and|or)(?=[\s(])|"
                    r"(?P<field>properties/status)\s+eq\s+'(?P<value>(?:[^']|'')*)')", re.I)


def parse_status_filter(text: str) -> Callable[[str], bool]:
    """`properties/status eq 'Running'` terms joined by and/or (and binds tighter; parentheses
    allowed) -> a predicate on the status; ArmError(400) for anything else."""
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _ODATA.match(text, pos)
        if not m:
            raise bad_request(f"Invalid $filter (the fake understands properties/status eq '<Status>' terms "
                              f"joined by and/or): {text!r}")
        pos = m.end()
        if m.group("lp"):
            tokens.append(("(", ""))
        elif m.group("rp"):
            tokens.append((")", ""))
        elif m.group("kw"):
            tokens.append((m.group("kw").lower(), ""))
        else:
            tokens.append(("eq", m.group("value").replace("''", "'")))
    i = 0

    def disj() -> Callable[[str], bool]:
        nonlocal i
        parts = [conj()]
        while i < len(tokens) and tokens[i][0] == "or":
            i += 1
            parts.append(conj())
        return lambda s: any(p(s) for p in parts)

    def conj() -> Callable[[str], bool]:
        nonlocal i
        parts = [atom()]
        while i < len(tokens) and tokens[i][0] == "and":
            i += 1
            parts.append(atom())
        return lambda s: all(p(s) for p in parts)

    def atom() -> Callable[[str], bool]:
        nonlocal i
        if i >= len(tokens):
            raise bad_request(f"Invalid $filter (ends early): {text!r}")
        kind, value = tokens[i]
        i += 1
        if kind == "eq":
            return lambda s: s == value
        if kind == "(":
            inner = disj()
            if i >= len(tokens) or tokens[i][0] != ")":
                raise bad_request(f"Invalid $filter (unbalanced parentheses): {text!r}")
            i += 1
            return inner
        raise bad_request(f"Invalid $filter (unexpected {kind!r}): {text!r}")

    pred = disj()
    if i != len(tokens):
        raise bad_request(f"Invalid $filter: {text!r}")
    return pred


def _read_token(token: str) -> Any:
    try:
        return read_page_token(token)
    except ValueError as e:
        raise bad_request(f"Invalid $skipToken: {token!r}") from e


# ---- the fake ----------------------------------------------------------------------------------------

_JOB = r"/subscriptions/(?P<sub>[^/]+)/resourceGroups/(?P<rg>[^/]+)/providers/Microsoft\.App/jobs/(?P<job>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    ("GET", re.compile(_JOB, re.I), "_get_job"),
    ("POST", re.compile(_JOB + "/start", re.I), "_start"),
    ("GET", re.compile(_JOB + "/executions", re.I), "_list_executions"),
    ("GET", re.compile(_JOB + "/executions/(?P<ex>[^/]+)", re.I), "_get_execution"),
    ("POST", re.compile(_JOB + "/executions/(?P<ex>[^/]+)/stop", re.I), "_stop_execution"),
    ("GET", re.compile(r"/subscriptions/(?P<sub>[^/]+)/providers/Microsoft\.App/locations/(?P<loc>[^/]+)"
                       r"/containerappsjobOperationResults/(?P<op>[^/]+)", re.I), "_get_operation"),
]
_QUERY = re.compile(r"/v1/workspaces/(?P<ws>[^/]+)/query")


class FakeAzure(FakeCloud):
    """Container Apps jobs (ARM) and Log Analytics query on one local HTTPS port, with an executor
    thread that runs executions as local processes. See the module docstring; every control is a
    plain attribute or method and is safe to use from any thread."""

    def __init__(self, *, pending_s: float = 0.05, start_jobs: bool = True, seed: int | None = None,
                 stop_grace_s: float = 10.0, page_size: int = 100, subscription: str | None = None,
                 workspace: str | None = None, location: str = "eastus"):
        super().__init__(seed=seed)
        self.subscription = subscription or SUBSCRIPTION
        self.workspace = workspace or WORKSPACE
        self.location = location
        self.start_jobs = start_jobs  # False: executions stay Processing (no capacity)
        self.pending_s = pending_s  # how long an execution is Processing before its process starts
        self.stop_grace_s = stop_grace_s  # SIGTERM -> SIGKILL delay after a stop
        self.ignore_stop = False  # True: stop answers 202 and nothing happens
        self.page_size = page_size  # executions per list page
        self.history_limit: int | None = None  # ended executions kept per job; None: all
        self.fault_rate = 0.0  # share of authenticated requests answered 429 (Retry-After: 0) first
        # The next n job starts are refused for the subscription's core quota (ARM's 409
        # OperationNotAllowed, the message naming the quota), or throttled (429, Retry-After: 0).
        self.quota_refusals = 0
        self.start_throttles = 0
        self.log_delay_s = 0.0  # ingestion delay: a row is queryable only this long after it is written
        self.query_quota_per_min: int | None = None  # queries per rolling 60 s (not throttled ones); None: no limit
        # The environment's log destination: "log-analytics" (table ContainerAppConsoleLogs_CL) or
        # "azure-monitor" (a diagnostic setting: table ContainerAppConsoleLogs); the workspace has that one table.
        self.log_destination = "log-analytics"
        self.trim_datetimes = False  # render datetimes without the fraction's trailing zeros
        self.start_body = True  # False: a start answers a bare 202 (Location, Retry-After, no body), as the spec allows
        self.list_lag_s = 0.0  # an execution is listed only this long after its start (a GET finds it at once)
        self.list_templates = True  # False: the executions list leaves out each execution's template
        # True: an execution whose container exited stays Running until it is stopped (then Stopped), as
        # Container Apps executions sometimes do (microsoft/azure-container-apps#1071's kin); ignore_stop keeps it so.
        self.linger = False
        # Called in a start's own thread, outside the fake's lock: "received" before the execution is
        # made, "created" after (before the answer). A hook that waits holds that call alone.
        self.launch_hook: Callable[[str], None] | None = None
        self.tokens: list[str] = []  # bearer tokens seen, one per authenticated request
        self.api_versions: list[str] = []  # api-version of each ARM request
        self.queries: list[tuple[str, str | None]] = []  # (KQL, timespan) of each accepted query
        self.images: dict[str, list[str]] = {}  # image -> entrypoint, for containers without a command
        self._names = random.Random()
        self._jobs: dict[tuple[str, str], _Job] = {}
        self._executions: dict[str, _Execution] = {}  # lower-cased name -> execution (forgotten ones removed)
        self._operations: dict[str, str] = {}  # operation id -> execution key
        self._rows: list[tuple[float, Row]] = []  # (monotonic time visible from, row)
        self._query_calls: list[float] = []
        self._seq = 0
        self._synthetic = 0

        self._dir = Path(tempfile.mkdtemp(prefix="fake-azure-"))
        tls, ca = self_signed_tls(self._dir)
        self.ca_file = str(ca)  # the CA's PEM: connection_verify= for the SDK clients
        self._serve("fake-azure", tls)  # url: https://127.0.0.1:PORT, base_url= / endpoint= for the SDK clients

    def close(self) -> None:
        """Stop serving, stop the executor, SIGKILL every process group, remove the certificates."""
        super().close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- setup and inspection (tests) -------------------------------------------------------------

    def create_job(self, resource_group: str, job: str, *, command: list[str], args: list[str] | None = None,
                   env: dict[str, str] | None = None, image: str = "runner:1", replica_timeout_s: float = 600,
                   cpu: float = 0.5, memory: str = "1Gi") -> str:
        """Create (or replace) a job; its image's entrypoint becomes `command`. Returns the job's id."""
        j = _Job(resource_group, job, image, list(command), list(args or []), dict(env or {}),
                 float(replica_timeout_s), cpu, memory)
        with self._lock:
            self._jobs[j.key] = j
            self.images[image] = list(command)
            return self._job_id(j)

    def executions(self, job: str | None = None) -> list[dict[str, Any]]:
        """Server-side state of the executions (of `job`), oldest first."""
        with self._lock:
            return [self._inspect(e) for e in sorted(self._executions.values(), key=lambda e: e.seq)
                    if job is None or e.job.name.lower() == job.lower()]

    def execution_json(self, name: str) -> dict[str, Any]:
        """The JobExecution as the API answers it."""
        with self._lock:
            return self._execution_json(self._find(name))

    def set_status(self, name: str, status: str | None) -> None:
        """Make the API report `status` (e.g. "Degraded", "Unknown") for this execution, whatever
        it is doing; None reports the real status again. The process, if any, is not touched."""
        if status is not None and status not in STATUSES:
            raise ValueError(f"status must be one of {sorted(STATUSES)}")
        with self._lock:
            self._find(name).forced = status

    def forget(self, name: str) -> None:
        """The execution vanishes (pruned history, or a lost record); its process is killed."""
        with self._lock:
            e = self._find(name)
            self._drop(e)
            proc = e.proc
        if proc is not None:
            killpg(proc, signal.SIGKILL)

    def add_executions(self, resource_group: str, job: str, n: int, status: str = "Running") -> list[str]:
        """Insert n synthetic executions that run no process, with env CONTROLPLANE_JOB_NAME=synthetic-{i}
        (i counts on across calls); they stay `status` (Running or Processing) until `finish` (a
        stop ends them at once, unless ignore_stop). Creates the job if needed. Returns their names."""
        if status not in ("Running", "Processing"):
            raise ValueError("status must be Running or Processing")
        with self._lock:
            j = self._jobs.get((resource_group.lower(), job.lower()))
            if j is None:
                self.create_job(resource_group, job, command=RUNNER)
                j = self._jobs[(resource_group.lower(), job.lower())]
            names = []
            for _ in range(n):
                i = self._synthetic
                self._synthetic += 1
                template = j.template()
                template["containers"][0]["env"].append({"name": "CONTROLPLANE_JOB_NAME", "value": f"synthetic-{i}"})
                e = self._new_execution(j, template, synthetic=True)
                if status == "Running":
                    e.status, e.start_time, e.started_mono = "Running", time.time(), time.monotonic()
                names.append(e.name)
            return names

    def reset_counts(self) -> None:
        with self._lock:
            super().reset_counts()
            self.tokens.clear()
            self.api_versions.clear()
            self.queries.clear()

    def add_log(self, resource_group: str, job: str, execution: str, text: str,
                ts: datetime | float | str | None = None, *, stream: str = "stdout",
                item_id: str | None = None) -> dict[str, Any]:
        """Write a console-log row for `execution` of `job` as the log agent would. `ts`: a datetime,
        epoch seconds or ISO text (7 fractional digits kept); default now. Returns the row as queried."""
        with self._lock:
            e = self._find(execution)
            if e.job.key != (resource_group.lower(), job.lower()):
                raise KeyError(f"{execution} is an execution of {e.job.resource_group}/{e.job.name}")
            row = self._add_row(e, text, _to_ticks(ts), stream, item_id)
            return _render(row)

    def log_rows(self, execution: str | None = None) -> list[dict[str, Any]]:
        """Every row written so far (visible or not) in (TimeGenerated, _ItemId) order; `execution`
        narrows to its replica's rows."""
        prefix = execution.rsplit("/", 1)[-1].lower() + "-" if execution else ""
        with self._lock:
            rows = [r for _, r in self._rows if r["ContainerGroupName_s"].startswith(prefix)]
        return [_render(r) for r in sorted(rows, key=lambda r: (r["TimeGenerated"], r["_ItemId"]))]

    # -- HTTP dispatch -------------------------------------------------------------------------------

    def _respond(self, r: Request) -> Answer:
        try:
            return self._dispatch(r)
        except ArmError as e:
            return e.answer()
        except Exception as e:  # noqa: BLE001 - a bug in the fake: say so, keep serving
            traceback.print_exc()
            return ArmError(500, "InternalServerError", f"The fake failed: {e!r}").answer()

    def _dispatch(self, r: Request) -> Answer:
        logs = _QUERY.fullmatch(r.path)
        with self._lock:
            self.requests.append((time.monotonic(), r.method, r.path))
            if self._stop.is_set():
                raise ArmError(503, "ServiceUnavailable", "The fake is shutting down.")
            auth = r.headers.get("Authorization") or ""
            token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
            if not token:
                if logs:
                    raise ArmError(401, "AuthorizationRequiredError", "Valid authentication was not provided.")
                raise ArmError(401, "AuthenticationFailed", "Authentication failed. The 'Authorization' header is missing.",
                               headers={"WWW-Authenticate": 'Bearer authorization_uri="https://login.microsoftonline.com/common", '
                                                            'error="invalid_token", error_description="The authentication '
                                                            "failed because of missing 'Authorization' header.\""})
            self.tokens.append(token)
            if self.fault_rate > 0 and self.rng.random() < self.fault_rate:
                self.faults += 1
                raise ArmError(429, "TooManyRequests", "The request is being throttled (injected fault).",
                               headers={"Retry-After": "0"})
        if logs:
            if r.method != "POST":
                raise ArmError(405, "MethodNotAllowed", f"The method {r.method} is not allowed here.")
            return self._query(logs.group("ws"), r.body)
        path_known = False
        for verb, pattern, handler in _ROUTES:
            m = pattern.fullmatch(r.path)
            if not m:
                continue
            path_known = True
            if verb != r.method:
                continue
            version = (r.query.get("api-version") or [""])[0]
            if not version:
                raise ArmError(400, "MissingApiVersionParameter",
                               "The api-version query parameter (?api-version=) is required for all requests.")
            groups = m.groupdict()
            with self._lock:
                self.api_versions.append(version)
                if groups["sub"].lower() != self.subscription.lower():
                    raise ArmError(404, "SubscriptionNotFound", f"The subscription '{groups['sub']}' could not be found.")
            return getattr(self, handler)(r=r, version=version, **{k: v for k, v in groups.items() if k != "sub"})
        if path_known:
            raise ArmError(405, "MethodNotAllowed", f"The requested resource does not support http method '{r.method}'.")
        raise ArmError(404, "NotFound", f"The requested path {r.path} is not served by the fake.")

    # -- ARM handlers ------------------------------------------------------------------------------

    def _get_job(self, rg: str, job: str, **_: Any) -> Answer:
        with self._lock:
            j = self._job(rg, job)
            return 200, {
                "id": self._job_id(j), "name": j.name, "type": "Microsoft.App/jobs", "location": "East US", "tags": {},
                "properties": {
                    "provisioningState": "Succeeded", "runningState": "Ready",
                    "environmentId": f"/subscriptions/{self.subscription}/resourceGroups/{j.resource_group}"
                                     "/providers/Microsoft.App/managedEnvironments/cp-env",
                    "workloadProfileName": "Consumption",
                    "configuration": {"triggerType": "Manual", "replicaTimeout": int(j.replica_timeout_s),
                                      "replicaRetryLimit": 0,
                                      "manualTriggerConfig": {"replicaCompletionCount": 1, "parallelism": 1}},
                    "template": j.template(),
                },
            }, {}

    def _start(self, r: Request, rg: str, job: str, version: str, **_: Any) -> Answer:
        with self._lock:
            if self.quota_refusals > 0:
                self.quota_refusals -= 1
                raise ArmError(409, "OperationNotAllowed", "Operation results in exceeding quota limits of Core. "
                                                           "Maximum allowed: 4, Current in use: 4, Additional requested: 1.")
            if self.start_throttles > 0:
                self.start_throttles -= 1
                raise ArmError(429, "TooManyRequests", "The request is being throttled.", {"Retry-After": "0"})
        hook = self.launch_hook
        if hook is not None:
            hook("received")
        answer = self._make_execution(r, rg, job, version)
        if hook is not None:
            hook("created")
        return answer

    def _make_execution(self, r: Request, rg: str, job: str, version: str) -> Answer:
        body = _json_body(r.body)
        with self._lock:
            j = self._job(rg, job)
            template = j.template() if body is None else _template(body)
            e = self._new_execution(j, template)
            self._active.add(e.name.lower())
            self._prune(j)
            return 202, ({"name": e.name, "id": self._execution_id(e)} if self.start_body else None), \
                self._operation(e, version)

    def _list_executions(self, r: Request, rg: str, job: str, version: str, **_: Any) -> Answer:
        token = (r.query.get("$skipToken") or r.query.get("$skiptoken") or [""])[0]
        before, text = None, (r.query.get("$filter") or [None])[0]
        if token:
            cursor = _read_token(token)
            if not isinstance(cursor, dict) or not isinstance(cursor.get("before"), int):
                raise bad_request(f"Invalid $skipToken: {token!r}")
            before, text = cursor["before"], cursor.get("filter")
        pred = parse_status_filter(text) if text else (lambda s: True)
        with self._lock:
            j = self._job(rg, job)
            listed_before = time.monotonic() - self.list_lag_s
            found = sorted((e for e in self._executions.values()
                            if e.job is j and (before is None or e.seq < before) and pred(e.reported)
                            and e.created_mono <= listed_before),
                           key=lambda e: -e.seq)
            size = max(1, int(self.page_size))
            out: dict[str, Any] = {"value": [self._execution_json(e, template=self.list_templates)
                                             for e in found[:size]]}
            if len(found) > size:
                out["nextLink"] = (f"{self.url}{r.path}?api-version={version}"
                                   f"&$skipToken={page_token({'before': found[size - 1].seq, 'filter': text})}")
            return 200, out, {}

    def _get_execution(self, rg: str, job: str, ex: str, **_: Any) -> Answer:
        with self._lock:
            return 200, self._execution_json(self._execution(rg, job, ex)), {}

    def _stop_execution(self, rg: str, job: str, ex: str, version: str, **_: Any) -> Answer:
        with self._lock:
            e = self._execution(rg, job, ex)
            if e.ended:
                return 200, None, {}
            headers = self._operation(e, version)
            if self.ignore_stop or e.status in TERMINAL:
                return 202, None, headers
            e.stop_requested = True
            if e.status == "Processing" or e.proc is None:
                self._complete(e, "Stopped")  # nothing runs yet (or ever, if synthetic): it ends at once
            return 202, None, headers

    def _get_operation(self, loc: str, op: str, version: str, **_: Any) -> Answer:
        with self._lock:
            e = self._executions.get(self._operations.get(op, ""))
            if e is None:
                raise ArmError(404, "ResourceNotFound", f"The operation '{op}' was not found.")
            if e.ended:
                return 200, self._execution_json(e), {}
            return 202, None, self._operation(e, version, op)

    # -- Log Analytics ------------------------------------------------------------------------------

    def _query(self, workspace: str, raw: bytes) -> Answer:
        body = _json_body(raw, code="BadArgumentError")
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not body["query"].strip():
            raise ArmError(400, "BadArgumentError", "The request body must be a JSON object with a 'query' string.")
        if workspace.lower() != self.workspace.lower():
            raise ArmError(404, "WorkspaceNotFoundError", f"The workspace {workspace} could not be found.")
        extra = [w for w in body.get("workspaces") or [] if str(w).lower() != self.workspace.lower()]
        if extra:
            raise ArmError(400, "BadArgumentError", f"The fake has one workspace; unknown workspaces: {extra}")
        timespan = body.get("timespan")
        now_ticks = time.time_ns() // 100
        try:
            window = parse_timespan(timespan, now_ticks) if timespan else None
        except ValueError as e:
            raise ArmError(400, "BadArgumentError", f"Invalid timespan: {e}") from e
        with self._lock:
            now = time.monotonic()
            self._query_calls = [t for t in self._query_calls if now - t < 60]
            if self.query_quota_per_min is not None and len(self._query_calls) >= self.query_quota_per_min:
                raise ArmError(429, "ThrottledError", "Too many requests: the query rate limit was reached.")
            self._query_calls.append(now)
            rows = [row for visible, row in self._rows if visible <= now
                    and (window is None or window[0] <= row["TimeGenerated"] < window[1])]
        table = run_kql(body["query"], rows, {TABLE if self.log_destination == "log-analytics" else MONITOR_TABLE},
                        render_trimmed if self.trim_datetimes else render_ticks)  # KqlError (400) outside the subset
        with self._lock:
            self.queries.append((body["query"], timespan))
        return 200, {"tables": [table]}, {}

    def _add_row(self, e: _Execution, text: str, ticks: int, stream: str = "stdout", item_id: str | None = None) -> Row:
        row: Row = {"TimeGenerated": ticks, "_ItemId": item_id or str(uuid.uuid4()), "ContainerJobName_s": e.job.name,
                    "ContainerGroupName_s": e.replica, "ContainerName_s": e.container.get("name", ""),
                    "Log_s": text, "Stream_s": stream}
        with self._lock:
            self._rows.append((time.monotonic() + self.log_delay_s, row))
        return row

    # -- helpers ------------------------------------------------------------------------------------

    def _job_id(self, j: _Job) -> str:
        return f"/subscriptions/{self.subscription}/resourceGroups/{j.resource_group}/providers/Microsoft.App/jobs/{j.name}"

    def _execution_id(self, e: _Execution) -> str:
        return f"{self._job_id(e.job)}/executions/{e.name}"

    def _job(self, rg: str, job: str) -> _Job:
        j = self._jobs.get((rg.lower(), job.lower()))
        if j is None:
            raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.App/jobs/{job}' under resource group "
                                                    f"'{rg}' was not found. For more details please go to "
                                                    "https://aka.ms/ARMResourceNotFoundFix")
        return j

    def _execution(self, rg: str, job: str, name: str) -> _Execution:
        j = self._job(rg, job)
        e = self._executions.get(name.lower())
        if e is None or e.job is not j:
            raise ArmError(404, "ResourceNotFound", f"The Resource 'Microsoft.App/jobs/{job}/executions/{name}' under "
                                                    f"resource group '{rg}' was not found. For more details please go "
                                                    "to https://aka.ms/ARMResourceNotFoundFix")
        return e

    def _ended(self, e: _Execution) -> bool:
        return e.status in TERMINAL

    def _exited(self, e: _Execution, exit_code: int) -> None:
        self._complete(e, "Succeeded" if exit_code == 0 else "Failed")

    def _find(self, name: str) -> _Execution:
        key = name.rsplit("/", 1)[-1].lower()
        if key not in self._executions:
            raise KeyError(name)
        return self._executions[key]

    def _new_execution(self, j: _Job, template: dict[str, Any], synthetic: bool = False) -> _Execution:
        while True:
            name = f"{j.name.lower()}-" + "".join(self._names.choices(_ALNUM, k=7))
            if name not in self._executions:
                break
        self._seq += 1
        replica = f"{name}-" + "".join(self._names.choices(_ALNUM, k=5))
        e = _Execution(j, name, self._seq, replica, template, j.replica_timeout_s, synthetic=synthetic)
        self._executions[name] = e
        return e

    def _operation(self, e: _Execution, version: str, op: str | None = None) -> dict[str, str]:
        if op is None:
            op = str(uuid.uuid4())
            self._operations[op] = e.name.lower()
        return {"Location": f"{self.url}/subscriptions/{self.subscription}/providers/Microsoft.App/locations/"
                            f"{self.location}/containerappsjobOperationResults/{op}?api-version={version}",
                "Retry-After": "0"}

    def _drop(self, e: _Execution) -> None:
        self._executions.pop(e.name.lower(), None)
        self._active.discard(e.name.lower())
        for op in [o for o, n in self._operations.items() if n == e.name.lower()]:
            del self._operations[op]

    def _prune(self, j: _Job) -> None:
        if self.history_limit is None:
            return
        ended = sorted((e for e in self._executions.values() if e.job is j and e.status in TERMINAL), key=lambda e: e.seq)
        for e in ended[:max(0, len(ended) - self.history_limit)]:
            self._drop(e)

    def _inspect(self, e: _Execution) -> dict[str, Any]:
        c = e.container
        res = c.get("resources") or {}
        return {"name": e.name, "job": e.job.name, "resource_group": e.job.resource_group, "status": e.reported,
                "env": e.env, "command": list(c.get("command") or []), "args": list(c.get("args") or []),
                "image": c.get("image"), "cpu": res.get("cpu"), "memory": res.get("memory"), "replica": e.replica,
                "pid": e.proc.pid if e.proc else None, "exit_code": e.exit_code, "stop_requested": e.stop_requested,
                "synthetic": e.synthetic}

    def _execution_json(self, e: _Execution, template: bool = True) -> dict[str, Any]:
        props: dict[str, Any] = {"status": e.reported}
        if e.start_time is not None:
            props["startTime"] = rfc3339(e.start_time)
        if e.end_time is not None:
            props["endTime"] = rfc3339(e.end_time)
        if template:
            props["template"] = json.loads(json.dumps(e.template))
        return {"id": self._execution_id(e), "name": e.name, "type": "Microsoft.App/jobs/executions", "properties": props}

    # -- the executor: plays Container Apps ---------------------------------------------------------------

    def _step(self, e: _Execution) -> None:
        now = time.monotonic()
        with self._lock:
            if e.status in TERMINAL:
                self._active.discard(e.name.lower())
                return
            if e.status == "Processing":
                if self.start_jobs and now - e.created_mono >= self.pending_s:
                    self._launch(e)
                return
        if e.proc is None:
            return
        code = play(e, stopping=e.stop_requested, grace_s=self.stop_grace_s, now=now)
        if code is None:
            return
        with self._lock:
            if e.status in TERMINAL:
                return
            e.exit_code = code
            if self.linger and not e.stop_requested:
                return  # the container has exited; the execution goes on Running
            if e.stop_requested:
                self._complete(e, "Stopped")
            elif e.timed_out or code != 0:
                self._complete(e, "Failed")
            else:
                self._complete(e, "Succeeded")

    def _launch(self, e: _Execution) -> None:
        c = e.container
        e.start_time, e.started_mono = time.time(), time.monotonic()
        entrypoint = list(c.get("command") or []) or self.images.get(c.get("image", ""))
        if not entrypoint:
            e.exit_code = 127
            self._add_row(e, f"fake: image {c.get('image')!r} has no entrypoint known to the fake and the "
                             "container gives no command", time.time_ns() // 100, "stderr")
            self._complete(e, "Failed")
            return
        env = {**e.env, "CONTAINER_APP_JOB_NAME": e.job.name, "CONTAINER_APP_JOB_EXECUTION_NAME": e.name,
               "CONTAINER_APP_REPLICA_NAME": e.replica}
        try:
            proc = self.spawn([*entrypoint, *(c.get("args") or [])], env, self.hidden_env)
        except OSError as exc:
            e.exit_code = 127
            self._add_row(e, f"fake: the container failed to start: {exc}", time.time_ns() // 100, "stderr")
            self._complete(e, "Failed")
            return
        e.proc, e.status = proc, "Running"
        self._started(e.name, proc, e.env.get("CONTROLPLANE_JOB_NAME", e.job.name))
        forward_lines(proc, lambda line: self._add_row(e, line, time.time_ns() // 100), e.output_done,
                      name=f"logs-{e.name}")

    def _complete(self, e: _Execution, status: str) -> None:
        e.status = status
        e.end_time = time.time()
        if e.start_time is None and status != "Stopped":
            e.start_time = e.end_time
        self._active.discard(e.name.lower())
        self._prune(e.job)


def _render(row: Row, render: Callable[[int], str] = render_ticks) -> dict[str, Any]:
    return {k: render(v) if COLUMNS.get(k) == "datetime" else v for k, v in row.items()}


def _json_body(raw: bytes, code: str = "BadRequest") -> Any:
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise ArmError(400, code, f"The request content was invalid and could not be deserialized: {e}") from e


def _template(body: Any) -> dict[str, Any]:
    """A JobExecutionTemplate body -> the normalised template the execution runs and echoes."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JobExecutionTemplate object.")
    unknown = set(body) - {"containers", "initContainers"}
    if unknown:
        raise bad_request(f"Unknown JobExecutionTemplate properties: {sorted(unknown)}")
    containers = body.get("containers")
    if not isinstance(containers, list) or not containers:
        raise bad_request("The template must have at least one container.")
    out: dict[str, Any] = {"containers": [_container(c) for c in containers]}
    if body.get("initContainers"):
        if not isinstance(body["initContainers"], list):
            raise bad_request("initContainers must be a list.")
        out["initContainers"] = [_container(c) for c in body["initContainers"]]
    return out


def _container(c: Any) -> dict[str, Any]:
    if not isinstance(c, dict):
        raise bad_request("A container must be an object.")
    for key in ("image", "name"):
        if not isinstance(c.get(key), str) or not c[key]:
            raise bad_request(f"Each container needs a non-empty '{key}'.")
    out: dict[str, Any] = {"image": c["image"], "name": c["name"]}
    for key in ("command", "args"):
        if c.get(key) is not None:
            if not isinstance(c[key], list) or not all(isinstance(x, str) for x in c[key]):
                raise bad_request(f"Container '{c['name']}': {key} must be a list of strings.")
            out[key] = list(c[key])
    env = []
    for var in c.get("env") or []:
        if not isinstance(var, dict) or not isinstance(var.get("name"), str) or not var["name"]:
            raise bad_request(f"Container '{c['name']}': each env var needs a name.")
        if var.get("secretRef"):
            raise bad_request(f"Container '{c['name']}': env var {var['name']!r} refers to a secret; the fake has no secrets.")
        env.append({"name": var["name"], "value": str(var.get("value") or "")})
    out["env"] = env
    if c.get("resources") is not None:
        res = c["resources"]
        if not isinstance(res, dict):
            raise bad_request(f"Container '{c['name']}': resources must be an object.")
        out["resources"] = {k: res[k] for k in ("cpu", "memory") if k in res}
    return out


# ---- clients (the real SDKs pointed at the fake) ---------------------------------------------------

class FakeCredential:
    """A TokenCredential for the fake: any bearer token will do. Records the scopes asked for."""

    def __init__(self, token: str = "fake-arm-token"):
        self.token = token
        self.scopes: list[tuple[str, ...]] = []

    def get_token(self, *scopes: str, **kw: Any) -> Any:
        from azure.core.credentials import AccessToken

        self.scopes.append(scopes)
        return AccessToken(self.token, int(time.time()) + 3600)


def arm_client(fake: FakeAzure, credential: Any = None, **kw: Any) -> Any:
    """azure.mgmt.appcontainers.ContainerAppsAPIClient against the fake (kw: e.g. retry_total=...)."""
    from azure.mgmt.appcontainers import ContainerAppsAPIClient

    return ContainerAppsAPIClient(credential or FakeCredential(), fake.subscription, base_url=fake.url,
                                  connection_verify=fake.ca_file, polling_interval=0, **kw)


def logs_client(fake: FakeAzure, credential: Any = None, **kw: Any) -> Any:
    """azure.monitor.query.LogsQueryClient against the fake."""
    from azure.monitor.query import LogsQueryClient

    return LogsQueryClient(credential or FakeCredential(), endpoint=fake.url, connection_verify=fake.ca_file, **kw)


# ---- the catalog the tests use ---------------------------------------------------------------------
SUBSCRIPTION = "00000000-0000-4000-8000-000000000000"
RESOURCE_GROUP = "cp-rg"
JOB = "cp-exercise"
WORKSPACE = "11111111-1111-4111-8111-111111111111"
RUNNER = ["python", "-m", "controlplane_runner", "--"]  # the runner image's entrypoint
