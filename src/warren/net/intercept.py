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
4. streams the answer back with every form of a real value the proxy sent (the value,
   its percent-encoding, the ``Basic`` credential, its base64 at any alignment)
   replaced by the same form of its placeholder, headers
   and body, re-framed as chunked (the length changes); a gzip or deflate body the
   server sends anyway is decoded first, any other coding is a 502.

Every request is one net-log event: method, host, port, path, and the *names* of the
secrets put in — never a value.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from .allowlist import Decision
from .secrets import HttpRule, PlacedSecret, StreamScrubber, Substituter, ambiguous_path, host_matches
from .tlsca import CA, Leaves, upstream_context
from .tlsstream import TlsStream

HEAD_LIMIT = 64 * 1024
IDLE_TIMEOUT = 300.0  # a kept-alive connection with no request for this long is closed
HANDSHAKE_TIMEOUT = 30.0
_PIECE = 1 << 18  # body bytes read, scrubbed and sent at a time (sixteen full TLS records)
_SESSIONS = 256  # upstream TLS sessions kept for resumption, one per host and port
_HEAD_READ = 1 << 14  # plaintext read at a time while looking for a head or a chunk-size line
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
    _sessions: dict[tuple[str, int], ssl.SSLSession] = field(default_factory=dict, repr=False)
    _sessions_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

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
        why = ambiguous_path(path)
        if why is not None:
            return Decision(False, f"{method} {_short(path)}: {why}, refused where --allow-http rules apply")
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

    # A new connection to a host resumes the TLS session of the last one (about 0.3 ms
    # of the proxy's CPU instead of 0.5, measured): no certificate to verify again. A
    # session comes only from a handshake verified under the same name, and is offered
    # only to that name and port; a server that no longer knows it makes a full (and
    # verified) handshake instead.

    def session(self, host: str, port: int) -> ssl.SSLSession | None:
        with self._sessions_lock:
            return self._sessions.get((host, port))

    def keep_session(self, host: str, port: int, session: ssl.SSLSession | None) -> None:
        if session is None:
            return
        with self._sessions_lock:
            self._sessions.pop((host, port), None)
            self._sessions[(host, port)] = session
            while len(self._sessions) > _SESSIONS:
                del self._sessions[next(iter(self._sessions))]  # the least recently kept


def _short(path: str) -> str:
    return path if len(path) <= 200 else path[:200] + "..."


class Reader:
    """HTTP/1.1 framing over a ``TlsStream``: heads and lines through a small buffer,
    bodies straight into the caller's buffer once the small one is empty."""

    def __init__(self, stream: TlsStream) -> None:
        self.stream = stream
        self.buf = bytearray()
        self._scratch = memoryview(bytearray(_HEAD_READ))

    def _more(self) -> bool:
        n = self.stream.read_into(self._scratch)
        self.buf += self._scratch[:n]
        return bool(n)

    def head(self) -> bytes | None:
        """Up to the empty line; None at a clean end before any byte."""
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > HEAD_LIMIT:
                raise Refused(400, "Bad Request", "header too large")
            if not self._more():
                if not self.buf:
                    return None
                raise Refused(400, "Bad Request", "connection closed inside a header")
        head = bytes(self.buf[:end])
        del self.buf[: end + 4]
        return head

    def line(self) -> bytes:
        while (end := self.buf.find(b"\r\n")) < 0:
            if len(self.buf) > HEAD_LIMIT:
                raise Refused(400, "Bad Request", "line too long")
            if not self._more():
                raise ConnectionError("closed inside a chunked body")
        out = bytes(self.buf[:end])
        del self.buf[: end + 2]
        return out

    def readinto(self, view: memoryview) -> int:
        """Some bytes into ``view`` (what is buffered first); 0 at the end."""
        if self.buf:
            n = min(len(view), len(self.buf))
            view[:n] = self.buf[:n]
            del self.buf[:n]
            return n
        return self.stream.read_into(view)

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._more():
                raise ConnectionError("closed inside a body")
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out


class Body:
    """A message body as its headers frame it (Content-Length, chunked, or until the
    connection ends), de-chunked, read into the caller's buffer."""

    def __init__(self, reader: Reader, headers: Sequence[tuple[str, str]], until_close: bool) -> None:
        fields = {k.lower(): v for k, v in headers}
        self.reader = reader
        self.chunked = "chunked" in fields.get("transfer-encoding", "").lower()
        self.left: int | None = 0  # bytes left in the body or the chunk; None: until the end
        if not self.chunked and "content-length" in fields:
            self.left = int(fields["content-length"])
        elif not self.chunked and until_close:
            self.left = None
        self._in_chunks = False
        self.done = False

    def _next_chunk(self) -> None:
        if self._in_chunks and self.reader.exact(2) != b"\r\n":
            raise ConnectionError("a chunk does not end with CRLF")
        self._in_chunks = True
        size_text = self.reader.line().split(b";", 1)[0].strip()
        try:
            self.left = int(size_text, 16)
        except ValueError:
            raise ConnectionError("bad chunk size") from None
        if self.left == 0:
            while self.reader.line():  # trailers: dropped
                pass
            self.done = True

    def readinto(self, view: memoryview) -> int:
        """Some of the body into ``view``; 0 at its end."""
        if self.chunked and self.left == 0 and not self.done:
            self._next_chunk()
        if self.done:
            return 0
        if self.left is None:
            n = self.reader.readinto(view)
            self.done = not n
            return n
        if self.left == 0:
            self.done = True
            return 0
        n = self.reader.readinto(view[: min(len(view), self.left)])
        if not n:
            raise ConnectionError("closed inside a body")
        self.left -= n
        return n


class Framer:
    """Pieces of a body out to a stream, as they are or as HTTP chunks (``chunked``, set
    per body), written from one buffer that has room for the chunk-size line before a
    piece and the CRLF after it (no copy of the piece in Python). ``frame[START:]`` is
    where pieces are put. One per direction and connection, made when first needed: a
    small request must not pay for zeroing a large buffer."""

    START = 16  # room for a chunk-size line

    def __init__(self, out: TlsStream, size: int) -> None:
        self.out = out
        self.chunked = False
        self.size = size
        self.frame = bytearray(self.START + size + 2)
        self.view = memoryview(self.frame)

    def write(self, end: int) -> None:
        """Send ``frame[START:end]`` (bytes after ``end`` are left as they were)."""
        start = self.START
        if end <= start:
            return
        if not self.chunked:
            self.out.write(self.view[start:end])
            return
        size = b"%x\r\n" % (end - start)
        after = bytes(self.frame[end : end + 2])
        self.frame[start - len(size) : start] = size
        self.frame[end : end + 2] = b"\r\n"
        self.out.write(self.view[start - len(size) : end + 2])
        self.frame[end : end + 2] = after

    def write_bytes(self, data: bytes) -> None:
        if data:
            self.out.write(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)

    def finish(self) -> None:
        if self.chunked:
            self.out.write(b"0\r\n\r\n")


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
    then requests until either side closes. The sockets stay the caller's to close."""
    client.settimeout(HANDSHAKE_TIMEOUT)
    upstream.settimeout(HANDSHAKE_TIMEOUT)
    up = TlsStream(
        upstream,
        intercept.upstream_context(),
        server_side=False,
        server_hostname=host,
        session=intercept.session(host, port),
    )
    try:
        up.handshake()
    except (ssl.SSLError, ssl.CertificateError, OSError) as e:
        why = f"TLS to {host}:{port} failed: {getattr(e, 'verify_message', None) or e}"
        log("TLS", Decision(False, why))
        body = f"warren proxy: {why}\n".encode()
        with contextlib.suppress(OSError):
            client.sendall(
                f"{version} 502 Bad Gateway\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
                "X-Warren-Proxy: refused\r\n\r\n".encode()
                + body
            )
        return
    client.sendall(f"{version} 200 Connection established\r\n\r\n".encode())
    # Writes are batched (``TlsStream``), but what is flushed must not wait for the
    # client's delayed ACK behind Nagle (40 ms per request, measured).
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        context = intercept.server_context(host)
    except Exception as e:  # cryptography's errors: a refusal, never a dead thread
        log("TLS", Decision(False, f"cannot make a certificate for {host}: {e}"))
        return
    # requests are mostly small: a smaller receive buffer on the sandbox's side
    down = TlsStream(client, context, server_side=True, recv_size=1 << 16)
    try:
        down.handshake()
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
        return
    up.peer, down.peer = down, up
    sub = intercept.substituter(host)
    authority = f"{host}:{port}" if port != 443 else host
    from_client, from_up = Reader(down), Reader(up)
    client.settimeout(IDLE_TIMEOUT)
    upstream.settimeout(None)  # an answer may stream for as long as a tunnel would
    try:
        exchange = _Exchange(intercept, sub, from_client, from_up, host, authority, log, parse_head)
        more = exchange.next()
        # TLS 1.3 sends the ticket after the handshake: known once an answer was read
        intercept.keep_session(host, port, up.tls.session)
        while more:
            more = exchange.next()
        down.close_notify()
    except Refused as r:
        _answer(down, r.status, r.phrase, f"warren proxy: {r.why}\n")
    except (OSError, ValueError, zlib.error):  # ssl.SSLError and ConnectionError are OSErrors
        pass


def _answer(stream: TlsStream, status: int, phrase: str, text: str) -> None:
    data = text.encode()
    with contextlib.suppress(OSError, ValueError):
        stream.send(
            f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\nX-Warren-Proxy: refused\r\n\r\n".encode()
            + data
        )
        stream.close_notify()


@dataclass
class _Exchange:
    """The requests of one intercepted connection, one after the other."""

    intercept: Interception
    sub: Substituter
    from_client: Reader
    from_up: Reader
    host: str
    authority: str
    log: Log
    parse_head: Callable[[bytes], tuple[str, str, str, list[tuple[str, str]]]]
    _requests: Framer | None = None
    _answers: Framer | None = None

    def next(self) -> bool:
        """One request and its answer; False when the connection ends."""
        intercept, sub, host, authority, log = self.intercept, self.sub, self.host, self.authority, self.log
        from_client, client, up = self.from_client, self.from_client.stream, self.from_up.stream
        head = from_client.head()
        if head is None:
            return False
        try:
            method, target, version, headers = self.parse_head(head)
        except Exception as e:  # the proxy's strict parser: its refusal, as is
            raise Refused(400, "Bad Request", str(e)) from None
        if not target.startswith("/"):
            raise Refused(400, "Bad Request", f"expected a path, got {target[:100]!r}")
        rule = intercept.check_http(host, method, target)
        if rule is not None and not rule.allowed:
            log(f"{method}", Decision(False, rule.reason))
            raise Refused(403, "Forbidden", f"refused {method} {host}{_short(target)}: {rule.reason}")
        if any(k.lower() == "upgrade" for k, _ in headers):
            log(
                method,
                Decision(False, f"{_short(target)}: protocol upgrades (WebSocket) to {host} are refused"),
            )
            raise Refused(403, "Forbidden", f"protocol upgrades (WebSocket) to {host} are refused")
        used: list[str] = []
        out: list[tuple[str, str]] = [("Host", authority)]
        if any(k.lower() == "expect" and v.lower() == "100-continue" for k, v in headers):
            # The body is read here before the server answers: say go on now (and not
            # ask the server, whose 100 would arrive after the body).
            client.send(b"HTTP/1.1 100 Continue\r\n\r\n")
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
        up.write(
            (
                "\r\n".join([f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in out)]) + "\r\n\r\n"
            ).encode("latin-1")
        )
        body = Body(from_client, headers, until_close=False)
        if body.chunked or body.left:
            if self._requests is None:
                self._requests = Framer(up, _PIECE)
            framer = self._requests
            framer.chunked = body.chunked
            while n := body.readinto(framer.view[framer.START : framer.START + _PIECE]):
                framer.write(framer.START + n)
            framer.finish()
        return self._relay_answer(method, version) and not close

    def _relay_answer(self, method: str, version: str) -> bool:
        """The answer, scrubbed; False when the connection must end after it."""
        sub, from_up, client = self.sub, self.from_up, self.from_client.stream
        while True:
            head = from_up.head()
            if head is None:
                raise ConnectionError("the server closed without answering")
            status_line, status, headers = _parse_status(head)
            if status == 101:
                raise ConnectionError("the server switched protocols unasked")
            if 100 <= status < 200:
                client.write(sub.scrub(head) + b"\r\n\r\n")
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
        client.write(sub.scrub(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")))
        if has_body:
            body = Body(from_up, headers, until_close=not framed)
            # room for a piece after the longest end held back; a credential built for
            # this request may have made that longer
            if self._answers is None or self._answers.size < max(sub.longest - 1, 0) + _PIECE:
                self._answers = Framer(client, max(sub.longest - 1, 0) + _PIECE)
            framer = self._answers
            framer.chunked = chunked_out
            if decoder is None:
                _scrub_stream(body, framer, sub)
            else:
                _scrub_decoded(body, framer, sub, decoder)
            framer.finish()
        client.flush()
        return not ends


def _scrub_stream(body: Body, framer: Framer, sub: Substituter) -> None:
    """The answer's body to the client with every real value replaced, in place: each
    piece is read after the end held back from the last one (at most the longest value
    less a byte, the part that could begin a value), looked through once for whole
    values (a copy only where one is found), and sent up to a new such end."""
    start, frame = framer.START, framer.frame
    held = 0
    while n := body.readinto(framer.view[start + held : start + held + _PIECE]):
        end = start + held + n
        if sub.pairs and sub.occurs_in(frame, start, end):
            data = sub.scrub(bytes(frame[start:end]))
            held = sub.held_tail(data, 0, len(data))
            framer.write_bytes(data[: len(data) - held])
            frame[start : start + held] = data[len(data) - held :]
            continue
        held = sub.held_tail(frame, start, end) if sub.pairs else 0
        framer.write(end - held)
        frame[start : start + held] = frame[end - held : end]
    framer.write(start + held)  # the start of a value that never came


def _scrub_decoded(body: Body, framer: Framer, sub: Substituter, decoder: zlib._Decompress) -> None:
    """A gzip or deflate body, decoded (at most a piece at a time, whatever the ratio),
    then scrubbed as a stream of bytes."""
    scrubber = StreamScrubber(sub)
    raw = framer.view[framer.START : framer.START + _PIECE]
    while n := body.readinto(raw):
        data = decoder.decompress(raw[:n], _PIECE)
        while data:
            framer.write_bytes(scrubber.feed(data))
            data = decoder.decompress(decoder.unconsumed_tail, _PIECE)
    framer.write_bytes(scrubber.feed(decoder.flush()))
    framer.write_bytes(scrubber.flush())
