"""The guard every request passes first: what JSON cannot carry reaches no handler.

The 2025-11-25 HTTP and stdio parsers refuse text that is not Unicode (a lone surrogate such as
"\\ud800"), but the 2026-07-28 HTTP parser and the in-memory transport hand it on, and no parser
refuses NaN or Infinity. Past this guard every value is JSON (`api.json_problem`), so nothing
downstream meets text the database driver cannot encode, a number no bound can compare, or
nesting that exhausts a parser's stack. A refused request changes nothing:

* tools/call: an `isError` INVALID_REQUEST result naming the argument (`inputs.<field>` for a
  catalog tool, as its other input errors do);
* any other request: JSON-RPC INVALID_PARAMS naming the parameter.

It also keeps the protocol methods' answers clean: an unexpected exception is logged and answered
INTERNAL_ERROR with no details (the SDK's 2025-11-25 dispatcher would send its text, code 0).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from fastmcp.exceptions import DisabledError, FastMCPError, NotFoundError
from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from fastmcp.tools.base import ToolResult
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from pydantic import BaseModel, ValidationError

from controlplane.api import dotted, json_problem
from controlplane.errors import invalid
from controlplane.mcp.tools import error

if TYPE_CHECKING:
    from controlplane.catalog import Catalog

log = logging.getLogger("controlplane.mcp")
EXPECTED = (MCPError, ValidationError, FastMCPError, NotFoundError, DisabledError)  # answered by the SDK or fastmcp


def _params(message: Any) -> Any:
    """The request's params as JSON values (the outer pass sees the raw mapping, the component
    methods a validated model)."""
    return message.model_dump(by_alias=True) if isinstance(message, BaseModel) else message


class JsonOnly(Middleware):
    def __init__(self, catalog: Catalog):
        self.catalog = catalog

    async def on_call_tool(self, context: MiddlewareContext, call_next: CallNext) -> ToolResult:
        params = context.message
        problem = json_problem(params.arguments or {})
        if problem is not None:
            prefix = "inputs" if self.catalog.tool(params.name) is not None else ""
            return error(invalid(f"{dotted(problem[0], prefix)}: {problem[1]}"), time.perf_counter())
        result: ToolResult = await call_next(context)
        return result

    async def on_request(self, context: MiddlewareContext, call_next: CallNext) -> Any:
        if context.method != "tools/call":  # its arguments are on_call_tool's
            problem = json_problem(_params(context.message))
            if problem is not None:
                raise MCPError(code=INVALID_PARAMS, message=f"{dotted(problem[0])}: {problem[1]}")
        try:
            return await call_next(context)
        except EXPECTED:
            raise
        except Exception:
            log.exception("%s failed", context.method)
            raise MCPError(code=INTERNAL_ERROR, message="internal error; the server log has the details") from None
