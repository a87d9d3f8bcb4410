"""The proxy in process, without a sandbox: limits, half-close, stop."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from warren.net import proxy as netproxy
from warren.net.allowlist import Allowlist, parse_rules


@pytest.fixture
def upstream() -> Iterator[socket.socket]:
    """A TCP server on 127.0.0.2 that reads until EOF, then answers with what it got."""
    srv = socket.socket()
    srv.bind(("127.0.0.2", 0))
    srv.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            conn.sendall(b"got " + str(len(data)).encode())
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    yield srv
    srv.close()


def _proxy(port: int) -> tuple[netproxy.Proxy, int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    rules = parse_rules([f"up.test:{port}", f"127.0.0.2:{port}"])
    proxy = netproxy.Proxy(listener, Allowlist(rules), sandbox="t", resolve={"up.test": "127.0.0.2"})
    return proxy.start(), listener.getsockname()[1]


def _connect(proxy_port: int, target: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
    s.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    assert head.startswith(b"HTTP/1.1 200"), head
    return s


def test_tunnel_half_close_delivers_the_answer(upstream: socket.socket) -> None:
    proxy, port = _proxy(upstream.getsockname()[1])
    try:
        s = _connect(port, f"up.test:{upstream.getsockname()[1]}")
        s.sendall(b"x" * 3_000_000)
        s.shutdown(socket.SHUT_WR)  # upstream sees EOF only through a half-close
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
        assert answer == b"got 3000000"
        s.close()
    finally:
        proxy.stop()
    assert [(e.method, e.allowed) for e in proxy.events] == [("CONNECT", True)]


def test_connections_beyond_the_cap_get_503(upstream: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(netproxy, "MAX_CLIENTS", 2)
    proxy, port = _proxy(upstream.getsockname()[1])
    try:
        held = [socket.create_connection(("127.0.0.1", port)) for _ in range(2)]  # no header yet
        extra = socket.create_connection(("127.0.0.1", port), timeout=10)
        assert extra.recv(100).startswith(b"HTTP/1.1 503")
        for s in held:
            s.close()
    finally:
        proxy.stop()


def test_stop_closes_open_tunnels(upstream: socket.socket) -> None:
    proxy, port = _proxy(upstream.getsockname()[1])
    s = _connect(port, f"up.test:{upstream.getsockname()[1]}")
    s.sendall(b"pending")
    proxy.stop()
    s.settimeout(10)
    assert s.recv(100) in (b"", b"got 7")  # the tunnel ends; nothing hangs
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2)


def test_a_pipelined_request_never_reaches_upstream_with_its_own_host() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.2", 0))
    srv.listen()
    seen: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        conn.settimeout(1.0)
        data = b""
        try:
            while chunk := conn.recv(65536):
                data += chunk
        except TimeoutError:
            pass
        seen.append(data)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = srv.getsockname()[1]
    proxy, proxy_port = _proxy(port)
    try:
        c = socket.create_connection(("127.0.0.1", proxy_port), timeout=10)
        first = f"POST http://up.test:{port}/a HTTP/1.1\r\nHost: up.test\r\nContent-Length: 5\r\n\r\nhello"
        second = f"GET http://up.test:{port}/b HTTP/1.1\r\nHost: internal.admin\r\n\r\n"
        c.sendall((first + second).encode())
        reply = b""
        while chunk := c.recv(65536):
            reply += chunk
        c.close()
        t.join(5)
    finally:
        proxy.stop()
        srv.close()
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok")
    [got] = seen
    assert got.count(b"HTTP/1.1") == 1 and got.endswith(b"hello")
    assert b"internal.admin" not in got and f"Host: up.test:{port}".encode() in got


def test_a_plain_http_answer_reaches_a_client_that_reads_slowly() -> None:
    """The answer moves by splice into the client's socket: a client that does not read
    for a while fills its buffers, and the proxy must wait, not cut the answer short
    (it did: the socket still had the header timeout, so its descriptor was
    non-blocking and a full buffer was an error)."""
    body = b"y" * (16 << 20)
    srv = socket.socket()
    srv.bind(("127.0.0.2", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body))
        conn.sendall(body)
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    port = srv.getsockname()[1]
    proxy, proxy_port = _proxy(port)
    try:
        c = socket.create_connection(("127.0.0.1", proxy_port), timeout=30)
        c.sendall(f"GET http://up.test:{port}/big HTTP/1.1\r\nHost: up.test\r\n\r\n".encode())
        time.sleep(1.0)  # everything in between fills up
        reply = bytearray()
        while chunk := c.recv(1 << 20):
            reply += chunk
        c.close()
    finally:
        proxy.stop()
        srv.close()
    head, _, got = bytes(reply).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and len(got) == len(body)


def _two_part_gaps(proxy_port: int, up_port: int, rounds: int) -> list[float]:
    """Through a tunnel, ``rounds`` exchanges in which upstream answers in two small
    writes 2 ms apart (as a server writes a head, then a body): how long after the
    first part the second arrived, each time."""
    srv_ready = threading.Event()
    gaps: list[float] = []

    def serve(srv: socket.socket) -> None:
        conn, _ = srv.accept()
        srv_ready.set()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            if not conn.recv(16):
                return
            conn.sendall(b"A" * 100)
            time.sleep(0.002)
            conn.sendall(b"B" * 100)
        conn.close()

    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the same port again for the control
    srv.bind(("127.0.0.2", up_port))
    srv.listen()
    threading.Thread(target=serve, args=(srv,), daemon=True).start()
    try:
        s = _connect(proxy_port, f"up.test:{up_port}")
        for _ in range(rounds):
            s.sendall(b"next")
            got = s.recv(200)
            first = time.monotonic()
            while len(got) < 200:
                got += s.recv(200 - len(got))
            gaps.append(time.monotonic() - first)
        s.close()
    finally:
        srv.close()
    return gaps


def test_the_tunnel_passes_a_small_write_on_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy relays to the sandbox with TCP_NODELAY: a second small write of an
    answer (a body after its head, a TLS record) arrives as it was written, not after
    the client's delayed ACK (~40 ms each on Linux; uv's index requests paid it).
    Control: the proxy without it shows that delay."""
    port = _free_port()
    proxy, pport = _proxy(port)
    try:
        fast = sorted(_two_part_gaps(pport, port, 12))
    finally:
        proxy.stop()
    monkeypatch.setattr(netproxy, "_no_delay", lambda sock: None)
    proxy, pport = _proxy(port)
    try:
        slow = sorted(_two_part_gaps(pport, port, 12))
    finally:
        proxy.stop()
    assert fast[len(fast) // 2] < 0.015, fast
    assert slow[len(slow) // 2] > 0.03, slow  # the control: Nagle waits for the ACK


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    port = s.getsockname()[1]
    s.close()
    return int(port)
