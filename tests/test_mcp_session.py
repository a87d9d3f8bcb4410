"""A `warren mcp` session's life as an agent's client sees it, with the official MCP
client over stdio: the default sandbox stops when idle (30m, or --idle-timeout, or
$WARREN_MCP_IDLE_TIMEOUT) and is removed when the session ends (stdin closed, or
SIGTERM); results carry warren's hints and its exit codes (a timeout is 124, as in the
CLI); a normal end prints nothing on stderr."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

from warren import Sandbox


def _data(result: Any) -> dict[str, Any]:
    assert not result.isError, result.content
    content: dict[str, Any] = result.structuredContent
    return content


def _defaults() -> list[Any]:
    return [i for i in Sandbox.list() if i.name.startswith("mcp-") and i.name.endswith("-default")]


def _session(tmp_path: Path, flags: list[str], env: dict[str, str], steps: Any) -> tuple[dict[str, Any], str]:
    """Run ``steps(session)`` in a `warren mcp` session; its result and the server's stderr."""
    ws = tmp_path / "proj"
    ws.mkdir(exist_ok=True)
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "warren", "mcp", "--workspace", str(ws), *flags],
        env={**os.environ, **env},
    )
    errlog = tmp_path / "mcp-stderr.txt"

    async def main() -> dict[str, Any]:
        with errlog.open("w") as err:
            async with (
                stdio_client(params, errlog=err) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                got: dict[str, Any] = await steps(session)
                return got

    return asyncio.run(main()), errlog.read_text()


async def _use_default(session: ClientSession) -> dict[str, Any]:
    ran = _data(await session.call_tool("run_command", {"command": "echo hi"}))
    assert ran == {"exit_code": 0, "stdout": "hi\n", "stderr": "", "truncated": False, "timed_out": False}
    (info,) = _defaults()
    return {"idle_timeout": info.idle_timeout, "alive": info.alive}


@pytest.mark.parametrize(
    ("flags", "env", "seconds"),
    [
        ([], {}, 1800.0),
        (["--idle-timeout", "5m"], {"WARREN_MCP_IDLE_TIMEOUT": "2h"}, 300.0),
        ([], {"WARREN_MCP_IDLE_TIMEOUT": "2h"}, 7200.0),
    ],
)
def test_default_sandbox_has_an_idle_timeout_and_goes_when_the_session_ends(
    tmp_path: Path, state_home: Path, flags: list[str], env: dict[str, str], seconds: float
) -> None:
    seen, stderr = _session(tmp_path, flags, env, _use_default)
    assert seen == {"idle_timeout": seconds, "alive": True}
    assert _defaults() == []  # removed when the server ended
    assert stderr == ""  # no traceback, no ValueError from a closed stdout


def test_a_bad_idle_timeout_is_refused_at_start(tmp_path: Path, state_home: Path) -> None:
    r = subprocess.run(
        [sys.executable, "-m", "warren", "mcp", "--workspace", str(tmp_path)],
        env={**os.environ, "WARREN_MCP_IDLE_TIMEOUT": "soon"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 125
    assert r.stderr.startswith("warren: $WARREN_MCP_IDLE_TIMEOUT: 'soon' is not a duration")
    assert "Traceback" not in r.stderr and "hint:" in r.stderr


def test_sigterm_ends_the_server_and_removes_its_default_sandbox(tmp_path: Path, state_home: Path) -> None:
    """What a client does when the server lingers after stdin closed."""
    ws = tmp_path / "proj"
    ws.mkdir()
    server = subprocess.Popen(
        [sys.executable, "-m", "warren", "mcp", "--workspace", str(ws)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert server.stdin is not None and server.stdout is not None and server.stderr is not None
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    for message in (
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "run_command",
         "arguments": {"command": "true"}}},
    ):  # fmt: skip
        server.stdin.write(json.dumps(message).encode() + b"\n")
    server.stdin.flush()
    replies = [json.loads(server.stdout.readline()) for _ in range(2)]
    assert replies[1]["id"] == 2 and not replies[1]["result"]["isError"], replies
    assert len(_defaults()) == 1
    server.terminate()
    assert server.wait(timeout=60) == 128 + 15
    assert _defaults() == []
    assert server.stderr.read() == b""
    server.stdin.close()
    server.stdout.close()
    server.stderr.close()


async def _failures(session: ClientSession) -> dict[str, Any]:
    out: dict[str, Any] = {}
    out["timeout"] = _data(await session.call_tool("run_command", {"command": "sleep 60", "timeout": 0.5}))
    resolver = "echo 'curl: (6) Could not resolve host: pypi.org' >&2; exit 6"
    out["resolver"] = _data(await session.call_tool("run_command", {"command": resolver}))
    out["clone"] = _data(
        await session.call_tool("run_command", {"argv": ["git", "clone", "https://x.test/r"]})
    )
    out["plain"] = _data(await session.call_tool("run_command", {"command": "exit 3"}))
    return out


def test_results_carry_cli_exit_codes_and_hints(tmp_path: Path, state_home: Path) -> None:
    got, stderr = _session(tmp_path, [], {}, _failures)
    assert got["timeout"]["timed_out"] is True and got["timeout"]["exit_code"] == 124
    assert "hints" not in got["timeout"]
    for case in ("resolver", "clone"):
        (hint,) = got[case]["hints"]
        assert hint.startswith("the sandbox has no network") and "--network allow" in hint, got[case]
    assert got["resolver"]["exit_code"] == 6
    assert got["plain"] == {
        "exit_code": 3,
        "stdout": "",
        "stderr": "",
        "truncated": False,
        "timed_out": False,
    }
    assert stderr == ""


def test_with_the_network_open_no_network_hint(tmp_path: Path, state_home: Path) -> None:
    async def steps(session: ClientSession) -> dict[str, Any]:
        resolver = "echo 'curl: (6) Could not resolve host: pypi.org' >&2; exit 6"
        return _data(await session.call_tool("run_command", {"command": resolver}))

    got, _ = _session(tmp_path, ["--allow-host", "pypi.org"], {}, steps)
    assert got["exit_code"] == 6 and "hints" not in got


def test_a_limit_that_killed_the_command_is_a_hint(tmp_path: Path, state_home: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup needs root here; uid 1001 gets an rlimit the program meets itself")

    async def steps(session: ClientSession) -> dict[str, Any]:
        hog = ["python3", "-c", "x = bytearray(400 << 20)"]
        return _data(await session.call_tool("run_command", {"argv": hog}))

    got, stderr = _session(tmp_path, ["--memory", "64M"], {}, steps)
    assert got["exit_code"] == 137, got
    assert got["hints"] == ["killed: memory limit 64M reached"]
    assert stderr == ""
