"""The catalog's tools and prompts on the MCP server, swapped whole when the catalog changes
(docs/design/catalog-reload.md), and the clients told so.

- 2025-11-25 and older: `notifications/tools/list_changed` and `notifications/prompts/list_changed`
  on the connection's standalone channel, to every connection that listed tools or prompts (one
  that never listed them has nothing to refresh; a closed one drops out by itself).
- 2026-07-28: `ToolsListChanged` and `PromptsListChanged` on every open `subscriptions/listen`
  stream that asked for them (`TaskSubscriptions.publish`).
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastmcp.server.middleware import CallNext, Middleware, MiddlewareContext
from mcp.server.subscriptions import PromptsListChanged, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from controlplane.mcp import compat, prompts
from controlplane.mcp.tools import ServiceTool, catalog_tool, output_schema
from controlplane.service import answers

if TYPE_CHECKING:
    from fastmcp import FastMCP

    from controlplane.app import ControlPlane
    from controlplane.mcp.subscriptions import TaskSubscriptions

log = logging.getLogger("controlplane.mcp.catalog")


class CatalogTools(Middleware):
    """Registers one tool and one prompt per catalog tool; `swap()` replaces them all at once
    (no await in between: no request sees half of it) and tells the clients."""

    def __init__(self, mcp: FastMCP, cp: ControlPlane, subscriptions: TaskSubscriptions,
                 make_tool: Callable[[Any], ServiceTool], schemas: dict[str, dict[str, Any]],
                 on_schemas: Callable[[], None]):
        self.mcp, self.cp, self.subscriptions = mcp, cp, subscriptions
        self.make_tool = make_tool
        self.schemas = schemas  # every tool's input schema by name, shared with completion
        self.on_schemas = on_schemas  # called after `schemas` changed
        self.names: set[str] = set()
        self._listed: weakref.WeakSet[Any] = weakref.WeakSet()  # 2025-era connections that listed

    def install(self) -> list[ServiceTool]:
        tools = [self.make_tool(spec) for spec in self.cp.catalog.tools.values()]
        self.names = {t.name for t in tools}
        prompts.install(self.mcp, self.cp)
        self.cp.catalog_listeners.append(self.swap)
        return tools

    async def swap(self) -> None:
        """The catalog changed: its tools and prompts replace the old ones, then clients hear of it."""
        local = self.mcp.local_provider
        new = [self.make_tool(spec) for spec in self.cp.catalog.tools.values()]
        for name in self.names:
            local.remove_tool(name)
            local.remove_prompt(name)
            self.schemas.pop(name, None)
        for t in new:
            self.mcp.add_tool(t)
            self.schemas[t.name] = t.parameters
        prompts.install(self.mcp, self.cp)
        self.names = {t.name for t in new}
        self.on_schemas()
        await self.announce()

    async def announce(self) -> None:
        for connection in list(self._listed):
            try:
                await connection.send_tool_list_changed()
                await connection.send_prompt_list_changed()
            except Exception as e:  # noqa: BLE001 - a connection closing meanwhile
                log.debug("list_changed not sent: %r", e)
        await self.subscriptions.publish(ToolsListChanged(), PromptsListChanged())

    # ---- who listed: the 2025-era connections to tell ---------------------------------------------
    async def __call__(self, context: MiddlewareContext, call_next: CallNext) -> Any:
        """Every other request passes straight on (one method instead of fastmcp's per-hook
        dispatch, which cost each tool call several times more)."""
        if context.method in ("tools/list", "prompts/list"):
            self._remember(context)
        return await call_next(context)

    def _remember(self, context: MiddlewareContext) -> None:
        try:
            connection = compat.connection_of(context.fastmcp_context.session)  # type: ignore[union-attr]
        except (AttributeError, RuntimeError):
            return
        if connection.protocol_version not in MODERN_PROTOCOL_VERSIONS:  # those hear it on listen streams
            self._listed.add(connection)


def make_catalog_tool(cp: ControlPlane, default_owner: str, after: Callable[[str, dict[str, Any]], None]
                      ) -> Callable[[Any], ServiceTool]:
    """Makes the tool of a catalog entry; their outputSchema is made here, once for all of them."""
    schema = output_schema(answers.CatalogToolAnswer)
    return lambda spec: catalog_tool(spec, cp.service.submit_direct, answer_schema=schema,
                                     default_owner=default_owner, after=after)
