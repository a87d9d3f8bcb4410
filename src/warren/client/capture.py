"""Run and capture: send a run or exec request with pipes for the command's stdio,
feed stdin, capture output (capped), and build the ``Result``; the command is
followed by the one client loop (``relay``), as ``cli.attach`` follows it on a
terminal. Used for one-shot runs and for execs in live sandboxes alike.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable

from .. import protocol, wire
from ..errors import SandboxError
from ..models import Result
from ..net.allowlist import NetEvent
from ..net.log import parse as parse_events
from ..output import Capture, feed
from . import connect
from .relay import Relay
from .transport import Command

CLIENT_GRACE = 10.0  # beyond a timeout, how long to wait for the sandbox to say so


def _lost() -> SandboxError:
    return SandboxError("the connection to warren was lost")


def run_captured(
    sock: wire.Sock,
    message: protocol.RunRequest | protocol.ExecRequest,
    command: Command,
    *,
    lost: Callable[[], Exception] | None = None,
) -> Result:
    """``message``'s command gets pipes for stdout and stderr (and stdin when
    ``command`` has some; output and proxy decisions go to its callbacks as they come);
    a run with ``net_events`` also gets the pipe its proxy decisions come through.
    ``lost`` makes the error for a connection that ends without an answer."""
    start = time.monotonic()
    stdin, on_net_event = command.stdin, command.on_net_event
    out_r, out_w = os.pipe2(os.O_CLOEXEC)
    err_r, err_w = os.pipe2(os.O_CLOEXEC)
    theirs = [out_w, err_w]
    in_w = net_r = -1
    if stdin is not None:
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        theirs.insert(0, in_r)
    want_events = isinstance(message, protocol.RunRequest) and message.net_events
    if want_events:
        net_r, net_w = os.pipe2(os.O_CLOEXEC)
        theirs.append(net_w)
    message.command.stdio = [stdin is not None, True, True]
    ours = [fd for fd in (out_r, err_r, in_w, net_r) if fd >= 0]
    try:
        connect.send_request(sock, message, theirs)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    captures = {
        out_r: Capture(command.output_limit, command.on_stdout),
        err_r: Capture(command.output_limit, command.on_stderr),
    }
    events: list[NetEvent] = []
    partial = b""
    pending = memoryview(stdin or b"")
    if in_w >= 0:
        if pending:
            os.set_blocking(in_w, False)
        else:
            os.close(in_w)
            in_w = -1
    deadline = None if command.timeout is None else start + command.timeout + CLIENT_GRACE
    started: protocol.Started | None = None

    def take_events(chunk: bytes) -> None:
        nonlocal partial
        partial += chunk
        lines, _, partial = partial.rpartition(b"\n")
        for event in parse_events(lines.decode(errors="replace")):
            events.append(event)
            if on_net_event is not None:
                with contextlib.suppress(Exception):
                    on_net_event(event)

    def read(fd: int) -> bool:
        chunk = os.read(fd, 65536)
        if chunk and fd == net_r:
            take_events(chunk)
        elif chunk:
            captures[fd].feed(chunk)
        return bool(chunk)

    def write(fd: int) -> bool:
        nonlocal pending, in_w
        pending = feed(fd, pending)
        if not pending:
            os.close(fd)
            in_w = -1
        return bool(pending)

    def on_started(msg: protocol.Started, fds: list[int]) -> None:
        nonlocal started
        started = msg
        for fd in fds:
            os.close(fd)

    relay = Relay(sock, lost or _lost)
    for fd in (out_r, err_r, net_r):
        if fd >= 0:
            relay.on_read(fd, read)
    if in_w >= 0:
        relay.on_write(in_w, write)
    try:
        # None: the sandbox did not enforce the timeout; give up on it. Closing the
        # connection makes warren kill the command's tree.
        final = relay.follow(on_started, deadline) or protocol.Exited(status=9, timed_out=True)
        # The command has exited: what it wrote is in the pipes. Read to the end, but
        # do not wait for background processes that inherited them.
        for fd in relay.readers:
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                while read(fd):
                    pass
    finally:
        for fd in (out_r, err_r, net_r, in_w):
            if fd >= 0:
                os.close(fd)
    exit_code = protocol.exit_code(final.status)
    sig = os.WTERMSIG(final.status) if os.WIFSIGNALED(final.status) else None
    out, err = captures[out_r], captures[err_r]
    return Result(
        exit_code=exit_code,
        stdout=out.value(),
        stderr=err.value(),
        duration=time.monotonic() - start,
        signal=sig,
        timed_out=final.timed_out,
        limit=final.limit,
        stdout_truncated=bool(out.dropped),
        stderr_truncated=bool(err.dropped),
        warnings=(*(started.warnings if started else ()), *final.warnings),
        cwd=started.cwd if started else None,
        net_log=tuple(events),
    )
