"""The supervisor's connected clients as a set: taking connections (verified, a batch
per turn, at most ``MAX_CLIENTS``), making room, answering and letting go.

Nothing here waits on a client: a reply is queued and written as the socket takes it,
a client too slow to send its request header is dropped at its deadline, and one told
there is no room is told so only if its socket takes the words at once. What a client
asks is read and dispatched by the supervisor's loop, not here.
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import socket
import time
from collections.abc import Iterator

from .. import protocol, wire
from ..errors import WarrenError
from . import clients, peer
from .clients import Client

MAX_CLIENTS = 1024
ACCEPT_BATCH = 64  # connections accepted per turn of the loop: the others' requests are read between
_R, _W = selectors.EVENT_READ, selectors.EVENT_WRITE


class Connections:
    def __init__(
        self, sel: selectors.BaseSelector, listener: socket.socket | None, notes: clients.Notes
    ) -> None:
        self.sel = sel
        self.listener = listener
        self.notes = notes
        self.clients: dict[Client, None] = {}  # oldest first
        self.asked_at = 0.0  # the last connection accepted or let go (the supervisor: or exec ended)

    def __contains__(self, c: object) -> bool:
        return c in self.clients

    def __iter__(self) -> Iterator[Client]:
        return iter(self.clients)

    def __bool__(self) -> bool:
        return bool(self.clients)

    def accept(self) -> list[Client]:
        """Take new connections, a batch per turn; the clients made of them. At
        ``MAX_CLIENTS`` the oldest client that has sent nothing (its request head is not
        complete and no byte waits unread) makes room and is told why: a flood of idle
        connections cannot lock a client out, since a client sends its request as soon
        as it connects. When none can make room the new connection is told so, and
        closed."""
        assert self.listener is not None
        taken: list[Client] = []
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return taken
            except OSError:
                return taken  # out of descriptors: the client retries
            why = peer.verify(sock)
            if why is not None:
                self.notes.log("refused", f"refused a connection: {why}")
                sock.close()
                continue
            if len(self.clients) >= MAX_CLIENTS and not self._make_room():
                self.notes.log("full", f"refused a connection: {MAX_CLIENTS} clients, all busy")
                clients.tell(sock, clients.full(f"all {MAX_CLIENTS} of its connections are busy"))
                continue
            _pid, uid, gid = wire.peer_creds(sock)
            taken.append(self.add(sock, uid, gid))
            self.asked_at = time.monotonic()
        return taken

    def _make_room(self) -> bool:
        for c in self.clients:
            if c.deadline is None or c.busy or c.box is not None or c.stdin is not None:
                continue
            try:
                if c.sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK):
                    continue  # its request is there, to be read this turn
            except OSError:
                pass  # nothing waits (BlockingIOError), or it is gone: either way it goes
            self.notes.log("evicted", f"closed an idle connection to make room ({MAX_CLIENTS} clients)")
            with contextlib.suppress(OSError, WarrenError):
                c.sock.send(
                    wire.frame(clients.full("this connection sent nothing and made room")),
                    socket.MSG_DONTWAIT,
                )
            self.drop(c)
            return True
        return False

    def add(self, sock: socket.socket, uid: int, gid: int) -> Client:
        c = Client(sock, uid, gid)
        self.clients[c] = None
        self.sel.register(sock, _R, ("client", c))
        return c

    def expire(self, now: float) -> None:
        for c in list(self.clients):
            if c.deadline is not None and now > c.deadline:
                within = f"{clients.HEADER_DEADLINE:g} s"
                self.notes.log("expired", f"closed a connection that sent no whole request in {within}")
                self.drop(c)  # too slow to send its request: it holds up nobody

    def drop(self, c: Client, handed_off: bool = False) -> None:
        """Forget a client; a one-shot sandbox running its command is killed. A
        connection handed to a sandbox is only let go of: its helper reads on."""
        if c not in self.clients:
            return
        self.clients.pop(c, None)
        c.release()
        self.asked_at = time.monotonic()
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(c.sock)
        c.inbox.close_fds()
        c.outbox.close()
        # Unread input makes the kernel reset the connection, and the client would
        # lose the error it was just sent: discard a bounded amount first.
        with contextlib.suppress(OSError):
            for _ in range(0 if handed_off else 16):
                if not c.sock.recv(65536, socket.MSG_DONTWAIT):
                    break
        c.sock.close()
        if c.box is not None and c.box.run is not None and not c.box.run.answered:
            c.box.run.answered = True
            c.box.signal(signal.SIGKILL)

    def reply(
        self, c: Client, message: protocol.Message, payload: bytes = b"", fds: list[int] | None = None
    ) -> None:
        """Queue ``message`` and close the connection once it is written."""
        c.outbox.put(message, payload, fds or [])
        c.closing = True
        c.deadline = None
        self.flush(c)

    def flush(self, c: Client) -> None:
        try:
            done = c.outbox.flush()
        except OSError:
            self.drop(c)
            return
        if done and c.closing:
            self.drop(c)
        elif c in self.clients:
            self.sel.modify(c.sock, _R if done else _R | _W, ("client", c))
