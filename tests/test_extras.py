"""A missing extra is one line naming it, never a traceback or a silent gap.

The second MCP venv (scripts/setup: warren and mcp 2.x, no extras) is an install without
``e2b`` and ``grpc``: ``warren serve`` there says at start which APIs it serves and
answers an E2B SDK's request in E2B's error shape saying what to install (it reached
``/v1``'s 401 before, and the SDK failed with ``KeyError: 'code'``); ``warren sandboxd``
there names the extra (it died with ``ModuleNotFoundError: grpc``)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from service_util import OTHER_MCP_PYTHON, OTHER_MCP_VENV
from warren.extras import DISTRIBUTION

BARE = OTHER_MCP_VENV / "bin" / "warren-python"

pytestmark = [
    pytest.mark.skipif(not os.access(BARE, os.X_OK), reason=f"no {OTHER_MCP_VENV} (scripts/setup makes it)"),
    pytest.mark.caller_independent,
]


def _lacks(module: str) -> bool:
    probe = subprocess.run([OTHER_MCP_PYTHON, "-c", f"import {module}"], capture_output=True)
    return probe.returncode != 0


def test_the_distribution_is_warren_sandbox_and_its_command_warren() -> None:
    """PyPI's ``warren`` is an unrelated project: the distribution has a name of its own,
    the command and the import package stay ``warren``."""
    from importlib.metadata import distribution

    dist = distribution(DISTRIBUTION)
    assert dist.metadata["Name"] == "warren-sandbox"
    shown = subprocess.run([str(BARE.with_name("warren")), "--version"], capture_output=True, text=True)
    assert shown.stdout == f"warren {dist.version}\n", shown.stderr


def test_sandboxd_without_its_extra_names_the_extra(tmp_path: Path) -> None:
    if not _lacks("grpc"):
        pytest.skip("the bare venv has grpc")
    r = subprocess.run([str(BARE), "sandboxd"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert r.returncode == 125, r.stderr
    assert "needs the 'sandboxd' extra" in r.stderr and f"'{DISTRIBUTION}[sandboxd]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_serve_without_the_e2b_extra_says_so_and_answers_e2b_requests_in_e2bs_shape(tmp_path: Path) -> None:
    if not _lacks("e2b"):
        pytest.skip("the bare venv has e2b")
    token = tmp_path / "token"
    token.write_text("t" * 40)
    token.chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    serve = subprocess.Popen(
        [str(BARE), "serve", "--listen", f"127.0.0.1:{port}", "--token-file", str(token)],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert serve.stderr is not None
        lines: list[str] = []
        deadline = time.monotonic() + 60
        while not any("serving " in line for line in lines) and time.monotonic() < deadline:
            lines.append(serve.stderr.readline())
        said = "".join(lines)
        assert f"not E2B's API: pip install '{DISTRIBUTION}[e2b]'" in said, said
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/sandboxes", headers={"X-API-Key": "x"})
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(request, timeout=30)
        body = json.loads(got.value.read())
        assert got.value.code == 501 and body["code"] == 501
        assert f"{DISTRIBUTION}[e2b]" in body["message"]
        # warren's own API is as before: its token is asked for
        with pytest.raises(urllib.error.HTTPError) as got:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/sandboxes", timeout=30)
        assert got.value.code == 401
    finally:
        serve.terminate()
        serve.wait(timeout=30)
