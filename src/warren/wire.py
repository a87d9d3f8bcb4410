"""The message format between warren clients, the supervisor and a sandbox's PID 1.

Owns framing only: a message is a JSON header plus an optional raw payload (file
contents, a pickled plan), sent over a unix stream socket, with file descriptors
(stdio of an exec) attached as SCM_RIGHTS to its first byte. It must not know what
the messages mean. Also owns binding/connecting unix sockets whose path is longer
than ``sun_path`` allows (deep ``$XDG_STATE_HOME``), through ``/proc/self/fd``.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import struct
from collections.abc import Iterator, Sequence
from typing import Any

_HEADER = struct.Struct("!IQ")  # JSON length, payload length
_MAX_FDS = 8
_SUN_PATH_MAX = 100


class ConnectionClosed(EOFError):
    """The peer closed the connection before a whole message arrived."""


def send(sock: socket.socket, msg: dict[str, Any], payload: bytes = b"", fds: Sequence[int] = ()) -> None:
    head = json.dumps(msg, separators=(",", ":")).encode()
    data = _HEADER.pack(len(head), len(payload)) + head
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
        sent = sock.sendmsg([data], ancillary)
        data = data[sent:]
    if payload:
        sock.sendall(data)
        sock.sendall(payload)
    elif data:
        sock.sendall(data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionClosed("connection closed mid-message")
        got += k
    return bytes(buf)


def recv(sock: socket.socket) -> tuple[dict[str, Any], bytes, list[int]]:
    """One message: (header, payload, received fds). Received fds are close-on-exec."""
    fds: list[int] = []
    first = b""
    space = socket.CMSG_SPACE(_MAX_FDS * 4)
    while len(first) < _HEADER.size:
        data, ancdata, _flags, _addr = sock.recvmsg(_HEADER.size - len(first), space, socket.MSG_CMSG_CLOEXEC)
        for level, kind, blob in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                arr = array.array("i")
                arr.frombytes(blob[: len(blob) - len(blob) % 4])
                fds.extend(arr)
        if not data:
            for fd in fds:
                os.close(fd)
            raise ConnectionClosed("connection closed")
        first += data
    head_len, payload_len = _HEADER.unpack(first)
    try:
        msg = json.loads(_recv_exact(sock, head_len))
        payload = _recv_exact(sock, payload_len) if payload_len else b""
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return msg, payload, fds


@contextlib.contextmanager
def _short(path: str) -> Iterator[str]:
    """A name for ``path`` that fits in ``sun_path``."""
    if len(os.fsencode(path)) <= _SUN_PATH_MAX:
        yield path
        return
    dirfd = os.open(os.path.dirname(path) or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{dirfd}/{os.path.basename(path)}"
    finally:
        os.close(dirfd)


def listen(path: str, backlog: int = 128) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        with _short(path) as name:
            sock.bind(name)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        with _short(path) as name:
            sock.connect(name)
    except BaseException:
        sock.close()
        raise
    return sock


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)
