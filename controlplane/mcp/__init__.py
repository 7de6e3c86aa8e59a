"""The MCP surface: tool components, the server factory, bearer-token auth."""
