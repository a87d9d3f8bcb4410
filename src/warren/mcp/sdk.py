"""The one place that knows which major version of the official ``mcp`` SDK is installed.

warren installs beside agent projects, and those pin ``mcp`` 1.x or 2.x; warren accepts
both (``mcp>=1.20,<3``) so it never forces a downgrade on the project. What differs
between the majors, for warren's server, is small and lives here:

- the server class: ``FastMCP`` (1.x, ``mcp.server.fastmcp``) became ``MCPServer``
  (2.x, ``mcp.server.mcpserver``), with ``ToolError`` moved beside it;
- where the streamable-HTTP path and the transport-security settings go: the
  constructor in 1.x, ``streamable_http_app()`` in 2.x;
- ``call_tool``'s signature: 2.x passes a request context as a third argument;
- a listed tool's JSON schema: ``inputSchema`` (1.x) became ``input_schema`` (2.x).

Everything else (the ``tool()`` decorator, ``_tool_manager.get_tool(name).parameters``,
``run("stdio")``, ``session_manager``) is the same in both. The SDK's classes are
looked up by name at import time, so type checking does not depend on which major is
installed: they are ``Any`` here, and ``server.py`` is typed against its own code.
"""

from __future__ import annotations

import importlib
from importlib.metadata import version
from typing import Any

MAJOR = int(version("mcp").split(".", 1)[0])

_module = "mcp.server.mcpserver" if MAJOR >= 2 else "mcp.server.fastmcp"
Server: Any = getattr(importlib.import_module(_module), "MCPServer" if MAJOR >= 2 else "FastMCP")
ToolError: type[Exception] = importlib.import_module(_module + ".exceptions").ToolError


def server_kwargs(streamable_path: str, security: Any) -> dict[str, Any]:
    """What the server's constructor takes beyond name and instructions."""
    if MAJOR >= 2:
        return {}
    return {"streamable_http_path": streamable_path, "transport_security": security}


def http_app_kwargs(streamable_path: str, security: Any) -> dict[str, Any]:
    """What ``streamable_http_app()`` takes (the settings 1.x already got at construction)."""
    if MAJOR >= 2:
        return {"streamable_http_path": streamable_path, "transport_security": security}
    return {}


def input_schema(tool: Any) -> dict[str, Any]:
    """A listed tool's JSON schema for its arguments, under either major's name."""
    schema = getattr(tool, "input_schema", None)
    if schema is None:
        schema = tool.inputSchema
    return dict(schema)
