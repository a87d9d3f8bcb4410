"""Framing of protocol messages on unix stream sockets, with bounds everywhere.

A frame is an 8-byte prefix (JSON length, payload length), the JSON of one
``protocol`` message, then an optional raw payload; descriptors ride as SCM_RIGHTS on
the first bytes. Every length is checked before anything is allocated, a truncated
descriptor list is an error, and descriptors that arrived with a rejected frame are
closed. Blocking helpers serve clients and PID 1's helpers; ``Inbox``/``Outbox`` let
the single-threaded supervisor read and write many connections without ever waiting
on one of them.

Also owns the sockets' addresses: warren's control sockets are *abstract* unix
sockets, which live in a network namespace — every sandbox has its own, so no
sandbox can name them — plus the peer credentials a listener checks.
"""

from __future__ import annotations

import _socket as socket  # the C module: ``socket`` would load enum (start-up time)
import os
import select
import struct

from . import protocol
from .errors import ProtocolError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import socket as _stdsocket
    from collections.abc import Sequence

PREFIX = struct.Struct("!II")  # JSON length, payload length
MAX_HEADER = 4 * 1024 * 1024
MAX_PAYLOAD = 256 * 1024 * 1024
MAX_FDS = 8
# A request handed into a sandbox (supervisor -> PID 1 -> helper, or supervisor -> a
# spare helper) carries the client's connection, up to three stdio descriptors, the
# exec's end, one cgroup counter per controller and one watch per repository: more
# than ``MAX_FDS`` in a workspace with a nested repository. Those channels' peers are
# warren's own processes; a client's stay at ``MAX_FDS``.
HANDOFF_MAX_FDS = 64
_CMSG_SPACE = socket.CMSG_SPACE(MAX_FDS * 4)
SO_PEERPIDFD = 77  # Linux 6.5
Sock = socket.socket  # what every function here takes (``socket.socket`` is one too)


class ConnectionClosed(EOFError):
    """The peer closed the connection before a whole message arrived."""


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        try:  # noqa: SIM105 - contextlib is not loaded on the fast path
            os.close(fd)
        except OSError:
            pass


def frame(message: protocol.Message, payload_len: int = 0) -> bytes:
    head = message.encode()
    if len(head) > MAX_HEADER:
        raise ProtocolError(
            f"message too large: {len(head)} bytes of JSON (at most {MAX_HEADER})",
            operation="encode",
            hint="pass fewer or shorter arguments and environment variables",
        )
    if payload_len > MAX_PAYLOAD:
        raise ProtocolError(
            f"payload too large: {payload_len} bytes (at most {MAX_PAYLOAD})",
            operation="encode",
            hint="move large files with `warren cp` in parts, or through the workspace",
        )
    return PREFIX.pack(len(head), payload_len) + head


def send(
    sock: socket.socket, message: protocol.Message, payload: bytes = b"", fds: Sequence[int] = ()
) -> None:
    data = frame(message, len(payload))
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
        sent = sock.sendmsg([data], ancillary)
        data = data[sent:]
    if data:
        sock.sendall(data)
    if payload:
        sock.sendall(payload)


def _check_lengths(head_len: int, payload_len: int, max_payload: int) -> None:
    if not 0 < head_len <= MAX_HEADER:
        raise ProtocolError(
            f"malformed frame: header length {head_len} (at most {MAX_HEADER})",
            operation="decode",
            hint="only warren's own clients speak this protocol",
        )
    if payload_len > max_payload:
        raise ProtocolError(
            f"payload too large: {payload_len} bytes (at most {max_payload})",
            operation="decode",
            hint="move large files in parts, or through the workspace",
        )


def _take_fds(ancdata: list[tuple[int, int, bytes]], flags: int, fds: list[int], most: int = MAX_FDS) -> None:
    for level, kind, blob in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            whole = len(blob) - len(blob) % 4
            fds.extend(struct.unpack(f"{whole // 4}i", blob[:whole]))
    if flags & socket.MSG_CTRUNC:
        raise ProtocolError(f"malformed frame: more than {most} descriptors attached", operation="decode")


def _cmsg_space(max_fds: int) -> int:
    return _CMSG_SPACE if max_fds == MAX_FDS else socket.CMSG_SPACE(max_fds * 4)


def _recv_exact(sock: socket.socket, n: int, fds: list[int], max_fds: int = MAX_FDS) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        data, anc, flags, _ = sock.recvmsg(n - len(buf), _cmsg_space(max_fds), socket.MSG_CMSG_CLOEXEC)
        _take_fds(anc, flags, fds, max_fds)
        if not data:
            raise ConnectionClosed("connection closed mid-message" if buf else "connection closed")
        buf += data
    return bytes(buf)


def recv_header(
    sock: socket.socket,
    expect: tuple[type[protocol.Message], ...] = (),
    max_payload: int = MAX_PAYLOAD,
    max_fds: int = MAX_FDS,
) -> tuple[protocol.Message, int, list[int]]:
    """One message without its payload: (message, payload length, descriptors). The
    descriptors are close-on-exec and are closed again if the frame is rejected."""
    fds: list[int] = []
    try:
        head_len, payload_len = PREFIX.unpack(_recv_exact(sock, PREFIX.size, fds, max_fds))
        _check_lengths(head_len, payload_len, max_payload)
        message = protocol.decode(_recv_exact(sock, head_len, fds, max_fds), expect)
    except BaseException:
        _close(fds)
        raise
    return message, payload_len, fds


def recv_payload(sock: socket.socket, n: int) -> bytes:
    return _recv_exact(sock, n, []) if n else b""


def recv(
    sock: socket.socket,
    expect: tuple[type[protocol.Message], ...] = (),
    max_payload: int = MAX_PAYLOAD,
    max_fds: int = MAX_FDS,
) -> tuple[protocol.Message, bytes, list[int]]:
    message, n, fds = recv_header(sock, expect, max_payload, max_fds)
    try:
        payload = recv_payload(sock, n)
    except BaseException:
        _close(fds)
        raise
    return message, payload, fds


class Inbox:
    """Assemble one message header at a time from a non-blocking socket without ever
    reading past it: a payload stays in the socket for whoever the request is handed
    to."""

    def __init__(self, sock: socket.socket, max_fds: int = MAX_FDS) -> None:
        self.sock = sock
        self.max_fds = max_fds
        self.buf = bytearray()
        self.fds: list[int] = []
        self.head_len = -1
        self.payload_len = 0
        self.payload = bytearray()

    def read(
        self, expect: tuple[type[protocol.Message], ...] = ()
    ) -> tuple[protocol.Message, int, list[int]] | None:
        """A whole header if one is complete now, else None. Raises ConnectionClosed
        at end of file and ProtocolError for a malformed frame (descriptors closed)."""
        try:
            while True:
                want = PREFIX.size - len(self.buf) if self.head_len < 0 else self.head_len - len(self.buf)
                try:
                    data, anc, flags, _ = self.sock.recvmsg(
                        want, _cmsg_space(self.max_fds), socket.MSG_CMSG_CLOEXEC | socket.MSG_DONTWAIT
                    )
                except (BlockingIOError, InterruptedError):
                    return None
                _take_fds(anc, flags, self.fds, self.max_fds)
                if not data:
                    raise ConnectionClosed("connection closed")
                self.buf += data
                if len(self.buf) < (PREFIX.size if self.head_len < 0 else self.head_len):
                    continue
                if self.head_len < 0:
                    self.head_len, self.payload_len = PREFIX.unpack(self.buf)
                    _check_lengths(self.head_len, self.payload_len, MAX_PAYLOAD)
                    self.buf.clear()
                    continue
                message = protocol.decode(bytes(self.buf), expect)
                fds, self.fds = self.fds, []
                n = self.payload_len
                self.buf.clear()
                self.head_len, self.payload_len = -1, 0
                return message, n, fds
        except BaseException:
            self.close_fds()
            raise

    def read_payload(self, n: int) -> bytes | None:
        """The ``n`` payload bytes after the header ``read`` returned, once all have
        arrived; None until then. For requests the reader serves itself (the caller
        bounds ``n``). Raises ConnectionClosed at end of file."""
        while len(self.payload) < n:
            try:
                data = self.sock.recv(min(n - len(self.payload), 1 << 20), socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return None
            if not data:
                raise ConnectionClosed("connection closed mid-payload")
            self.payload += data
        data, self.payload = bytes(self.payload), bytearray()
        return data

    def close_fds(self) -> None:
        _close(self.fds)
        self.fds = []


class Outbox:
    """Frames queued for a non-blocking socket; ``flush`` writes what the socket takes
    now. Descriptors go with the first byte of their frame."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.queue: list[tuple[memoryview, list[int]]] = []

    def put(self, message: protocol.Message, payload: bytes = b"", fds: Sequence[int] = ()) -> None:
        # Descriptors are duplicated: the caller keeps (and closes) its own.
        self.queue.append((memoryview(frame(message, len(payload)) + payload), [os.dup(fd) for fd in fds]))

    @property
    def empty(self) -> bool:
        return not self.queue

    def flush(self) -> bool:
        """True once everything is written; raises OSError when the peer is gone."""
        while self.queue:
            data, fds = self.queue[0]
            try:
                if fds:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))]
                    n = self.sock.sendmsg([data], anc, socket.MSG_DONTWAIT)
                    _close(fds)
                    fds.clear()
                else:
                    n = self.sock.send(data, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return False
            if n < len(data):
                self.queue[0] = (data[n:], fds)
                return False
            self.queue.pop(0)
        return True

    def close(self) -> None:
        for _data, fds in self.queue:
            _close(fds)
        self.queue.clear()


# --- addresses and peers ---------------------------------------------------------------------


def readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` can be read (or has hung up) within ``timeout`` seconds (None:
    however long it takes). poll, not select: select refuses a descriptor numbered 1024
    or more, which a supervisor with a hundred or so sandboxes holds, and so may a client
    process with many connections open."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0.0, timeout) * 1000))


def abstract_name(token: str) -> str:
    """The address of a control socket: abstract (a leading NUL), so it exists only in
    the network namespace it was bound in — the host's, never a sandbox's."""
    return "\0warren-" + token


def listen_abstract(name: str, backlog: int = 512) -> _stdsocket.socket:
    import socket as stdsocket

    sock = stdsocket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.bind(name)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(name)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_creds(sock: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the peer, as this process's namespaces see them (pid 0: the
    peer is outside this process's pid namespace)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", creds)
    return pid, uid, gid


def peer_pidfd(sock: socket.socket) -> int | None:
    """A pidfd of the peer process as it was at connect time (Linux >= 6.5), else None."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERPIDFD, 4)
    except OSError:
        return None
    fd = int(struct.unpack("i", raw)[0])
    return fd if fd >= 0 else None
