"""The intercepting proxy's data path (``net.intercept`` over ``net.tlsstream``): large
answers, however framed and however cut, reach the client with every real value
replaced; and clients that ask for HTTP/2 get HTTP/1.1 from it.

The proxy runs in this process (the same code ``--network allow`` runs in the network
helper) in front of a TLS server on 127.0.0.2; the client is this process, curl or Node
on the host. What the client received is judged here, beside a control fetched
directly that shows the value is there to find.
"""

from __future__ import annotations

import gzip
import http.client
import json
import random
import shutil
import socket
import ssl
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from test_secrets_https import _test_ca
from warren.net import intercept
from warren.net.allowlist import Allowlist, parse_rules
from warren.net.intercept import Interception
from warren.net.proxy import Proxy
from warren.net.secrets import PlacedSecret, Substituter, placeholder
from warren.net.tlsca import make_ca

TOKEN = b"ghp_REALtoken_0123456789abcdefXYZ"
NAME = "api.test"
UNNAMED = "unnamed.test"  # same server, but its certificate does not name this one
PH = placeholder("TOKEN", "stream-test").encode()


def _planted_body() -> bytes:
    """About 1.3 MiB with the value at and around 16 KiB (a TLS record) and 256 KiB (the
    proxy's piece) boundaries: every cut of the value a read could make, somewhere."""
    size = (5 << 18) + 4096
    cuts = (1, 7, 16, 31, 32, 2, 20)
    offsets = {k * 16384 - cuts[k % len(cuts)] for k in range(1, size // 16384)}
    offsets |= {k * 16384 + 8000 + k for k in range(1, size // 16384)}
    offsets |= {k * (1 << 18) - cuts[k] for k in range(1, 6)}
    body = bytearray(b"." * size)
    last = -len(TOKEN)
    for at in sorted(offsets):
        if at >= last + len(TOKEN) and at + len(TOKEN) <= size:
            body[at : at + len(TOKEN)] = TOKEN
            last = at
    return bytes(body)


BODY = _planted_body()


@dataclass
class Server:
    """A TLS server that answers ``/cl``, ``/chunked``, ``/close``, ``/gzip`` and
    ``/small`` with BODY (or a little) framed that way, written in uneven pieces."""

    ctx: ssl.SSLContext
    sock: socket.socket = field(default_factory=socket.socket)
    alpn: list[str | None] = field(default_factory=list)
    resumed: list[bool] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)

    def start(self) -> int:
        self.sock.bind(("127.0.0.2", 0))
        self.sock.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()
        return int(self.sock.getsockname()[1])

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, raw: socket.socket) -> None:
        try:
            with self.ctx.wrap_socket(raw, server_side=True) as conn:
                self.alpn.append(conn.selected_alpn_protocol())
                self.resumed.append(conn.session_reused)
                while True:
                    buf = b""
                    while b"\r\n\r\n" not in buf:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        buf += chunk
                    head = buf.split(b"\r\n\r\n")[0].decode()
                    path = head.split(" ")[1]
                    self.auth += [
                        line[15:] for line in head.split("\r\n") if line.startswith("Authorization: ")
                    ]
                    if self._answer(conn, path):
                        return
        except (OSError, ssl.SSLError):
            pass

    def _answer(self, conn: ssl.SSLSocket, path: str) -> bool:
        """Send the answer; True when the connection ends with it."""
        rng = random.Random(path)

        def pieces(data: bytes) -> Iterator[bytes]:
            i = 0
            while i < len(data):
                n = rng.choice((1, 5, 4093, 16384, 16385, 40000, 300000))
                yield data[i : i + n]
                i += n

        if path == "/small":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nsmall")
            return False
        if path == "/chunked":
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            for piece in pieces(BODY):
                conn.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            conn.sendall(b"0\r\n\r\n")
            return False
        if path == "/close":
            conn.sendall(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")
            for piece in pieces(BODY):
                conn.sendall(piece)
            return True
        data, extra = (gzip.compress(BODY), b"Content-Encoding: gzip\r\n") if path == "/gzip" else (BODY, b"")
        conn.sendall(b"HTTP/1.1 200 OK\r\n%sContent-Length: %d\r\n\r\n" % (extra, len(data)))
        for piece in pieces(data):
            conn.sendall(piece)
        return False


@dataclass
class Setup:
    server: Server
    port: int
    proxy_port: int
    test_ca: Path
    sandbox_ca: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("stream")
    ca, cert, key = _test_ca(tmp, (NAME,))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2", "http/1.1"])  # a server that would speak HTTP/2 if asked
    server = Server(ctx)
    port = server.start()
    sandbox_ca = make_ca("stream-test", [NAME, UNNAMED])
    (tmp / "sandbox-ca.pem").write_bytes(sandbox_ca.cert_pem)
    interception = Interception(
        [PlacedSecret("TOKEN", PH.decode(), (NAME, UNNAMED), "$TOKEN")],
        {"TOKEN": TOKEN},
        [],
        sandbox_ca,
        ca.read_text(),
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    proxy = Proxy(
        listener,
        Allowlist(parse_rules([f"{NAME}:{port}", f"{UNNAMED}:{port}", f"127.0.0.2:{port}"])),
        sandbox="stream-test",
        resolve={NAME: "127.0.0.2", UNNAMED: "127.0.0.2"},
        intercept=interception,
    ).start()
    yield Setup(server, port, int(listener.getsockname()[1]), ca, tmp / "sandbox-ca.pem")
    proxy.stop()
    server.sock.close()


def _through_proxy(
    s: Setup, path: str, alpn: list[str] | None = None, name: str = NAME
) -> tuple[bytes, str | None]:
    ctx = ssl.create_default_context(cafile=s.sandbox_ca)
    if alpn:
        ctx.set_alpn_protocols(alpn)
    conn = http.client.HTTPSConnection("127.0.0.1", s.proxy_port, context=ctx, timeout=30)
    conn.set_tunnel(name, s.port)
    conn.request("GET", path, headers={"Authorization": f"Bearer {PH.decode()}"})
    assert conn.sock is not None
    chosen = conn.sock.selected_alpn_protocol()  # type: ignore[attr-defined]
    r = conn.getresponse()
    data = r.read()
    conn.close()
    assert r.status == 200, data[:200]
    return data, chosen


@pytest.mark.parametrize("path", ["/cl", "/chunked", "/close", "/gzip"])
def test_a_large_answer_loses_the_value_wherever_reads_cut_it(setup: Setup, path: str) -> None:
    planted = BODY.count(TOKEN)
    assert planted > 150  # control: the body carries the value, many times
    data, _ = _through_proxy(setup, path)
    assert TOKEN not in data
    assert data == BODY.replace(TOKEN, PH)
    assert setup.server.auth[-1] == f"Bearer {TOKEN.decode()}"


def test_control_the_same_answer_fetched_directly_shows_the_value(setup: Setup) -> None:
    ctx = ssl.create_default_context(cafile=setup.test_ca)
    raw = socket.create_connection(("127.0.0.2", setup.port))
    conn = http.client.HTTPSConnection(NAME, setup.port, context=ctx, timeout=30)
    conn.sock = ctx.wrap_socket(raw, server_hostname=NAME)
    conn.request("GET", "/chunked")
    data = conn.getresponse().read()
    conn.close()
    assert data == BODY and TOKEN in data


def test_a_new_connection_resumes_the_proxys_session_with_the_server(setup: Setup) -> None:
    seen = len(setup.server.resumed)
    for _ in range(3):
        assert _through_proxy(setup, "/small")[0] == b"small"
        assert setup.server.auth[-1] == f"Bearer {TOKEN.decode()}"
    assert setup.server.resumed[seen + 1 :] == [True, True]


def test_a_session_is_never_offered_to_another_name_at_the_same_address(setup: Setup) -> None:
    """The server's certificate names api.test only. After api.test's session was kept,
    a CONNECT to unnamed.test (same address, same port) must still be checked in full
    and refused, the value never sent."""
    _through_proxy(setup, "/small")
    sent = len(setup.server.auth)
    with pytest.raises(OSError, match="502"):
        _through_proxy(setup, "/small", name=UNNAMED)
    assert len(setup.server.auth) == sent


class _Collect:
    def __init__(self) -> None:
        self.out = bytearray()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data


class _Pieces:
    """A body that returns the given pieces, one per read."""

    def __init__(self, pieces: list[bytes]) -> None:
        self.pieces = pieces

    def readinto(self, view: memoryview) -> int:
        if not self.pieces:
            return 0
        piece = self.pieces.pop(0)
        view[: len(piece)] = piece
        return len(piece)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert data == b"\r\n"
            return out
        out, data = out + data[:size], data[size + 2 :]


def test_the_in_place_scrubber_catches_a_value_cut_at_every_byte() -> None:
    """Deterministic: the body in two and three reads cut at every position, chunked
    out and as it is. Only what could begin a value is ever held back."""
    other = b"sk-short"  # a second, shorter value whose start is the long one's too
    sub = Substituter({PH: TOKEN, b"warren-secret-K-x": other})
    body = b"a" * 10 + TOKEN + b"b" + other + TOKEN[:5] + b"c" + TOKEN
    expected = b"a" * 10 + PH + b"b" + b"warren-secret-K-x" + TOKEN[:5] + b"c" + PH
    for chunked in (True, False):
        for cut in range(1, len(body)):
            for pieces in ([body[:cut], body[cut:]], [body[:cut], body[cut : cut + 3], body[cut + 3 :]]):
                sink = _Collect()
                framer = intercept.Framer(sink, 1 << 12)  # type: ignore[arg-type]
                framer.chunked = chunked
                intercept._scrub_stream(_Pieces([p for p in pieces if p]), framer, sub)  # type: ignore[arg-type]
                framer.finish()
                got = _dechunk(bytes(sink.out)) if chunked else bytes(sink.out)
                assert got == expected, (chunked, cut)
    # what cannot begin a value is passed on at once: a pause never holds an event back
    sink = _Collect()
    framer = intercept.Framer(sink, 1 << 12)  # type: ignore[arg-type]
    intercept._scrub_stream(_Pieces([b"event: done\n\n"]), framer, sub)  # type: ignore[arg-type]
    assert bytes(sink.out) == b"event: done\n\n"


class _Filling:
    """A body of ``data`` that fills every buffer it is given (as a fast server does)."""

    def __init__(self, data: bytes) -> None:
        self.data = memoryview(data)

    def readinto(self, view: memoryview) -> int:
        n = min(len(view), len(self.data))
        view[:n], self.data = self.data[:n], self.data[n:]
        return n


def test_a_value_cut_by_the_edge_of_a_full_read_buffer_is_scrubbed() -> None:
    """The proxy's own buffer sizes: each read fills a whole piece, and the value lies
    across the edge of the first (from all of it before the edge to all of it after)."""
    sub = Substituter({PH: TOKEN})
    for shift in range(-len(TOKEN), 2):
        body = b"a" * (intercept._PIECE + shift) + TOKEN + b"z" * 100 + TOKEN
        for chunked in (True, False):
            sink = _Collect()
            framer = intercept.Framer(sink, max(sub.longest - 1, 0) + intercept._PIECE)  # type: ignore[arg-type]
            framer.chunked = chunked
            intercept._scrub_stream(_Filling(body), framer, sub)  # type: ignore[arg-type]
            framer.finish()
            got = _dechunk(bytes(sink.out)) if chunked else bytes(sink.out)
            assert got == body.replace(TOKEN, PH), (shift, chunked)
            assert TOKEN not in sink.out


def test_a_client_asking_for_http2_gets_http11_and_its_request_works(setup: Setup) -> None:
    seen = len(setup.server.alpn)
    data, chosen = _through_proxy(setup, "/small", alpn=["h2", "http/1.1"])
    assert chosen == "http/1.1" and data == b"small"
    # the proxy offers the server only HTTP/1.1 too, though the server would speak h2
    assert setup.server.alpn[seen:] == ["http/1.1"]
    assert setup.server.auth[-1] == f"Bearer {TOKEN.decode()}"


def test_an_http2_only_client_gets_no_h2_and_its_preface_is_refused(setup: Setup) -> None:
    """A client that speaks nothing but HTTP/2 (gRPC) cannot use an intercepted host: no
    ALPN is agreed, and its connection preface is a 400 from the proxy."""
    raw = socket.create_connection(("127.0.0.1", setup.proxy_port), timeout=30)
    raw.sendall(f"CONNECT {NAME}:{setup.port} HTTP/1.1\r\nHost: {NAME}\r\n\r\n".encode())
    assert raw.recv(4096).startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(cafile=setup.sandbox_ca)
    ctx.set_alpn_protocols(["h2"])
    with ctx.wrap_socket(raw, server_hostname=NAME) as tls:
        assert tls.selected_alpn_protocol() is None
        tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 400 ")


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_with_http2_falls_back_to_http11(setup: Setup) -> None:
    r = subprocess.run(
        [
            "curl", "-sS", "--http2", "--cacert", str(setup.sandbox_ca), "-x", f"http://127.0.0.1:{setup.proxy_port}",
            "-H", f"Authorization: Bearer {PH.decode()}", "-w", "\n%{http_version}",
            f"https://{NAME}:{setup.port}/small",
        ],
        capture_output=True,
        timeout=60,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert r.stdout == b"small\n1.1"
    assert setup.server.auth[-1] == f"Bearer {TOKEN.decode()}"


NODE = r"""
const http = require("http"), tls = require("tls"), fs = require("fs");
const [proxyPort, target, ca, token] = process.argv.slice(-4);
const ask = {host: "127.0.0.1", port: +proxyPort, method: "CONNECT", path: target};
http.request(ask).on("connect", (res, socket) => {
  const alpn = ["h2", "http/1.1"];
  const options = {socket, servername: "api.test", ca: fs.readFileSync(ca), ALPNProtocols: alpn};
  const s = tls.connect(options, () => {
    const auth = `Authorization: Bearer ${token}`;
    s.write(`GET /small HTTP/1.1\r\nHost: api.test\r\n${auth}\r\nConnection: close\r\n\r\n`);
  });
  let out = ""; s.on("data", d => out += d);
  s.on("end", () => console.log(JSON.stringify({alpn: s.alpnProtocol, status: out.split("\r\n")[0]})));
  s.on("error", e => console.log(JSON.stringify({error: e.message})));
}).end();
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_asking_for_h2_gets_http11(setup: Setup) -> None:
    r = subprocess.run(
        [
            "node",
            "-e",
            NODE,
            str(setup.proxy_port),
            f"{NAME}:{setup.port}",
            str(setup.sandbox_ca),
            PH.decode(),
        ],
        capture_output=True,
        timeout=60,
    )
    assert json.loads(r.stdout or b"{}") == {"alpn": "http/1.1", "status": "HTTP/1.1 200 OK"}, r.stderr
