"""Network modes at launch: the handshake between a sandbox's PID 1 and its caller.

Owns what happens to the sandbox's network namespace after it exists:

- ``none``: nothing (PID 1 brought ``lo`` up; no other interface exists).
- ``allow``: PID 1 creates the proxy's listening socket inside the namespace and
  sends the descriptor to the caller, which serves it with ``netproxy.Proxy``.
- ``open``: PID 1 says its namespace is ready and waits; the caller attaches pasta
  (a user-mode TCP/IP stack from the passt package) to it, then says go. pasta runs
  in the caller's namespace and translates the sandbox's traffic into ordinary
  sockets; it is told never to map the host's loopback or forward ports.

The same handshake serves one-shot runs (``oneshot``/``cli``) and long-lived
sandboxes (``supervisor``).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import socket
import time
from collections.abc import Callable

from . import wire
from .errors import SetupError
from .netpolicy import Allowlist, NetEvent, parse_rules
from .netproxy import Proxy, listen_inside
from .plan import Plan

HANDSHAKE_TIMEOUT = 10.0
PASTA_TIMEOUT = 10.0


class Channel:
    """The socketpair of the handshake, across the clone of PID 1 (both ends None
    for ``none``): one end stays with the caller, the other goes to PID 1."""

    def __init__(self, plan: Plan) -> None:
        pair = socket.socketpair() if plan.network != "none" else (None, None)
        self.ours: socket.socket | None = pair[0]
        self.theirs: socket.socket | None = pair[1]

    def child_fds(self) -> list[int]:
        """Descriptors the cloned PID 1 must keep."""
        return [self.theirs.fileno()] if self.theirs is not None else []

    def in_child(self) -> socket.socket | None:
        if self.ours is not None:
            self.ours.close()
        return self.theirs

    def in_parent(self) -> socket.socket | None:
        if self.theirs is not None:
            self.theirs.close()
        return self.ours

    def close(self) -> None:
        for end in (self.ours, self.theirs):
            if end is not None:
                end.close()


def pid1_handshake(plan: Plan, sock: socket.socket) -> bool:
    """In PID 1, after ``lo`` is up and before any command runs. False: the caller
    gave up on this sandbox (it reports why itself and kills it)."""
    try:
        if plan.network == "allow":
            listener = listen_inside()
            wire.send(sock, {"net": "proxy"}, fds=[listener.fileno()])
            listener.close()
        elif plan.network == "open":
            wire.send(sock, {"net": "ready"})
            msg, _, _ = wire.recv(sock)
            if not msg.get("go"):
                return False
            up = _wait_for_default_route(time.monotonic() + PASTA_TIMEOUT)
            wire.send(sock, {"net": "up" if up else "timeout"})
            return up
    except (wire.ConnectionClosed, OSError):
        return False
    finally:
        sock.close()
    return True


def _wait_for_default_route(deadline: float) -> bool:
    """pasta configures the namespace from outside; its default route (IPv4 or IPv6)
    is the last step, so its presence means the network is up."""
    while True:
        if _has_default_route():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)


def _has_default_route() -> bool:
    with contextlib.suppress(OSError), open("/proc/self/net/route") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) > 7 and fields[1] == "00000000" and fields[7] == "00000000":
                return True
    with contextlib.suppress(OSError), open("/proc/self/net/ipv6_route") as f:
        for line in f:
            fields = line.split()
            if len(fields) == 10 and fields[0] == "0" * 32 and fields[1] == "00" and fields[9] != "lo":
                return True
    return False


def complete(plan: Plan, sock: socket.socket, pid1: int) -> socket.socket | Pasta | None:
    """The caller's half. ``allow``: the proxy's listening socket (serve it with
    ``netproxy.Proxy``); ``open``: the attached pasta; None when PID 1 ended before
    the handshake (its report says why). Raises SetupError when pasta fails (PID 1
    is told, and gives up)."""
    sock.settimeout(HANDSHAKE_TIMEOUT)
    try:
        msg, _, fds = wire.recv(sock)
    except (wire.ConnectionClosed, OSError):
        sock.close()
        return None
    try:
        if msg.get("net") == "proxy" and fds:
            return socket.socket(fileno=fds.pop(0))
        if msg.get("net") == "ready":
            try:
                pasta = Pasta.spawn(pid1)
            except SetupError:
                with contextlib.suppress(OSError):
                    wire.send(sock, {"go": False})
                raise
            try:
                wire.send(sock, {"go": True})
                pasta.wait_until_up(sock)
            except BaseException:
                pasta.stop()
                raise
            return pasta
        return None
    finally:
        for fd in fds:
            os.close(fd)
        sock.close()


def proxy_for(
    plan: Plan, listener: socket.socket, sandbox: str, on_event: Callable[[NetEvent], None] | None
) -> Proxy:
    return Proxy(
        listener,
        Allowlist(parse_rules(plan.allow_hosts)),
        sandbox=sandbox,
        resolve=dict(plan.resolve),
        on_event=on_event,
    )


class Pasta:
    """pasta attached to a sandbox's user and network namespaces, in the foreground
    as a child of the caller, with a parent-death signal: if the caller dies, pasta
    dies too (by itself it would keep the namespace alive forever)."""

    def __init__(self, pid: int, pidfd: int, log: int) -> None:
        self.pid = pid
        self.pidfd: int | None = pidfd
        self.log = log

    @classmethod
    def spawn(cls, pid1: int) -> Pasta:
        exe = shutil.which("pasta")
        if exe is None:
            raise SetupError(
                "--network open needs pasta, which is not installed",
                operation="network",
                hint="install the passt package (apt install passt), or use --network allow",
            )
        tun = "/dev/net/tun"
        if not os.access(tun, os.R_OK | os.W_OK):
            raise SetupError(
                f"--network open needs {tun}, which you cannot open",
                operation="network",
                path=tun,
                hint="the distribution default is mode 0666 (as root: chmod 0666 /dev/net/tun), "
                "or use --network allow",
            )
        argv = [
            exe,
            "--foreground",
            "--quiet",
            "--config-net",
            # No port forwarding in either direction, and the gateway address is the
            # real gateway: nothing in the sandbox can reach the host's loopback.
            *("-t", "none", "-u", "none", "-T", "none", "-U", "none"),
            "--no-map-gw",
            *("--userns", f"/proc/{pid1}/ns/user", "--netns", f"/proc/{pid1}/ns/net"),
        ]
        if os.getuid() == 0:
            # As root pasta would switch to "nobody" before opening the namespaces,
            # which are root's (it gives up its capabilities by itself).
            argv += ["--runas", "0:0"]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "KILL", *argv]
        log = os.memfd_create("warren-pasta-log", os.MFD_CLOEXEC)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid = os.posix_spawn(
                argv[0],
                argv,
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0),
                    (os.POSIX_SPAWN_DUP2, devnull, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                ],
                setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGTERM),
            )
        except OSError as e:
            os.close(log)
            raise SetupError(
                f"cannot start pasta: {e.strerror}",
                operation="network",
                path=argv[0],
                errno=e.errno,
                hint="check the passt package, or use --network allow",
            ) from None
        finally:
            os.close(devnull)
        return cls(pid, os.pidfd_open(pid), log)

    def wait_until_up(self, sock: socket.socket) -> None:
        """Until PID 1 sees the network configured; a SetupError naming pasta's own
        message if pasta exits first."""
        assert self.pidfd is not None
        ready, _, _ = select.select([sock.fileno(), self.pidfd], [], [], PASTA_TIMEOUT + 1)
        if sock.fileno() in ready:
            with contextlib.suppress(wire.ConnectionClosed, OSError):
                msg, _, _ = wire.recv(sock)
                if msg.get("net") == "up":
                    return
        raise SetupError(
            f"pasta could not set up the sandbox's network: {self.output() or 'it did not finish in time'}",
            operation="network",
            hint="check that pasta works here (pasta --version); or use --network allow",
        )

    def output(self) -> str:
        data = os.pread(self.log, 8192, 0).decode(errors="replace")
        return " ".join(line.strip() for line in data.splitlines() if line.strip() and "syslog" not in line)

    def stop(self, wait: bool = True) -> None:
        if self.pidfd is None:
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)
        if wait:
            if not select.select([self.pidfd], [], [], 1.0)[0]:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        os.close(self.pidfd)
        os.close(self.log)
        self.pidfd = None


def stop(handle: Proxy | Pasta | None) -> None:
    if handle is not None:
        handle.stop()
