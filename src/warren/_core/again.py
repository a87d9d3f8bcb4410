"""A helper that serves again: in a burst of commands (a framework's several tool calls
in one turn, a script's execs back to back), the next request comes a moment after the
last one's answer, long before a spare forked then is ready (15-20 ms on a 2-core
machine: a fork of PID 1's Python, its command's process made as the stub, and their
first run). So the helper that answered an exec, told by PID 1 that it may, becomes the
next spare itself: it makes its command's process again (the stub, spawned) and PID 1
gives it to the supervisor as any spare; a request that reached PID 1 meanwhile waits
for it rather than for a helper forked cold. Every exec's helper is told so, not only
one whose request came in a burst: the first request of a burst follows a pause, and
the second its answer at once (9 ms when its helper was forked for it, 4 ms served
again); at an agent's pace the spare is then that helper, ready sooner than a fork of
PID 1 and at no more memory (5.2 MB PSS either way, measured).

The exchange on the channel between PID 1 and the helper it gave the request (bytes,
each a message; the helper's own "t" says it took a request, as ever)::

    PID 1  -> helper   "b"  offer yourself once answered
    helper -> PID 1    "r"  answered, nothing of the command left: may I?
    PID 1  -> helper   "g"  go (else PID 1 closes its end: the helper exits, as before)
    helper -> PID 1    "a"  ready, with the supervisor's end of a new direct channel
                            and a copy of its end of the new stub's (``protocol.Spare``)

A helper serves again only after an exec whose processes are all gone (one the command
left running stays its child: that helper ends as before, and the process is PID 1's),
with every descriptor of the request closed, and never in a one-shot sandbox. PID 1
refuses an offer made under other rules than today's (``Refresh``, ``Walked``: the
generation), while it quiesces or stops, or when it has a spare already.
"""

from __future__ import annotations

import array
import contextlib
import os
import select
import socket
from dataclasses import dataclass, field

_INT = array.array("i")
BURST = b"b"
ASK = b"r"
GO = b"g"
AGAIN = b"a"
TAKEN = b"t"

# Milliseconds a helper waits for PID 1's go before it ends as it would have.
GO_WAIT_MS = 200
# Seconds a request that reached PID 1 while the helper before it readies itself again
# waits for it, before PID 1 forks a helper for it after all.
PENDING_WAIT = 0.02
# Seconds PID 1 holds a helper's offer before it gives it to the supervisor: the next
# request of a burst is often on its way to PID 1 already (the supervisor sent it
# before it could hear of the offer), and is written to that helper then.
HOLD = 0.004


@dataclass(eq=False)
class Serving:
    """PID 1's end of the channel to the helper given the last exec, kept
    to hear its offer."""

    chan: socket.socket
    pid: int
    generation: int  # the rules it was forked with (``Init.generation`` then)
    window: bool  # forked with the hard-link walk's window filter
    going: bool = False  # told "g": its command is over, its new stub on the way
    offer: list[int] = field(default_factory=list)  # ... its "a": the descriptors for the supervisor
    until: float = 0.0  # ... held back until then (``HOLD``)

    def tell(self, what: bytes) -> bool:
        try:
            return self.chan.send(what, socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL) == 1
        except OSError:
            return False

    def heard(self) -> tuple[bytes, list[int]]:
        """The helper's next word, and the descriptors with it; b"" when it ended, b"?"
        when nothing is there yet (the caller polls again). Never waits: PID 1 reads on
        here after each word, while the helper's command may run for hours.
        (``socket.recv_fds`` of Python 3.11 drops its flags: it waited for the next word,
        the end of the command that helper served, and PID 1 with it.)"""
        try:
            room = socket.CMSG_LEN(2 * _INT.itemsize)
            data, ancdata, _flags, _addr = self.chan.recvmsg(1, room, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return b"?", []
        except OSError:
            return b"", []
        fds = array.array("i")
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
        return data, list(fds)


# --- in the helper ---------------------------------------------------------------------


def open_fds() -> set[int]:
    """This process's open descriptors (``/proc/self/fd``); empty when unreadable."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return set()
    return {int(n) for n in names if n.isdigit()}


def close_others(kept: set[int]) -> None:
    """Close every descriptor but ``kept``: whatever the request brought (the client's
    connection, the supervisor's "active" pipe, counters, stdio) or its serving left
    open (a pidfd)."""
    for fd in open_fds() - kept:
        with contextlib.suppress(OSError):
            os.close(fd)


def alone() -> bool:
    """Reap what has ended; True when this helper has no child left (a process the
    command left behind is its child: it is a subreaper)."""
    while True:
        try:
            got = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            return True
        if got is None:
            return False


def answered(pid: int) -> bool:
    """In PID 1: whether the helper ``pid`` has no child left (its command over: it
    asks to serve again in a moment, or ends); False where the kernel does not list
    children (``/proc/PID/task/PID/children``)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            return not f.read().strip()
    except OSError:
        return False


def told_burst(chan: socket.socket) -> bool:
    """Whether PID 1 said this helper may serve again, "b" (and nothing else)."""
    try:
        return chan.recv(1, socket.MSG_DONTWAIT) == BURST
    except OSError:
        return False


def ask(chan: socket.socket) -> bool:
    """Say "r" (PID 1's go is read later: ``went``)."""
    try:
        return chan.send(ASK, socket.MSG_NOSIGNAL) == 1
    except OSError:
        return False


def went(chan: socket.socket) -> bool:
    """Whether PID 1 said go (waited for ``GO_WAIT_MS`` at most)."""
    try:
        poller = select.poll()
        poller.register(chan, select.POLLIN)
        if not poller.poll(GO_WAIT_MS):
            return False
        return chan.recv(1, socket.MSG_DONTWAIT) == GO
    except OSError:
        return False


def offer(chan: socket.socket, fds: list[int]) -> bool:
    """Say "a" with the supervisor's end of the new direct channel (and a copy of the
    new stub's channel)."""
    try:
        return socket.send_fds(chan, [AGAIN], fds, socket.MSG_NOSIGNAL) == 1
    except OSError:
        return False
