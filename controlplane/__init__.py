"""mcp-controlplane: run heavy compute as durable tasks for AI agents."""

# The one place the version is written: the package's metadata (pyproject.toml reads it from
# here), the MCP server's serverInfo, `controlplane --version` and server.json (checked by a test).
__version__ = "0.1.0"
