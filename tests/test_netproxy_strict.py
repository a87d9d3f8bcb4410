"""The allowlist proxy parses requests strictly: every way for it and an upstream server
to read a request differently (smuggling), every odd authority and every slow head is
refused before upstream sees a byte of it; clean requests still go through."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from warren.net import proxy as netproxy
from warren.net.allowlist import Allowlist, parse_rules


class Recorder:
    """An upstream on 127.0.0.2 that records every connection's bytes, answering 200."""

    def __init__(self) -> None:
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.2", 0))
        self.srv.listen()
        self.port = self.srv.getsockname()[1]
        self.seen: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            conn.settimeout(0.5)
            data = b""
            try:
                while chunk := conn.recv(65536):
                    data += chunk
            except OSError:
                pass
            self.seen.append(data)
            with conn:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")


@pytest.fixture
def up() -> Iterator[Recorder]:
    rec = Recorder()
    yield rec
    rec.srv.close()


@pytest.fixture
def proxy_port(up: Recorder) -> Iterator[int]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    rules = parse_rules([f"up.test:{up.port}", f"127.0.0.2:{up.port}"])
    proxy = netproxy.Proxy(listener, Allowlist(rules), sandbox="t", resolve={"up.test": "127.0.0.2"}).start()
    yield listener.getsockname()[1]
    proxy.stop()


def _exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(data)
        reply = b""
        try:
            while chunk := c.recv(65536):
                reply += chunk
        except ConnectionResetError:
            pass
    return reply


SMUGGLED = b"GET http://up.test/admin HTTP/1.1\r\nHost: up.test\r\n\r\n"


def _bad_heads(port: int) -> list[bytes]:
    start = f"POST http://up.test:{port}/a HTTP/1.1\r\nHost: up.test\r\n".encode()
    return [
        start + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
        start + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLED,
        start + b"Content-Length: 5\r\nContent-Length: 60\r\n\r\nhello" + SMUGGLED,
        start + b"X-Pad: 1\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello" + SMUGGLED,
        start + b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n" + SMUGGLED,
        start + b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
        start + b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
        start + b"Content-Length: +5\r\n\r\nhello" + SMUGGLED,
        start + b"Content-Length: 1_0\r\n\r\nhello" + SMUGGLED,
        start + b"X-A: a\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + SMUGGLED,
        start + b"".join(b"X-%d: 1\r\n" % i for i in range(101)) + b"\r\n",
        start + b"X-Big: " + b"a" * 70_000 + b"\r\n\r\n",
    ]


@pytest.mark.parametrize("case", range(12))
def test_a_request_upstream_could_read_differently_is_400_and_never_sent(
    up: Recorder, proxy_port: int, case: int
) -> None:
    reply = _exchange(proxy_port, _bad_heads(up.port)[case])
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    time.sleep(0.1)
    assert up.seen == []


def test_a_chunk_size_that_is_not_plain_hex_ends_the_request_before_its_data(
    up: Recorder, proxy_port: int
) -> None:
    head = f"POST http://up.test:{up.port}/a HTTP/1.1\r\nHost: up.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    reply = _exchange(proxy_port, head.encode() + b"0x5\r\nhello\r\n0\r\n\r\n" + SMUGGLED)
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    for _ in range(50):
        if up.seen:
            break
        time.sleep(0.05)
    assert all(b"hello" not in got and b"/admin" not in got for got in up.seen)


def test_clean_requests_still_go_through(up: Recorder, proxy_port: int) -> None:
    head = f"POST http://up.test:{up.port}/a HTTP/1.1\r\nHost: up.test\r\n"
    reply = _exchange(
        proxy_port, (head + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n").encode()
    )
    assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"ok"), reply
    reply = _exchange(proxy_port, (head + "Content-Length: 5\r\nX-Tab:\tv\r\n\r\nhello").encode())
    assert reply.startswith(b"HTTP/1.1 200"), reply
    for _ in range(50):
        if len(up.seen) == 2:
            break
        time.sleep(0.05)
    assert up.seen[0].endswith(b"5\r\nhello\r\n0\r\n\r\n") and up.seen[1].endswith(b"\r\n\r\nhello")


@pytest.mark.parametrize(
    "authority",
    [
        "user@up.test:{port}",
        "user:pw@127.0.0.2:{port}",
        "2130706434:{port}",  # 127.0.0.2 as one number
        "0x7f.0.0.2:{port}",
        "127.2:{port}",
        "0177.0.0.2:{port}",
        "127.000.000.002:{port}",
        "up.test:0",
        "up.test:99999",
        "up.test:+{port}",
        "up.test",
        "up test:{port}",
        "[127.0.0.2]:{port}",
        "[::1]x:{port}",
    ],
)
def test_connect_to_an_odd_authority_is_400_and_reaches_nothing(
    up: Recorder, proxy_port: int, authority: str
) -> None:
    target = authority.format(port=up.port)
    reply = _exchange(proxy_port, f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
    assert reply.startswith(b"HTTP/1.1 400"), reply[:200]
    time.sleep(0.1)
    assert up.seen == []


def test_connect_to_the_canonical_forms_is_allowed(up: Recorder, proxy_port: int) -> None:
    for target in (f"up.test:{up.port}", f"127.0.0.2:{up.port}"):
        with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as c:
            c.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
            assert c.recv(100).startswith(b"HTTP/1.1 200"), target


def test_a_head_trickled_byte_by_byte_is_cut_off_at_the_deadline(
    up: Recorder, proxy_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(netproxy, "HEADER_TIMEOUT", 1.0)
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=10) as c:
        start = time.monotonic()
        reply = b""
        for ch in f"GET http://up.test:{up.port}/ HTTP/1.1\r\nX-Pad: {'a' * 100}".encode():
            try:
                c.sendall(bytes([ch]))
            except OSError:
                break
            time.sleep(0.05)
            c.setblocking(False)
            try:
                reply = c.recv(200)
            except BlockingIOError:
                continue
            finally:
                c.setblocking(True)
            break
        took = time.monotonic() - start
    assert reply.startswith(b"HTTP/1.1 400") and b"did not arrive" in reply, reply
    assert took < 3
    assert up.seen == []
