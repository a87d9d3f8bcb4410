"""warren's MCP server under both majors of the official ``mcp`` package, met by a
client of each major.

warren accepts ``mcp>=1.20,<3`` so it installs beside an agent project on either
major. One virtualenv holds one version, so scripts/setup prepares a second one
($WARREN_MCP_OTHER_VENV) with the major the test venv does not have, and warren
installed in it too. Each test starts ``warren mcp`` (stdio) or ``warren serve``'s
``/mcp`` (streamable HTTP) with one venv's python and drives it with
tests/mcp_any_client.py run by a python that holds the other (or the same) major.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from service_util import OTHER_MCP_PYTHON, OTHER_MCP_VENV, Serve

# The wire between each major of the mcp package and warren's server: the same whoever
# calls. The sandboxes behind it run in both halves (tests/test_mcp.py,
# tests/test_mcp_session.py).
pytestmark = pytest.mark.caller_independent(half="root")

HERE = Path(__file__).resolve().parent


def _major(python: str) -> int:
    out = subprocess.run(
        [python, "-c", "from importlib.metadata import version; print(version('mcp'))"],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.split(".", 1)[0])


@pytest.fixture(scope="module")
def pythons() -> dict[int, str]:
    """mcp major -> a python whose venv holds it (and warren)."""
    if not os.access(OTHER_MCP_PYTHON, os.X_OK):
        pytest.skip(f"no second MCP venv at {OTHER_MCP_VENV} (scripts/setup prepares it)")
    found = {int(version("mcp").split(".", 1)[0]): sys.executable, _major(OTHER_MCP_PYTHON): OTHER_MCP_PYTHON}
    assert set(found) == {1, 2}, f"the two venvs should hold mcp 1.x and 2.x, found {found}"
    return found


@pytest.fixture
def project(tmp_path: Path, state_home: Path) -> Any:
    ws = tmp_path / "proj"
    ws.mkdir()
    outside = Path(os.path.expanduser("~")) / f".warren-mcp-versions-{os.getpid()}"
    outside.write_text("keep\n")
    yield ws, outside
    outside.unlink()


def _calls(outside: Path) -> list[list[Any]]:
    return [
        ["run_command", {"command": "echo hi; pwd; echo oops >&2; exit 3"}],
        ["write_file", {"path": "notes.txt", "content": "héllo\n"}],
        ["read_file", {"path": "notes.txt"}],
        ["run_command", {"command": "true", "network": "open"}],
        ["write_file", {"path": str(outside), "content": "changed"}],
        ["run_command", {"command": "true", "sandbox": "../x"}],
    ]


def _value(call: dict[str, Any]) -> Any:
    assert not call["is_error"], call
    content = call["structured"]
    if isinstance(content, dict):
        return content.get("result", content) if set(content) == {"result"} else content
    return json.loads(call["text"][0]) if call["text"][0][:1] in "{[" else call["text"][0]


def _judge(report: dict[str, Any], client_major: int, ws: Path, outside: Path) -> None:
    assert int(report["client_mcp"].split(".", 1)[0]) == client_major
    assert report["server_name"] == "warren"
    assert {"run_command", "read_file", "write_file", "write_stdin", "expose_port"} <= set(report["tools"])
    ran, wrote, read, widened, escaped, badname = report["calls"]
    assert _value(ran) == {
        "exit_code": 3,
        "stdout": f"hi\n{ws}\n",
        "stderr": "oops\n",
        "truncated": False,
        "timed_out": False,
    }
    assert _value(wrote)["bytes"] == len("héllo\n".encode())
    assert (ws / "notes.txt").read_text() == "héllo\n"
    assert _value(read) == "héllo\n"
    # an argument the tool does not declare is refused, not ignored (the shim's call_tool)
    assert widened["is_error"] and "fixed by whoever started" in widened["text"][0]
    # a write outside the workspace fails with warren's hint, and the host file is untouched
    assert escaped["is_error"] and "hint:" in escaped["text"][0]
    assert outside.read_text() == "keep\n"
    assert badname["is_error"] and "is not allowed" in badname["text"][0]


def _client(python: str, request: dict[str, Any]) -> dict[str, Any]:
    out = subprocess.run(
        [python, str(HERE / "mcp_any_client.py"), json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report: dict[str, Any] = json.loads(out.stdout)
    return report


@pytest.mark.parametrize("server_major", [1, 2])
@pytest.mark.parametrize("client_major", [1, 2])
def test_mcp_server_over_stdio_with_each_sdk_major(
    pythons: dict[int, str], project: Any, server_major: int, client_major: int
) -> None:
    ws, outside = project
    server = [pythons[server_major], "-m", "warren", "mcp", "--workspace", str(ws)]
    report = _client(
        pythons[client_major], {"stdio": server, "env": dict(os.environ), "calls": _calls(outside)}
    )
    _judge(report, client_major, ws, outside)


@pytest.mark.parametrize("server_major", [1, 2])
def test_mcp_on_serve_over_streamable_http_with_the_other_sdk_major(
    pythons: dict[int, str], project: Any, tmp_path: Path, server_major: int
) -> None:
    ws, outside = project
    client_major = 3 - server_major
    server = Serve(tmp_path, mcp_workspace=ws, python=pythons[server_major])
    try:
        request = {"http": f"{server.url}/mcp", "token": server.token, "calls": _calls(outside)}
        _judge(_client(pythons[client_major], request), client_major, ws, outside)
    finally:
        server.stop()


@pytest.mark.parametrize("server_major", [1, 2])
def test_mcp_on_serve_leaves_host_checks_to_warren_under_each_sdk_major(
    pythons: dict[int, str], project: Any, tmp_path: Path, server_major: int
) -> None:
    """On a unix socket warren takes any Host (no browser reaches it); the SDK's own
    DNS-rebinding check, which 2.x turns on by itself for a loopback host unless told
    otherwise, must not refuse what warren allows."""
    ws, _ = project
    server = Serve(tmp_path, unix=True, mcp_workspace=ws, python=pythons[server_major])
    hello = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    try:
        with server.client() as c:
            answer = c.post(
                "/mcp",
                json=hello,
                headers={"Host": "warren.internal", "Accept": "application/json, text/event-stream"},
            )
        assert answer.status_code == 200, answer.text
        assert "warren" in answer.text
    finally:
        server.stop()
