"""The one run-and-capture loop: send a run or exec request with pipes for the
command's stdio, feed stdin, capture output (capped), follow the command's start and
exit on the connection, and build the ``Result``. Used for one-shot runs and for
execs in live sandboxes alike.
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import time
from collections.abc import Callable

from .. import protocol, wire
from ..errors import SandboxError
from ..models import Result
from ..net.allowlist import NetEvent
from ..net.log import parse as parse_events
from ..output import Capture, feed
from .connect import command_event

CLIENT_GRACE = 10.0  # beyond a timeout, how long to wait for the sandbox to say so


def _lost() -> SandboxError:
    return SandboxError("the connection to warren was lost")


def run_captured(
    sock: wire.Sock,
    message: protocol.RunRequest | protocol.ExecRequest,
    *,
    stdin: bytes | None,
    on_stdout: Callable[[bytes], None] | None = None,
    on_stderr: Callable[[bytes], None] | None = None,
    on_net_event: Callable[[NetEvent], None] | None = None,
    lost: Callable[[], Exception] | None = None,
) -> Result:
    """``message``'s command gets pipes for stdout and stderr (and stdin when given);
    a run with ``net_events`` also gets the pipe its proxy decisions come through.
    ``lost`` makes the error for a connection that ends without an answer."""
    start = time.monotonic()
    command = message.command
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
    command.stdio = [stdin is not None, True, True]
    ours = [fd for fd in (out_r, err_r, in_w, net_r) if fd >= 0]
    try:
        wire.send(sock, message, fds=theirs)
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    captures = {
        out_r: Capture(command.output_limit, on_stdout),
        err_r: Capture(command.output_limit, on_stderr),
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
    readers: list[int | wire.Sock] = [sock, out_r, err_r, *([net_r] if net_r >= 0 else [])]
    deadline = None if command.timeout is None else start + command.timeout + CLIENT_GRACE
    started: protocol.Started | None = None
    final: protocol.Exited | None = None

    def take_events(chunk: bytes) -> None:
        nonlocal partial
        partial += chunk
        lines, _, partial = partial.rpartition(b"\n")
        for event in parse_events(lines.decode(errors="replace")):
            events.append(event)
            if on_net_event is not None:
                with contextlib.suppress(Exception):
                    on_net_event(event)

    try:
        while final is None:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready_r, ready_w = _ready(readers, [in_w] if in_w >= 0 else [], wait)
            if not ready_r and not ready_w:
                # The sandbox did not enforce the timeout: give up on it. Closing the
                # connection makes warren kill the command's tree.
                final = protocol.Exited(status=9, timed_out=True)
                break
            for _fd in ready_w:
                pending = feed(in_w, pending)
                if not pending:
                    os.close(in_w)
                    in_w = -1
            for r in ready_r:
                if r is sock:
                    msg, fds = command_event(sock, lost or _lost)
                    for fd in fds:
                        os.close(fd)
                    if isinstance(msg, protocol.Started):
                        started = msg
                    else:
                        final = msg
                    continue
                assert isinstance(r, int)
                chunk = os.read(r, 65536)
                if not chunk:
                    readers.remove(r)
                elif r == net_r:
                    take_events(chunk)
                else:
                    captures[r].feed(chunk)
        # The command has exited: what it wrote is in the pipes. Read to the end, but
        # do not wait for background processes that inherited them.
        for fd in [r for r in readers if isinstance(r, int)]:
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(fd, 65536):
                    if fd == net_r:
                        take_events(chunk)
                    else:
                        captures[fd].feed(chunk)
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


def _ready(
    readers: list[int | wire.Sock], writers: list[int], wait: float | None
) -> tuple[list[int | wire.Sock], list[int]]:
    """select()'s answer from poll(): a caller may hold descriptors numbered past
    select()'s limit of 1024."""
    poller = select.poll()
    by_fd: dict[int, int | wire.Sock] = {}
    for r in readers:
        fd = r if isinstance(r, int) else r.fileno()
        by_fd[fd] = r
        poller.register(fd, select.POLLIN)
    for w in writers:
        poller.register(w, select.POLLOUT)
    timeout = None if wait is None else math.ceil(wait * 1000)
    ready_r: list[int | wire.Sock] = []
    ready_w: list[int] = []
    for fd, _mask in poller.poll(timeout):
        if fd in by_fd:
            ready_r.append(by_fd[fd])
        else:
            ready_w.append(fd)
    return ready_r, ready_w
