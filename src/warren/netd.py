"""The network helper of one long-lived sandbox: its allowlist proxy and its exposed
ports. Forked by the supervisor (which stays single-threaded) when a sandbox in
``--network allow`` is created, or on its first ``expose``.

    supervisor ── netd (this, host network namespace, threads)
                   ├─ proxy: accepts on the socket PID 1 made inside the sandbox
                   │   (``netproxy``); decisions appended to the sandbox's net.jsonl
                   └─ exposes: a listening socket on the host's 127.0.0.1 per port;
                       each connection is joined to a socket that the sandbox's PID 1
                       connects to 127.0.0.1:PORT *inside* and hands over by fd

It ends when the sandbox's PID 1 does (a pidfd), or when the supervisor does (its
control socket closes; also the parent-death signal), closing every port with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import threading
from pathlib import Path
from typing import Any

from . import _sys, netns, wire
from .netpolicy import NetEvent
from .netproxy import relay
from .plan import Plan


class _Log:
    """Appends decisions as JSON lines; the file is opened on the first one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()
        self.fd = -1

    def __call__(self, event: NetEvent) -> None:
        line = (json.dumps(event.to_dict(), separators=(",", ":")) + "\n").encode()
        with self.lock:
            if self.fd < 0:
                self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                self.fd = os.open(self.path, flags, 0o600)
            os.write(self.fd, line)


def read_log(path: Path) -> list[NetEvent]:
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    events = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError, TypeError):
            events.append(NetEvent.from_dict(json.loads(line)))
    return events


class _Expose:
    """127.0.0.1:host_port on the host -> 127.0.0.1:port inside the sandbox."""

    def __init__(self, port: int, host_port: int, pid1_socket: str) -> None:
        self.port = port
        self.pid1_socket = pid1_socket
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", host_port))
        self.listener.listen(128)
        self.host_port = int(self.listener.getsockname()[1])
        self.address = f"127.0.0.1:{self.host_port}"
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        inside: socket.socket | None = None
        try:
            inside = self._connect_inside()
            if inside is None:
                # Nothing listens inside: refuse the way a closed port would.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                return
            relay(client, inside)
        except OSError:
            pass
        finally:
            client.close()
            if inside is not None:
                inside.close()

    def _connect_inside(self) -> socket.socket | None:
        conn = wire.connect(self.pid1_socket)
        try:
            conn.settimeout(10)
            wire.send(conn, {"op": "connect", "port": self.port})
            _reply, _, fds = wire.recv(conn)
        finally:
            conn.close()
        if not fds:
            return None
        for extra in fds[1:]:
            os.close(extra)
        return socket.socket(fileno=fds[0])


def serve(
    ctl: socket.socket,
    plan: Plan,
    *,
    name: str,
    pid1: int,
    pid1_socket: str,
    log_path: Path,
    proxy_listener: socket.socket | None,
) -> int:
    """The helper's main loop; returns its exit code."""
    _sys.prctl(_sys.PR_SET_PDEATHSIG, signal.SIGKILL)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        pidfd = os.pidfd_open(pid1)
    except OSError:
        return 0  # the sandbox is already gone
    if proxy_listener is not None:
        netns.proxy_for(plan, proxy_listener, name, _Log(log_path)).start()
    exposes: dict[int, _Expose] = {}
    ctl.setblocking(True)
    while True:
        ready, _, _ = select.select([pidfd, ctl.fileno()], [], [])
        if pidfd in ready:
            return 0
        try:
            msg, _, fds = wire.recv(ctl)
        except (wire.ConnectionClosed, OSError):
            return 0
        for fd in fds:
            os.close(fd)
        wire.send(ctl, _handle(msg, exposes, pid1_socket))


def _handle(msg: dict[str, Any], exposes: dict[int, _Expose], pid1_socket: str) -> dict[str, Any]:
    if msg.get("op") != "expose":
        return {"ok": True}
    port, host_port = int(msg["port"]), int(msg.get("host_port") or 0)
    current = exposes.get(port)
    if current is not None and host_port in (0, current.host_port):
        return {"ok": True, "address": current.address}
    try:
        expose = _Expose(port, host_port, pid1_socket)
    except OSError as e:
        return {
            "error": "SandboxError",
            "message": f"cannot listen on 127.0.0.1:{host_port} on the host: {os.strerror(e.errno or 0)}",
            "operation": "expose",
            "errno": e.errno,
            "hint": "choose another host port, or pass none to get a free one",
        }
    exposes[port] = expose
    return {"ok": True, "address": expose.address}
