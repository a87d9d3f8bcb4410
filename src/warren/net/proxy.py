"""The allowlist proxy of ``--network allow``: HTTP CONNECT and plain HTTP, outside
the sandbox, listening on a socket that lives inside it.

The sandbox has only ``lo``. Its PID 1 creates a listening TCP socket on
127.0.0.1:3128 in the sandbox's network namespace and hands the descriptor out;
the proxy accepts on it here, in the caller's network namespace. A socket belongs
to the namespace it was created in, so the sandbox reaches the proxy and nothing
else, and the proxy's upstream connections are ordinary host connections that it
makes only after ``netpolicy`` said yes, to the very addresses it vetted (no second
resolution for an attacker's DNS to change).

Threads, not an event loop: one per client connection plus one per tunnel
direction, each blocking in ``splice(2)`` so tunnelled bytes move between sockets
inside the kernel (see bench/bench_net.py for the figures). Every decision is
passed to ``on_event`` (time, sandbox, method, host, port, allowed, reason).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping

from .allowlist import PROXY_PORT, Allowlist, Decision, NetEvent

HEADER_LIMIT = 64 * 1024
MAX_CLIENTS = 256  # concurrent connections per sandbox: threads here are the host's
HEADER_TIMEOUT = 30.0
CONNECT_TIMEOUT = 15.0
_SPLICE_CHUNK = 1 << 20
# Not SPLICE_F_MORE: like TCP_CORK it holds a partial segment back for up to 200 ms,
# which stalls every request/response exchange inside a CONNECT tunnel (measured).
_SPLICE_FLAGS = getattr(os, "SPLICE_F_MOVE", 1)
# A bigger pipe moves ~4x more per splice call. Best effort: pipe memory is counted per
# user, and past the soft limit the kernel refuses (and shrinks the user's new pipes).
_PIPE_SIZE = 256 * 1024


def _now() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}Z"


class _BadRequest(Exception):
    pass


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
    ) -> None:
        self.listener = listener
        self.allowlist = allowlist
        self.sandbox = sandbox
        self.resolve = dict(resolve or {})
        self.on_event = on_event
        self.events: list[NetEvent] = []
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._slots = threading.BoundedSemaphore(MAX_CLIENTS)

    # --- lifecycle ----------------------------------------------------------------

    def start(self) -> Proxy:
        self.listener.settimeout(None)
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

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError as e:
                if self._stopped or e.errno in (errno.EINVAL, errno.EBADF):
                    return
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)
                continue
            if not self._slots.acquire(blocking=False):
                _reply(
                    client, 503, "Service Unavailable", f"warren proxy: more than {MAX_CLIENTS} connections\n"
                )
                client.close()
                continue
            if not self._track(client):
                self._slots.release()
                client.close()
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

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
        for s in socks:
            s.close()

    def _log(self, method: str, host: str, port: int, decision: Decision, address: str | None = None) -> None:
        event = NetEvent(_now(), self.sandbox, method, host, port, decision.allowed, decision.reason, address)
        with self._lock:
            self.events.append(event)
        if self.on_event is not None:
            with contextlib.suppress(Exception):
                self.on_event(event)

    # --- one client ---------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        try:
            client.settimeout(HEADER_TIMEOUT)
            head, rest = _read_head(client)
            method, target, version, headers = _parse_head(head)
            if method == "CONNECT":
                host, port = _split_authority(target, None)
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
                upstream = self._open(method, host, port, client)
                if upstream is None:
                    return
                # One request per connection: its head (Host rewritten to the vetted
                # name) and its body, nothing after. A second request pipelined behind
                # it would carry its own Host header past the check: it is never sent.
                upstream.sendall(_origin_request(method, path, version, headers, host, port))
                _send_body(client, upstream, headers, rest)
                upstream.settimeout(None)
                _pump(upstream, client)
        except _BadRequest as e:
            _reply(client, 400, "Bad Request", f"warren proxy: {e}")
        except OSError:
            pass
        finally:
            self._untrack(client, *([upstream] if upstream is not None else []))
            self._slots.release()

    def _open(self, method: str, host: str, port: int, client: socket.socket) -> socket.socket | None:
        decision = self.allowlist.check_target(host, port)
        if decision is None:
            try:
                answers = _resolve(host.lower().rstrip("."), port, self.resolve)
            except (OSError, UnicodeError) as e:
                decision = Decision(False, f"cannot resolve {host}: {getattr(e, 'strerror', None) or e}")
                self._log(method, host, port, decision)
                _reply(client, 502, "Bad Gateway", _refusal(method, host, port, decision))
                return None
            decision = self.allowlist.check_answers(host, port, answers)
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
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not self._track(sock):
                sock.close()
                return None
            self._log(method, host, port, decision, address)
            return sock
        why = os.strerror(last.errno) if last is not None and last.errno else "no address"
        failed = Decision(True, f"allowed, but connecting failed: {why}")
        self._log(method, host, port, failed, ",".join(decision.addresses))
        _reply(client, 502, "Bad Gateway", f"warren proxy: cannot connect to {host}:{port}: {why}\n")
        return None


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
    buf = b""
    while b"\r\n\r\n" not in buf:
        if len(buf) > HEADER_LIMIT:
            raise _BadRequest("request header too large")
        chunk = sock.recv(65536)
        if not chunk:
            raise _BadRequest("connection closed before the request header ended")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    return head, rest


def _parse_head(head: bytes) -> tuple[str, str, str, list[tuple[str, str]]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise _BadRequest(f"malformed request line {lines[0][:100]!r}")
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise _BadRequest(f"malformed header line {line[:100]!r}")
        headers.append((name.strip(), value.strip()))
    return parts[0].upper(), parts[1], parts[2], headers


def _split_authority(authority: str, default_port: int | None) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, rest = authority[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = authority.rpartition(":") if ":" in authority else (authority, "", "")
    if not port_text:
        if default_port is None:
            raise _BadRequest(f"CONNECT target {authority!r} has no port")
        return host, default_port
    if not port_text.isdigit():
        raise _BadRequest(f"bad port in {authority!r}")
    return host, int(port_text)


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
    try:
        length = int(fields.get("content-length", "0") or "0")
    except ValueError:
        raise _BadRequest("bad Content-Length") from None
    if length < 0:
        raise _BadRequest("bad Content-Length")
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
        upstream.sendall(size_line + b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise _BadRequest("bad chunk size") from None
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
