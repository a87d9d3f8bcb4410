"""Handing a client's request (exec, spawn, files, processes, signals) to the PID 1 of
its sandbox, with the client's connection: a helper forked there serves it.

What travels with the connection: the descriptors the request declared, a spawned
process's record and stdin pipe, an exec's "active" pipe and the sandbox's limit
counters. After this the supervisor lets go of the connection.
"""

from __future__ import annotations

import os
import socket
import time

from .. import protocol
from .._core import shim
from ..errors import ProtocolError
from . import checkpoints, rootpoints, spawns, stdin
from .box import Box

HANDED = (
    protocol.ExecRequest,
    protocol.SpawnRequest,
    protocol.FileRequest,
    protocol.PsRequest,
    protocol.SignalRequest,
)


def hand_over(
    box: Box,
    conn: socket.socket,
    msg: protocol.Message,
    payload_len: int,
    fds: list[int],
    *,
    root: str,
    stdin_pipes: stdin.StdinPipes | None,
    peer: dict[str, int] | None = None,
) -> None:
    """Send ``msg`` and the connection to ``box``'s PID 1; the descriptors in ``fds``
    are closed here (PID 1 has its copies)."""
    assert isinstance(msg, HANDED)
    box.can_hold()  # before anything is made for it
    box.follow_roots()
    if isinstance(msg, (protocol.ExecRequest, protocol.SpawnRequest)):
        box.keeper.caught_up(box.git)  # a host commit's index, before the command looks
        if box.plan.review is not None:
            box.freeze_due = None  # came first: its checkpoint is taken now, whole
            checkpoints.before_command(box, root, msg.command.argv)
        elif box.root_points:
            rootpoints.noted(box, msg.command.argv)
    declared = sum(1 for a in msg.command.stdio[:3] if a) if isinstance(msg, protocol.ExecRequest) else 0
    if len(fds) != declared:
        raise ProtocolError(
            f"a {msg.TAG} request declared {declared} descriptors but carried {len(fds)}",
            operation="decode",
        )
    if payload_len and not isinstance(msg, protocol.FileRequest):
        raise ProtocolError(f"a {msg.TAG} request carries no payload", operation="decode")
    handoff = protocol.Handoff(request=msg, payload=payload_len)
    extra: list[int] = []
    named: list[int] = []  # handoff.extra's descriptors: the sandbox's, not closed here
    ours = -1  # an exec's end of its "active" channel (``Box.exec_started``)
    if isinstance(msg, protocol.SpawnRequest):
        handoff.spawn_id, extra = spawns.create(root, box.name)
        if msg.stdin:
            assert stdin_pipes is not None
            extra.append(stdin_pipes.open(box.name, handoff.spawn_id))
    elif isinstance(msg, protocol.PsRequest):
        handoff.spawned = spawns.running(root, box.name)
    if isinstance(msg, protocol.ExecRequest):
        name, fd, watches, ours = box.exec_started()
        handoff.extra.append(name)
        extra.append(fd)
        handoff.extra.extend(f"gitwatch.{i}" for i in range(len(watches)))
        named.extend(watches)
    if isinstance(msg, (protocol.ExecRequest, protocol.SpawnRequest)):
        handoff.extra.extend(name for name, _fd in box.launched.counters)
        named.extend(fd for _name, fd in box.launched.counters)
    stub = shim.stub_request(box.plan, msg.command) if isinstance(msg, protocol.ExecRequest) else None
    handed_at = time.monotonic()  # an exec's duration counts from here: its command starts after
    box.hand(handoff, conn.fileno(), fds, [*extra, *named], stub)
    for fd in [*fds, *extra]:
        os.close(fd)
    # The trail's record once the request is handed: its write is not on the command's
    # path (an exec's end, which the record is for, is read in a later turn of the loop).
    # Ends reported before it first: a client's next request comes after its answer,
    # and an exec's report is written before the answer.
    box.take_reports()
    box.recorded(msg, peer or {}, ours, handed_at)
