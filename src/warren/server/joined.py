"""Work done in a sandbox's user and mount namespaces by a child of the supervisor.

PID 1 has no capability left once it settled; the supervisor's user owns the sandbox's
namespaces, so a process forked from the supervisor can join them (``box.ns``, from
``Ready``) and mount there: bind a replaced writable root again (``follow``), stack the
root again for a snapshot (``restack``). The child runs one function and passes back
the descriptors it returns, or the error it raised, over a socket pair; it never
outlives the call.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import struct
from collections.abc import Callable

from .._core import kernel

TIMEOUT = 10.0
_HEAD = struct.Struct("!i")


def run(ns: tuple[int, int], work: Callable[[list[int]], list[int]], fds: list[int]) -> list[int]:
    """``work(fds)`` in a child that joined the namespaces ``ns``; the descriptors it
    returns. An ``OSError`` there is raised here with its errno and its file name (or
    its text); a child that gives no answer within ``TIMEOUT`` is killed (ETIMEDOUT)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            kernel.join_namespaces(*ns)
            socket.send_fds(theirs, [_HEAD.pack(0)], work(fds))
            code = 0
        except OSError as e:
            what = e.filename if isinstance(e.filename, str) else str(e.strerror)
            with contextlib.suppress(OSError):
                theirs.sendall(_HEAD.pack(e.errno or errno.EIO) + what.encode()[:900])
        except BaseException as e:
            with contextlib.suppress(OSError):
                theirs.sendall(_HEAD.pack(errno.EIO) + repr(e).encode()[:900])
        finally:
            os._exit(code)
    theirs.close()
    try:
        got, out, what = _receive(ours)
        if got == errno.ETIMEDOUT:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    finally:
        ours.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if got != 0:
        raise OSError(got, os.strerror(got), what)
    return out


def _receive(sock: socket.socket) -> tuple[int, list[int], str]:
    if not select.select([sock], [], [], TIMEOUT)[0]:
        return errno.ETIMEDOUT, [], "no answer from the sandbox's namespaces"
    data, fds, _flags, _addr = socket.recv_fds(sock, 1024, 64)
    if len(data) < _HEAD.size:
        for fd in fds:
            os.close(fd)
        return errno.EIO, [], "the process in the sandbox's namespaces failed"
    return _HEAD.unpack(data[: _HEAD.size])[0], fds, data[_HEAD.size :].decode(errors="replace")
