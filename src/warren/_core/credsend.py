"""The credentials sender (``native/credsend.c``, compiled at install as
``warren-credsend``): the process that makes a command's unix sends when they must name
the command as their sender.

The broker (PID 1) makes every send of a sandboxed command, so a receiver asking for
its sender's credentials (``SO_PASSCRED``, ``SCM_CREDENTIALS``) would be told PID 1's
pid, where on the host it is told the command's. Chromium's zygote checks that pid.
The kernel takes an explicit ``SCM_CREDENTIALS`` naming another pid only from a sender
holding ``CAP_SYS_ADMIN`` over the user namespace that owns its pid namespace, which
PID 1 must not keep. So PID 1 spawns this program before dropping its capabilities
(``start``); it keeps ``CAP_SYS_ADMIN`` alone under a seccomp filter that allows only
receiving a request, sending, closing and exiting (its own header says why that is
sound), and the broker hands it each unix send with the pid of the command whose send
it is (``Sender.send``).

Only in a sandbox with namespaces of its own (in the degraded mode PID 1 holds no
capability to give), and only with the program installed (``WARREN_CREDSEND=0``: as
without it). Without it, or when it has ended, the broker sends itself and receivers
see PID 1's pid, as before.

Owns: finding and loading the program, starting it, and its wire format.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import socket
import struct
import threading

from . import _sys, programs

NAME = "warren-credsend"
# The shared memory's layout, as native/credsend.c has it.
NAME_ROOM = 128
CREDS_ROOM = 32
CTL_MAX = 256 << 10
DATA_MAX = 1 << 20
NAME_AT = 0
CTL_AT = NAME_ROOM + CREDS_ROOM
DATA_AT = CTL_AT + CTL_MAX
SIZE = DATA_AT + DATA_MAX
MAX_FDS = 252  # the message's own, with the socket one more: SCM_MAX_FD (253)
_REQUEST = struct.Struct("=IIIIi")  # flags, namelen, ctllen, datalen, pid
_RESULT = struct.Struct("=q")
CAP_SETPCAP, CAP_SYS_ADMIN = 8, 21
RELEASE = 64 << 10  # memory of a send larger than this is given back after it


def program() -> str | None:
    return programs.find(NAME, "WARREN_CREDSEND")


def load() -> int | None:
    """In the supervisor, before any sandbox (``programs.load``)."""
    return programs.load(NAME, program)


def loaded() -> int | None:
    return programs.loaded(NAME)


class Sender:
    """PID 1's end: one request at a time (the broker's thread and its workers share it)."""

    def __init__(self, sock: socket.socket, shared: mmap.mmap, pid: int) -> None:
        self.sock, self.shared, self.pid = sock, shared, pid
        self.lock = threading.Lock()
        self.alive = True

    def send(
        self, fd: int, address: bytes, data: bytes, control: bytes, rights: list[int], flags: int, pid: int
    ) -> int | None:
        """sendmsg(2) on ``fd`` made by the sender, naming ``pid`` in an added
        ``SCM_CREDENTIALS`` (0: none added; ``control`` may carry its own). ``rights``:
        the fds the control's SCM_RIGHTS name, in order. The bytes sent or -errno; None
        when the sender cannot make it (ended, or too large for it): send as before."""
        if (
            not self.alive
            or len(address) > NAME_ROOM
            or len(control) > CTL_MAX
            or len(data) > DATA_MAX
            or len(rights) > MAX_FDS
        ):
            return None
        with self.lock:
            if not self.alive:
                return None
            view = self.shared
            view[NAME_AT : NAME_AT + len(address)] = address
            view[CTL_AT : CTL_AT + len(control)] = control
            view[DATA_AT : DATA_AT + len(data)] = data
            header = _REQUEST.pack(flags & 0xFFFFFFFF, len(address), len(control), len(data), pid)
            try:
                fds = struct.pack(f"{1 + len(rights)}i", fd, *rights)
                self.sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
                answer = self.sock.recv(_RESULT.size)
            except OSError:
                answer = b""
            if len(data) > RELEASE:
                with contextlib.suppress(OSError, ValueError):
                    view.madvise(mmap.MADV_REMOVE, DATA_AT, len(data) + (-len(data)) % mmap.PAGESIZE)
            if len(answer) != _RESULT.size:
                self.alive = False  # it ended (a setup step failed, or killed): as before
                return None
            return int(_RESULT.unpack(answer)[0])


def start() -> Sender | None:
    """In PID 1, with its capabilities still held and before its broker starts: the
    sender spawned from the loaded program; None without one. ``posix_spawn`` (a
    vfork): no copy of PID 1's page tables. PID 1 raises the two capabilities the
    program needs as ambient ones for the spawn; ``harden.settle_pid1``, which comes
    next, clears them with every other."""
    program = loaded()
    if program is None:
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    held: list[int] = []
    try:
        memory = os.memfd_create("warren-credsend-buffer", os.MFD_CLOEXEC)
        held.append(memory)
        os.ftruncate(memory, SIZE)
        shared = mmap.mmap(memory, SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        # above 4 first: the spawn's dup2 onto 3 and 4 then clobbers none of them
        for fd in (program, theirs.fileno(), memory):
            held.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10))
        exe, sock, buffer = held[1:]
        _sys.ambient_caps((CAP_SYS_ADMIN, CAP_SETPCAP))
        pid = os.posix_spawn(
            f"/proc/self/fd/{exe}",
            [NAME, str(os.getpid())],
            {},
            file_actions=[(os.POSIX_SPAWN_DUP2, sock, 3), (os.POSIX_SPAWN_DUP2, buffer, 4)],
            setsigmask=(),
        )
    except OSError:
        ours.close()
        return None
    finally:
        theirs.close()
        for fd in held:
            os.close(fd)
    return Sender(ours, shared, pid)
