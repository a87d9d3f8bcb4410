"""``warren mcp``: an MCP server (official ``mcp`` SDK) over the client core; see ``server``."""
