"""An MCP client that runs under either major version of the official ``mcp`` package.

tests/test_mcp_versions.py runs it with the python of a virtualenv holding mcp 1.x or
2.x, against a warren MCP server started from another (or the same) virtualenv, so each
client major meets each server major. It only drives the session and reports what came
back, as JSON on stdout; the test judges it.

Input (argv[1], JSON): {"stdio": [command, args...], "env": {...}} or
{"http": url, "token": "..."}, and "calls": [[tool, arguments], ...].
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import AsyncExitStack
from importlib.metadata import version
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

MAJOR = int(version("mcp").split(".", 1)[0])


def _field(obj: Any, snake: str, camel: str) -> Any:
    """A result's field: 2.x names them in snake_case, 1.x as on the wire (camelCase)."""
    return getattr(obj, snake) if MAJOR >= 2 else getattr(obj, camel)


async def main(request: dict[str, Any]) -> dict[str, Any]:
    async with AsyncExitStack() as stack:
        if "stdio" in request:
            command, *args = request["stdio"]
            params = StdioServerParameters(command=command, args=args, env=request["env"])
            streams = await stack.enter_async_context(stdio_client(params))
        else:
            if MAJOR >= 2:
                import httpx2 as http_lib  # 2.x's client is built on httpx2
            else:
                import httpx as http_lib
            http = await stack.enter_async_context(
                http_lib.AsyncClient(headers={"Authorization": f"Bearer {request['token']}"}, timeout=60)
            )
            streams = await stack.enter_async_context(
                streamable_http_client(request["http"], http_client=http)
            )
        session = await stack.enter_async_context(ClientSession(streams[0], streams[1]))
        init = await session.initialize()
        tools = (await session.list_tools()).tools
        calls = []
        for name, arguments in request["calls"]:
            result = await session.call_tool(name, arguments)
            calls.append(
                {
                    "is_error": _field(result, "is_error", "isError"),
                    "text": [c.text for c in result.content if getattr(c, "type", "") == "text"],
                    "structured": _field(result, "structured_content", "structuredContent"),
                }
            )
        return {
            "client_mcp": version("mcp"),
            "server_name": _field(init, "server_info", "serverInfo").name,
            "tools": sorted(t.name for t in tools),
            "calls": calls,
        }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
