"""Property-based fuzz of every entry point, in both protocol eras (issue 12).

Every tool of tools/list (the canonical tools and each catalog tool), `tasks/get|list|cancel|
result|update`, `completion/complete`, the `io.github.mcp-controlplane/completion` extension
method, `prompts/get` and `resources/read` of `task://` and `tool://` URIs are called with
arguments drawn from the input schemas the server itself returns from tools/list, with hostile
values mixed in: lone surrogates, U+10FFFF, NUL, 10,000-deep JSON in strings, deep structures,
NaN and Infinity, numbers beyond every bound, unknown fields.

Each answer must be a success, or an error with a documented code (the README's tables): an
`isError` result `{code, message, hint?}` with a code of `ErrorCode`, or a JSON-RPC error with one
of `PROTOCOL_CODES` (-32603 only as a task's own error, in `data`). No text may carry a traceback,
a path, an exception class or an exception's text; every answer is strict JSON. A rejected call
changes nothing in the database, and no task is ever stored with NaN, Infinity or text that is
not Unicode.

The server is real: `build_server` behind fastmcp's in-memory Client (both eras; its requests are
sent raw, so NaN and lone surrogates reach the server as they are), and the HTTP app on 127.0.0.1
spoken to as raw JSON-RPC (`tests/wire.py`: a 2025-11-25 session and 2026-07-28 requests). Nobody
holds the leader lease but a stranger, so no job is ever launched, whatever the fuzz submits.

The examples at the end pin the defects the fuzz found, one by one.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import mcp_types
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from fastmcp import Client
from fastmcp_tasks.client import TasksClientExtension
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp.shared.exceptions import MCPError
from mcp.shared.inbound import NAME_BEARING_METHODS, encode_header_value
from mcp_types.jsonrpc import HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY, UNSUPPORTED_PROTOCOL_VERSION
from pydantic import ConfigDict
from sqlalchemy import select

from controlplane import api
from controlplane.app import LEADER_LEASE, ControlPlane
from controlplane.errors import ErrorCode, TaskErrorCode
from controlplane.mcp.completion import EXTENSION_ID
from controlplane.mcp.server import build_server
from controlplane.settings import Settings
from controlplane.store.models import Task
from tests.conftest import ENGINES, FAST, ROOT, catalog_text, serving
from tests.postgres import require_or_skip
from tests.test_bad_input import db_state
from tests.test_completion import RENDER_TOOL
from tests.wire import LEGACY, MODERN, Legacy, modern_body, modern_headers

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"

# JSON-RPC codes an answer may carry (the README's table of them): the SDK's parse, envelope,
# method and header checks, bad params (ours: unknown task, malformed argument, text that is not
# Unicode, a number that is not finite), the tasks extension not declared, an unsupported version.
PROTOCOL_CODES = {mcp_types.PARSE_ERROR, mcp_types.INVALID_REQUEST, mcp_types.METHOD_NOT_FOUND,
                  mcp_types.INVALID_PARAMS, HEADER_MISMATCH, MISSING_REQUIRED_CLIENT_CAPABILITY,
                  UNSUPPORTED_PROTOCOL_VERSION}
TASK_ERROR_CODES = {str(c) for c in TaskErrorCode} | {"NOT_FOUND"}  # -32603 data: a task ended badly
# INTERNAL is documented, but only for a fault of the server: no argument may cause one.
CALL_ERROR_CODES = {str(c) for c in ErrorCode} - {"INTERNAL"}
# The fields an error of a code may carry besides code, message and hint, as docs/troubleshooting.md
# and docs/reference/tools.md document them (an invalid sweep shard; a limit or budget; a sweep too large).
ERROR_FIELDS = {"INVALID_REQUEST": {"shard", "field"}, "LIMIT_EXCEEDED": {"limit", "max", "retry_after_s", "budget"},
                "SWEEP_TOO_LARGE": {"shards", "max"}}

# What must never reach a client: tracebacks, paths, exception classes and exception texts.
LEAKS = re.compile(r"Traceback|File \"|\.py\b|site-packages|[A-Z]\w*(Error|Exception)\b|sqlite|sqlalchemy|"
                   r"pydantic|codec can't|surrogates not allowed|recursion|Invalid JSON|object at 0x|"
                   + re.escape(str(ROOT)))

# The 2025-11-25 HTTP parser's answer (the SDK's) says where the body stops being JSON, and nothing else.
PARSE_ERROR_TEXT = re.compile(r"Parse error(: [a-z ]+ at line \d+ column \d+)?")

# test_completion's tool of strings, enums, small ranges and a required field, with a pattern, an
# array and a bounded number besides, next to the default catalog's two.
FUZZ_TOOL = RENDER_TOOL + """properties.camera = { type = "string", pattern = "^[a-z][a-z0-9_]{0,15}$" }
properties.shots = { type = "array", items = { type = "integer", minimum = 1, maximum = 100000 }, maxItems = 8 }
properties.exposure = { type = "number", minimum = -10, maximum = 10 }
"""

# ---- hostile values -----------------------------------------------------------------------------
DEEP_JSON = "[" * 10_000 + "]" * 10_000  # valid JSON, 10,000 levels deep, in a string
HOSTILE_TEXT = ["\ud800", "\udfff", "a\udc00b", "\U0010ffff", "x\U0010ffffy", "\x00", "tsk_\x00", "\ufeff",
                "\u202e", "", " ", "\r\n", "NaN", "Infinity", "-Infinity", "1e999", "$.", "$.x.y", DEEP_JSON,
                '{"a":' * 10_000, "x" * 5_000, "tsk_" + "a" * 26 + "\ud800", "log_\ud800", "lst_\U0010ffff",
                "task://\ud800", "../../etc/passwd"]
ZONES = [None, UTC, timezone(timedelta(hours=23, minutes=59)), timezone(-timedelta(hours=23, minutes=59))]
HOSTILE_NUMBERS = [math.nan, math.inf, -math.inf, 1e308, -0.0, 5e-324, 2**63, -(2**63) - 1, 10**30, 0.5]


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


hostile = st.one_of(
    st.sampled_from(HOSTILE_TEXT),
    st.sampled_from(HOSTILE_NUMBERS),
    st.integers(2, 300).map(nested),
    st.sampled_from([None, True, [], {}, {"\ud800": 1}, {"a": math.nan}, [math.inf], {"": {"\x00": "\ud800"}}]),
)


def json_trees(floats: st.SearchStrategy[float]) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.none() | st.booleans() | st.integers() | floats | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
        max_leaves=8,
    )


json_values = json_trees(st.floats())  # NaN and Infinity included: what Python's parsers accept
valid_json = json_trees(st.floats(allow_nan=False, allow_infinity=False))
text = st.one_of(st.text(max_size=40), st.sampled_from(HOSTILE_TEXT))


def near(kind: Any) -> st.SearchStrategy[Any]:
    """Hostile values, those of a kind first (a JSON Schema type, or a Python value's)."""
    if kind in ("number", "integer") or isinstance(kind, int | float) and not isinstance(kind, bool):
        return st.one_of(st.sampled_from(HOSTILE_NUMBERS), hostile)
    if kind == "string" or isinstance(kind, str):
        return st.one_of(st.sampled_from(HOSTILE_TEXT), hostile)
    return hostile


def mixed(valid: st.SearchStrategy[Any], kind: Any = None) -> st.SearchStrategy[Any]:
    """Mostly the valid value, sometimes a hostile one (of its kind, or any)."""
    return st.one_of(valid, valid, valid, valid, near(kind))


# ---- arguments from a JSON schema ---------------------------------------------------------------
@dataclass
class Pools:
    """Values worth drawing besides random ones: real ids, cursors and names of this server."""

    task_ids: list[str]
    finished_ids: list[str]  # tasks that ended (tasks/result waits for the others)
    cursors: list[str]
    tool_names: list[str]
    catalog_names: list[str]
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)

    def ids(self) -> st.SearchStrategy[str]:
        return st.sampled_from(self.task_ids + [i + "\ud800" for i in self.task_ids] + [i.upper() for i in self.task_ids])

    def hint(self, name: str | None) -> st.SearchStrategy[Any] | None:
        """Values for an argument of this name, besides what its schema allows."""
        if name == "task_id":
            return self.ids()
        if name == "cursor":
            return st.sampled_from(self.cursors)
        if name == "tool_name":
            return st.sampled_from(self.tool_names)
        if name == "timeout_s":  # a valid wait would hold the call open on a task that never runs
            return st.floats(min_value=0.001, max_value=0.05)
        return None


def from_schema(schema: Any, pools: Pools, name: str | None = None, *, mix: bool = True) -> st.SearchStrategy[Any]:
    """Values valid for `schema` (the subset of JSON Schema our tools use); with `mix`, a hostile
    one now and then, at every level."""
    if not isinstance(schema, dict):
        return mixed(valid_json) if mix else valid_json
    hint = pools.hint(name)
    if "enum" in schema:
        valid: st.SearchStrategy[Any] = st.sampled_from(schema["enum"])
    elif "const" in schema:
        valid = st.just(schema["const"])
    elif "anyOf" in schema or "oneOf" in schema:
        valid = st.one_of([from_schema(s, pools, name, mix=mix) for s in schema.get("anyOf", schema.get("oneOf"))])
    else:
        types = schema.get("type", ["null", "boolean", "integer", "number", "string", "array", "object"])
        types = types if isinstance(types, list) else [types]
        valid = st.one_of([_typed(t, schema, pools, mix) for t in types])
    if hint is not None:
        valid = st.one_of(hint, valid)
    return mixed(valid, schema.get("type")) if mix else valid


def _bounds(schema: dict[str, Any], integer: bool) -> tuple[Any, Any]:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        lo = schema["exclusiveMinimum"] + 1 if integer else schema["exclusiveMinimum"]
    if "exclusiveMaximum" in schema:
        hi = schema["exclusiveMaximum"] - 1 if integer else schema["exclusiveMaximum"]
    return lo, hi


def _typed(t: str, schema: dict[str, Any], pools: Pools, mix: bool) -> st.SearchStrategy[Any]:
    if t == "null":
        return st.none()
    if t == "boolean":
        return st.booleans()
    if t == "integer":
        lo, hi = _bounds(schema, True)
        return st.integers(min_value=lo, max_value=hi)
    if t == "number":
        lo, hi = _bounds(schema, False)
        return st.floats(min_value=lo, max_value=hi, allow_nan=False, allow_infinity=False,
                         exclude_min="exclusiveMinimum" in schema, exclude_max="exclusiveMaximum" in schema)
    if t == "string":
        if schema.get("format") == "date-time":  # with zones that carry the ends of the calendar past them
            return st.datetimes(timezones=st.sampled_from(ZONES)).map(lambda d: d.isoformat())
        lo, hi = schema.get("minLength", 0), schema.get("maxLength", 60)
        if "pattern" in schema:
            return st.from_regex(schema["pattern"], fullmatch=True).filter(lambda s: lo <= len(s) <= hi)
        return st.text(min_size=lo, max_size=min(hi, 60))
    if t == "array":
        return st.lists(from_schema(schema.get("items", {}), pools, mix=mix), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 4), 4))
    if t == "object":
        props = schema.get("properties")
        if not props:
            return st.dictionaries(st.text(max_size=8), json_values if mix else valid_json, max_size=3)
        required = set(schema.get("required", []))
        optional = {k: from_schema(v, pools, k, mix=mix) for k, v in props.items() if k not in required}
        if mix:
            optional["unknown_field"] = st.just(1)
        return st.fixed_dictionaries({k: from_schema(v, pools, k, mix=mix) for k, v in props.items() if k in required},
                                     optional=optional)
    return json_values if mix else valid_json


def paths_in(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in items:
        yield from paths_in(v, (*path, k))


def replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = new if len(path) == 1 else replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def poisoned(draw: st.DrawFn, valid: st.SearchStrategy[Any], schema: dict[str, Any]) -> Any:
    """A valid value with one hostile value put in it (any field, at any depth): the call gets as
    far as it can before that value is judged."""
    value = draw(valid)
    props = schema.get("properties", {})
    if not isinstance(value, dict):
        return value
    paths = sorted({p for p in paths_in(value) if p} | {(k,) for k in props}, key=repr)
    path = draw(st.sampled_from(paths))
    leaf: Any = value
    for key in path:
        leaf = leaf.get(key) if isinstance(leaf, dict) else leaf[key]
    kind = props.get(path[0], {}).get("type") if len(path) == 1 and leaf is None else leaf
    return replaced(value, path, draw(near(kind)))


def arguments(name: str, pools: Pools) -> st.SearchStrategy[Any]:
    schema = pools.schemas[name]
    # the arguments are an object (anything else is the SDK's to refuse): hostile values go inside
    args = st.one_of(_typed("object", schema, pools, True), poisoned(from_schema(schema, pools, mix=False), schema))
    if "timeout_s" in schema.get("properties", {}):  # its default (60 s) would hold the example that long
        args = args.map(lambda a: {**a, "timeout_s": 0.05} if isinstance(a, dict) and "timeout_s" not in a else a)
    if name != "submit_task":
        return args
    # inputs that fit the tool named, so that a hostile value deep in them is what gets judged
    return st.one_of(args, st.tuples(from_schema(schema, pools, mix=False), st.sampled_from(pools.catalog_names)).flatmap(
        lambda pair: arguments(pair[1], pools).map(lambda inputs: {**pair[0], "tool_name": pair[1], "inputs": inputs})))


# ---- the entry points --------------------------------------------------------------------------------
def tool_names(pools: Pools) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(pools.tool_names), text)


def calls(pools: Pools) -> st.SearchStrategy[tuple[str, dict[str, Any]]]:
    """(method, params) of every entry point."""
    task_id = st.one_of(pools.ids(), text)
    tool_calls = st.one_of([
        st.tuples(st.just("tools/call"), st.fixed_dictionaries({"name": st.just(name), "arguments": arguments(name, pools)}))
        for name in sorted(pools.schemas)
    ] + [st.tuples(st.just("tools/call"), st.fixed_dictionaries({"name": text, "arguments": json_values}))])
    # a prompt's arguments are text: a tool's arguments as JSON (the server parses them), or any text
    prompt_args = st.sampled_from(pools.catalog_names).flatmap(lambda name: arguments(name, pools)).map(
        lambda args: {k: v if isinstance(v, str) else json.dumps(v) for k, v in args.items()} if isinstance(args, dict)
        else {}) | st.dictionaries(text, text, max_size=3)
    refs = st.one_of(
        st.fixed_dictionaries({"type": st.just("ref/resource"),
                               "uri": st.sampled_from(["task://{task_id}", "tool://{tool_name}"]) | text}),
        st.fixed_dictionaries({"type": st.just("ref/prompt"), "name": st.one_of(st.sampled_from(pools.catalog_names), text)}),
    )
    argument = st.fixed_dictionaries({"name": st.sampled_from(["task_id", "tool_name", "sleep_s", "result", "scene",
                                                               "quality", "inputs.sleep_s", "$.x"]) | text,
                                      "value": text})
    return st.one_of(tool_calls, st.one_of(
        st.tuples(st.sampled_from(["tasks/get", "tasks/cancel"]), st.fixed_dictionaries({"taskId": task_id})),
        st.tuples(st.just("tasks/result"),
                  st.fixed_dictionaries({"taskId": st.one_of(st.sampled_from(pools.finished_ids), text)})),
        st.tuples(st.just("tasks/update"), st.fixed_dictionaries({"taskId": task_id, "inputResponses": st.just({})})),
        st.tuples(st.just("tasks/list"), st.fixed_dictionaries({}, optional={"cursor": st.sampled_from(pools.cursors) | text})),
        st.tuples(st.just("prompts/get"), st.fixed_dictionaries(
            {"name": st.one_of(st.sampled_from(pools.catalog_names), text)}, optional={"arguments": prompt_args})),
        st.tuples(st.just("resources/read"), st.fixed_dictionaries({"uri": st.one_of(
            task_id.map(lambda i: f"task://{i}"), tool_names(pools).map(lambda n: f"tool://{n}"), text)})),
        st.tuples(st.just("completion/complete"), st.fixed_dictionaries(
            {"ref": refs, "argument": argument},
            optional={"context": st.fixed_dictionaries({"arguments": st.dictionaries(text, text, max_size=3)})})),
        st.tuples(st.just(EXTENSION_ID), st.fixed_dictionaries(
            {"ref": st.fixed_dictionaries({"type": st.just("ref/tool"), "name": tool_names(pools)}), "argument": argument},
            optional={"context": st.fixed_dictionaries({"arguments": st.dictionaries(text, mixed(json_values), max_size=3)})})),
    ))


# ---- routes: one era over one transport --------------------------------------------------------------
@dataclass
class Answer:
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    unsendable: bool = False  # the client cannot put this request on its wire at all


def strict_json(body: str) -> Any:
    """JSON as RFC 8259 has it: no NaN, no Infinity."""
    def refuse(constant: str) -> Any:
        raise AssertionError(f"{constant} is not JSON: {body[:300]}")
    return json.loads(body, parse_constant=refuse)


class RawParams(mcp_types.RequestParams):
    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants")


class RawRequest(mcp_types.Request[RawParams, str]):
    """Any method with any params, sent as they are (NaN stays NaN)."""

    model_config = ConfigDict(ser_json_inf_nan="constants")
    method: str
    params: RawParams


class AnyResult(mcp_types.Result):
    model_config = ConfigDict(extra="allow")


class MemoryRoute:
    """fastmcp's Client on the in-memory transport, sending requests raw."""

    def __init__(self, client: Client, era: str):
        self.client, self.era = client, era

    async def send(self, method: str, params: dict[str, Any]) -> Answer:
        request = RawRequest(method=method, params=RawParams.model_validate(params))
        try:  # what the client must encode before anything is sent: its own limits, not the server's
            data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
            key = NAME_BEARING_METHODS.get(method)
            if self.era == MODERN and key and isinstance(data["params"].get(key), str):
                encode_header_value(data["params"][key])
        except ValueError:  # UnicodeEncodeError and pydantic's serialization errors among them
            return Answer(unsendable=True)
        try:
            res = await self.client.session.send_request(request, AnyResult)
        except MCPError as e:
            return Answer(error=e.error.model_dump(exclude_none=True))
        return Answer(result=res.model_dump(by_alias=True, exclude_none=True))


class HttpRoute:
    """Raw JSON-RPC over Streamable HTTP: bytes as a hostile client would send them."""

    def __init__(self, http: httpx.AsyncClient, url: str, era: str, session: Legacy | None):
        self.http, self.url, self.era, self.session = http, url, era, session
        self.next_id = 0

    async def send(self, method: str, params: dict[str, Any]) -> Answer:
        self.next_id += 1
        if self.era == MODERN:
            body = modern_body(method, params, request_id=self.next_id, meta={
                "io.modelcontextprotocol/clientCapabilities": {"extensions": {TASKS_EXTENSION: {}}}})
            headers = modern_headers(**{"Mcp-Method": method})
            key = NAME_BEARING_METHODS.get(method)
            if key and isinstance(params.get(key), str):
                headers["Mcp-Name"] = header_value(params[key])
        else:
            assert self.session is not None
            body = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
            headers = self.session.headers()
        # json.dumps writes NaN as NaN and a lone surrogate as its \ud800 escape: bytes a client can send
        r = await self.http.post(self.url, content=json.dumps(body).encode(), headers=headers)
        assert r.status_code < 500, (r.status_code, r.text[:500])
        if r.headers.get("content-type", "").startswith("text/event-stream"):
            lines = re.split(r"\r\n|\r|\n", r.text)  # SSE's line ends only (str.splitlines also splits at U+0085)
            messages = [strict_json(ln[5:]) for ln in lines if ln.startswith("data:") and ln[5:].strip()]
            [msg] = [m for m in messages if m.get("id") == self.next_id]
        else:
            msg = strict_json(r.text)
            assert msg.get("id") in (self.next_id, None), msg
        assert ("result" in msg) != ("error" in msg), msg
        return Answer(result=msg.get("result"), error=msg.get("error"))


def header_value(value: str) -> str:
    """Mcp-Name as the SDK's client encodes it; text that is not Unicode as its raw code units
    (no client could send better, and the server must not trust it to match)."""
    try:
        return encode_header_value(value)
    except UnicodeEncodeError:
        return f"=?base64?{base64.b64encode(value.encode('utf-8', 'surrogatepass')).decode()}?="


def fuzz_control_plane(home: Path, database_url: str | None = None) -> ControlPlane:
    home.mkdir(parents=True, exist_ok=True)
    (home / "catalog.toml").write_text(catalog_text() + FUZZ_TOOL)
    cp = ControlPlane(Settings(home=home, database_url=database_url, **FAST))
    # Someone else leads for the next hour: this server schedules nothing, so no job runs.
    assert cp.store.leases.acquire(LEADER_LEASE, "fuzz: nobody", 3600)
    return cp


def seed(cp: ControlPlane) -> tuple[list[str], list[str], list[str]]:
    """Three tasks of the caller (one queued, two cancelled) and real cursors."""
    owner, svc = cp.settings.default_owner, cp.service
    ids = [svc.submit(owner, api.SubmitTask(tool_name="exercise", tags=["fuzz"], idempotency_key=f"k{i}"))["task_id"]
           for i in range(3)]
    for tid in ids[1:]:
        svc.cancel(owner, api.CancelTask(task_id=tid))
    page = svc.list(owner, api.ListTasks(limit=1))
    cursors = [page["next_cursor"], "log_000000000", "log_000000001", "plog_", "lst_", "log_"]
    return ids, ids[1:], cursors


@asynccontextmanager
async def open_route(kind: str, era: str, cp: ControlPlane) -> AsyncIterator[MemoryRoute | HttpRoute]:
    if kind == "memory":
        async with Client(build_server(cp), mode="auto" if era == MODERN else "legacy",
                          extensions=[TasksClientExtension()]) as client:
            yield MemoryRoute(client, era)
        return
    async with serving(cp) as server, httpx.AsyncClient(timeout=60) as http:
        session = None
        if era == LEGACY:
            session = Legacy(http, server.url)
            await session.start()
        yield HttpRoute(http, server.url, era, session)


@dataclass(repr=False)
class Harness:
    portal: BlockingPortal
    route: MemoryRoute | HttpRoute
    cp: ControlPlane
    pools: Pools

    def send(self, method: str, params: dict[str, Any]) -> Answer:
        return self.portal.call(self.route.send, method, params)

    def __repr__(self) -> str:  # what a failing example shows of it
        return f"Harness({type(self.route).__name__}, {self.route.era})"


@contextmanager
def harness(kind: str, era: str, home: Path, database_url: str | None = None) -> Iterator[Harness]:
    cp = fuzz_control_plane(home, database_url)
    try:
        ids, finished, cursors = seed(cp)
        with start_blocking_portal("asyncio") as portal, \
                portal.wrap_async_context_manager(open_route(kind, era, cp)) as route:
            h = Harness(portal, route, cp, Pools(ids, finished, cursors, [], sorted(cp.catalog.tools)))
            listed = h.send("tools/list", {})
            assert listed.result is not None, listed
            h.pools.schemas = {t["name"]: t["inputSchema"] for t in listed.result["tools"]}
            h.pools.tool_names = sorted(h.pools.schemas)
            assert {"submit_task", "get_task_status", "tail_task_logs", "list_tasks", "cancel_task", "get_task_result",
                    "wait_task", "exercise", "lj_relax", "render"} <= set(h.pools.tool_names)
            yield h
    finally:
        cp.db.dispose()  # before its database is dropped


ROUTES = [(kind, era, engine) for engine in ENGINES
          for kind, era in (("memory", MODERN), ("memory", LEGACY), ("http", MODERN), ("http", LEGACY))]


ROUTE_IDS = [f"{k}-{e}-{engine}" for k, e, engine in ROUTES]


@pytest.fixture(scope="module", params=ROUTES, ids=ROUTE_IDS)
def fuzzed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    """One server per route and engine for the whole module: the fuzz and the examples share it
    (on PostgreSQL, one database for the module, named in its settings)."""
    kind, era, engine = request.param
    home = tmp_path_factory.mktemp("fuzz") / "home"
    if engine == "sqlite":
        with harness(kind, era, home) as h:
            yield h
        return
    cluster = request.getfixturevalue("pg")
    if cluster is None:
        require_or_skip("its binaries (initdb, postgres) were not found")
    with cluster.database() as url, harness(kind, era, home, url) as h:
        yield h


# ---- what every answer must be ----------------------------------------------------------------------
def strings_in(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings_in(k)
            yield from strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings_in(v)


def assert_no_internals(message: str, params: dict[str, Any], home: Path) -> None:
    """No traceback, path, exception class or exception text (echoes of the request aside)."""
    for s in sorted(set(strings_in(params)), key=len, reverse=True):
        if len(s) > 2:
            message = message.replace(s, "").replace(repr(s)[1:-1], "")
    found = LEAKS.search(message)
    assert found is None, f"internal detail {found.group(0)!r} in {message[:500]!r}"
    assert str(home) not in message, message[:500]


def is_valid_text(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def assert_storable(cp: ControlPlane, task_ids: set[str]) -> None:
    """What a new task stores is strict JSON and Unicode: nothing NaN, nothing half a character."""
    if not task_ids:
        return
    T = Task.__table__
    with cp.db.engine.connect() as c:
        rows = c.execute(select(T).where(T.c.task_id.in_(task_ids))).mappings().all()
    for row in rows:
        for col in ("inputs_json", "resources_json", "tags_json"):
            strict_json(row[col])
            assert all(is_valid_text(s) for s in strings_in(json.loads(row[col]))), (col, row[col][:300])
        for col in ("idempotency_key", "tool_name"):
            assert row[col] is None or is_valid_text(row[col]), (col, row[col])


def check(h: Harness, method: str, params: dict[str, Any], answer: Answer) -> bool:
    """Asserts what every answer must be; True when the call was refused."""
    if answer.error is not None:
        err = answer.error
        code = err.get("code")
        data = err.get("data")
        if code == mcp_types.INTERNAL_ERROR:  # only a task that ended badly, its own error in data
            assert method in ("tasks/result", "tasks/get") and isinstance(data, dict) \
                and data.get("code") in TASK_ERROR_CODES, err
        else:
            assert code in PROTOCOL_CODES, err
        assert isinstance(err.get("message"), str) and err["message"], err
        if code == mcp_types.PARSE_ERROR:  # the SDK's parser, on the bytes: where they stop being JSON
            assert PARSE_ERROR_TEXT.fullmatch(err["message"]), err
        else:
            assert_no_internals(json.dumps(err, ensure_ascii=False) if code != mcp_types.INTERNAL_ERROR
                                else err["message"], params, h.cp.settings.home)
        return True
    result = answer.result
    assert result is not None
    if method == "tools/call" and result.get("resultType") != "task":
        content = result["content"]
        assert content and content[0]["type"] == "text", result
        payload = strict_json(content[0]["text"])
        if result.get("isError"):
            assert payload.get("code") in CALL_ERROR_CODES, payload
            assert set(payload) <= {"code", "message", "hint"} | ERROR_FIELDS.get(payload["code"], set()), payload
            assert result.get("structuredContent") in (None, payload), result
            assert_no_internals(payload["message"] + " " + payload.get("hint", ""), params, h.cp.settings.home)
            return True
    return False


def call_and_check(h: Harness, method: str, params: dict[str, Any]) -> Answer:
    before = db_state(h.cp)
    answer = h.send(method, params)
    if answer.unsendable:
        return answer
    after = db_state(h.cp)
    refused = check(h, method, params, answer)
    if refused:
        assert after == before, f"refused {method} {params!r:.300} changed the database"
    assert_storable(h.cp, set(after[2]) - set(before[2]))
    return answer


FUZZ = settings(max_examples=200, derandomize=True, deadline=None, database=None, print_blob=False,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])


@FUZZ
@given(data=st.data())
def test_every_entry_point_answers_with_a_documented_code(fuzzed: Harness, data: st.DataObject) -> None:
    method, params = data.draw(calls(fuzzed.pools), label="call")
    call_and_check(fuzzed, method, params)


# ---- the defects the fuzz found, one example each ------------------------------------------------------
# Every example must be refused naming its field, in every route that can carry it (the 2025-11-25
# HTTP parser refuses a lone surrogate itself, -32700; the in-memory client cannot name a tool,
# prompt or resource with one in the 2026-07-28 era), and change nothing.
TASK_ID = "<a task of the caller>"
NOT_UNICODE = "not valid Unicode text"  # what the messages say (README, "Error codes")
NOT_FINITE_WHY = "not a finite number"
TOO_DEEP = "nested more than 100 levels deep"
SURROGATE = "\ud800"
LONE_SURROGATES = [
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise\ud800"}}, "tool_name"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "tags": ["ok", "t\udfff"]}}, "tags.1"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "idempotency_key": "k\ud800"}},
     "idempotency_key"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "inputs": {"result": {"a": "\ud800"}}}},
     "inputs.result.a"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "inputs": {"result": {"\ud800": 1}}}},
     "inputs.result.\\ud800"),
    ("tools/call", {"name": "exercise", "arguments": {"result": {"a": "\ud800"}}}, "inputs.result.a"),
    ("tools/call", {"name": "render", "arguments": {"scene": "\udc00"}}, "inputs.scene"),
    ("tools/call", {"name": "get_task_status", "arguments": {"task_id": TASK_ID + SURROGATE}}, "task_id"),
    ("tools/call", {"name": "get_task_result", "arguments": {"task_id": TASK_ID + SURROGATE}}, "task_id"),
    ("tools/call", {"name": "wait_task", "arguments": {"task_id": TASK_ID + SURROGATE}}, "task_id"),
    ("tools/call", {"name": "cancel_task", "arguments": {"task_id": TASK_ID, "reason": "\ud800"}}, "reason"),
    ("tools/call", {"name": "tail_task_logs", "arguments": {"task_id": TASK_ID, "cursor": "log_\ud800"}}, "cursor"),
    ("tools/call", {"name": "list_tasks", "arguments": {"cursor": "lst_\ud800"}}, "cursor"),
    ("tools/call", {"name": "list_tasks", "arguments": {"tags_any": ["\ud800"]}}, "tags_any.0"),
    ("tasks/get", {"taskId": TASK_ID + SURROGATE}, "taskId"),
    ("tasks/cancel", {"taskId": TASK_ID + SURROGATE}, "taskId"),
    ("tasks/update", {"taskId": TASK_ID + SURROGATE, "inputResponses": {}}, "taskId"),
    ("tasks/result", {"taskId": TASK_ID + SURROGATE}, "taskId"),
    ("tasks/list", {"cursor": "lst_\ud800"}, "cursor"),
    ("completion/complete", {"ref": {"type": "ref/resource", "uri": "task://{task_id}"},
                             "argument": {"name": "task_id", "value": "tsk_\ud800"}}, "argument.value"),
    (EXTENSION_ID, {"ref": {"type": "ref/tool", "name": "get_task_status"},
                    "argument": {"name": "task_id", "value": "tsk_\ud800"}}, "argument.value"),
    ("prompts/get", {"name": "exercise", "arguments": {"sleep_s": "\ud800"}}, "arguments.sleep_s"),
    ("resources/read", {"uri": "task://" + TASK_ID + SURROGATE}, "uri"),
]
NOT_FINITE = [
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "priority": math.nan}}, "priority"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "resources": {"cpu": math.nan}}},
     "resources.cpu"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "inputs": {"sleep_s": math.nan}}},
     "inputs.sleep_s"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "lj_relax", "inputs": {"fmax": math.inf}}},
     "inputs.fmax"),
    ("tools/call", {"name": "lj_relax", "arguments": {"fmax": math.nan}}, "inputs.fmax"),
    ("tools/call", {"name": "exercise", "arguments": {"result": {"x": [1, -math.inf]}}}, "inputs.result.x.1"),
    ("tools/call", {"name": "render", "arguments": {"scene": "s", "exposure": math.nan}}, "inputs.exposure"),
    ("tools/call", {"name": "wait_task", "arguments": {"task_id": TASK_ID, "timeout_s": math.nan}}, "timeout_s"),
    ("tools/call", {"name": "wait_task", "arguments": {"task_id": TASK_ID, "timeout_s": math.inf}}, "timeout_s"),
    (EXTENSION_ID, {"ref": {"type": "ref/tool", "name": "exercise"}, "argument": {"name": "sleep_s", "value": ""},
                    "context": {"arguments": {"sleep_s": math.nan}}}, "context.arguments.sleep_s"),
]


def _case_id(case: tuple[str, dict[str, Any], str]) -> str:
    method, params, field_name = case
    name = params.get("name") or params.get("ref", {}).get("name") or params.get("ref", {}).get("uri") or ""
    return f"{method.rsplit('/', 1)[-1]}-{name}-{field_name}".replace("\\", "")


def refused(h: Harness, method: str, params: dict[str, Any], field_name: str, why: str = "") -> None:
    """Refused with a documented code, naming the field and what is wrong with it; nothing stored."""
    params = json.loads(json.dumps(params).replace(json.dumps(TASK_ID)[1:-1], h.pools.task_ids[0]))
    answer = call_and_check(h, method, params)
    if answer.unsendable:
        pytest.skip("this client cannot send it in this era")
    if answer.error is not None:
        if answer.error["code"] in (mcp_types.PARSE_ERROR, HEADER_MISMATCH):
            return  # the SDK refused the bytes: the 2025-11-25 parser, or an Mcp-Name no client can match
        assert answer.error["code"] == mcp_types.INVALID_PARAMS, answer.error
        assert answer.error["message"].startswith(f"{field_name}: {why}"), answer.error
        return
    assert answer.result is not None and answer.result.get("isError"), answer.result
    err = strict_json(answer.result["content"][0]["text"])
    assert err["code"] == "INVALID_REQUEST" and err["message"].startswith(f"{field_name}: {why}"), err


@pytest.mark.parametrize("case", LONE_SURROGATES, ids=[_case_id(c) for c in LONE_SURROGATES])
def test_a_lone_surrogate_is_refused_naming_the_field(fuzzed: Harness, case: tuple[str, dict[str, Any], str]) -> None:
    refused(fuzzed, *case, why=NOT_UNICODE)


@pytest.mark.parametrize("case", NOT_FINITE, ids=[_case_id(c) for c in NOT_FINITE])
def test_nan_and_infinity_are_refused_and_create_no_task(fuzzed: Harness, case: tuple[str, dict[str, Any], str]) -> None:
    refused(fuzzed, *case, why=NOT_FINITE_WHY)


def test_the_highest_code_point_goes_through_intact(fuzzed: Harness) -> None:
    """U+10FFFF is Unicode like any other character: stored and returned as sent."""
    text = "example \U0010ffff"  # not among the fuzz's values: this task alone carries it
    answer = call_and_check(fuzzed, "tools/call", {"name": "submit_task", "arguments": {
        "tool_name": "exercise", "tags": [text], "idempotency_key": text, "inputs": {"result": {text: text}}}})
    assert answer.result is not None and not answer.result.get("isError"), answer
    task_id = strict_json(answer.result["content"][0]["text"])["task_id"]
    status = call_and_check(fuzzed, "tools/call", {"name": "get_task_status", "arguments": {"task_id": task_id}})
    assert status.result is not None and strict_json(status.result["content"][0]["text"])["tags"] == [text]
    again = call_and_check(fuzzed, "tools/call", {"name": "submit_task", "arguments": {
        "tool_name": "exercise", "tags": [text], "idempotency_key": text, "inputs": {"result": {text: text}}}})
    assert again.result is not None and strict_json(again.result["content"][0]["text"])["task_id"] == task_id
    listed = call_and_check(fuzzed, "tools/call", {"name": "list_tasks", "arguments": {"tags_any": [text]}})
    assert listed.result is not None
    assert [t["task_id"] for t in strict_json(listed.result["content"][0]["text"])["tasks"]] == [task_id]


DEEP_CASES = [
    ("prompts/get", {"name": "exercise", "arguments": {"result": DEEP_JSON}}, "inputs.result"),
    ("prompts/get", {"name": "lj_relax", "arguments": {"fmax": DEEP_JSON}}, "inputs.fmax"),
    ("completion/complete", {"ref": {"type": "ref/prompt", "name": "exercise"}, "argument": {"name": "sleep_s", "value": ""},
                             "context": {"arguments": {"result": DEEP_JSON}}}, None),
    ("tools/call", {"name": "exercise", "arguments": {"result": {"deep": nested(250)}}}, "inputs.result"),
    ("tools/call", {"name": "submit_task", "arguments": {"tool_name": "exercise", "inputs": {"result": nested(250)}}},
     "inputs"),
]


@pytest.mark.parametrize("case", DEEP_CASES, ids=[_case_id(c) for c in DEEP_CASES])
def test_deeply_nested_json_is_answered(fuzzed: Harness, case: tuple[str, dict[str, Any], str | None]) -> None:
    """10,000 levels of JSON in a string argument (parsed by the server for prompts and completion),
    and 250 real levels in an argument: an answer with a documented code, never INTERNAL."""
    method, params, field_name = case
    if field_name is None:  # completion: the deep text is just text, nothing to refuse
        answer = call_and_check(fuzzed, method, params)
        assert answer.result is not None and "0" in answer.result["completion"]["values"], answer  # the default
        return
    if method == "prompts/get":
        answer = call_and_check(fuzzed, method, params)
        assert answer.error is not None and answer.error["code"] == mcp_types.INVALID_PARAMS, answer
        assert answer.error["message"].startswith(f"{field_name}: "), answer.error["message"][:200]
        return
    refused(fuzzed, method, params, field_name, why=TOO_DEEP)


def test_an_unexpected_error_in_a_protocol_method_is_internal_without_its_text(
        fuzzed: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 2025-11-25 dispatcher answers an unexpected exception with code 0 and its text."""
    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError(f"boom in {ROOT}/controlplane/store/tasks.py")

    monkeypatch.setattr(fuzzed.cp.store.tasks, "get", broken)
    answer = fuzzed.send("tasks/get", {"taskId": fuzzed.pools.task_ids[0]})
    assert answer.error == {"code": mcp_types.INTERNAL_ERROR,
                            "message": "internal error; the server log has the details"} or \
        answer.error == {"code": mcp_types.INTERNAL_ERROR, "message": "Internal server error"}, answer

