"""Argument completion (docs/design/progress-and-completion.md): candidate values for a tool's argument, a task id, a tool name.

A value starting with `$.` is a reference to another argument and is completed from the other
arguments already given, and from nothing else: `$.se` offers the values given for the arguments
whose names start with `se`; an object argument offers `$.opts.` to walk into it. Otherwise the
candidates come, in this order, from:
1. the argument's JSON schema: `enum`, `const`, `anyOf`/`oneOf` branches, booleans, small integer
   ranges, array item enums;
2. values the same caller used for that argument in earlier tasks of the same tool, newest first;
3. the schema's `default` and `examples`.
Canonical tools complete `task_id` with the caller's own task ids (newest first), `tool_name` with
the catalog's tools, and `inputs.<field>` of submit_task as the field of the tool it names.

Matching is a case-insensitive prefix match. At most 100 values are returned (the MCP limit) with
the total when it is known. Nothing here knows about MCP: the MCP surface wraps it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controlplane.catalog import Catalog
    from controlplane.service import TaskService

MAX_VALUES = 100  # the MCP completion limit
HISTORY_TASKS = 200  # earlier tasks of the tool looked at for previously used values


@dataclass(frozen=True)
class Candidates:
    values: list[str]
    total: int | None  # None: more may exist than were looked at
    has_more: bool


def _text(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"))


def _finish(cands: list[str], typed: str, *, resolved: list[str] | None = None) -> Candidates:
    """The candidates that match what was typed (resolved references are answers already)."""
    want = typed.casefold()
    seen: dict[str, None] = dict.fromkeys(resolved or [])
    for c in cands:
        if c.casefold().startswith(want):
            seen.setdefault(c, None)
    values = list(seen)
    more = len(values) > MAX_VALUES
    return Candidates(values[:MAX_VALUES], len(values), more)


def schema_values(schema: dict[str, Any]) -> list[str]:
    """The values a schema names itself (enum, const, branches, booleans, small ranges)."""
    out: list[str] = []
    if "const" in schema:
        out.append(_text(schema["const"]))
    out.extend(_text(v) for v in schema.get("enum", []))
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key, []):
            if isinstance(branch, dict):
                out.extend(schema_values(branch))
    types = schema.get("type")
    types = types if isinstance(types, list) else [types]
    if "boolean" in types:
        out.extend(["true", "false"])
    if "integer" in types and isinstance(schema.get("minimum"), int) and isinstance(schema.get("maximum"), int):
        lo, hi = schema["minimum"], schema["maximum"]
        if 0 <= hi - lo < MAX_VALUES:
            out.extend(str(i) for i in range(lo, hi + 1))
    if "array" in types and isinstance(schema.get("items"), dict):
        out.extend(schema_values(schema["items"]))
    return out


def _suggested(schema: dict[str, Any]) -> list[str]:
    out = [_text(schema["default"])] if "default" in schema else []
    return out + [_text(v) for v in schema.get("examples", [])]


def property_schema(schema: dict[str, Any], path: str) -> dict[str, Any] | None:
    """The schema of an argument, by name (`a.b` for a field of an object argument)."""
    cur: Any = schema
    for part in path.split("."):
        props = cur.get("properties") if isinstance(cur, dict) else None
        if not isinstance(props, dict) or part not in props:
            return None
        cur = props[part]
    return cur if isinstance(cur, dict) else None


def _lookup(data: Any, path: list[str]) -> tuple[bool, Any]:
    cur = data
    for part in path:
        if not isinstance(cur, dict) or part not in cur:
            return False, None
        cur = cur[part]
    return True, cur


def references(typed: str, argument: str, arguments: dict[str, Any]) -> list[str]:
    """`$.field` references resolved from the other arguments: `$.se` offers the values of the
    arguments whose names start with `se`; an object argument offers `$.obj.field` to go on."""
    parts = typed[2:].split(".")
    *parents, last = parts
    others = {k: v for k, v in arguments.items() if k != argument.split(".")[0]}
    found, parent = _lookup(others, parents)
    if not found or not isinstance(parent, dict):
        return []
    out = []
    for key, value in parent.items():
        if not key.startswith(last):
            continue
        if isinstance(value, dict):
            out.append("$." + ".".join([*parents, key]) + ".")
        else:
            out.append(_text(value))
    return out


def resolve(value: Any, argument: str, arguments: dict[str, Any]) -> Any:
    """A `$.field` value replaced by the value of that other argument; anything else as it is."""
    if not isinstance(value, str) or not value.startswith("$."):
        return value
    others = {k: v for k, v in arguments.items() if k != argument.split(".")[0]}
    found, v = _lookup(others, value[2:].split("."))
    return v if found and not (isinstance(v, str) and v.startswith("$.")) else value


def _history(inputs: list[dict[str, Any]], path: str) -> list[str]:
    out = []
    for one in inputs:
        found, v = _lookup(one, path.split("."))
        if found and v is not None and not isinstance(v, dict | list):
            out.append(_text(v))
    return out


class Completer:
    """`schemas`: the input schemas of the served tools, by name (as served, $refs inlined); a
    catalog tool is completed from its catalog entry (and its history) first."""

    def __init__(self, service: TaskService, catalog: Catalog, schemas: dict[str, dict[str, Any]]):
        self.service = service
        self.catalog = catalog
        self.schemas = schemas

    def task_ids(self, caller: str, typed: str) -> Candidates:
        ids = self.service.task_ids(caller, typed, MAX_VALUES + 1)
        more = len(ids) > MAX_VALUES
        return Candidates(ids[:MAX_VALUES], None if more else len(ids), more)

    def tool_names(self, typed: str) -> Candidates:
        return _finish(sorted(self.catalog.tools), typed)

    def argument(self, caller: str, tool: str, argument: str, typed: str,
                 arguments: dict[str, Any] | None = None) -> Candidates | None:
        """Candidates for one argument of a tool (catalog or canonical); None for an unknown tool."""
        arguments = arguments or {}
        spec = self.catalog.tool(tool)
        if spec is not None:
            return self._catalog_argument(caller, spec, argument, typed, arguments)
        if tool not in self.schemas:
            return None
        if argument == "task_id":
            return self.task_ids(caller, typed)
        if argument == "tool_name":
            return self.tool_names(typed)
        if tool == "submit_task" and argument.startswith("inputs."):
            given = arguments.get("inputs")
            inner: dict[str, Any] = given if isinstance(given, dict) else {}
            target = self.catalog.tool(str(arguments.get("tool_name", "")))
            if target is None:
                return Candidates([], 0, False)
            return self._catalog_argument(caller, target, argument.removeprefix("inputs."), typed, inner)
        schema = property_schema(self.schemas[tool], argument) or {}
        if typed.startswith("$."):
            return _finish([], typed, resolved=references(typed, argument, arguments))
        return _finish(schema_values(schema) + _suggested(schema), typed)

    def _catalog_argument(self, caller: str, spec: Any, argument: str, typed: str,
                          arguments: dict[str, Any]) -> Candidates:
        schema = property_schema(spec.input_schema, argument)
        if schema is None:
            return Candidates([], 0, False)
        if typed.startswith("$."):
            return _finish([], typed, resolved=references(typed, argument, arguments))
        cands = schema_values(schema)
        cands += _history(self.service.recent_inputs(caller, spec.name, HISTORY_TASKS), argument)
        cands += _suggested(schema)
        return _finish(cands, typed)
