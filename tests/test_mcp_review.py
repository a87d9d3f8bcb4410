"""The MCP tools of a review sandbox (`warren mcp --review`): an agent sees what it
changed (`diff`), lists its checkpoints and undoes its last step (`rollback`), judged
on the host's workspace, which stays untouched."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import module_state


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _data(result: Any) -> Any:
    assert not result.isError, result.content
    if result.structuredContent is not None:
        content = result.structuredContent
        return content.get("result", content) if set(content) == {"result"} else content
    return json.loads(result.content[0].text)


def test_an_agent_undoes_its_last_step_with_rollback(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("print('main')\n")
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "warren", "mcp", "--review", "--workspace", str(ws)],
        env=dict(os.environ),
    )

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            run = {"command": "echo draft > notes.txt"}
            assert _data(await session.call_tool("run_command", run))["exit_code"] == 0
            ran = _data(await session.call_tool("run_command", {"command": "rm -rf ./* && ls | wc -l"}))
            assert ran["stdout"] == "0\n"  # the control: the step did remove everything
            changes = _data(await session.call_tool("diff", {}))["changes"]
            assert {(c["kind"], c["path"]) for c in changes} == {("removed", "main.py")}
            listed = _data(await session.call_tool("checkpoints", {}))["checkpoints"]
            assert listed[-1]["command"] == "sh -c 'rm -rf ./* && ls | wc -l'"
            back = _data(await session.call_tool("rollback", {}))
            assert back["checkpoint"] == listed[-1]["id"] and back["stopped"] == ""
            ran = _data(await session.call_tool("run_command", {"command": "cat notes.txt main.py"}))
            assert ran["stdout"] == "draft\nprint('main')\n"
            patched = _data(await session.call_tool("diff", {"patch": True}))
            assert "+draft" in patched["patch"] and patched["truncated"] is False
            bad = await session.call_tool("rollback", {"checkpoint": 99999})
            assert bad.isError and "no checkpoint 99999" in bad.content[0].text
            assert "hint:" in bad.content[0].text

    asyncio.run(main())
    assert sorted(os.listdir(ws)) == ["main.py"]  # the host's workspace untouched throughout
