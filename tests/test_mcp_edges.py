"""`warren mcp` given hostile or edge values by the official MCP client: every one is
a tool error saying what is wrong (never a dropped connection or a silent default),
and the server ends without a traceback."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from service_util import mcp_server_pythons
from warren import PolicySpec, Sandbox


def _error_text(result: Any) -> str:
    assert result.isError, result
    return str(result.content[0].text)


def _data(result: Any) -> Any:
    assert not result.isError, result.content
    content = result.structuredContent
    return content.get("result", content) if set(content) == {"result"} else content


async def _edges(session: ClientSession, ws: Path) -> None:
    await session.initialize()
    # timeout 0 is not "no limit": refused, like a negative or absurd one
    for bad in (0, -1, 1e16, 1e308):
        text = _error_text(await session.call_tool("run_command", {"command": "true", "timeout": bad}))
        assert "timeout" in text, text
    ran = _data(await session.call_tool("run_command", {"command": "sleep 5", "timeout": 0.5}))
    assert ran["timed_out"]  # control: a small positive timeout is a limit
    assert (
        _data(await session.call_tool("run_command", {"command": "true", "timeout": None}))["exit_code"] == 0
    )

    started = _data(await session.call_tool("start_process", {"command": "echo up; sleep 30"}))
    for offsets in ({"offset": 1 << 70}, {"stderr_offset": 1 << 70}, {"offset": -1}):
        text = _error_text(await session.call_tool("process_output", {"id": started["id"], **offsets}))
        assert "offset" in text, text
    # the connection survived: the same session still answers
    out = _data(await session.call_tool("process_output", {"id": started["id"], "offset": 1 << 40}))
    assert out["stdout"] == "" and out["next_offset"] == 1 << 40
    stopped = _data(await session.call_tool("stop_process", {"id": started["id"], "signal": "SIGKILL"}))
    assert stopped["ended"] is False
    for _ in range(100):
        if not _data(await session.call_tool("process_output", {"id": started["id"]}))["running"]:
            break
        await asyncio.sleep(0.05)
    again = _data(await session.call_tool("stop_process", {"id": started["id"]}))
    assert again["ended"] is True  # an ended process: said so, not an error

    # one argument over the kernel's 128 KiB limit: said to be too long (E2BIG)
    text = _error_text(await session.call_tool("run_command", {"argv": ["echo", "x" * (1 << 20)]}))
    assert "too long" in text and "execute bit" not in text
    text = _error_text(await session.call_tool("run_command", {"command": "echo " + "x" * (1 << 20)}))
    assert "too long" in text
    ran = _data(await session.call_tool("run_command", {"argv": ["printf", "%s", "x" * 100_000]}))
    assert len(ran["stdout"]) == 100_000  # control: a long argument under the limit runs

    # another server's (or the user's) sandboxes cannot be named
    for name in ("plain", "../plain", "mcp-00000000-default", "", "a" * 41, "x/y", "-x"):
        text = _error_text(await session.call_tool("remove_sandbox", {"name": name}))
        assert "no sandbox" in text or "not allowed" in text, text
    assert any(i.name == "plain" and i.alive for i in Sandbox.list())
    for path in ("", "a\x00b", "x" * 5000):
        text = _error_text(await session.call_tool("read_file", {"path": path}))
        assert "path" in text, text
    text = _error_text(await session.call_tool("run_command", {"command": "true", "cwd": "a\x00b"}))
    assert "cwd" in text


@pytest.mark.parametrize("server_python", mcp_server_pythons())
def test_mcp_refuses_edge_values_with_tool_errors_and_exits_without_a_traceback(
    tmp_path: Path, state_home: Path, server_python: str
) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    Sandbox.create(PolicySpec(workspace=str(ws)), name="plain")
    params = StdioServerParameters(
        command=server_python, args=["-m", "warren", "mcp", "--workspace", str(ws)], env=dict(os.environ)
    )
    errlog = tmp_path / "mcp-stderr.txt"

    async def main() -> None:
        with errlog.open("w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                await _edges(session, ws)

    asyncio.run(main())
    text = errlog.read_text()
    assert "Traceback" not in text and "Error" not in text, text
