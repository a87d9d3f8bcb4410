"""`warren serve` under attack: idle and slow connections, floods, DNS rebinding,
cross-site requests, log injection. Every refusal is judged from outside (the
connection closed, the status, the log), with a control showing success was visible."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from service_util import Serve
from warren.service import conn

# The HTTP server's defences are the same whoever runs it: scripts/test runs them in its
# root half only.
pytestmark = pytest.mark.caller_independent(half="root")

HEAD = 2.0  # the --header-timeout of these tests' server


@pytest.fixture
def tcp(tmp_path: Path, state_home: Path) -> Iterator[Serve]:
    server = Serve(tmp_path, extra=("--header-timeout", str(HEAD)))
    yield server
    server.stop()


def _address(server: Serve) -> tuple[str, int]:
    host, port = server.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


@pytest.fixture
def many_fds() -> Iterator[None]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8192), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _closed(sock: socket.socket) -> bool:
    """The server closed it (end of file or reset); False while it is open and quiet."""
    timeout = sock.gettimeout()
    sock.settimeout(0)  # a socket with a timeout would wait for readiness first
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.settimeout(timeout)


def _wait_closed(socks: list[socket.socket], within: float) -> list[socket.socket]:
    """Wait until every socket is closed by the server; the ones still open at the end."""
    sel = selectors.DefaultSelector()
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    left = set(socks)
    deadline = time.monotonic() + within
    while left and time.monotonic() < deadline:
        for key, _ in sel.select(0.2):
            s = key.fileobj
            assert isinstance(s, socket.socket)
            if _closed(s):
                sel.unregister(s)
                left.discard(s)
    sel.close()
    return list(left)


def test_three_thousand_idle_connections_neither_lock_out_a_client_nor_stay_open(
    tcp: Serve, many_fds: None
) -> None:
    address = _address(tcp)
    idle = []
    try:
        for _ in range(3000):
            s = socket.create_connection(address)
            idle.append(s)
        # control: the newest idle connections are open (the test can see an open one)
        assert not any(_closed(s) for s in idle[-50:])
        start = time.monotonic()
        with tcp.client() as c:
            r = c.get("/v1/health", timeout=10)
        took = time.monotonic() - start
        assert r.status_code == 200 and r.json()["status"] == "ok"
        assert took < 5, f"an authenticated client waited {took:.1f}s behind idle connections"
        # every idle connection is closed: the oldest to make room, the rest at the timeout
        left = _wait_closed(idle, HEAD + 10)
        assert not left, f"{len(left)} idle connections still open after the header timeout"
    finally:
        for s in idle:
            s.close()
    lines = tcp.log.read_text().splitlines()
    assert len(lines) < 20, lines[:30]


def test_a_request_head_trickled_byte_by_byte_is_closed_at_the_header_timeout(tcp: Serve) -> None:
    head = f"GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tcp.token}\r\n"
    # control: the same head sent at once is answered
    with socket.create_connection(_address(tcp)) as s:
        s.sendall(head.encode() + b"\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 200")
    with socket.create_connection(_address(tcp)) as s:
        start = time.monotonic()
        closed_after = None
        for ch in (head + "X-Pad: " + "a" * 200).encode():
            try:
                s.send(bytes([ch]))
            except OSError:
                closed_after = time.monotonic() - start
                break
            if _closed(s):
                closed_after = time.monotonic() - start
                break
            time.sleep(0.1)
        assert closed_after is not None, "a trickled head kept the connection for 40 s"
        assert closed_after < HEAD + 3


def test_a_body_that_stops_coming_is_closed_and_a_whole_body_is_served(tcp: Serve) -> None:
    head = (
        f"POST /v1/sandboxes HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {tcp.token}\r\n"
        "Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    with socket.create_connection(_address(tcp)) as s:
        s.sendall(head.encode() + b'{"name": ')
        start = time.monotonic()
        assert not _wait_closed([s], 3 * HEAD + 5), "a stalled body held the connection"
        assert time.monotonic() - start >= 3 * HEAD - 0.5  # the body's pause allowance, not less
    with tcp.client() as c:  # control: a whole body is served
        assert c.post("/v1/sandboxes", content=b'{"name": 5}').status_code == 400


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("Host", "evil.example:{port}"),
        ("Host", "127.0.0.1.nip.io:{port}"),
        ("Origin", "http://evil.example"),
        ("Origin", "null"),
    ],
)
def test_a_web_page_reaching_loopback_by_dns_rebinding_or_cross_site_is_refused(
    tcp: Serve, tmp_path: Path, header: str, value: str
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = ws / "ran"
    body = {"argv": ["touch", str(marker)], "policy": {"workspace": str(ws)}}
    port = _address(tcp)[1]
    with tcp.client() as c:  # even with the token: the page is not the client
        r = c.post("/v1/run", json=body, headers={header: value.format(port=port)})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["type"] == "WarrenError"
        assert "access-control-allow-origin" not in r.headers
    assert not marker.exists()
    with tcp.client() as c:  # control: the same request naming the service runs
        r = c.post("/v1/run", json=body, headers={"Origin": f"http://localhost:{port}"})
        assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
        assert "access-control-allow-origin" not in r.headers
    assert marker.exists()


def test_a_cross_site_text_plain_post_without_a_token_does_nothing(tcp: Serve, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    marker = ws / "ran"
    body = f'{{"argv": ["touch", "{marker}"], "policy": {{"workspace": "{ws}"}}}}'
    port = _address(tcp)[1]
    with httpx.Client(base_url=tcp.url) as c:
        for origin in (None, "http://evil.example", f"http://127.0.0.1:{port}"):
            headers = {"Content-Type": "text/plain"} | ({"Origin": origin} if origin else {})
            r = c.post("/v1/run", content=body, headers=headers)
            assert r.status_code in (401, 403), r.text
            assert "access-control-allow-origin" not in r.headers
            pre = c.options("/v1/run", headers={"Origin": "http://evil.example"} | headers)
            assert "access-control-allow-origin" not in pre.headers
    assert not marker.exists()
    with tcp.client() as c:  # control: the same text/plain body with the token runs
        r = c.post("/v1/run", content=body, headers={"Content-Type": "text/plain"})
        assert r.status_code == 200, r.text
    assert marker.exists()


def test_control_characters_in_a_path_are_escaped_in_the_log(tcp: Serve) -> None:
    with httpx.Client(base_url=tcp.url) as c:  # no token needed to try
        for _ in range(3):
            c.get("/v1/x%0A2026-01-01T00:00:00 FORGED%1b[31mred")
    with tcp.client() as c:
        c.get("/v1/health")
    deadline = time.monotonic() + 5
    while "/v1/health 200" not in tcp.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    text = tcp.log.read_text()
    assert "\x1b" not in text
    assert not any(line.startswith("2026-01-01T00:00:00 FORGED") for line in text.splitlines())
    assert "\\n2026-01-01T00:00:00 FORGED\\x1b[31mred" in text  # the request is in the log, escaped


def test_many_unauthenticated_requests_are_a_few_log_lines(tcp: Serve) -> None:
    with httpx.Client(base_url=tcp.url) as c:
        for _ in range(300):
            assert c.get("/v1/health").status_code == 401
    with contextlib.closing(socket.create_connection(_address(tcp))) as s:
        for _ in range(50):  # malformed requests: uvicorn's own warnings
            with socket.create_connection(_address(tcp)) as bad:
                bad.sendall(b"GARBAGE\x00\r\n\r\n")
                bad.recv(100)
        s.close()
    with tcp.client() as c:
        c.get("/v1/health")
    deadline = time.monotonic() + 5
    while "/v1/health 200" not in tcp.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = tcp.log.read_text().splitlines()
    assert any("GET /v1/health 401" in line for line in lines)  # control: refusals are logged
    assert len(lines) < 20, lines


def _busy_server(limits: conn.Limits) -> tuple[uvicorn.Server, int, threading.Event]:
    """uvicorn with ``limits`` around an app that holds every request until released."""
    release = threading.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        while scope["path"] == "/hold" and not release.is_set():
            await asyncio.sleep(0.02)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, log_level="critical", lifespan="off", **conn.config_kwargs(limits))
    server = uvicorn.Server(config)
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    while not server.started:
        time.sleep(0.01)
    return server, sock.getsockname()[1], release


def test_when_every_connection_is_busy_a_new_one_gets_a_503_json_error() -> None:
    server, port, release = _busy_server(conn.Limits(max_total=4, max_per_peer=4))
    busy = []
    try:
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(b"GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
            busy.append(s)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            reply = s.recv(4096)
        head, _, body = reply.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503"), reply
        assert json.loads(body)["error"]["message"].startswith("warren serve is at its connection limit")
        release.set()
        for s in busy:  # control: the busy requests themselves are served
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:  # and room is back
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
    finally:
        for s in busy:
            s.close()
        server.should_exit = True


def test_per_peer_cap_evicts_that_peers_oldest_idle_connection() -> None:
    limits = conn.Limits(max_total=100, max_per_peer=3)
    server, port, _release = _busy_server(limits)
    try:
        idle = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(3)]
        time.sleep(0.2)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert s.recv(4096).startswith(b"HTTP/1.1 200")
        assert _closed(idle[0]) or not _wait_closed([idle[0]], 2)  # the oldest made room
        assert not _closed(idle[2])  # the newest is still open
        assert limits.evicted >= 1 and limits.refused == 0
        for s in idle:
            s.close()
    finally:
        server.should_exit = True
