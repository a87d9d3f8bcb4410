"""The allowlist proxy of ``--network allow``: HTTP CONNECT and plain HTTP, outside
the sandbox, listening on a socket that lives inside it.

The sandbox has only ``lo``. Its PID 1 creates a listening TCP socket on
127.0.0.1:3128 in the sandbox's network namespace and hands the descriptor out;
the proxy accepts on it here, in the caller's network namespace. A socket belongs
to the namespace it was created in, so the sandbox reaches the proxy and nothing
else, and the proxy's upstream connections are ordinary host connections that it
makes only after ``netpolicy`` said yes, to the very addresses it vetted (no second
resolution for an attacker's DNS to change).

Requests are parsed strictly, because whatever the proxy and the upstream server read
differently can smuggle a second request past the check: a request with both
Content-Length and Transfer-Encoding, several Content-Lengths, a Transfer-Encoding
other than ``chunked``, a folded (obs-fold) or malformed header line, a chunk size that
is not plain hex, too many or too large headers, a CONNECT authority with userinfo, a
port outside 1-65535, or a host that is an IP address in a non-canonical form
(``0x7f.1``, ``2130706433``, ``127.1``: the resolver would read them as 127.0.0.1) is a
400. The head must arrive whole within ``HEADER_TIMEOUT`` however slowly it trickles.

Threads, not an event loop: one per client connection plus one per tunnel
direction, each blocking in ``splice(2)`` so tunnelled bytes move between sockets
inside the kernel (see bench/bench_net.py for the figures). Every decision is
passed to ``on_event`` (time, sandbox, method, host, port, allowed, reason).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import ipaddress
import os
import re
import select
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from .allowlist import PROXY_PORT, Allowlist, Decision, NetEvent, ip_literal, normalize_host

if TYPE_CHECKING:
    from .intercept import Interception
    from .live import LivePolicy, Pending

HEADER_LIMIT = 64 * 1024
MAX_HEADERS = 100
MAX_CLIENTS = 256  # concurrent connections per sandbox: threads here are the host's
HEADER_TIMEOUT = 30.0
KEPT_EVENTS = 1000
CONNECT_TIMEOUT = 15.0
_SPLICE_CHUNK = 1 << 20
# Not SPLICE_F_MORE: like TCP_CORK it holds a partial segment back for up to 200 ms,
# which stalls every request/response exchange inside a CONNECT tunnel (measured).
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1)
# A bigger pipe moves ~4x more per splice call. Best effort: pipe memory is counted per
# user, and past the soft limit the kernel refuses (and shrinks the user's new pipes).
_PIPE_SIZE = 256 * 1024


def now() -> str:
    """The time of a log record, UTC to the millisecond."""
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class _BadRequest(Exception):
    pass


class _Stopped(Exception):
    """The proxy stopped accepting (``stop``, ``leave_if_idle``)."""


def _resolve(host: str, port: int, overrides: Mapping[str, str]) -> list[str]:
    if host in overrides:
        return [overrides[host]]
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


class Proxy:
    """Serve one sandbox's proxy socket until ``stop``."""

    def __init__(
        self,
        listener: socket.socket,
        allowlist: Allowlist,
        *,
        sandbox: str,
        resolve: Mapping[str, str] | None = None,
        on_event: Callable[[NetEvent], None] | None = None,
        intercept: Interception | None = None,
        live: LivePolicy | None = None,
        asker: Callable[[tuple[str, int]], str] | None = None,
    ) -> None:
        self.listener = listener
        self.intercept = intercept  # secrets and HTTP rules: ``net.intercept``
        self.allowlist = allowlist
        # a running sandbox's changes and approvals (``net.live``): its allowlist wins
        self.live = live
        self.asker = asker  # which process of the sandbox a connection is from (``net.asker``)
        self.sandbox = sandbox
        self.resolve = dict(resolve or {})
        self.on_event = on_event
        # the newest decisions, for a caller without ``on_event``; bounded: a sandbox
        # makes as many as it likes, and this is the helper's memory
        self.events: collections.deque[NetEvent] = collections.deque(maxlen=KEPT_EVENTS)
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._last = time.monotonic()  # a connection's start or end, the latest

    # --- lifecycle ----------------------------------------------------------------

    def start(self) -> Proxy:
        # Accepted under the lock, never blocking (``_accept``): a connection is either
        # taken and tracked or left in the backlog, never taken by a helper that leaves.
        self.listener.setblocking(False)
        self._thread = threading.Thread(target=self._accept_loop, name="warren-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Close the listener and every open connection; returns once accepting stopped."""
        with self._lock:
            self._stopped = True
            conns = list(self._conns)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.listener.close()

    def leave_if_idle(self, after: float) -> bool:
        """Stop accepting if no connection is open and none started or ended in the last
        ``after`` seconds: True if so. Connections that come later wait in the listener's
        backlog for whoever holds it next (the supervisor, ``server.box``)."""
        with self._lock:
            if self._stopped or self._conns or time.monotonic() - self._last < after:
                return False
            self._stopped = True
            return True

    def _accept(self) -> socket.socket | None:
        """A connection waiting, taken and tracked; None if none (``_Stopped`` once stopped)."""
        with self._lock:
            if self._stopped:
                raise _Stopped
            try:
                client, _ = self.listener.accept()
            except BlockingIOError:
                return None
            self._conns.add(client)
            self._last = time.monotonic()
            return client

    def _accept_loop(self) -> None:
        poll = select.poll()
        poll.register(self.listener.fileno(), select.POLLIN)
        while True:
            try:
                poll.poll()
                client = self._accept()
            except _Stopped:
                return
            except OSError as e:
                if self._stopped or e.errno in (errno.EINVAL, errno.EBADF):
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)
                continue
            if client is None:
                continue
            if not self._slots.acquire(blocking=False):
                _reply(
                    client, 503, "Service Unavailable", f"warren proxy: more than {MAX_CLIENTS} connections\n"
                )
                self._untrack(client)
                continue
            try:
                threading.Thread(target=self._serve, args=(client,), daemon=True).start()
            except RuntimeError:
                # no thread to be had: the helper counts in the sandbox's pids limit
                self._untrack(client)
                self._slots.release()
                continue

    def _track(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._stopped:
                return False
            self._conns.add(sock)
            return True

    def _untrack(self, *socks: socket.socket) -> None:
        with self._lock:
            for s in socks:
                self._conns.discard(s)
            self._last = time.monotonic()
        for s in socks:
            s.close()

    def _log(self, method: str, host: str, port: int, decision: Decision, address: str | None = None) -> None:
        event = NetEvent(
            now(),
            self.sandbox,
            method,
            host,
            port,
            decision.allowed,
            decision.reason,
            address,
            request=decision.request,
        )
        self._emit(event)

    def _emit(self, event: NetEvent) -> None:
        with self._lock:
            self.events.append(event)
        if self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event(event)

    # --- one client ---------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            # The relay writes what upstream sent as it comes: with Nagle on, the tail of
            # an answer waited for the client's delayed ACK (40 ms a request, measured).
            _no_delay(client)
            client.settimeout(HEADER_TIMEOUT)
            head, rest = _read_head(client)
            method, target, version, headers = _parse_head(head)
            if method == "CONNECT":
                host, port = _split_authority(target, None)
                if self.intercept is not None and self.intercept.wants(normalize_host(host)):
                    upstream = self._intercept(client, host, port, version, rest)
                    return
                upstream = self._open(method, host, port, client)
                if upstream is None:
                    return
                client.sendall(f"{version} 200 Connection established\r\n\r\n".encode())
                if rest:
                    upstream.sendall(rest)
                client.settimeout(None)
                upstream.settimeout(None)
                relay(client, upstream)
            else:
                host, port, path = _absolute_url(target)
                if self.intercept is not None and not self._plain_http_ok(method, host, port, path, client):
                    return
                upstream = self._open(method, host, port, client)
                if upstream is None:
                    return
                # One request per connection: its head (Host rewritten to the vetted
                # name) and its body, nothing after. A second request pipelined behind
                # it would carry its own Host header past the check: it is never sent.
                upstream.sendall(_origin_request(method, path, version, headers, host, port))
                _send_body(client, upstream, headers, rest)
                # splice needs blocking descriptors: a socket with a timeout is
                # non-blocking underneath, and a client slow to read (a full buffer,
                # EAGAIN) would cut the answer short
                upstream.settimeout(None)
                client.settimeout(None)
                _pump(upstream, client)
        except _BadRequest as e:
            _reply(client, 400, "Bad Request", f"warren proxy: {e}")
        except OSError:
            pass
        finally:
            self._untrack(client, *([upstream] if upstream is not None else []))
            self._slots.release()

    def _intercept(
        self, client: socket.socket, host: str, port: int, version: str, rest: bytes
    ) -> socket.socket | None:
        from . import intercept

        assert self.intercept is not None
        if rest:
            raise _BadRequest("bytes sent before the tunnel was established")
        upstream = self._open("CONNECT", host, port, client)
        if upstream is not None:
            name = normalize_host(host)
            intercept.serve(
                self.intercept,
                client,
                upstream,
                name,
                port,
                version,
                lambda method, decision: self._log(method, name, port, decision),
                _parse_head,
            )
        return upstream

    def _ask(
        self, method: str, host: str, port: int, refused: Decision, client: socket.socket
    ) -> tuple[Decision | None, Allowlist, str, int]:
        """``--network ask``: wait for the owner's answer about an unlisted target; the
        decision that follows (None: resolve the name, judged by the list returned, as
        any allowed name is), what let it through, and the request's id."""
        from . import live

        assert self.live is not None
        addr = ip_literal(host)
        target = str(addr) if addr is not None else normalize_host(host)
        asker = self.asker
        who = None if asker is None else lambda: asker(client.getpeername())
        answer, asked = self.live.wait_for_answer(method, target, port, who=who, on_asked=self._asked)
        request = asked.id if asked is not None else 0
        if asked is not None and answer in (live.APPROVED, live.APPROVED_ALWAYS):
            allowlist = self.live.approved_list(asked)
            return allowlist.check_target(target, port), allowlist, f"{answer} (request {asked.id})", request
        if answer == live.REJECTED and asked is not None:
            why = f"rejected (request {asked.id})"
        elif answer == live.TIMED_OUT and asked is not None:
            why = f"no answer within {self.live.ask_timeout:g} s (request {asked.id})"
        elif answer == live.FULL:
            why = f"{live.MAX_PENDING} requests are waiting for an answer already: refused at once"
        else:
            why = (
                "nobody can answer here (a one-shot run asks only on its terminal; otherwise "
                "--network ask waits in a sandbox made with `warren create`)"
            )
        return Decision(False, f"{refused.reason}; {why}", request=request), self.live.current, "", request

    def _asked(self, asked: Pending) -> None:
        """A connection starts to wait: a record of its own, which a one-shot run's
        client may turn into a question on its terminal."""
        assert self.live is not None
        waits = f"waits up to {self.live.ask_timeout:g} s for an answer"
        by = f" (from {asked.process})" if asked.process else ""
        reason = f"request {asked.id}: {asked.method} {asked.target}{by} {waits}"
        event = NetEvent(now(), self.sandbox, asked.method, asked.host, asked.port, False, reason)
        self._emit(replace(event, kind="pending", request=asked.id))

    def _plain_http_ok(self, method: str, host: str, port: int, path: str, client: socket.socket) -> bool:
        """A secret's host is reached over HTTPS only (the value would cross the
        network in clear text); a host with HTTP rules only as they allow."""
        assert self.intercept is not None
        name = normalize_host(host)
        carried = self.intercept.secrets_for(name)
        if carried:
            names = ", ".join(s.name for s in carried)
            decision = Decision(False, f"{name} carries secrets ({names}): HTTPS only, plain HTTP refused")
        else:
            checked = self.intercept.check_http(name, method, path)
            if checked is None or checked.allowed:
                return True
            decision = checked
        self._log(method, host, port, decision)
        _reply(client, 403, "Forbidden", _refusal(method, host, port, decision))
        return False

    def _open(self, method: str, host: str, port: int, client: socket.socket) -> socket.socket | None:
        allowlist = self.allowlist if self.live is None else self.live.current
        decision = allowlist.check_target(host, port)
        approval, request = "", 0
        if decision is not None and decision.unlisted and self.live is not None and self.live.asks:
            decision, allowlist, approval, request = self._ask(method, host, port, decision, client)
        if decision is None:
            try:
                answers = _resolve(host.lower().rstrip("."), port, self.resolve)
            except (OSError, UnicodeError) as e:
                decision = Decision(False, f"cannot resolve {host}: {getattr(e, 'strerror', None) or e}")
                self._log(method, host, port, decision)
                _reply(client, 502, "Bad Gateway", _refusal(method, host, port, decision))
                return None
            decision = allowlist.check_answers(host, port, answers)
        if approval and decision.allowed:
            decision = replace(decision, reason=f"{approval}; {decision.reason}")
        if request:
            decision = replace(decision, request=request)
        if not decision.allowed:
            self._log(method, host, port, decision)
            _reply(client, 403, "Forbidden", _refusal(method, host, port, decision))
            return None
        last: OSError | None = None
        for address in decision.addresses:
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            sock.settimeout(CONNECT_TIMEOUT)
            try:
                sock.connect((address, port))
            except OSError as e:
                sock.close()
                last = e
                continue
            _no_delay(sock)
            if not self._track(sock):
                sock.close()
                return None
            self._log(method, host, port, decision, address)
            return sock
        why = os.strerror(last.errno) if last is not None and last.errno else "no address"
        failed = Decision(True, f"allowed, but connecting failed: {why}", request=decision.request)
        self._log(method, host, port, failed, ",".join(decision.addresses))
        _reply(client, 502, "Bad Gateway", f"warren proxy: cannot connect to {host}:{port}: {why}\n")
        return None


def _no_delay(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _refusal(method: str, host: str, port: int, decision: Decision) -> str:
    return f"warren proxy refused {method} {host}:{port}: {decision.reason}\n"


def _reply(sock: socket.socket, code: int, phrase: str, body: str) -> None:
    data = body.encode()
    head = (
        f"HTTP/1.1 {code} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\nX-Warren-Proxy: refused\r\n\r\n"
    )
    with contextlib.suppress(OSError):
        sock.sendall(head.encode() + data)


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request head, read by one deadline for all of it (a trickle does not extend it)."""
    buf = b""
    deadline = time.monotonic() + HEADER_TIMEOUT
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEADER_LIMIT:
            raise _BadRequest("request header too large")
        left = deadline - time.monotonic()
        if left <= 0:
            raise _BadRequest(f"the request header did not arrive within {HEADER_TIMEOUT:.0f} s")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise _BadRequest(f"the request header did not arrive within {HEADER_TIMEOUT:.0f} s") from None
        if not chunk:
            raise _BadRequest("connection closed before the request header ended")
        buf += chunk
    sock.settimeout(HEADER_TIMEOUT)  # a body may pause this long between reads
    head, _, rest = buf.partition(b"\r\n\r\n")
    if len(head) > HEADER_LIMIT:
        raise _BadRequest("request header too large")
    return head, rest


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # RFC 9110 field names and methods
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # controls other than tab (CR, LF: smuggling)
_HOSTNAME = re.compile(
    r"^[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*\.?$"
)
_NUMERIC_LABEL = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$", re.IGNORECASE)


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not re.fullmatch(r"HTTP/1\.[01]", parts[2]) or not _TOKEN.match(parts[0]):
        raise _BadRequest(f"malformed request line {lines[0][:100]!r}")
    if len(lines) - 1 > MAX_HEADERS:
        raise _BadRequest(f"more than {MAX_HEADERS} header lines")
    headers = []
    for line in lines[1:]:
        if line[:1] in (" ", "\t"):
            raise _BadRequest("folded header line (obs-fold) refused")
        name, sep, value = line.partition(":")
        if not sep or not _TOKEN.match(name):
            raise _BadRequest(f"malformed header line {line[:100]!r}")
        if _BAD_VALUE.search(value):
            raise _BadRequest(f"control character in header {name[:100]!r}")
        headers.append((name, value.strip(" \t")))
    _check_framing(headers)
    return parts[0].upper(), parts[1], parts[2], headers


def _check_framing(headers: list[tuple[str, str]]) -> None:
    """One way to read where the body ends, the same for any reader, or a 400."""
    lengths = [v for k, v in headers if k.lower() == "content-length"]
    codings = [v for k, v in headers if k.lower() == "transfer-encoding"]
    if lengths and codings:
        raise _BadRequest("both Content-Length and Transfer-Encoding (request smuggling) refused")
    if len(lengths) > 1:
        raise _BadRequest("more than one Content-Length refused")
    if lengths and not (lengths[0].isascii() and lengths[0].isdigit() and len(lengths[0]) <= 18):
        raise _BadRequest(f"bad Content-Length {lengths[0][:40]!r}")
    if codings and (len(codings) > 1 or codings[0].lower() != "chunked"):
        raise _BadRequest("a Transfer-Encoding other than a single 'chunked' refused")


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if "@" in authority:
        raise _BadRequest(f"userinfo in {authority[:100]!r} refused")
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
        if (rest and not rest.startswith(":")) or ":" not in host:
            raise _BadRequest(f"bad authority {authority[:100]!r} (brackets hold an IPv6 address)")
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    _check_host(host, authority)
    if not port_text:
        if default_port is None:
            raise _BadRequest(f"CONNECT target {authority[:100]!r} has no port")
        return host, default_port
    if not (port_text.isascii() and port_text.isdigit()) or not 1 <= int(port_text[:6]) <= 65535:
        raise _BadRequest(f"bad port in {authority[:100]!r} (1-65535)")
    return host, int(port_text)


def _check_host(host: str, authority: str) -> None:
    """A DNS name, or an IP address written the one canonical way."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        if str(ipaddress.ip_address(host)) != host.lower() and ":" not in host:
            raise _BadRequest(f"IP address {host[:100]!r} is not in canonical form")
        return
    if not host or len(host) > 253 or not _HOSTNAME.match(host):
        raise _BadRequest(f"bad host in {authority[:100]!r}")
    last = host.rstrip(".").rsplit(".", 1)[-1]
    if _NUMERIC_LABEL.match(last):
        # what inet_aton (and so getaddrinfo) reads as an IPv4 address: 0x7f.1, 2130706433, 127.1
        raise _BadRequest(f"IP address {host[:100]!r} is not in canonical form (write it dotted-decimal)")


def _absolute_url(target: str) -> tuple[str, int, str]:
    if not target.lower().startswith("http://"):
        raise _BadRequest(
            f"expected an absolute http:// URL, got {target[:100]!r} "
            "(https goes through CONNECT; this port is the sandbox's proxy, not a web server)"
        )
    rest = target[7:]
    slash = rest.find("/")
    authority, path = (rest, "/") if slash < 0 else (rest[:slash], rest[slash:])
    authority = authority.rpartition("@")[2]
    host, port = _split_authority(authority, 80)
    return host, port, path


_HOP_BY_HOP = {"proxy-connection", "proxy-authorization", "connection", "keep-alive"}


def _origin_request(
    method: str, path: str, version: str, headers: list[tuple[str, str]], host: str, port: int
) -> bytes:
    # The Host header is the vetted URL's, whatever the client wrote: a different one
    # could reach another virtual host behind the same allowed address.
    kept = [(k, v) for k, v in headers if k.lower() not in _HOP_BY_HOP and k.lower() != "host"]
    authority = f"[{host}]" if ":" in host else host
    kept.insert(0, ("Host", authority if port == 80 else f"{authority}:{port}"))
    kept.append(("Connection", "close"))
    lines = [f"{method} {path} {version}", *(f"{k}: {v}" for k, v in kept)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _send_body(
    client: socket.socket, upstream: socket.socket, headers: list[tuple[str, str]], rest: bytes
) -> None:
    """The first request's body, framed as its headers say (Content-Length or
    chunked); bytes after it are discarded."""
    fields = {k.lower(): v for k, v in headers}
    if "chunked" in fields.get("transfer-encoding", "").lower():
        _send_chunked(client, upstream, rest)
        return
    length = int(fields.get("content-length", "0") or "0")  # digits only: _check_framing
    upstream.sendall(rest[:length])
    left = length - min(length, len(rest))
    while left:
        chunk = client.recv(min(left, 1 << 16))
        if not chunk:
            raise _BadRequest("connection closed inside the request body")
        upstream.sendall(chunk)
        left -= len(chunk)


def _send_chunked(client: socket.socket, upstream: socket.socket, buf: bytes) -> None:
    def fill(need: int) -> None:
        nonlocal buf
        while len(buf) < need:
            chunk = client.recv(1 << 16)
            if not chunk:
                raise _BadRequest("connection closed inside a chunked body")
            buf += chunk

    def line() -> bytes:
        nonlocal buf
        while b"\r\n" not in buf:
            if len(buf) > HEADER_LIMIT:
                raise _BadRequest("chunk size line too long")
            fill(len(buf) + 1)
        out, _, buf = buf.partition(b"\r\n")
        return out

    while True:
        size_line = line()
        digits = size_line.split(b";", 1)[0].rstrip(b" \t")
        if not re.fullmatch(rb"[0-9A-Fa-f]{1,15}", digits) or re.search(
            rb"[\x00-\x08\x0a-\x1f\x7f]", size_line
        ):
            raise _BadRequest("bad chunk size line")
        size = int(digits, 16)
        upstream.sendall(size_line + b"\r\n")
        if size == 0:
            while True:  # trailers, up to the empty line
                trailer = line()
                upstream.sendall(trailer + b"\r\n")
                if not trailer:
                    return
        fill(size + 2)
        upstream.sendall(buf[: size + 2])
        buf = buf[size + 2 :]


def _pump(src: socket.socket, dst: socket.socket) -> None:
    """Move bytes src -> dst until EOF, through a pipe with splice (no copies into
    Python); then half-close dst so the peer sees the end too."""
    r, w = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    try:
        s, d = src.fileno(), dst.fileno()
        while True:
            n = os.splice(s, w, _SPLICE_CHUNK, flags=_SPLICE_FLAGS)
            if n == 0:
                break
            while n:
                n -= os.splice(r, d, n, flags=_SPLICE_FLAGS)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        os.close(r)
        os.close(w)


def relay(a: socket.socket, b: socket.socket) -> None:
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()


def listen_inside(port: int = PROXY_PORT) -> socket.socket:
    """In the sandbox's network namespace (PID 1, before hardening): the socket the
    proxy will accept on. Only loopback exists there."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(512)
    return sock
