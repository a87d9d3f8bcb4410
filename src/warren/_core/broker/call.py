"""One notified call, seen as its process sees it: its memory, its fds, its paths.

Owns pinning (a pidfd of the calling thread, then a check that the notification is
still that thread's, so a pid reused meanwhile is never acted for) and every read the
broker makes of the process. Everything read here is a *copy*: the broker judges and
acts on these bytes and on these fds, never on the process's memory or fd table again.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable

from .. import _sys, procs

AT_FDCWD = -100
AT_SYMLINK_NOFOLLOW = 0x100
AT_EMPTY_PATH = 0x1000
PIDFD_THREAD = os.O_EXCL

Outcome = int | None  # None: let the kernel run it; >= 0: its result; < 0: -errno


class Call:
    """One notified call: the process's memory, fds and paths, read as it sees them."""

    def __init__(self, listener: int, nid: int, pid: int, args: tuple[int, ...]) -> None:
        self.listener, self.nid, self.pid, self.args = listener, nid, pid, args
        self.pidfd = -1
        self.mem = -1
        self.tgid = 0  # its thread group, once asked (``sockets``)
        self.after: Callable[[], None] | None = None  # what follows the answer (a signal)

    def __enter__(self) -> Call:
        return self

    def __exit__(self, *_exc: object) -> None:
        for fd in (self.pidfd, self.mem):
            if fd >= 0:
                os.close(fd)
        self.pidfd = self.mem = -1

    def pin(self, writable: bool = False) -> bool:
        """Pin the process (a pidfd) and its memory, then check the notification still
        belongs to it: a pid reused meanwhile is not acted for."""
        try:
            # The notification names a thread; PIDFD_THREAD (= O_EXCL, Linux 6.9) pins
            # that thread, else its thread group leader is pinned.
            try:
                self.pidfd = os.pidfd_open(self.pid, PIDFD_THREAD)
            except OSError:
                self.pidfd = os.pidfd_open(_tgid(self.pid))
            mode = os.O_RDWR if writable else os.O_RDONLY
            self.mem = os.open(f"/proc/{self.pid}/mem", mode | os.O_CLOEXEC)
        except OSError:
            return False
        return _sys.notif_valid(self.listener, self.nid)

    def valid(self) -> bool:
        return _sys.notif_valid(self.listener, self.nid)

    def read(self, address: int, size: int) -> bytes | None:
        out = b""
        try:
            while len(out) < size:
                chunk = os.pread(self.mem, size - len(out), address + len(out))
                if not chunk:
                    return None
                out += chunk
        except (OSError, OverflowError, ValueError):
            return None
        return out

    def write(self, address: int, data: bytes) -> bool:
        """Write into the process's memory (a result it asked for, as sendmmsg's
        ``msg_len``); needs ``pin(writable=True)``."""
        try:
            return os.pwrite(self.mem, data, address) == len(data)
        except (OSError, OverflowError, ValueError):
            return False

    def string(self, address: int, limit: int = 4096) -> bytes | None:
        out = b""
        try:
            while len(out) < limit:
                chunk = os.pread(self.mem, 256, address + len(out))
                if not chunk:
                    return None
                end = chunk.find(b"\0")
                if end >= 0:
                    return out + chunk[:end]
                out += chunk
        except (OSError, OverflowError, ValueError):
            return None
        return None

    def their_fd(self, fd_arg: int) -> int:
        """A copy of the process's fd (the same open file description), or -errno."""
        try:
            return _sys.pidfd_getfd(self.pidfd, fd_arg_int(fd_arg))
        except OSError as e:
            return -(e.errno or errno.EBADF)

    def resolve(self, dirfd_arg: int, path: bytes) -> bytes:
        """``path`` as the process would resolve it (from its cwd or the dirfd). Its own
        ``/proc/self`` (``/dev/fd``, ...) is its, not the broker's: glibc changes a file
        ``AT_SYMLINK_NOFOLLOW`` through ``/proc/self/fd/N`` of an ``O_PATH`` descriptor."""
        if path.startswith(b"/"):
            for own, under in _OWN.items():
                if path == own.rstrip(b"/") or (own.endswith(b"/") and path.startswith(own)):
                    return f"/proc/{self.pid}/{under}".encode() + path[len(own) :]
            return path
        dirfd = fd_arg_int(dirfd_arg)
        base = f"/proc/{self.pid}/cwd/" if dirfd == AT_FDCWD else f"/proc/{self.pid}/fd/{dirfd}/"
        return base.encode() + path

    def parent(self, dirfd_arg: int, path: bytes) -> tuple[int, bytes] | None:
        """An fd of the directory holding ``path``'s last component, and that component."""
        if not path:
            return None
        head, _, tail = path.rstrip(b"/").rpartition(b"/")
        if tail in (b"", b".", b".."):
            return None
        where = self.resolve(dirfd_arg, head if head or path.startswith(b"/") else b".")
        try:
            fd = os.open(where or b"/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError:
            return None
        return fd, tail


# Paths naming the calling process itself, and what they are under /proc/PID.
_OWN = {
    b"/proc/self/": "",
    b"/proc/thread-self/": "",
    b"/dev/fd/": "fd/",
    b"/dev/stdin": "fd/0",
    b"/dev/stdout": "fd/1",
    b"/dev/stderr": "fd/2",
}


def _tgid(tid: int) -> int:
    tgid = procs.status_number(tid, "Tgid")
    return tid if tgid is None else tgid


def fd_arg_int(value: int) -> int:
    """An int argument (an fd, a length): the low 32 bits, signed."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value
