"""TLS termination for the hosts that carry a secret or HTTP rules (``--secret``,
``--allow-http``): the proxy reads their requests, puts the real secret in, checks
the rules, and scrubs the answers.

Only these hosts: every other CONNECT stays an opaque tunnel. For one of them the
proxy

1. connects to the vetted address and opens TLS to it, verified against the caller's
   trust (the system's plus the caller's ``SSL_CERT_FILE``) under the requested name;
   a failure is a 502 to the CONNECT naming the host, before the client sent anything;
2. answers the CONNECT and serves TLS itself with a certificate for that host signed
   by the sandbox's own CA (``tlsca``), which only the sandbox trusts; a client that
   pins certificates or ignores the sandbox's trust store fails its handshake, logged
   naming the host;
3. relays HTTP/1.1 requests one at a time: a method or path no ``--allow-http`` rule
   of the host allows gets a 403; placeholders in header values and a ``Basic``
   credential become the real values (``secrets.Substituter``; never in a body), the
   client's ``Accept-Encoding`` becomes ``identity`` so the answer can be read, and an
   ``Upgrade`` (WebSocket) is refused;
4. streams the answer back with every real value replaced by its placeholder, headers
   and body, re-framed as chunked (the length changes); a gzip or deflate body the
   server sends anyway is decoded first, any other coding is a 502.

Every request is one net-log event: method, host, port, path, and the *names* of the
secrets put in — never a value.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from .allowlist import Decision
from .secrets import HttpRule, PlacedSecret, StreamScrubber, Substituter, host_matches
from .tlsca import CA, Leaves, upstream_context

HEAD_LIMIT = 64 * 1024
IDLE_TIMEOUT = 300.0  # a kept-alive connection with no request for this long is closed
HANDSHAKE_TIMEOUT = 30.0
_CHUNK = 1 << 16
# Not forwarded either way: they describe one hop (the proxy re-frames the answer).
_HOP = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer"}

Log = Callable[[str, Decision], None]


class Refused(Exception):
    """A request the proxy answers itself (status, why), closing the connection."""

    def __init__(self, status: int, phrase: str, why: str) -> None:
        super().__init__(why)
        self.status, self.phrase, self.why = status, phrase, why


@dataclass
class Interception:
    """What one sandbox's proxy intercepts: its secrets (with their real values) and
    HTTP rules, its CA, and the caller's trust for the real hosts."""

    secrets: Sequence[PlacedSecret]
    values: Mapping[str, bytes]  # secret name -> real value (memory of the network helper only)
    rules: Sequence[HttpRule]
    ca: CA
    extra_cadata: str | None = None
    _leaves: Leaves | None = field(default=None, repr=False)
    _upstream: ssl.SSLContext | None = field(default=None, repr=False)

    def wants(self, host: str) -> bool:
        return bool(self.secrets_for(host) or self.rules_for(host))

    def secrets_for(self, host: str) -> list[PlacedSecret]:
        return [s for s in self.secrets if any(host_matches(h, host) for h in s.hosts)]

    def rules_for(self, host: str) -> list[HttpRule]:
        return [r for r in self.rules if host_matches(r.host, host)]

    def check_http(self, host: str, method: str, path: str) -> Decision | None:
        """None: no rule applies to ``host``; else whether one allows the request."""
        rules = self.rules_for(host)
        if not rules:
            return None
        if any(r.allows(method, path) for r in rules):
            return Decision(True, "allowed by --allow-http")
        allowed = ", ".join(repr(r.text) for r in rules)
        return Decision(False, f"{method} {_short(path)} matches no --allow-http rule of {host} ({allowed})")

    def substituter(self, host: str) -> Substituter:
        return Substituter(
            {s.placeholder.encode(): self.values.get(s.name, b"") for s in self.secrets_for(host)}
        )

    def server_context(self, host: str) -> ssl.SSLContext:
        if self._leaves is None:
            self._leaves = Leaves(self.ca)
        return self._leaves.context(host)

    def upstream_context(self) -> ssl.SSLContext:
        if self._upstream is None:
            self._upstream = upstream_context(self.extra_cadata)
        return self._upstream


def _short(path: str) -> str:
    return path if len(path) <= 200 else path[:200] + "..."


class Reader:
    """Buffered reads from a (TLS) socket: heads, lines, exact sizes."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _more(self) -> bool:
        data = self.sock.recv(_CHUNK)
        self.buf += data
        return bool(data)

    def head(self) -> bytes | None:
        """Up to the empty line; None at a clean end before any byte."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > HEAD_LIMIT:
                raise Refused(400, "Bad Request", "header too large")
            if not self._more():
                if not self.buf:
                    return None
                raise Refused(400, "Bad Request", "connection closed inside a header")
        head, _, self.buf = self.buf.partition(b"\r\n\r\n")
        return head

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            if len(self.buf) > HEAD_LIMIT:
                raise Refused(400, "Bad Request", "line too long")
            if not self._more():
                raise ConnectionError("closed inside a chunked body")
        out, _, self.buf = self.buf.partition(b"\r\n")
        return out

    def some(self, limit: int) -> bytes:
        if not self.buf and not self._more():
            return b""
        out, self.buf = self.buf[:limit], self.buf[limit:]
        return out

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._more():
                raise ConnectionError("closed inside a body")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out


def _body(reader: Reader, headers: Sequence[tuple[str, str]], until_close: bool) -> Iterator[bytes]:
    """The body's bytes as framed by ``headers`` (de-chunked)."""
    fields = {k.lower(): v for k, v in headers}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        while True:
            size_text = reader.line().split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ConnectionError("bad chunk size") from None
            if size == 0:
                while reader.line():  # trailers: dropped
                    pass
                return
            yield from _sized(reader, size, "chunk")
            reader.exact(2)
    elif "content-length" in fields:
        yield from _sized(reader, int(fields["content-length"]), "body")
    elif until_close:
        while piece := reader.some(_CHUNK):
            yield piece


def _sized(reader: Reader, size: int, what: str) -> Iterator[bytes]:
    """The next ``size`` bytes, in pieces as they come (a chunk's, or a whole body's)."""
    left = size
    while left:
        piece = reader.some(min(left, _CHUNK))
        if not piece:
            raise ConnectionError(f"closed inside a {what}")
        left -= len(piece)
        yield piece


def _parse_status(head: bytes) -> tuple[str, int, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise ConnectionError("malformed status line")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers.append((name.strip(), value.strip(" \t")))
    return lines[0], int(parts[1]), headers


def serve(
    intercept: Interception,
    client: socket.socket,
    upstream: socket.socket,
    host: str,
    port: int,
    version: str,
    log: Log,
    parse_head: Callable[[bytes], tuple[str, str, str, list[tuple[str, str]]]],
) -> None:
    """The CONNECT to ``host`` is accepted and ``upstream`` connected: TLS both ways,
    then requests until either side closes."""
    # TLS on duplicates: wrapping detaches a socket, and the proxy's ``stop`` must still
    # be able to shut the originals down (which ends these too).
    client = socket.socket(fileno=os.dup(client.fileno()))
    upstream = socket.socket(fileno=os.dup(upstream.fileno()))
    client.settimeout(HANDSHAKE_TIMEOUT)
    upstream.settimeout(HANDSHAKE_TIMEOUT)
    try:
        tls_up = intercept.upstream_context().wrap_socket(upstream, server_hostname=host)
    except (ssl.SSLError, ssl.CertificateError, OSError) as e:
        why = f"TLS to {host}:{port} failed: {getattr(e, 'verify_message', None) or e}"
        log("TLS", Decision(False, why))
        upstream.close()
        body = f"warren proxy: {why}\n".encode()
        with contextlib.suppress(OSError):
            client.sendall(
                f"{version} 502 Bad Gateway\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
                "X-Warren-Proxy: refused\r\n\r\n".encode()
                + body
            )
        client.close()
        return
    client.sendall(f"{version} 200 Connection established\r\n\r\n".encode())
    # A head and a body go out in separate writes: without this, Nagle holds the
    # second back until the client's delayed ACK (40 ms per request, measured).
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        context = intercept.server_context(host)
    except Exception as e:  # cryptography's errors: a refusal, never a dead thread
        log("TLS", Decision(False, f"cannot make a certificate for {host}: {e}"))
        client.close()
        tls_up.close()
        return
    try:
        tls_client = context.wrap_socket(client, server_side=True)
    except (ssl.SSLError, OSError) as e:
        log(
            "TLS",
            Decision(
                False,
                f"the sandbox's client refused warren's certificate for {host} ({e.__class__.__name__}: "
                f"{getattr(e, 'reason', None) or e}): it pins certificates or does not use the sandbox's "
                "trust bundle, so requests to this host cannot carry secrets",
            ),
        )
        client.close()
        tls_up.close()
        return
    sub = intercept.substituter(host)
    authority = f"{host}:{port}" if port != 443 else host
    from_client, from_up = Reader(tls_client), Reader(tls_up)
    tls_client.settimeout(IDLE_TIMEOUT)
    tls_up.settimeout(None)  # an answer may stream for as long as a tunnel would
    try:
        while _exchange(
            intercept, sub, from_client, from_up, tls_client, tls_up, host, authority, log, parse_head
        ):
            pass
    except Refused as r:
        _answer(tls_client, r.status, r.phrase, f"warren proxy: {r.why}\n")
    except (OSError, ConnectionError, ValueError, zlib.error):
        pass
    finally:
        for s in (tls_client, tls_up):
            with contextlib.suppress(OSError, ValueError):
                s.close()


def _answer(sock: socket.socket, status: int, phrase: str, text: str) -> None:
    data = text.encode()
    with contextlib.suppress(OSError, ValueError):
        sock.sendall(
            f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\nX-Warren-Proxy: refused\r\n\r\n".encode()
            + data
        )


def _exchange(
    intercept: Interception,
    sub: Substituter,
    from_client: Reader,
    from_up: Reader,
    client: socket.socket,
    up: socket.socket,
    host: str,
    authority: str,
    log: Log,
    parse_head: Callable[[bytes], tuple[str, str, str, list[tuple[str, str]]]],
) -> bool:
    """One request and its answer; False when the connection ends."""
    head = from_client.head()
    if head is None:
        return False
    try:
        method, target, version, headers = parse_head(head)
    except Exception as e:  # the proxy's strict parser: its refusal, as is
        raise Refused(400, "Bad Request", str(e)) from None
    if not target.startswith("/"):
        raise Refused(400, "Bad Request", f"expected a path, got {target[:100]!r}")
    rule = intercept.check_http(host, method, target)
    if rule is not None and not rule.allowed:
        log(f"{method}", Decision(False, rule.reason))
        raise Refused(403, "Forbidden", f"refused {method} {host}{_short(target)}: {rule.reason}")
    if any(k.lower() == "upgrade" for k, _ in headers):
        log(method, Decision(False, f"{_short(target)}: protocol upgrades (WebSocket) to {host} are refused"))
        raise Refused(403, "Forbidden", f"protocol upgrades (WebSocket) to {host} are refused")
    used: list[str] = []
    out: list[tuple[str, str]] = [("Host", authority)]
    if any(k.lower() == "expect" and v.lower() == "100-continue" for k, v in headers):
        # The body is read here before the server answers: say go on now (and not
        # ask the server, whose 100 would arrive after the body).
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
    close = version == "HTTP/1.0"
    for name, value in headers:
        low = name.lower()
        if low == "connection" and "close" in value.lower():
            close = True
        if low in _HOP or low in ("host", "expect") or (low == "accept-encoding" and sub.pairs):
            continue
        value, names = sub.request_value(value)
        used += names
        out.append((name, value))
    if sub.pairs:
        out.append(("Accept-Encoding", "identity"))
    reason = "on the allowlist, TLS intercepted" if rule is None else rule.reason + ", TLS intercepted"
    if used:
        reason += "; secrets put in: " + ", ".join(dict.fromkeys(used))
    log(method, Decision(True, f"{_short(target)}: {reason}"))
    up.sendall(
        ("\r\n".join([f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in out)]) + "\r\n\r\n").encode(
            "latin-1"
        )
    )
    fields = {k.lower(): v for k, v in headers}
    request_chunked = "chunked" in fields.get("transfer-encoding", "").lower()
    for piece in _body(from_client, headers, until_close=False):
        up.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if request_chunked else piece)
    if request_chunked:
        up.sendall(b"0\r\n\r\n")
    return _relay_answer(sub, from_up, client, method, version) and not close


def _relay_answer(
    sub: Substituter, from_up: Reader, client: socket.socket, method: str, version: str
) -> bool:
    """The answer, scrubbed; False when the connection must end after it."""
    while True:
        head = from_up.head()
        if head is None:
            raise ConnectionError("the server closed without answering")
        status_line, status, headers = _parse_status(head)
        if status == 101:
            raise ConnectionError("the server switched protocols unasked")
        if 100 <= status < 200:
            client.sendall(sub.scrub(head) + b"\r\n\r\n")
            continue
        break
    fields = {k.lower(): v for k, v in headers}
    has_body = method != "HEAD" and status not in (204, 304)
    server_close = "close" in fields.get("connection", "").lower() or status_line.startswith("HTTP/1.0")
    framed = "content-length" in fields or "chunked" in fields.get("transfer-encoding", "").lower()
    coding = fields.get("content-encoding", "identity").strip().lower()
    decoder = None
    if has_body and coding not in ("", "identity") and sub.pairs:
        if coding not in ("gzip", "x-gzip", "deflate"):
            raise Refused(
                502, "Bad Gateway", f"cannot read a {coding!r} answer for secrets (asked for identity)"
            )
        decoder = zlib.decompressobj(47)  # gzip or zlib header, detected
    keep = [
        (k, v)
        for k, v in headers
        if k.lower() not in _HOP
        and k.lower() not in ("content-length", "transfer-encoding")
        and not (decoder is not None and k.lower() == "content-encoding")
    ]
    chunked_out = has_body and version == "HTTP/1.1"
    ends = server_close or not framed or version != "HTTP/1.1"
    if chunked_out:
        keep.append(("Transfer-Encoding", "chunked"))
    elif not has_body and "content-length" in fields:
        keep.append(("Content-Length", fields["content-length"]))  # HEAD: the length it would have
    if ends:
        keep.append(("Connection", "close"))
    lines = [status_line, *(f"{k}: {v}" for k, v in keep)]
    client.sendall(sub.scrub(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")))
    if not has_body:
        return not ends
    scrubber = StreamScrubber(sub)

    def send(data: bytes) -> None:
        if data:
            client.sendall(b"%x\r\n%s\r\n" % (len(data), data) if chunked_out else data)

    for piece in _body(from_up, headers, until_close=not framed):
        send(scrubber.feed(decoder.decompress(piece) if decoder is not None else piece))
    if decoder is not None:
        send(scrubber.feed(decoder.flush()))
    send(scrubber.flush())
    if chunked_out:
        client.sendall(b"0\r\n\r\n")
    return not ends
