"""Catalog tools as MCP prompts (docs/design/progress-and-completion.md): one prompt per catalog tool, named like the tool,
whose arguments are the tool's. A host that shows prompts as commands completes their values
(`controlplane.mcp.completion`), and the rendered prompt asks the model to run the tool as a
task with them (`$.field` values resolved from the other arguments).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastmcp.prompts.base import Prompt, PromptArgument
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS
from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from controlplane import api
from controlplane.errors import ControlPlaneError
from controlplane.mcp.candidates import resolve

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from controlplane.app import ControlPlane


class RunToolPrompt(Prompt):
    """A catalog tool as a prompt: its arguments are the tool's (values as JSON or plain text)."""

    tool_input_schema: dict[str, Any] = Field(default_factory=dict, exclude=True)
    validate_inputs: SkipJsonSchema[Callable[[str, dict[str, Any]], None]] = Field(exclude=True)

    async def render(self, arguments: dict[str, Any] | None = None) -> str:
        props = self.tool_input_schema.get("properties", {})
        given = {k: typed_argument(v, props.get(k)) for k, v in (arguments or {}).items() if v is not None and v != ""}
        values = {name: resolve(v, name, given) for name, v in given.items()}
        try:
            self.validate_inputs(self.name, values)  # what submitting them would say
        except ControlPlaneError as e:
            raise MCPError(code=INVALID_PARAMS, message=e.message) from None
        inputs = json.dumps(values, indent=2, sort_keys=True)
        return (f"Run the tool `{self.name}` as a durable task with these arguments:\n\n```json\n{inputs}\n```\n\n"
                "The call returns a task id at once. Then call wait_task with that id (it streams progress "
                "and returns the result), or poll get_task_status; get_task_result gives the result and "
                "download links for its artifacts.")


def typed_argument(v: Any, schema: dict[str, Any] | None) -> Any:
    """A prompt argument (always text) as the tool's argument: JSON unless the field is a string."""
    types = (schema or {}).get("type")
    if "string" in (types if isinstance(types, list) else [types]):
        return v
    return _json_or_text(v)


def _json_or_text(v: Any) -> Any:
    """The value the text spells in JSON, else the text as it is (the tool's schema then says
    what is wrong with it): nesting too deep to parse, and what JSON cannot carry (NaN, a
    `\\ud800` escape, see `api.json_problem`), stay text."""
    if not isinstance(v, str):
        return v
    try:
        parsed = json.loads(v)
    except (ValueError, RecursionError):
        return v
    return v if api.json_problem(parsed) is not None else parsed


def tool_prompt(spec: Any, validate_inputs: Callable[[str, dict[str, Any]], None]) -> RunToolPrompt:
    schema = spec.input_schema
    required = set(schema.get("required", []))
    args = [PromptArgument(name=n, description=(p or {}).get("description"), required=n in required)
            for n, p in schema.get("properties", {}).items()]
    return RunToolPrompt(name=spec.name, description=f"Run {spec.name} as a durable task. {spec.description}",
                         arguments=args, tool_input_schema=schema, validate_inputs=validate_inputs,
                         meta={"schemaVersion": spec.schema_version})


def install(mcp: FastMCP, cp: ControlPlane) -> None:
    for spec in cp.catalog.tools.values():
        mcp.add_prompt(tool_prompt(spec, cp.service.validate_inputs))
