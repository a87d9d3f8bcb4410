"""Socket calls for a sandboxed process: ``connect``, ``sendto`` with an address,
``sendmsg``, ``sendmmsg``.

Landlock covers pathname unix sockets only from ABI 9, so a sandbox could reach a host
socket outside the hidden directories. A pathname socket may be reached only inside
the writable roots or the sandbox's private ``/tmp`` and ``/dev/shm``; anything else
gets ``EACCES``. Abstract addresses stay in the sandbox's own network namespace.

None of these is ever let through (``CONTINUE``): the kernel would look up the fd and
read the address again, and another thread of the process can ``dup2`` a unix socket
onto the fd number, or rewrite the address, between the broker's look and the kernel's.
So the broker acts on what it judged: the copy of the process's fd (``pidfd_getfd``
shares its open file description, so connecting the copy connects the process's
socket), with the address and data bytes it read — for every family, TCP included —
and returns the result. Control messages go along with their fds copied from the
process (``SCM_RIGHTS``); ``SCM_CREDENTIALS`` naming the caller names PID 1 instead
(the kernel allows a sender only its own pid).

These calls can block (a full backlog, a TCP handshake, a full send buffer), so they
run on the broker's workers (``pool``), never on its own thread; the socket's own
``O_NONBLOCK`` decides, as for the process. A worker interrupted because its caller
went away (a signal, death) returns ``EINTR`` and the answer is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
import struct
from collections.abc import Callable

from .. import _sys
from .call import AT_FDCWD, Call, Outcome, fd_arg_int
from .places import Places

SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage): the kernel refuses longer (EINVAL)
UIO_MAXIOV = 1024
MAX_SEND = 4 << 20  # bytes per call: a stream socket gets a short write beyond, others EMSGSIZE
MAX_CONTROL = 256 << 10  # above any optmem_max: the kernel says ENOBUFS too
MSG_NOSIGNAL = 0x4000
SCM_RIGHTS = 1
SCM_CREDENTIALS = 2
_MSGHDR = struct.Struct("=QI4xQQQQ")  # name, namelen, iov, iovlen, control, controllen
_MSGHDR_SIZE = 56  # with msg_flags and padding
_MMSGHDR = 64  # struct msghdr + unsigned msg_len, padded


def _retrying(call: Call, act: Callable[[], int]) -> int:
    """Run ``act``; again after EINTR while the caller still waits (a stray signal to
    the worker). A caller gone away is not waited for."""
    result = act()
    while result == -errno.EINTR and call.valid():
        result = act()
    return result


def _peer(places: Places, call: Call, raw: bytes) -> tuple[bytes, int] | int:
    """For an AF_UNIX pathname address: the address to use instead (the judged socket
    file, through ``/proc/self/fd``) and the fd to close after; -errno when it may not
    be reached. Any other address (abstract, unnamed) as it is."""
    if len(raw) <= 2 or struct.unpack_from("=H", raw)[0] != socket.AF_UNIX or raw[2] == 0:
        return raw, -1
    path = raw[2:].split(b"\0", 1)[0]
    try:
        fd = os.open(call.resolve(AT_FDCWD, path), os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        return -(e.errno or errno.EIO)
    try:
        if not places.inside(fd):
            os.close(fd)
            return -errno.EACCES
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            os.close(fd)
            return -errno.ECONNREFUSED
    except OSError as e:
        os.close(fd)
        return -(e.errno or errno.EIO)
    return struct.pack("=H", socket.AF_UNIX) + f"/proc/self/fd/{fd}".encode() + b"\0", fd


def _address(call: Call, ptr: int, length_arg: int) -> bytes | int:
    length = fd_arg_int(length_arg)
    if length < 0 or length > SOCKADDR_MAX:
        return -errno.EINVAL
    if not length:
        return b""
    raw = call.read(ptr, length)
    return -errno.EFAULT if raw is None else raw


class _Socket:
    """The copy of the process's socket for one call: its fd, domain and type."""

    def __init__(self, call: Call, fd_arg: int) -> None:
        self.fd = call.their_fd(fd_arg)
        self.error = self.fd if self.fd < 0 else 0
        self.domain = self.type = -1
        if self.fd >= 0:
            kind = _sys.socket_kind(self.fd)
            if isinstance(kind, int):
                self.error = kind
            else:
                self.domain, self.type = kind

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def judged(self, places: Places, call: Call, raw: bytes) -> tuple[bytes, int] | int:
        """The address to use: judged where the kernel would look it up (a unix
        datagram socket's destination; a connect's peer is judged by ``connect``)."""
        if self.domain == socket.AF_UNIX and self.type == socket.SOCK_DGRAM and raw:
            return _peer(places, call, raw)
        return raw, -1


def connect(places: Places, call: Call) -> Outcome:
    sock = _Socket(call, call.args[0])
    try:
        if sock.error:
            return sock.error
        raw = _address(call, call.args[1], call.args[2])
        if isinstance(raw, int):
            return raw
        peer = _peer(places, call, raw) if sock.domain == socket.AF_UNIX else (raw, -1)
        if isinstance(peer, int):
            return peer
        address, held = peer
        try:
            return _retrying(call, lambda: _sys.connect(sock.fd, address))
        finally:
            if held >= 0:
                os.close(held)
    finally:
        sock.close()


def _sigpipe(call: Call, sock: _Socket, result: int, flags: int) -> None:
    """The kernel signals a writer to a stream whose other end is gone: the broker
    wrote for the process, so the process gets the signal (after its answer)."""
    if result == -errno.EPIPE and not flags & MSG_NOSIGNAL and sock.type == socket.SOCK_STREAM:
        pidfd = call.pidfd

        def send() -> None:
            with contextlib.suppress(OSError):  # gone meanwhile
                signal.pidfd_send_signal(pidfd, signal.SIGPIPE)

        call.after = send


def sendto(places: Places, call: Call) -> Outcome:
    sock = _Socket(call, call.args[0])
    try:
        if sock.error:
            return sock.error
        length = min(call.args[2], 0x7FFFFFFF)
        if length > MAX_SEND and sock.type != socket.SOCK_STREAM:
            return -errno.EMSGSIZE
        raw = _address(call, call.args[4], call.args[5])
        if isinstance(raw, int):
            return raw
        data = call.read(call.args[1], min(length, MAX_SEND))
        if data is None:
            return -errno.EFAULT
        flags = call.args[3] & 0xFFFFFFFF
        result = _send(places, call, sock, raw, [data], b"", flags)
        _sigpipe(call, sock, result, flags)
        return result
    finally:
        sock.close()


def _send(
    places: Places, call: Call, sock: _Socket, raw: bytes, parts: list[bytes], ctl: bytes, flags: int
) -> int:
    peer = sock.judged(places, call, raw)
    if isinstance(peer, int):
        return peer
    address, held = peer
    try:
        return _retrying(call, lambda: _sys.sendmsg(sock.fd, address or None, parts, ctl, flags))
    finally:
        if held >= 0:
            os.close(held)


def _control(call: Call, ctl: bytes) -> tuple[bytes, list[int]] | int:
    """The control messages with the process's fds (SCM_RIGHTS) replaced by copies,
    and those copies (to close after the send); -errno as the kernel would say."""
    buf = bytearray(ctl)
    held: list[int] = []
    off = 0
    while off + 16 <= len(buf):
        size, level, kind = struct.unpack_from("=Qii", buf, off)
        if size < 16 or off + size > len(buf):
            break  # the kernel stops at the first header that does not fit
        if level == socket.SOL_SOCKET and kind == SCM_RIGHTS:
            for at in range(off + 16, off + size - 3, 4):
                (theirs,) = struct.unpack_from("=i", buf, at)
                ours = call.their_fd(theirs)
                if ours < 0:
                    for fd in held:
                        os.close(fd)
                    return -errno.EBADF
                held.append(ours)
                struct.pack_into("=i", buf, at, ours)
        elif level == socket.SOL_SOCKET and kind == SCM_CREDENTIALS and size >= 28:
            (pid,) = struct.unpack_from("=i", buf, off + 16)
            if pid == _caller_tgid(call):
                struct.pack_into("=i", buf, off + 16, os.getpid())
        off += (size + 7) & ~7
    return bytes(buf), held


def _caller_tgid(call: Call) -> int:
    try:
        with open(f"/proc/{call.pid}/status") as f:
            for line in f:
                if line.startswith("Tgid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return call.pid


def _message(places: Places, call: Call, sock: _Socket, msg_ptr: int, flags: int) -> int:
    """One ``struct msghdr`` of the process, sent on the copy: bytes sent or -errno."""
    hdr = call.read(msg_ptr, _MSGHDR_SIZE)
    if hdr is None:
        return -errno.EFAULT
    name_ptr, namelen, iov, iovlen, control, controllen = _MSGHDR.unpack_from(hdr)
    raw = b""
    if name_ptr:
        length = fd_arg_int(namelen)
        if length < 0:
            return -errno.EINVAL
        got = _address(call, name_ptr, min(length, SOCKADDR_MAX))
        if isinstance(got, int):
            return got
        raw = got
    if iovlen > UIO_MAXIOV:
        return -errno.EMSGSIZE
    vec = call.read(iov, 16 * iovlen) if iovlen else b""
    if vec is None:
        return -errno.EFAULT
    parts: list[bytes] = []
    room = MAX_SEND
    for i in range(iovlen):
        base, size = struct.unpack_from("=QQ", vec, 16 * i)
        if size > room:
            if sock.type != socket.SOCK_STREAM:
                return -errno.EMSGSIZE
            size = room  # a short write, as a stream may give
        part = call.read(base, size) if size else b""
        if part is None:
            return -errno.EFAULT
        parts.append(part)
        room -= size
    if controllen > MAX_CONTROL:
        return -errno.ENOBUFS
    ctl = call.read(control, controllen) if controllen else b""
    if ctl is None:
        return -errno.EFAULT
    copied = _control(call, ctl)
    if isinstance(copied, int):
        return copied
    ctl, held = copied
    try:
        return _send(places, call, sock, raw, parts, ctl, flags)
    finally:
        for fd in held:
            os.close(fd)


def sendmsg(places: Places, call: Call) -> Outcome:
    sock = _Socket(call, call.args[0])
    try:
        if sock.error:
            return sock.error
        flags = call.args[2] & 0xFFFFFFFF
        result = _message(places, call, sock, call.args[1], flags)
        _sigpipe(call, sock, result, flags)
        return result
    finally:
        sock.close()


def sendmmsg(places: Places, call: Call) -> Outcome:
    """Each message as ``sendmsg``, its ``msg_len`` written back; the count sent, or
    the first error when none was."""
    sock = _Socket(call, call.args[0])
    try:
        if sock.error:
            return sock.error
        vec, flags = call.args[1], call.args[3] & 0xFFFFFFFF
        sent = 0
        for i in range(min(call.args[2] & 0xFFFFFFFF, UIO_MAXIOV)):
            result = _message(places, call, sock, vec + _MMSGHDR * i, flags)
            if result < 0:
                if sent == 0:
                    _sigpipe(call, sock, result, flags)
                    return result
                break
            if not call.write(vec + _MMSGHDR * i + _MSGHDR_SIZE, struct.pack("=I", result)):
                return sent or -errno.EFAULT
            sent += 1
        return sent
    finally:
        sock.close()


HANDLERS: dict[str, Callable[[Places, Call], Outcome]] = {
    "connect": connect,
    "sendto": sendto,
    "sendmsg": sendmsg,
    "sendmmsg": sendmmsg,
}
