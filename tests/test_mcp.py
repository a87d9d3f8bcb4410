"""`warren mcp` (stdio) and `/mcp` on `warren serve` (streamable HTTP), driven by the
official MCP client (the `mcp` package), as an agent would."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from service_util import Serve, mcp_server_pythons
from warren import PolicySpec, Sandbox

TOOLS = {
    "run_command",
    "create_sandbox",
    "list_sandboxes",
    "remove_sandbox",
    "read_file",
    "write_file",
    "list_files",
    "start_process",
    "process_output",
    "stop_process",
    "write_stdin",
    "expose_port",
    "sandbox_events",
    "sandbox_network",
    "diff",
    "checkpoints",
    "rollback",
}


def _data(result: Any) -> Any:
    assert not result.isError, result.content
    if result.structuredContent is not None:
        content = result.structuredContent
        return content.get("result", content) if set(content) == {"result"} else content
    return json.loads(result.content[0].text)


def _error_text(result: Any) -> str:
    assert result.isError, result
    return str(result.content[0].text)


async def _agent_session(session: ClientSession, ws: Path, outside: Path) -> None:
    await session.initialize()
    tools = {t.name: t for t in (await session.list_tools()).tools}
    assert set(tools) == TOOLS
    for tool in tools.values():
        assert tool.description and len(tool.description) > 40
        assert tool.inputSchema["type"] == "object"
    assert "command" in tools["run_command"].inputSchema["properties"]

    ran = _data(await session.call_tool("run_command", {"command": "echo hi; pwd; echo oops >&2; exit 3"}))
    assert ran == {
        "exit_code": 3,
        "stdout": f"hi\n{ws}\n",
        "stderr": "oops\n",
        "truncated": False,
        "timed_out": False,
    }
    ran = _data(await session.call_tool("run_command", {"argv": ["printf", "%s", "a b"]}))
    assert ran["stdout"] == "a b"

    _data(await session.call_tool("write_file", {"path": "src/notes.txt", "content": "héllo\n"}))
    assert (ws / "src" / "notes.txt").read_text() == "héllo\n"
    assert _data(await session.call_tool("read_file", {"path": "src/notes.txt"})) == "héllo\n"
    listed = _data(await session.call_tool("list_files", {"path": "src"}))
    assert listed["entries"] == [{"name": "notes.txt", "type": "file", "size": 7}]

    made = _data(await session.call_tool("create_sandbox", {"name": "second"}))
    assert made["state"] == "running"
    names = [s["name"] for s in _data(await session.call_tool("list_sandboxes", {}))["sandboxes"]]
    assert sorted(names) == ["default", "second"]
    ran = _data(await session.call_tool("run_command", {"command": "echo there", "sandbox": "second"}))
    assert ran["stdout"] == "there\n"

    started = _data(await session.call_tool("start_process", {"command": "echo up; sleep 30"}))
    for _ in range(100):
        out = _data(await session.call_tool("process_output", {"id": started["id"]}))
        if out["stdout"]:
            break
        await asyncio.sleep(0.05)
    assert out["stdout"] == "up\n" and out["running"] and out["next_offset"] == 3
    _data(await session.call_tool("stop_process", {"id": started["id"], "signal": "SIGKILL"}))

    # an interactive program: lines written later, answered in order, ended by eof
    assert "stdin" in tools["start_process"].inputSchema["properties"]
    upper = "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='', flush=True)"
    repl = _data(await session.call_tool("start_process", {"argv": ["python3", "-c", upper], "stdin": True}))
    wrote = _data(await session.call_tool("write_stdin", {"id": repl["id"], "data": "first\n"}))
    assert wrote == {"written": 6, "closed": False}
    for _ in range(200):
        out = _data(await session.call_tool("process_output", {"id": repl["id"]}))
        if out["stdout"]:
            break
        await asyncio.sleep(0.05)
    assert out["stdout"] == "FIRST\n" and out["running"]
    _data(await session.call_tool("write_stdin", {"id": repl["id"], "data": "second\n", "eof": True}))
    for _ in range(200):
        out = _data(await session.call_tool("process_output", {"id": repl["id"]}))
        if not out["running"]:
            break
        await asyncio.sleep(0.05)
    assert out["stdout"] == "FIRST\nSECOND\n" and out["exit_code"] == 0
    text = _error_text(await session.call_tool("write_stdin", {"id": repl["id"], "data": "late\n"}))
    assert "has ended" in text and "hint:" in text
    text = _error_text(await session.call_tool("write_stdin", {"id": started["id"], "data": "x"}))
    assert "without stdin" in text and "stdin=True" in text

    # the policy is fixed by whoever started the server: tool arguments cannot widen it
    for tool, args in (
        ("create_sandbox", {"name": "wide", "write": ["/"]}),
        ("run_command", {"command": "true", "network": "open"}),
        ("write_file", {"path": "x", "content": "y", "policy": {"write": [str(outside.parent)]}}),
    ):
        text = _error_text(await session.call_tool(tool, args))
        assert "fixed by whoever started" in text
    assert "wide" not in [
        s["name"] for s in _data(await session.call_tool("list_sandboxes", {}))["sandboxes"]
    ]
    text = _error_text(await session.call_tool("write_file", {"path": str(outside), "content": "changed"}))
    assert "hint:" in text
    assert outside.read_text() == "keep\n"
    # a sandbox the user made (with a wider policy) is out of the agent's reach
    text = _error_text(
        await session.call_tool("run_command", {"command": "touch /tmp/x", "sandbox": "plain"})
    )
    assert "no sandbox" in text
    text = _error_text(await session.call_tool("remove_sandbox", {"name": "plain"}))
    assert "no sandbox" in text
    text = _error_text(await session.call_tool("run_command", {"command": "x", "argv": ["y"]}))
    assert "exactly one" in text
    text = _error_text(await session.call_tool("read_file", {"path": "missing.txt"}))
    assert "missing.txt" in text and "hint:" in text

    assert _data(await session.call_tool("remove_sandbox", {"name": "second"})) == {"removed": "second"}


@pytest.fixture
def project(tmp_path: Path, state_home: Path) -> tuple[Path, Path]:
    ws = tmp_path / "proj"
    ws.mkdir()
    (tmp_path / "extra").mkdir()
    wider = PolicySpec(workspace=str(ws), write=[str(tmp_path / "extra")])
    Sandbox.create(wider, name="plain")
    outside = Path(os.path.expanduser("~")) / f".warren-mcp-test-{os.getpid()}"
    outside.write_text("keep\n")
    return ws, outside


@pytest.fixture
def cleanup_outside(project: tuple[Path, Path]) -> Iterator[None]:
    yield
    project[1].unlink()


@pytest.mark.parametrize("server_python", mcp_server_pythons())
def test_mcp_over_stdio_with_the_official_client(
    project: tuple[Path, Path], state_home: Path, cleanup_outside: None, server_python: str
) -> None:
    ws, outside = project
    params = StdioServerParameters(
        command=server_python, args=["-m", "warren", "mcp", "--workspace", str(ws)], env=dict(os.environ)
    )

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await _agent_session(session, ws, outside)

    asyncio.run(main())


@pytest.mark.parametrize("server_python", mcp_server_pythons())
def test_mcp_over_streamable_http_on_serve(
    tmp_path: Path, project: tuple[Path, Path], state_home: Path, cleanup_outside: None, server_python: str
) -> None:
    ws, outside = project
    server = Serve(tmp_path, mcp_workspace=ws, python=server_python)
    try:
        hello = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
        with server.client(None) as c:
            assert c.post("/mcp", json=hello).status_code == 401
        with server.client("wrong-wrong-wrong-wrong") as c:
            assert c.post("/mcp", json=hello).status_code == 401

        async def main() -> None:
            headers = {"Authorization": f"Bearer {server.token}"}
            async with (
                httpx.AsyncClient(headers=headers, timeout=60) as http,
                streamable_http_client(f"{server.url}/mcp", http_client=http) as (read, write, _),
                ClientSession(read, write) as session,
            ):
                await _agent_session(session, ws, outside)

        asyncio.run(main())
    finally:
        server.stop()
