"""Work done in a sandbox's user and mount namespaces by a child of the supervisor.

PID 1 has no capability left once it settled; the supervisor's user owns the sandbox's
namespaces, so a process forked from the supervisor can join them (``box.ns``, from
``Ready``) and mount there: bind a replaced writable root again (``follow``), stack the
root again for a snapshot (``restack``). The child runs one function and passes back
the descriptors it returns, or the error it raised, over a socket pair; it never
outlives the call. A ``Helper`` serves calls until closed, kept while its sandbox is
in use: it is cloned by the spawner (``spawner.HELPERS``), whose quiet pages it shares
(a fork of the supervisor came to own about 6.5 MB of the supervisor's), and forked
here only where no spawner can be had.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import json
import os
import signal
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from .. import wire
from .._core import _sys, clone, kernel, spawner

TIMEOUT = 10.0
NAME = "warren-joined"  # a Helper's name, as ``ps`` and the tests see it
SPAWNED = "joined"  # a Helper's name among the spawner's helpers
_HEAD = struct.Struct("!i")
_PR_SET_DUMPABLE = 4
_MAX_FD = 1 << 20

Op = Callable[[dict[str, Any], list[int]], list[int]]
_OPS: dict[str, Op] = {}


def op(name: str) -> Callable[[Op], Op]:
    """Register ``work(args, fds)`` as what a ``Helper`` does when called ``name``."""

    def register(work: Op) -> Op:
        _OPS[name] = work
        spawner.NEEDS.add(work.__module__)  # a spawner started anew imports it too
        return work

    return register


@dataclass
class Helper:
    """A child of the supervisor in a sandbox's user and mount namespaces, serving
    calls (``call``) one at a time until ``close``."""

    pid: int
    sock: socket.socket
    pidfd: int  # signalled by this, never by the pid (the supervisor's loop reaps children)

    @classmethod
    def start(cls, ns: tuple[int, int]) -> Helper:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            pid = clone.start_helper(SPAWNED, theirs, [], list(ns))  # this process's child
        finally:
            theirs.close()
        # Not reaped yet: only this thread reaps, and it is here.
        return cls(pid, ours, os.pidfd_open(pid))

    def call(self, name: str, args: dict[str, Any], fds: list[int], timeout: float = TIMEOUT) -> list[int]:
        """``name``'s work with ``args`` and ``fds`` (copies are sent) in the namespaces;
        the descriptors it returns. Its ``OSError`` is raised here; a helper that is
        gone or gives no answer within ``TIMEOUT`` raises EIO or ETIMEDOUT (and is
        closed: start another)."""
        try:
            socket.send_fds(self.sock, [json.dumps({"op": name, "args": args}).encode()], fds)
        except OSError as e:
            self.close()
            raise OSError(errno.EIO, "the helper in the sandbox's namespaces is gone", str(e)) from None
        got, out, what = _receive(self.sock, timeout)
        if got in (errno.ETIMEDOUT, -1):
            self.close()
            got = errno.ETIMEDOUT if got == errno.ETIMEDOUT else errno.EIO
        if got != 0:
            raise OSError(got, os.strerror(got), what)
        return out

    @property
    def closed(self) -> bool:
        return self.sock.fileno() < 0

    def close(self) -> None:
        """End it (its socket closes; it is killed in case it is stuck) and reap it."""
        if self.closed:
            return
        self.sock.close()
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.waitid(os.P_PIDFD, self.pidfd, os.WEXITED)
        os.close(self.pidfd)


def _spawned(channel: socket.socket, _tasks: list[tuple[str, int]], fds: list[int]) -> int:
    """A ``Helper``'s start (cloned by the spawner with CLONE_PARENT, or forked: its
    parent is the supervisor either way)."""
    _serve(channel.detach(), (fds[0], fds[1]), os.getppid())
    return 1  # not reached: it exits there


spawner.HELPERS[SPAWNED] = _spawned


def _serve(sock: int, ns: tuple[int, int], parent: int) -> NoReturn:
    """The helper's life: nothing of the supervisor's kept, the namespaces joined, then
    one call after another until the socket closes."""
    code = 1
    try:
        gc.disable()  # a stale object of the supervisor's must not close a descriptor reused since
        with contextlib.suppress(OSError), open("/proc/thread-self/comm", "w") as comm:
            comm.write(NAME)
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # what an op forks is not waited for
        keep = sorted({sock, *ns})
        low = 3
        for fd in keep:
            os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, _MAX_FD)
        kernel.join_namespaces(*ns)
        for fd in ns:
            os.close(fd)
        # After the joining: new capabilities clear the parent-death signal.
        kernel.die_with_parent()
        _sys.prctl(_PR_SET_DUMPABLE, 0)
        if os.getppid() != parent:
            os._exit(1)
        _warm()
        channel = socket.socket(fileno=sock)
        while True:
            data, fds, _flags, _addr = socket.recv_fds(channel, 1 << 16, 250)
            if not data:
                code = 0
                break
            try:
                request = json.loads(data)
                out = _OPS[request["op"]](request["args"], fds)
            except OSError as e:
                what = e.filename if isinstance(e.filename, str) else str(e.strerror)
                channel.sendall(_HEAD.pack(e.errno or errno.EIO) + what.encode()[:900])
                continue
            except Exception as e:
                channel.sendall(_HEAD.pack(errno.EIO) + repr(e).encode()[:900])
                continue
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            socket.send_fds(channel, [_HEAD.pack(0)], out)
            for fd in out:
                os.close(fd)
    except BaseException:  # the supervisor sees its end close
        code = 1
    finally:
        os._exit(code)


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
        got = errno.EIO if got == -1 else got
    finally:
        ours.close()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if got != 0:
        raise OSError(got, os.strerror(got), what)
    return out


def close_later(fd: int) -> None:
    """In a ``Helper``: close ``fd`` in a thread of its own (the last reference of a
    detached overlay: its end syncs the upper directory's filesystem)."""
    threading.Thread(target=os.close, args=(fd,), name="warren-close", daemon=True).start()


def _warm() -> None:
    """Run once through what a call runs (the overlay's calls fail here, given no
    layer): a forked child's first run copies every page of the supervisor's it
    touches, tens of milliseconds on a loaded host, paid now rather than by the first
    call."""
    json.loads(json.dumps({"op": "", "args": {"layers": [""]}}))
    with contextlib.suppress(OSError):
        _sys.overlay_from_fds([], -1, -1)
    with contextlib.suppress(OSError):
        os.close(os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC))
    with contextlib.suppress(OSError):
        _sys.move_mount(-1, "/")


def _receive(sock: socket.socket, timeout: float = TIMEOUT) -> tuple[int, list[int], str]:
    """The answer: 0 and the descriptors, or an errno and its text; -1 when the other
    end is gone (the answer is short: it died)."""
    if not wire.readable(sock.fileno(), timeout):
        return errno.ETIMEDOUT, [], "no answer from the sandbox's namespaces"
    data, fds, _flags, _addr = socket.recv_fds(sock, 1024, 64)
    if len(data) < _HEAD.size:
        for fd in fds:
            os.close(fd)
        return -1, [], "the process in the sandbox's namespaces ended"
    return _HEAD.unpack(data[: _HEAD.size])[0], fds, data[_HEAD.size :].decode(errors="replace")
