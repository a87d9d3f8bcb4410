"""What a streaming exec does when `warren serve` itself ends (stated in docs/known-limits.md):
a graceful stop (SIGTERM) lets the request finish, exit event included; a killed serve
takes the command with its client, as a terminal's job goes on hangup. A command meant
to outlive its client is started as a process, which keeps running."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from service_util import Serve

pytestmark = pytest.mark.usefixtures("state_home")

SCRIPT = "echo start; sleep 3; echo done > {marker}; echo end"


def _stream(server: Serve, name: str, marker: Path, out: list[str]) -> threading.Thread:
    def read() -> None:
        with (
            server.client() as c,
            c.stream(
                "POST",
                f"/v1/sandboxes/{name}/exec",
                json={"argv": ["sh", "-c", SCRIPT.format(marker=marker)]},
                headers={"Accept": "text/event-stream"},
            ) as r,
        ):
            try:
                for line in r.iter_lines():
                    out.append(line)
            except Exception as e:  # the connection is cut when serve is killed
                out.append(f"cut: {type(e).__name__}")

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_streaming_exec_when_serve_ends(tmp_path: Path, sig: signal.Signals) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = ws / "marker"
    server = Serve(tmp_path, unix=True)
    try:
        with server.client() as c:
            c.post("/v1/sandboxes", json={"name": "life", "workspace": str(ws)}).raise_for_status()
        out: list[str] = []
        reader = _stream(server, "life", marker, out)
        deadline = time.monotonic() + 20
        while not any("stdout" in line for line in out):
            assert time.monotonic() < deadline, out
            time.sleep(0.05)
        started = time.monotonic()
        server.stop(sig)
        reader.join(15)
        if sig == signal.SIGTERM:  # the stream ended with the command's end
            assert any(line == "event: exit" for line in out), out
            assert marker.read_text() == "done\n"
        else:
            time.sleep(max(0.0, started + 4 - time.monotonic()))  # past the command's own end (3 s)
            assert not any(line == "event: exit" for line in out), out
            assert not marker.exists(), "the command outlived its killed client"
    finally:
        server.stop(signal.SIGKILL)  # the sandbox goes with state_home
