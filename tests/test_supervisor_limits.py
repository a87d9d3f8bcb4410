"""The supervisor under a flood of connections from its own user: nobody is locked
out, the connections that made room are told why, and a supervisor holding more than
1024 descriptors still exposes ports (its helpers use epoll, not select())."""

from __future__ import annotations

import os
import resource
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import PolicySpec, Sandbox, build, protocol, wire
from warren.server import statedir


@pytest.fixture
def many_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def test_a_flood_of_idle_connections_locks_no_client_out_and_expose_works_past_1024_descriptors(
    tmp_path: Path, state_home: Path, many_fds: None
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.html").write_text("served from inside\n")
    sb = Sandbox.create(build(PolicySpec(workspace=str(ws))))
    sb.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"])
    probe = ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000))"]
    for _ in range(200):
        if sb.exec(probe).ok:
            break
        time.sleep(0.05)
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    token, pid = found
    flood = [wire.connect(wire.abstract_name(token)) for _ in range(1100)]
    try:
        deadline = time.monotonic() + 5
        while (held := len(os.listdir(f"/proc/{pid}/fd"))) <= 1024 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held > 1024, f"the supervisor holds only {held} descriptors: the test shows nothing"
        start = time.monotonic()
        assert sb.exec(["true"]).ok  # a client that sends its request is served
        took = time.monotonic() - start
        assert took < 5, f"a client waited {took:.1f}s behind idle connections"
        # the first port of this sandbox: its network helper starts now, with
        # descriptors numbered past 1024
        address = sb.expose(8000)
        assert _get(f"http://{address}/index.html") == "served from inside\n"
        # the oldest idle connections made room, and were told why
        flood[0].settimeout(5)
        reply, _, _ = wire.recv(flood[0], (protocol.Error,))
        assert isinstance(reply, protocol.Error)
        assert "connection limit" in reply.error.message
    finally:
        for s in flood:
            s.close()
        sb.remove()
