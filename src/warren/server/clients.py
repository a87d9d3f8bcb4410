"""One connected client as the supervisor sees it, and what it is told when there is no
room for it.

A ``Client`` is a record: its socket, credentials and cgroups (read from the kernel at
accept), its buffers and where its request stands. Reading it is the supervisor's
loop, answering it ``connections``'; nothing here blocks.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from typing import TYPE_CHECKING

from .. import protocol, wire
from .._core import cgroups
from ..errors import SandboxError, WarrenError
from ..plan import CallerFacts
from ..terminal import printable

if TYPE_CHECKING:
    from .box import Box

HEADER_DEADLINE = 10.0  # a client has this long to send a whole request header


def pin(sock: socket.socket) -> int | None:
    """A pidfd of the connected peer: the one SO_PEERPIDFD gives, or (before Linux 6.5)
    one taken now, at accept, as ``peer.verify`` does."""
    pidfd = wire.peer_pidfd(sock)
    if pidfd is None:
        pid, _uid, _gid = wire.peer_creds(sock)
        if pid > 0:
            with contextlib.suppress(OSError):
                pidfd = os.pidfd_open(pid)
    return pidfd


def peer_cgroups(sock: socket.socket, pidfd: int | None) -> tuple[str | None, WarrenError | None]:
    """The connected peer's /proc/PID/cgroup, read through the pidfd pinned at accept
    (``cgroups.peer_cgroups``), or why it cannot be had."""
    pid, _uid, _gid = wire.peer_creds(sock)
    if pidfd is None:
        return None, SandboxError(
            "cannot tell which cgroups the client is in: it is gone or in another pid namespace",
            operation="cgroup",
            hint="sandboxes are placed in their caller's cgroups; ask again from a live process",
        )
    try:
        return cgroups.peer_cgroups(pid, pidfd), None
    except WarrenError as e:
        return None, e


class Client:
    def __init__(self, sock: socket.socket, uid: int, gid: int) -> None:
        self.sock = sock
        self.uid, self.gid = uid, gid
        # The peer, pinned at accept: its cgroups (its sandboxes go beneath them) are read
        # through this when a request needs them (an exec does not), then it is closed.
        self._pidfd = pin(sock)
        self._cgroups: tuple[str | None, WarrenError | None] | None = None
        self.inbox = wire.Inbox(sock)
        self.outbox = wire.Outbox(sock)
        self.deadline: float | None = time.monotonic() + HEADER_DEADLINE
        self.box: Box | None = None  # the one-shot sandbox running this client's command
        self.busy = False  # its request is being served: it may only wait or hang up
        self.closing = False  # close once the outbox is flushed
        self.stdin: protocol.StdinRequest | None = None  # its payload is still arriving
        self.stdin_len = 0

    @property
    def cgroups(self) -> str | None:
        """The peer's cgroups as the kernel has them (read once, through the pidfd
        pinned at accept: a recycled pid cannot answer for it)."""
        return self._read_cgroups()[0]

    @property
    def cgroups_error(self) -> WarrenError | None:
        return self._read_cgroups()[1]

    def _read_cgroups(self) -> tuple[str | None, WarrenError | None]:
        if self._cgroups is None:
            self._cgroups = peer_cgroups(self.sock, self._pidfd)
            self.release()
        return self._cgroups

    def release(self) -> None:
        """Close the pidfd (the client is gone, or its cgroups were read)."""
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def who(self, via: str) -> str:
        """Who asks, for a record: what the client says it is (cli, library, http; its
        word only), and its uid and pid as the kernel has them."""
        pid, uid, _gid = wire.peer_creds(self.sock)
        said = printable(via[:40]) if via else "client"
        return f"{said} (uid {uid}, pid {pid})"

    def facts(self, caller: protocol.Caller) -> CallerFacts:
        """Who asks, for the planner: uid and gid from the kernel, the cgroups read at
        accept (its sandboxes count against them), the rest as the client said."""
        if self.cgroups is None:
            raise self.cgroups_error or SandboxError("the client's cgroups are unknown", operation="cgroup")
        return CallerFacts(
            uid=self.uid,
            gid=self.gid,
            home=caller.env.get("HOME") or os.path.expanduser("~"),
            env=caller.env,
            cwd=caller.cwd,
            cgroups=self.cgroups,
        )


class Notes:
    """Lines in the supervisor's log, at most one per kind every 5 seconds (with a count
    of those left out)."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[float, int]] = {}  # kind -> (last, dropped)

    def log(self, kind: str, line: str) -> None:
        now = time.monotonic()
        last, dropped = self.seen.get(kind, (-1e9, 0))
        if now - last < 5:
            self.seen[kind] = (last, dropped + 1)
            return
        self.seen[kind] = (now, 0)
        more = f" (and {dropped} more since the last such line)" if dropped else ""
        print(f"warren supervisor: {line}{more}", file=sys.stderr, flush=True)


def full(why: str) -> protocol.Message:
    return protocol.error_message(
        SandboxError(
            f"the warren supervisor is at its connection limit: {why}",
            operation="connect",
            hint="too many connections at once (is a program opening many and sending nothing?); retry",
        )
    )


def tell(sock: socket.socket, message: protocol.Message) -> None:
    """Send ``message`` if the socket takes it now, and close: never waits."""
    with contextlib.suppress(OSError, WarrenError):
        sock.send(wire.frame(message), socket.MSG_DONTWAIT)
    sock.close()
