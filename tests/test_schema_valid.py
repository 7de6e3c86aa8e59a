"""Every input the published schema allows is taken: for each tool of tools/list, inputs drawn
from the inputSchema the client sees (the fuzz's generator for the JSON Schema our tools use,
kept only when `jsonschema` finds them valid: hypothesis-jsonschema 0.23 does not run on this
hypothesis; real task ids and cursors of this server mixed in) are never refused INVALID_REQUEST for a reason that schema could have
stated, and never answered INTERNAL. What stays refusable is what no JSON Schema of the tool can
say: names of the operator's catalog and limits, cross-field rules, opaque cursors.

The server is real (`tests/test_fuzz.py`'s harness: `build_server` behind fastmcp's Client, on
SQLite and PostgreSQL), and each refusal must change nothing (`call_and_check`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from tests.conftest import ENGINES
from tests.postgres import require_or_skip
from tests.test_fuzz import FUZZ, Harness, call_and_check, from_schema, harness, strict_json
from tests.wire import MODERN

# INVALID_REQUEST messages that depend on what the schema cannot know or say.
BEYOND_THE_SCHEMA = re.compile("|".join([
    r"unknown tool '", r"unknown resource class '", r"exceeds the (tool|server)'s max", r"at most the class's",
    r"scratch", r"malformed cursor", r"give either cursor or from_end", r"from_end is not available",
    r"since: must be before until", r"give owner or everyone", r"^inputs",  # submit_task: the named tool's schema
    r"resources\.", r"exceeds the resource class", r"no provider", r"cannot",
]))
CANONICAL = ["submit_task", "get_task_status", "tail_task_logs", "list_tasks", "cancel_task", "get_task_result",
             "wait_task", "usage_report"]


@pytest.fixture(scope="module", params=ENGINES)
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    home = tmp_path_factory.mktemp("valid") / "home"
    if request.param == "sqlite":
        with harness("memory", MODERN, home) as h:
            yield h
        return
    cluster = request.getfixturevalue("pg")
    if cluster is None:
        require_or_skip("its binaries (initdb, postgres) were not found")
    with cluster.database() as url, harness("memory", MODERN, home, url) as h:
        yield h


def valid_arguments(h: Harness, name: str) -> st.SearchStrategy[dict[str, Any]]:
    """Inputs the published schema of `name` allows; task ids, cursors and tool names of this
    server in place of random ones half of the time (so that the calls get past NOT_FOUND)."""
    schema = h.pools.schemas[name]
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    drawn = from_schema(schema, h.pools, mix=False).filter(lambda a: isinstance(a, dict) and validator.is_valid(a))
    real = {"task_id": st.sampled_from(h.pools.task_ids), "cursor": st.sampled_from(h.pools.cursors),
            "tool_name": st.sampled_from(h.pools.catalog_names), "timeout_s": st.floats(0.001, 0.05)}

    @st.composite
    def mixed(draw: st.DrawFn) -> dict[str, Any]:
        args = dict(draw(drawn))
        if "timeout_s" in schema.get("properties", {}):
            args.setdefault("timeout_s", 0.05)  # (its default, 60 s, would hold each example that long)
        for key, values in real.items():
            if key in args and (key in ("task_id", "timeout_s") or draw(st.booleans())):
                args[key] = draw(values)
        return args

    return mixed()


@pytest.mark.parametrize("name", [*CANONICAL, "exercise", "lj_relax", "render"])
def test_a_schema_valid_input_is_never_refused_for_what_the_schema_could_say(server: Harness, name: str) -> None:
    assert name in server.pools.schemas

    @settings(FUZZ, max_examples=150)
    @given(args=valid_arguments(server, name))
    def run(args: dict[str, Any]) -> None:
        answer = call_and_check(server, "tools/call", {"name": name, "arguments": args})
        assert answer.error is None, answer.error
        result = answer.result
        assert result is not None
        if result.get("resultType") == "task" or not result.get("isError"):
            return
        err = strict_json(result["content"][0]["text"])
        assert err["code"] != "INTERNAL", (name, args)
        if err["code"] == "INVALID_REQUEST":
            assert BEYOND_THE_SCHEMA.search(err["message"]), (name, args, err)

    run()


def test_the_constraints_the_server_checks_are_in_the_published_schema(server: Harness) -> None:
    """The ones found by comparing refusals with the schema: distinct group_by entries, and no
    NUL in text the server keeps or looks up."""
    schemas = server.pools.schemas

    def text(schema: dict[str, Any]) -> dict[str, Any]:
        return next(b for b in schema.get("anyOf", [schema]) if b.get("type") == "string")

    assert schemas["usage_report"]["properties"]["group_by"]["uniqueItems"] is True
    for tool, field in [("submit_task", "idempotency_key"), ("cancel_task", "reason"), ("list_tasks", "tool_name"),
                        ("list_tasks", "owner"), ("usage_report", "owner")]:
        assert text(schemas[tool]["properties"][field])["pattern"] == r"^[^\x00]*$", (tool, field)
