"""The supervisor under a flood of connections from its own user: nobody is locked
out, the connections that made room are told why, and a supervisor holding more than
1024 descriptors still exposes ports (its helpers use epoll, not select()). The shape
that shows it with the least: 1,100 idle connections (the supervisor then holds over
1,024 descriptors), then a sandbox's first expose (its network helper starts then,
with descriptors numbered past 1,024). An exposed port, reachable by every local user,
holds a bounded number of connections."""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import PolicySpec, Sandbox, build, protocol, wire
from warren.server import netd, statedir


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


HOLDER = """
import selectors, socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", 8000))
s.listen(4096)
sel = selectors.DefaultSelector()
sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            c, _ = s.accept()
            c.sendall(b"hi")
            sel.register(c, selectors.EVENT_READ)
        else:
            try:
                data = key.fileobj.recv(4096)
            except OSError:
                data = b""
            if not data:
                sel.unregister(key.fileobj)
                key.fileobj.close()
"""  # says hi on every connection, holds it until the other side closes


def _greeted(sock: socket.socket) -> bool:
    """The sandbox's server said hi on this connection (False: reset or closed)."""
    try:
        return sock.recv(2) == b"hi"
    except OSError:
        return False


def test_an_exposed_port_caps_its_open_connections_and_recovers(
    tmp_path: Path, state_home: Path, many_fds: None
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with Sandbox.create(build(PolicySpec(workspace=str(ws)))) as sb:
        sb.spawn(["python3", "-c", HOLDER])
        probe = ["python3", "-c", "import socket; socket.create_connection(('127.0.0.1', 8000))"]
        for _ in range(200):
            if sb.exec(probe).ok:
                break
            time.sleep(0.05)
        host, port = sb.expose(8000).rsplit(":", 1)
        flood = []
        try:
            for _ in range(netd.MAX_EXPOSED_CONNECTIONS + 100):
                with contextlib.suppress(OSError):  # reset while connecting: one over the cap
                    flood.append(socket.create_connection((host, int(port)), timeout=10))
            greeted = sum(_greeted(s) for s in flood)
            # the rest were reset, not given threads
            assert greeted == netd.MAX_EXPOSED_CONNECTIONS, (greeted, len(flood))
        finally:
            for s in flood:
                s.close()
        for _ in range(100):  # the slots come back as the connections end
            try:
                with socket.create_connection((host, int(port)), timeout=10) as s:
                    if _greeted(s):
                        break
            except OSError:
                pass  # still full: reset
            time.sleep(0.05)
        else:
            pytest.fail("the exposed port did not recover after its connections closed")
