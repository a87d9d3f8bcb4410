"""The one loop that follows a running command from the client's side, for both
kinds of client: ``capture`` (its output captured into a ``Result``) and
``cli.attach`` (a terminal relayed to it).

The loop waits on the command's connection and on the descriptors it is given, each
with what to do when it is ready (read a pipe into a capture, copy a pty, feed the
command's stdin, deliver a signal); it takes the command's word on the connection
(``connect.command_event``: ``Started``, then ``Exited``; an ``Error`` raised) and
returns at the exit, or at a deadline. What a kind of client does with its bytes, and
after the exit, stays its own. poll(), not select(): a caller may hold descriptors
numbered past select()'s limit of 1024.

On the CLI's fast path: standard library only.
"""

from __future__ import annotations

import math
import os
import select
import time

from .. import protocol, wire
from . import connect

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    # Called when its descriptor is ready; False: done with it (no longer watched).
    OnReady = Callable[[int], bool]
    OnStarted = Callable[[protocol.Started, list[int]], None]


class Relay:
    def __init__(self, sock: wire.Sock, lost: Callable[[], Exception]) -> None:
        self.sock = sock
        self.lost = lost
        self.heard = False  # a word of the command's came (``Started``): it was taken
        self.readers: dict[int, OnReady] = {}
        self.writers: dict[int, OnReady] = {}

    def on_read(self, fd: int, ready: OnReady) -> None:
        self.readers[fd] = ready

    def on_write(self, fd: int, ready: OnReady) -> None:
        self.writers[fd] = ready

    def follow(self, on_started: OnStarted, deadline: float | None = None) -> protocol.Exited | None:
        """Until the command exits (its ``Exited``), or ``deadline`` (monotonic time)
        passes with nothing ready: then None. `connect.NotTaken` when the request was
        never read: nothing ran, and nothing was read from the descriptors it carried."""
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = self._poll(wait)
            if not ready:
                return None
            for fd in ready:
                if fd == self.sock.fileno():
                    msg, fds = connect.command_event(self.sock, self.lost, first=not self.heard)
                    self.heard = True
                    if isinstance(msg, protocol.Exited):
                        for extra in fds:
                            os.close(extra)
                        return msg
                    on_started(msg, fds)
                    continue
                # ready, or hung up, or in error: the handler's read or write says which
                table = self.writers if fd in self.writers else self.readers
                handler = table.get(fd)
                if handler is not None and not handler(fd):
                    del table[fd]

    def _poll(self, wait: float | None) -> list[int]:
        poller = select.poll()
        poller.register(self.sock.fileno(), select.POLLIN)
        for fd in self.readers:
            poller.register(fd, select.POLLIN)
        for fd in self.writers:
            poller.register(fd, select.POLLOUT)
        return [fd for fd, _events in poller.poll(None if wait is None else math.ceil(wait * 1000))]
