"""The broker's socket concern (``_core.broker.sockets``) in this process: what it
sends in place of the process's control messages and data, with a stand-in call."""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import sys

from warren._core.broker import sockets


class FakeCall:
    """A call whose process's fds are this process's (copied with dup)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.pidfd = -1  # its thread group is read from /proc (sockets._caller_tgid)
        self.tgid = 0

    def their_fd(self, fd: int) -> int:
        try:
            return os.dup(fd)
        except OSError as e:
            return -e.errno


def _cmsg(level: int, kind: int, data: bytes) -> bytes:
    size = 16 + len(data)
    return struct.pack("=Qii", size, level, kind) + data + b"\0" * (-size % 8)


def test_passed_fds_are_sent_as_copies_and_held_until_the_send_is_done() -> None:
    r, w = os.pipe()
    held: list[int] = []
    ctl = _cmsg(socket.SOL_SOCKET, sockets.SCM_RIGHTS, struct.pack("=ii", r, w))
    rights: list[int] = []
    out = sockets._control(FakeCall(os.getpid()), ctl, held, rights, [])  # type: ignore[arg-type]
    assert isinstance(out, bytes) and len(out) == len(ctl)
    sent = list(struct.unpack_from("=ii", out, 16))
    assert sent == held == rights and not {r, w} & set(sent)
    assert [os.fstat(a).st_ino for a in sent] == [os.fstat(b).st_ino for b in (r, w)]
    for fd in (*held, r, w):
        os.close(fd)


def test_a_bad_fd_in_scm_rights_is_ebadf_and_copies_made_stay_held_for_closing() -> None:
    r, w = os.pipe()
    os.close(w)
    held: list[int] = []
    ctl = _cmsg(socket.SOL_SOCKET, sockets.SCM_RIGHTS, struct.pack("=ii", r, 1 << 20))  # no such fd
    got = sockets._control(FakeCall(os.getpid()), ctl, held, [], [])  # type: ignore[arg-type]
    assert got == -errno.EBADF
    assert len(held) == 1  # closed by the call's close, as every copy
    for fd in (*held, r):
        os.close(fd)


def test_credentials_naming_the_caller_name_the_broker_and_others_pass_as_they_are() -> None:
    """Sent by PID 1 (no credentials sender): credentials naming the caller name PID 1
    instead, another pid stays for the kernel to refuse; the credentials sender is never
    handed a message naming another pid."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        mine = struct.pack("=iII", child.pid, os.getuid(), os.getgid())
        other = struct.pack("=iII", 4242, os.getuid(), os.getgid())
        ctl = _cmsg(socket.SOL_SOCKET, sockets.SCM_CREDENTIALS, mine)
        ctl += _cmsg(socket.SOL_SOCKET, sockets.SCM_CREDENTIALS, other)
        creds_at: list[int] = []
        out = sockets._control(FakeCall(child.pid), ctl, [], [], creds_at)  # type: ignore[arg-type]
        assert isinstance(out, bytes) and creds_at == [16, -1]
        assert out == ctl  # as the caller wrote it, for the credentials sender
        by_pid1 = sockets._Message(b"", [b"x"], out, creds_at=creds_at)._pid1_control()
        assert struct.unpack_from("=iII", by_pid1, 16) == (os.getpid(), os.getuid(), os.getgid())
        assert struct.unpack_from("=iII", by_pid1, 32 + 16) == (4242, os.getuid(), os.getgid())
    finally:
        child.kill()
        child.wait()


def test_a_short_stream_write_goes_on_with_the_rest_and_without_the_control() -> None:
    message = sockets._Message(b"", [b"abc", b"defg", b"h"], b"control")
    message.skip(5)
    assert message.parts == [b"fg", b"h"] and message.ctl == b""
    message.skip(2)
    assert message.parts == [b"h"]


def test_a_blocking_send_waits_as_long_as_the_sockets_send_timeout_says() -> None:
    """The wait the broker does for a blocking send made by the credentials sender
    (``_sys.poll_out``) is as long as SO_SNDTIMEO (in ms, rounded up), or unbounded."""
    from warren._core import _sys

    a, b = socket.socketpair()
    with a, b:
        assert _sys.send_timeout_ms(a.fileno()) == -1
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("=qq", 1, 500_000))
        assert _sys.send_timeout_ms(a.fileno()) == 1500
        # a part of a millisecond (as the kernel keeps it: in its ticks) is rounded up
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("=qq", 0, 1500))
        sec, usec = struct.unpack("=qq", a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16))
        assert _sys.send_timeout_ms(a.fileno()) == sec * 1000 + (usec + 999) // 1000 >= 2
