"""Connection limits of ``warren serve``: nothing a client holds open exhausts it.

uvicorn closes a keep-alive connection after its idle timeout, but a connection that
never sends a whole request head, or trickles a body, is held forever; enough of them
(no token needed) use up the service's descriptors. This module owns the HTTP
protocol class uvicorn runs (h11's, with these rules added), so they hold for every
connection by construction:

- a request head must arrive whole within ``head_timeout`` of the connection (or of
  the previous response: that is also the keep-alive timeout): trickling bytes does
  not extend it (slowloris);
- a request body must keep coming: ``body_idle`` without a byte closes it;
- at most ``max_total`` connections, and ``max_per_peer`` per peer address (a unix
  socket's peers are one peer: they are all this user). At a cap the oldest *idle*
  connection (no request in progress: waiting for its head, or kept alive) of that
  scope makes room, so a flood of idle connections cannot lock a real client out;
  when every connection is busy the new one gets a 503 JSON error and is closed.
  Refusals are logged through ``RateLimited``: one line per ``window``, with a count.

A request in progress (its head arrived, its response is not complete: a long exec,
an SSE stream) is never timed out or evicted here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

# The scope extension through which an app asks that its connection end with a reset:
# ``scope["extensions"][RESET]["call"]()``.
RESET = "warren.reset"
HEAD_TIMEOUT = 10.0
BODY_IDLE = 30.0
MAX_TOTAL = 1024
MAX_PER_PEER = 512


def printable(text: str) -> str:
    """``text`` for a log line: control and other non-printable characters (and the
    backslash) as escapes, so a request cannot forge or colour lines."""
    if text.isprintable() and "\\" not in text:
        return text
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch.isprintable():
            out.append(ch)
        else:
            out.append(ch.encode("unicode_escape").decode("ascii"))
    return "".join(out)


class RateLimited:
    """At most one line per ``window`` seconds for a kind of event; the next line says
    how many were left out."""

    def __init__(self, log: Callable[[str], None], window: float = 5.0) -> None:
        self.log = log
        self.window = window
        self.last: dict[str, float] = {}
        self.dropped: dict[str, int] = {}

    def __call__(self, kind: str, line: str) -> None:
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) < self.window:
            self.dropped[kind] = self.dropped.get(kind, 0) + 1
            return
        self.last[kind] = now
        dropped = self.dropped.pop(kind, 0)
        self.log(line + (f" (and {dropped} more like it since the last such line)" if dropped else ""))


@dataclass
class Limits:
    head_timeout: float = HEAD_TIMEOUT
    body_idle: float = BODY_IDLE
    max_total: int = MAX_TOTAL
    max_per_peer: int = MAX_PER_PEER
    log: RateLimited | None = None
    # every open connection, oldest first; and how many each peer has
    open: OrderedDict[Guarded, None] = field(default_factory=OrderedDict)
    per_peer: dict[str, int] = field(default_factory=dict)
    evicted: int = 0
    refused: int = 0

    def protocol(self) -> type[Guarded]:
        """The protocol class for ``uvicorn.Config(http=...)``, bound to these limits."""
        limits = self

        class Bound(Guarded):
            pass

        Bound.limits = limits
        return Bound

    def oldest_idle(self, peer: str | None) -> Guarded | None:
        for conn in self.open:
            if conn.idle() and (peer is None or conn.peer == peer):
                return conn
        return None


REFUSAL = json.dumps(
    {
        "error": {
            "type": "WarrenError",
            "message": "warren serve is at its connection limit and every connection is busy",
            "path": None,
            "errno": None,
            "hint": "retry in a moment; close connections you no longer use",
            "operation": "http",
        }
    }
).encode()


class Guarded(H11Protocol):
    """uvicorn's h11 protocol with a head deadline, a body idle timeout and the caps."""

    limits: Limits

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.timer: asyncio.TimerHandle | None = None
        self.head_since: float | None = None
        self.peer = self.client[0] if self.client else "unix"
        limits = self.limits
        room = True
        if limits.per_peer.get(self.peer, 0) >= limits.max_per_peer:
            room = self._evict(self.peer)
        if room and len(limits.open) >= limits.max_total:
            room = self._evict(None)
        if not room:
            self._refuse()
            return
        limits.open[self] = None
        limits.per_peer[self.peer] = limits.per_peer.get(self.peer, 0) + 1
        self._arm()

    def _evict(self, peer: str | None) -> bool:
        victim = self.limits.oldest_idle(peer)
        if victim is None:
            return False
        self.limits.evicted += 1
        victim.close("evicted")
        return True

    def _refuse(self) -> None:
        self.limits.refused += 1
        head = (
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            b"connection: close\r\nretry-after: 1\r\ncontent-length: %d\r\n\r\n" % len(REFUSAL)
        )
        self.transport.write(head + REFUSAL)
        self.transport.close()
        if self.limits.log is not None:
            self.limits.log(
                "refused",
                f"refused a connection from {printable(self.peer)}: {len(self.limits.open)} open, "
                f"all busy (limits: {self.limits.max_total} in total, {self.limits.max_per_peer} per peer)",
            )

    def idle(self) -> bool:
        """No request in progress: waiting for a head, or kept alive after a response."""
        return self.cycle is None or self.cycle.response_complete

    def close(self, why: str) -> None:
        self._forget()
        if not self.transport.is_closing():
            self.transport.close()

    def _forget(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        limits = self.limits
        if limits.open.pop(self, False) is not False:
            n = limits.per_peer.get(self.peer, 1) - 1
            if n:
                limits.per_peer[self.peer] = n
            else:
                limits.per_peer.pop(self.peer, None)

    def connection_lost(self, exc: Exception | None) -> None:
        if hasattr(self, "timer"):
            self._forget()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None:
            # The request's app may cut its response (``reset``); its task, made by
            # the line above, has not run yet: it finds this in its scope. (Once per
            # request: a body comes in many chunks.)
            extensions = cycle.scope.setdefault("extensions", {})
            if RESET not in extensions:
                extensions[RESET] = {"call": self.reset}
        self._arm(received=True)

    def reset(self) -> None:
        """The connection ends with a reset (TCP RST) when it closes, not an orderly end:
        a response cut short (a stream whose sandbox ended under it) reads to the client
        as the connection failing, as an HTTP/2 stream reset does on E2B, never as a
        peer that broke the protocol (an HTTP/1.1 chunked body ended early). A unix
        socket has no reset: it just ends."""
        sock = self.transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        # Closed here, on purpose: uvicorn then counts the response as one whose client
        # went away, not as an app that failed to complete it ("ASGI callable returned
        # without completing response", logged as an error for every such stream).
        if self.cycle is not None:
            self.cycle.disconnected = True
        self.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._arm()

    def _arm(self, received: bool = False) -> None:
        """The one timer for where the connection is: its head (a fixed deadline), its
        body (idle since the last byte), or a request being served (none)."""
        if self.transport.is_closing() or self not in self.limits.open:
            return
        loop = asyncio.get_running_loop()
        if self.idle() and self.conn.their_state in (h11.IDLE, h11.DONE):
            if self.head_since is None:
                self.head_since = loop.time()
                self._set(self.limits.head_timeout)
            return
        self.head_since = None
        if self.conn.their_state is h11.SEND_BODY:
            if received or self.timer is None:
                self._set(self.limits.body_idle)
            return
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _set(self, delay: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = asyncio.get_running_loop().call_later(delay, self._expired)

    def _expired(self) -> None:
        self.timer = None
        if self.conn.their_state is h11.SEND_BODY and not self.idle() and self.flow.read_paused:
            self._set(self.limits.body_idle)  # the app is not reading yet: not the client's pause
            return
        if self.idle() or self.conn.their_state is h11.SEND_BODY:
            self.close("timeout")


def config_kwargs(limits: Limits) -> dict[str, Any]:
    """What ``uvicorn.Config`` needs to run with these limits (a kept-alive connection
    gets the head deadline too: its next request head must come within it)."""
    return {"http": limits.protocol(), "timeout_keep_alive": max(1, round(limits.head_timeout))}
