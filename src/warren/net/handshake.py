"""The network handshake, PID 1's half: run right after ``lo`` is up, before any
command, on PID 1's control channel to the supervisor.

- ``none``: nothing (no other interface exists).
- ``allow``: make the proxy's listening socket *inside* the sandbox's network
  namespace (a socket belongs to the namespace it was made in) and send it out; the
  supervisor's network helper serves it (``net.proxy``).
- ``open``: say the namespace is ready, wait for the supervisor to attach pasta,
  then wait until pasta's configuration (its default route, the last step) shows.

The supervisor's half is in ``server.box`` and ``server.boxnet`` (it must never block on it).
"""

from __future__ import annotations

import contextlib
import socket
import time

from .. import protocol, wire
from ..errors import ProtocolError
from ..plan import Plan
from .pasta import PASTA_TIMEOUT
from .proxy import listen_inside


def pid1_network(plan: Plan, control: socket.socket) -> bool:
    """False: the supervisor gave up on this sandbox (it reports why itself)."""
    try:
        if plan.net.mode == "allow":
            listener = listen_inside()
            wire.send(control, protocol.NetProxy(), fds=[listener.fileno()])
            listener.close()
        elif plan.net.mode == "open":
            wire.send(control, protocol.NetReady())
            msg, _, _ = wire.recv(control, (protocol.NetGo,))
            assert isinstance(msg, protocol.NetGo)
            if not msg.go:
                return False
            up = _wait_for_default_route(time.monotonic() + PASTA_TIMEOUT)
            wire.send(control, protocol.NetUp(ok=up))
            return up
    except (wire.ConnectionClosed, OSError, ProtocolError):
        return False
    return True


def _wait_for_default_route(deadline: float) -> bool:
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
