"""A real ``warren serve`` for tests: a subprocess on loopback TCP (port 0, read back
from its first log line) or on a unix socket, stopped (or SIGKILLed) by the test."""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

# A second virtualenv with warren and the other major of the mcp SDK (scripts/setup).
OTHER_MCP_VENV = Path(os.environ.get("WARREN_MCP_OTHER_VENV", "/opt/warren-venv-mcp-other"))
OTHER_MCP_PYTHON = str(OTHER_MCP_VENV / "bin" / "python")


def mcp_server_pythons() -> list[object]:
    """Pythons to start warren's MCP server with: this venv's, and the second venv's
    (the other major of the SDK), so each MCP test covers the server under both."""
    missing = not os.access(OTHER_MCP_PYTHON, os.X_OK)
    skip = pytest.mark.skipif(missing, reason=f"no {OTHER_MCP_VENV} (scripts/setup prepares it)")
    return [
        pytest.param(sys.executable, id="server-this-sdk"),
        pytest.param(OTHER_MCP_PYTHON, id="server-other-sdk-major", marks=skip),
    ]


class Serve:
    def __init__(
        self,
        tmp: Path,
        *,
        unix: bool = False,
        token: bool = True,
        mcp_workspace: Path | None = None,
        extra: tuple[str, ...] = (),
        python: str = sys.executable,
    ) -> None:
        self.token = secrets.token_hex(16) if token else None
        self.socket = str(tmp / "serve.sock") if unix else None
        args = [python, "-m", "warren", "serve", "--listen", f"unix:{self.socket}" if unix else "127.0.0.1:0"]
        if self.token:
            token_file = tmp / f"token-{secrets.token_hex(4)}"
            token_file.write_text(self.token + "\n")
            token_file.chmod(0o600)
            args += ["--token-file", str(token_file)]
        if mcp_workspace is not None:
            args += ["--mcp-workspace", str(mcp_workspace)]
        args += extra
        env = {k: v for k, v in os.environ.items() if k not in ("WARREN_URL", "WARREN_TOKEN")}
        self.log = tmp / f"serve-{secrets.token_hex(4)}.log"
        self._log = self.log.open("w")
        self.proc = subprocess.Popen(args, stdout=self._log, stderr=self._log, env=env, cwd=tmp)
        deadline = time.monotonic() + 60  # a wait on a condition: only a loaded host takes long
        while True:
            text = self.log.read_text()
            found = re.search(r"listening on (\S+)", text)
            if found:
                self.url = found.group(1)
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"warren serve did not start: {text}")
            time.sleep(0.02)

    def client(self, token: str | None = "default", **kwargs: object) -> httpx.Client:
        token = self.token if token == "default" else token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if self.socket:
            return httpx.Client(
                base_url="http://localhost",
                transport=httpx.HTTPTransport(uds=self.socket),
                headers=headers,
                timeout=60,
                **kwargs,  # type: ignore[arg-type]
            )
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)  # type: ignore[arg-type]

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
