"""Running the API: where it listens, the token, and uvicorn.

Why Starlette + uvicorn: small, typed, long-maintained ASGI pieces; streaming
responses (SSE) without a framework in the way; the official ``mcp`` SDK's
streamable-HTTP transport is itself a Starlette app, so ``/mcp`` mounts beside
``/v1`` in one process and one event loop.

Security model: a unix socket (default ``$XDG_STATE_HOME/warren/serve.sock``, mode
0600) is reachable only by this user; TCP always needs a bearer token and a
non-loopback address needs ``--allow-remote`` (the token then travels in clear unless
a TLS proxy is in front). On loopback TCP, a request must name this service in its
``Host`` (and ``Origin``, when a browser sends one): a web page whose name resolves to
127.0.0.1 (DNS rebinding) is refused before the token is looked at. Connection limits
and timeouts are ``conn``'s; logs are escaped and refusals rate-limited there too.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import resource
import secrets
import signal
import socket
import stat
import sys
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from .. import extras, statedir
from ..errors import PolicyError, WarrenError
from . import conn


class ServeError(PolicyError):
    """``warren serve`` refuses these settings."""


def _refused(
    message: str, hint: str = "", *, path: str | None = None, errno: int | None = None
) -> ServeError:
    return ServeError(message, operation="serve", path=path, errno=errno, hint=hint)


@dataclass(frozen=True)
class Listen:
    unix: str | None = None
    host: str = ""
    port: int = 0


def parse_listen(value: str | None, env: Mapping[str, str]) -> Listen:
    if value is None:
        return Listen(unix=os.path.join(statedir.prepare(statedir.location(env)), "serve.sock"))
    if value.startswith("unix:"):
        path = value[5:]
        if not path:
            raise _refused("--listen unix: needs a path", "e.g. --listen unix:/tmp/w.sock")
        return Listen(unix=os.path.abspath(path))
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise _refused(
            f"--listen {value!r} is neither unix:PATH nor HOST:PORT",
            "e.g. --listen 127.0.0.1:7420 or --listen unix:/run/user/1000/warren.sock",
        )
    return Listen(host=host.strip("[]") or "127.0.0.1", port=int(port))


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def read_token(token_file: str | None, env: Mapping[str, str], listen: Listen | None = None) -> str | None:
    """The bearer token: ``--token-file``'s, else ``$WARREN_TOKEN``, else (for TCP) the
    one in warren's state directory, made on first use. A ``--token-file`` elsewhere is
    recorded there, so every sandbox started from now on has it denied."""
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as e:
            raise _refused(
                f"cannot read the token file {token_file}",
                "create it with e.g. `openssl rand -hex 32 > FILE; chmod 600 FILE`, or leave "
                f"--token-file out to use $XDG_STATE_HOME/warren/{statedir.TOKEN_FILE}",
                path=token_file,
                errno=e.errno,
            ) from None
        if not token:
            raise _refused(f"the token file {token_file} is empty", path=token_file)
        state = statedir.prepare(statedir.location(env))
        real = os.path.realpath(token_file)
        if not real.startswith(os.path.realpath(state) + "/"):
            statedir.record_secret_file(state, real)
        return token
    if env.get("WARREN_TOKEN"):
        return env["WARREN_TOKEN"]
    if listen is None or listen.unix is not None:
        return None
    return default_token(env)


def default_token(env: Mapping[str, str]) -> str:
    """The token in ``$XDG_STATE_HOME/warren/serve.token`` (hidden from every sandbox
    with the state directory), made (``e2b_`` and 32 random bytes in hex, mode 0600: the
    E2B SDK takes only keys of that form) if absent."""
    path = os.path.join(statedir.prepare(statedir.location(env)), statedir.TOKEN_FILE)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags | os.O_EXCL, 0o600)
        made = "e2b_" + secrets.token_hex(32)
        try:
            os.write(fd, (made + "\n").encode())
        finally:
            os.close(fd)
        _log(f"warren serve: a new token is in {path}")
        return made
    except FileExistsError:
        pass
    except OSError as e:
        raise _refused(
            f"cannot create the token file {path}",
            "check that warren's state directory is yours and writable, or pass --token-file",
            path=path,
            errno=e.errno,
        ) from None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise _refused(
            f"cannot read the token file {path}",
            "remove it; warren makes a new one",
            path=path,
            errno=e.errno,
        ) from None
    try:
        st = os.fstat(fd)
        token = os.read(fd, 4096).decode(errors="replace").strip()
    finally:
        os.close(fd)
    if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077 or not token:
        raise _refused(
            f"the token file {path} is not yours alone, or empty",
            "remove it; warren makes a new one",
            path=path,
        )
    return token


def check(listen: Listen, token: str | None, allow_remote: bool) -> None:
    if listen.unix is not None:
        return
    if token is None:
        raise _refused(
            f"refusing to listen on {listen.host}:{listen.port} without a token",
            "pass --token-file FILE or set WARREN_TOKEN, or neither to use the state directory's "
            "(TCP always needs a bearer token)",
        )
    if len(token) < 16:
        raise _refused("the token is shorter than 16 characters", "use 32 random hex digits")
    if not is_loopback(listen.host) and not allow_remote:
        raise _refused(
            f"refusing to listen on the non-loopback address {listen.host}",
            "pass --allow-remote if other machines should reach it (put TLS in front)",
        )


def bind(listen: Listen) -> socket.socket:
    if listen.unix is not None:
        path = listen.unix
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(path)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
    else:
        family = socket.AF_INET6 if ":" in listen.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # inherited by accepted connections: without it a response's body waits for the
        # client's delayed ACK of its headers (measured: +40 ms per keep-alive request)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            sock.bind((listen.host, listen.port))
        except OSError as e:
            raise _refused(
                f"cannot listen on {listen.host}:{listen.port}",
                "is another service on that port? pick another with --listen",
                errno=e.errno,
            ) from None
    sock.listen(1024)
    return sock


def _log(line: str) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    sys.stderr.write(f"{stamp} {conn.printable(line)}\n")
    sys.stderr.flush()


class _QuietLogs(logging.Filter):
    """uvicorn's and asyncio's own warnings (a malformed request, an accept error) at
    most once per window per kind, escaped: a flood of bad requests is a few lines."""

    def __init__(self, window: float = 5.0) -> None:
        super().__init__()
        self.window = window
        self.last: dict[str, float] = {}
        self.dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = f"{record.name}:{record.msg}"
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) < self.window:
            self.dropped[kind] = self.dropped.get(kind, 0) + 1
            return False
        self.last[kind] = now
        text = conn.printable(record.getMessage())
        dropped = self.dropped.pop(kind, 0)
        record.msg = text + (f" (and {dropped} more like it)" if dropped else "")
        record.args = ()
        return True


def allowed_hosts(listen: Listen, allow_remote: bool) -> frozenset[str] | None:
    """The names a request's ``Host`` may give on TCP (None: any, for a unix socket,
    which no browser reaches, or a remote address, whose names we cannot know)."""
    if listen.unix is not None or (allow_remote and not is_loopback(listen.host)):
        return None
    host = listen.host.lower()
    return frozenset({"localhost", "127.0.0.1", "[::1]", host, f"[{host}]"})


def raise_fd_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        soft = want
    return int(soft)


def limits_for(fd_limit: int, head_timeout: float) -> conn.Limits:
    """Connection caps that fit under the descriptor limit: room is kept for the
    worker threads' supervisor connections (256) and the rest of the process."""
    total = max(16, min(conn.MAX_TOTAL, fd_limit - 400))
    return conn.Limits(
        head_timeout=head_timeout,
        body_idle=3 * head_timeout,
        max_total=total,
        max_per_peer=max(8, min(conn.MAX_PER_PEER, total // 2)),
        log=conn.RateLimited(_log),
    )


def _without_e2b(app: Any) -> Any:
    """Where the ``e2b`` extra is missing, a request for anything but warren's own paths
    (an E2B SDK's: ``/sandboxes``, ``/files``, ``/process.Process/...``) is answered in
    E2B's error shape, saying what to install, instead of reaching ``/v1``'s 401."""
    from starlette.responses import JSONResponse

    message = f"this warren serve has no E2B API: {extras.install_line('e2b')} where it runs, then restart it"

    async def front(scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else "/v1"
        if path.startswith(("/v1", "/mcp")):
            await app(scope, receive, send)
            return
        await JSONResponse({"code": 501, "message": message}, status_code=501)(scope, receive, send)

    return front


def serve(
    listen: Listen,
    token: str | None,
    *,
    mcp_spec: Any = None,
    mcp_workspace: str | None = None,
    allow_remote: bool = False,
    head_timeout: float = conn.HEAD_TIMEOUT,
) -> int:
    import uvicorn

    from ..client.local import LocalTransport
    from ..mcp.server import build
    from .app import make_app

    # A stop asked for before uvicorn installs its own handlers (the socket already
    # exists by then) still stops gracefully: remembered, and honoured once it runs.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: early.append(signum))
    sock = bind(listen)
    transport = LocalTransport()
    mcp = build(transport, mcp_spec, mcp_workspace, streamable_path="/mcp")
    mcp_routes = list(mcp.streamable_http_app().routes)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with mcp.session_manager.run():
            yield

    hosts = allowed_hosts(listen, allow_remote)
    app = make_app(transport, token, log=_log, extra=mcp_routes, lifespan=lifespan, hosts=hosts)
    from .. import e2b

    apis = "warren's API (/v1), MCP (/mcp)"
    if e2b.available():
        app = e2b.mount(app, transport, token, log=_log, hosts=hosts)
        apis += ", E2B's API"
    else:
        app = _without_e2b(app)
        apis += f"; not E2B's API: {extras.install_line('e2b')} adds it"
    host = f"[{listen.host}]" if ":" in listen.host else listen.host
    where = f"unix:{listen.unix}" if listen.unix else f"http://{host}:{sock.getsockname()[1]}"
    _log(f"warren serve listening on {where}" + (" (token required)" if token else ""))
    _log(f"serving {apis}")
    limits = limits_for(raise_fd_limit(), head_timeout)
    quiet = _QuietLogs()
    for name in ("uvicorn.error", "asyncio"):
        logging.getLogger(name).addFilter(quiet)
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", **conn.config_kwargs(limits)
    )

    class Server(uvicorn.Server):
        # uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, which would skip
        # removing the socket below: stop gracefully and return instead.
        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True

    server = Server(config)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: server.handle_exit(signum, frame))
    if early:
        server.should_exit = True
    try:
        server.run(sockets=[sock])
    except WarrenError:
        raise
    finally:
        if listen.unix is not None:
            with contextlib.suppress(OSError):
                os.unlink(listen.unix)
    return 0
