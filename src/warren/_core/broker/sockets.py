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

Each call is read and judged first (``prepare``: no waiting), then made. A send is
tried at once without waiting (``MSG_DONTWAIT``, a flag of this call only); what would
wait — a send to a full buffer on a blocking socket, and every connect (a connect has
no such flag, and the process can flip its socket's ``O_NONBLOCK`` under the broker's
feet) — is made on one of the broker's workers (``pool``), blocking or not as the
socket says, exactly as the kernel would for the process. A worker interrupted
because its caller went away (a signal, death) gets ``EINTR``; the answer is dropped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import os
import signal
import socket
import stat
import struct
from collections.abc import Callable

from .. import _sys, credsend
from .call import AT_FDCWD, Call, fd_arg_int
from .places import Places

SOCKADDR_MAX = 128  # sizeof(struct sockaddr_storage): the kernel refuses longer (EINVAL)
UIO_MAXIOV = 1024
# Bytes per call (sendmmsg: all its messages), read into PID 1 — whose memory is the
# sandbox's: a stream socket gets a short write beyond, others EMSGSIZE (above any
# datagram the default socket buffers take).
MAX_SEND = 1 << 20
MAX_CONTROL = 256 << 10  # above any optmem_max: the kernel says ENOBUFS too
MSG_DONTWAIT = 0x40
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
    if len(raw) <= 2 or struct.unpack_from("=H", raw)[0] != socket.AF_UNIX:
        return raw, -1
    if raw[2] == 0:
        return (raw, -1) if places.abstract else -errno.EACCES
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


def _inet_peer(raw: bytes, family: int) -> tuple[str, int] | None:
    """(address, port) of a sockaddr_in or sockaddr_in6 (an IPv4-mapped IPv6 address as
    IPv4); None when it is too short to be one."""
    try:
        port = struct.unpack_from("!H", raw, 2)[0]
        if family == socket.AF_INET:
            return socket.inet_ntop(socket.AF_INET, raw[4:8]), port
        addr = ipaddress.IPv6Address(raw[8:24])
    except (struct.error, ValueError, OSError):
        return None
    return (str(addr.ipv4_mapped) if addr.ipv4_mapped else str(addr)), port


def _local(address: str) -> bool:
    """Does ``address`` lead to this host's loopback (127/8, ::1, or the unspecified
    address, which connect() takes for it)?"""
    addr = ipaddress.ip_address(address)
    return addr.is_loopback or addr.is_unspecified


def _address(call: Call, ptr: int, length_arg: int) -> bytes | int:
    length = fd_arg_int(length_arg)
    if length < 0 or length > SOCKADDR_MAX:
        return -errno.EINVAL
    if not length:
        return b""
    raw = call.read(ptr, length)
    return -errno.EFAULT if raw is None else raw


class Pending:
    """A socket call read and judged, holding what it needs (the copy of the socket,
    the judged peer, copies of passed fds) until ``close``."""

    def __init__(self, call: Call, fd: int, domain: int, kind: int) -> None:
        self.call, self.fd, self.domain, self.type = call, fd, domain, kind
        self.held: list[int] = []

    def now(self) -> int | None:
        """The result if the call can be made without waiting, else None."""
        return None

    def wait(self) -> int:
        """The call made as the process would (on a worker: it may block)."""
        raise NotImplementedError

    def close(self) -> None:
        for fd in (self.fd, *self.held):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.held = []
        self.fd = -1

    def judged(self, places: Places, raw: bytes, unix_dgram_only: bool = True) -> bytes | int:
        """The address to use, judged where the kernel would look it up: a connect's
        peer on a unix socket, a unix datagram socket's destination. -errno if refused."""
        if self.domain in (socket.AF_INET, socket.AF_INET6) and places.inet is not None and raw:
            family = struct.unpack_from("=H", raw)[0] if len(raw) >= 2 else -1
            if family == socket.AF_UNSPEC:
                return raw  # dissolves a datagram socket's association: reaches nothing
            return raw if _inet_peer(raw, family) in places.inet else -errno.EACCES
        if self.domain in (socket.AF_INET, socket.AF_INET6) and not places.loopback and raw:
            family = struct.unpack_from("=H", raw)[0] if len(raw) >= 2 else -1
            target = _inet_peer(raw, family) if family in (socket.AF_INET, socket.AF_INET6) else None
            if target is not None and _local(target[0]):
                return -errno.EACCES
        if self.domain != socket.AF_UNIX or not raw:
            return raw
        if unix_dgram_only and self.type != socket.SOCK_DGRAM:
            return raw  # a stream or seqpacket socket does not use it: the kernel says so
        peer = _peer(places, self.call, raw)
        if isinstance(peer, int):
            return peer
        address, held = peer
        if held >= 0:
            self.held.append(held)
        return address

    def _sigpipe(self, result: int, flags: int) -> int:
        """The kernel signals a writer to a stream whose other end is gone: the broker
        wrote for the process, so the process gets the signal. Sent before the answer
        it is pending when the call returns, as on the host (the default action ends
        the process there; ignored or blocked, the answer still arrives) — unless the
        process has a handler: that would interrupt its wait and restart the call, so
        the signal follows the answer instead."""
        if result == -errno.EPIPE and not flags & MSG_NOSIGNAL and self.type == socket.SOCK_STREAM:
            pidfd = self.call.pidfd

            def send() -> None:
                with contextlib.suppress(OSError):  # gone meanwhile
                    signal.pidfd_send_signal(pidfd, signal.SIGPIPE)

            if _catches(self.call.pid, signal.SIGPIPE):
                self.call.after = send
            else:
                send()
        return result


def _catches(pid: int, sig: int) -> bool:
    """Has the process a handler for ``sig`` (its SigCgt mask)?"""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (sig - 1)))
    except (OSError, ValueError):
        pass
    return False


def _socket(call: Call, fd_arg: int) -> tuple[int, int, int] | int:
    """The copy of the process's socket, its domain and type; -errno."""
    fd = call.their_fd(fd_arg)
    if fd < 0:
        return fd
    kind = _sys.socket_kind(fd)
    if isinstance(kind, int):
        os.close(fd)
        return kind
    return fd, kind[0], kind[1]


class _Connect(Pending):
    address = b""

    def wait(self) -> int:
        return _retrying(self.call, lambda: _sys.connect(self.fd, self.address))


class _Message:
    """One message: judged address, data, control with copied fds (``rights``, in the
    order its SCM_RIGHTS name them). ``creds_at``: where the control names the caller
    (its own SCM_CREDENTIALS); ``caller``: the caller's tgid, named as the sender when
    the credentials sender makes the send (``_core.credsend``), 0 when it may not."""

    def __init__(
        self,
        address: bytes,
        parts: list[bytes],
        ctl: bytes,
        rights: list[int] | None = None,
        creds_at: list[int] | None = None,
        caller: int = 0,
        sender: credsend.Sender | None = None,
    ) -> None:
        self.address, self.parts, self.ctl = address, parts, ctl
        self.rights, self.creds_at, self.caller, self.sender = rights or [], creds_at or [], caller, sender

    def send(self, fd: int, flags: int) -> int:
        if self.sender is not None and self.caller:
            sent = self._by_sender(fd, flags, self.sender)
            if sent is not None:
                return sent
        return _sys.sendmsg(fd, self.address or None, self.parts, self._pid1_control(), flags)

    def _pid1_control(self) -> bytes:
        """The control as PID 1 may send it: the caller's own SCM_CREDENTIALS name PID 1
        (the kernel allows a sender only its own pid)."""
        if not self.creds_at:
            return self.ctl
        buf = bytearray(self.ctl)
        for at in self.creds_at:
            if at >= 0:  # (another pid stays, for the kernel to refuse)
                struct.pack_into("=i", buf, at, os.getpid())
        return bytes(buf)

    def _by_sender(self, fd: int, flags: int, sender: credsend.Sender) -> int | None:
        """The send made by the credentials sender, which never waits (MSG_DONTWAIT):
        waiting, as a blocking socket would, is done here (``poll``), and a blocking
        stream's rest is sent as the kernel would. None: it could not (ended)."""
        wait = not flags & MSG_DONTWAIT and not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
        stream = wait and _sys.socket_kind(fd) == (socket.AF_UNIX, socket.SOCK_STREAM)
        total = 0
        while True:
            data = b"".join(self.parts)
            named = 0 if self.creds_at else self.caller  # its own SCM_CREDENTIALS name it already
            result = sender.send(fd, self.address, data, self.ctl, self.rights, flags | MSG_DONTWAIT, named)
            if result is None:
                return total or None
            if result == -errno.EAGAIN and wait:
                ready = _sys.poll_out(fd, _sys.send_timeout_ms(fd))
                if ready > 0:
                    continue
                result = ready or -errno.EAGAIN  # interrupted, or SO_SNDTIMEO passed
            if result < 0:
                return total or result
            total += result
            if not stream or result >= len(data):
                return total
            self.skip(result)

    def skip(self, sent: int) -> None:
        """Drop what a short write sent (its control went with the first byte)."""
        rest, self.ctl, self.rights, self.creds_at = [], b"", [], []
        for part in self.parts:
            if sent >= len(part):
                sent -= len(part)
                continue
            rest.append(part[sent:])
            sent = 0
        self.parts = rest


class _Send(Pending):
    message: _Message
    flags = 0
    sent = 0

    def now(self) -> int | None:
        # MSG_DONTWAIT, a flag of this call only, never waits whatever the process does
        # to its socket's O_NONBLOCK meanwhile; the process's own choice decides after.
        result = self.message.send(self.fd, self.flags | MSG_DONTWAIT)
        if self.flags & MSG_DONTWAIT or fcntl.fcntl(self.fd, fcntl.F_GETFL) & os.O_NONBLOCK:
            return self._sigpipe(result, self.flags)  # it asked not to wait: as it is
        if result == -errno.EAGAIN:
            return None  # it would wait: a worker does, as the process would
        total = sum(len(p) for p in self.message.parts)
        if 0 <= result < total and self.type == socket.SOCK_STREAM:
            self.sent = result  # a blocking stream write goes on with the rest
            self.message.skip(result)
            return None
        return self._sigpipe(result, self.flags)

    def wait(self) -> int:
        result = _retrying(self.call, lambda: self.message.send(self.fd, self.flags))
        if self.sent:
            return self.sent + max(result, 0)
        return self._sigpipe(result, self.flags)


class _SendMany(Pending):
    """sendmmsg: each message as sendmsg, its ``msg_len`` written back; the count sent,
    or the first error when none was. Made on a worker."""

    vec = 0
    flags = 0
    messages: list[_Message | int]

    def wait(self) -> int:
        sent = 0
        for i, message in enumerate(self.messages):
            result = (
                message
                if isinstance(message, int)
                else _retrying(
                    self.call,
                    lambda m=message: m.send(self.fd, self.flags),  # type: ignore[misc]
                )
            )
            if result < 0:
                return self._sigpipe(result, self.flags) if sent == 0 else sent
            if not self.call.write(self.vec + _MMSGHDR * i + _MSGHDR_SIZE, struct.pack("=I", result)):
                return sent or -errno.EFAULT
            sent += 1
        return sent


def _control(call: Call, ctl: bytes, held: list[int], rights: list[int], creds_at: list[int]) -> bytes | int:
    """The control messages with the process's fds (SCM_RIGHTS) replaced by copies
    (added to ``held``, closed after the send, and to ``rights`` in order); -errno as
    the kernel would say. Where an SCM_CREDENTIALS names the caller goes to
    ``creds_at``; one naming another pid stays as it is, for the kernel to refuse."""
    buf = bytearray(ctl)
    off = 0
    caller = 0
    while off + 16 <= len(buf):
        size, level, kind = struct.unpack_from("=Qii", buf, off)
        if size < 16 or off + size > len(buf):
            break  # the kernel stops at the first header that does not fit
        if level == socket.SOL_SOCKET and kind == SCM_RIGHTS:
            for at in range(off + 16, off + size - 3, 4):
                (theirs,) = struct.unpack_from("=i", buf, at)
                ours = call.their_fd(theirs)
                if ours < 0:
                    return -errno.EBADF
                held.append(ours)
                rights.append(ours)
                struct.pack_into("=i", buf, at, ours)
        elif level == socket.SOL_SOCKET and kind == SCM_CREDENTIALS and size >= 28:
            (pid,) = struct.unpack_from("=i", buf, off + 16)
            caller = caller or _caller_tgid(call)
            if pid == caller:
                creds_at.append(off + 16)
            else:
                creds_at.append(-1)  # another pid: never made by the sender
        off += (size + 7) & ~7
    return bytes(buf)


def _caller_tgid(call: Call) -> int:
    """The caller's process (its thread group), as the kernel names a sender."""
    if call.tgid:
        return call.tgid
    tgid = _sys.pidfd_tgid(call.pidfd) if call.pidfd >= 0 else None
    if tgid is None:
        try:
            with open(f"/proc/{call.pid}/status") as f:
                tgid = next((int(line.split()[1]) for line in f if line.startswith("Tgid:")), call.pid)
        except OSError:
            tgid = call.pid
    call.tgid = tgid
    return tgid


def _message(places: Places, pending: Pending, msg_ptr: int) -> _Message | int:
    """One ``struct msghdr`` of the process, read and judged; -errno."""
    call = pending.call
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
            if pending.type != socket.SOCK_STREAM:
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
    rights: list[int] = []
    creds_at: list[int] = []
    copied = _control(call, ctl, pending.held, rights, creds_at)
    if isinstance(copied, int):
        return copied
    address = pending.judged(places, raw)
    if isinstance(address, int):
        return address
    return _sent_as(places, pending, _Message(address, parts, copied, rights, creds_at))


def _sent_as(places: Places, pending: Pending, message: _Message) -> _Message:
    """A unix message to no pathname (connected, abstract or unnamed) goes by the
    credentials sender when there is one, naming the caller as the host's kernel would;
    everything else, and a message naming another pid, is PID 1's to send."""
    sender = places.sender
    if sender is None or not sender.alive or pending.domain != socket.AF_UNIX:
        return message
    if len(message.address) > 2 and message.address[2] != 0:
        return message  # a pathname, judged: PID 1's /proc/self/fd/N of it
    if -1 in message.creds_at:
        return message
    message.caller = _caller_tgid(pending.call)
    message.sender = sender
    return message


def _prepared(pending: Pending, outcome: int | None) -> Pending | int:
    if outcome is not None:
        pending.close()
        return outcome
    return pending


def connect(places: Places, call: Call) -> Pending | int:
    got = _socket(call, call.args[0])
    if isinstance(got, int):
        return got
    pending = _Connect(call, *got)
    raw = _address(call, call.args[1], call.args[2])
    if isinstance(raw, int):
        return _prepared(pending, raw)
    address = pending.judged(places, raw, unix_dgram_only=False)
    if isinstance(address, int):
        return _prepared(pending, address)
    pending.address = address
    return pending


def sendto(places: Places, call: Call) -> Pending | int:
    got = _socket(call, call.args[0])
    if isinstance(got, int):
        return got
    pending = _Send(call, *got)
    length = min(call.args[2], 0x7FFFFFFF)
    if length > MAX_SEND and pending.type != socket.SOCK_STREAM:
        return _prepared(pending, -errno.EMSGSIZE)
    raw = _address(call, call.args[4], call.args[5])
    if isinstance(raw, int):
        return _prepared(pending, raw)
    data = call.read(call.args[1], min(length, MAX_SEND))
    if data is None:
        return _prepared(pending, -errno.EFAULT)
    address = pending.judged(places, raw)
    if isinstance(address, int):
        return _prepared(pending, address)
    pending.message = _sent_as(places, pending, _Message(address, [data], b""))
    pending.flags = call.args[3] & 0xFFFFFFFF
    return pending


def sendmsg(places: Places, call: Call) -> Pending | int:
    got = _socket(call, call.args[0])
    if isinstance(got, int):
        return got
    pending = _Send(call, *got)
    message = _message(places, pending, call.args[1])
    if isinstance(message, int):
        return _prepared(pending, message)
    pending.message = message
    pending.flags = call.args[2] & 0xFFFFFFFF
    return pending


def sendmmsg(places: Places, call: Call) -> Pending | int:
    got = _socket(call, call.args[0])
    if isinstance(got, int):
        return got
    pending = _SendMany(call, *got)
    pending.vec, pending.flags = call.args[1], call.args[3] & 0xFFFFFFFF
    pending.messages = []
    size = 0
    for i in range(min(call.args[2] & 0xFFFFFFFF, UIO_MAXIOV)):
        message = _message(places, pending, pending.vec + _MMSGHDR * i)
        if not isinstance(message, int):
            size += sum(len(p) for p in message.parts)
            if size > MAX_SEND and pending.messages:
                break  # the count says how many went: the caller sends the rest again
        pending.messages.append(message)
        if isinstance(message, int):
            break  # sent up to here, then this error (or the count)
    return pending


def listen(places: Places, call: Call) -> Pending | int:
    """listen(2), brokered in the degraded mode under network none or allow only: an IP
    socket not bound to a loopback address is refused (``EACCES``). Never bound, the
    kernel would bind it to every address of the host (autobind), reachable from the
    network past the proxy; Landlock's bind rule does not see that bind. Made here on
    the judged socket (the copy shares it), never let through."""
    got = _socket(call, call.args[0])
    if isinstance(got, int):
        return got
    fd, domain, _kind = got
    sock = socket.socket(fileno=fd)
    try:
        if domain in (socket.AF_INET, socket.AF_INET6) and places.inet is not None:
            host = sock.getsockname()[0]
            port = sock.getsockname()[1]
            if not port or not ipaddress.ip_address(host.split("%", 1)[0]).is_loopback:
                return -errno.EACCES
        backlog = fd_arg_int(call.args[1])
        sock.listen(backlog if 0 <= backlog <= 0x7FFFFFFF else 0x7FFFFFFF)
        return 0
    except OSError as e:
        return -(e.errno or errno.EIO)
    finally:
        sock.close()


HANDLERS: dict[str, Callable[[Places, Call], Pending | int]] = {
    "listen": listen,
    "connect": connect,
    "sendto": sendto,
    "sendmsg": sendmsg,
    "sendmmsg": sendmmsg,
}
