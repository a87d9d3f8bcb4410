"""`warren run --network ask` on a terminal never writes a question into a full-screen
program: the command's output (the pty) and the connection's event (a pipe) reach the
CLI by different descriptors, in no set order, so a question is asked only after what
the command wrote before is read (``cli.attach.Attached._catch_up``). Judged on a real
pty: the program's switch to the alternate screen is written before the event comes,
and not yet read when the CLI opens its next question."""

from __future__ import annotations

import os
import pty
import socket

from warren import protocol, wire
from warren.cli.asking import Questions
from warren.cli.attach import Attached
from warren.client.relay import Relay


def _attached(master: int, shown: int, sock: wire.Sock) -> Attached:
    """The CLI's side of a run on a terminal, its command's pty ``master`` followed, the
    terminal being ``shown``, one connection waiting for an answer."""
    att = Attached(protocol.ExecRequest(sandbox="s", command=protocol.Command(argv=["sh"])))
    att.master, att.out_fd, att.saved_mode = master, shown, []
    att.relay = Relay(sock, lambda: RuntimeError("lost"))
    att.relay.on_read(master, att._from_command)
    att.questions = Questions(sock, shown)
    att.questions.waiting[7] = "GET 127.0.0.2:80"
    return att


def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    out = b""
    try:
        while chunk := os.read(fd, 65536):
            out += chunk
    except BlockingIOError:
        pass
    return out


def test_no_question_is_asked_over_a_switch_to_the_alternate_screen_not_yet_read() -> None:
    master, slave = pty.openpty()
    shown_r, shown_w = os.pipe()
    ours, _theirs = socket.socketpair()
    try:
        os.write(slave, b"\x1b[?1049hIN-ALT\n")  # written before the connection was made
        att = _attached(master, shown_w, wire.Sock(fileno=ours.detach()))
        att._ask_next()  # the event came first: asked before this change
        shown = _read_all(shown_r)
        assert b"IN-ALT" in shown  # the program's output, relayed
        assert b"the sandbox asks" not in shown and not att.questions.asked  # type: ignore[union-attr]
        # Control: once the program leaves the alternate screen, the question comes.
        os.write(slave, b"\x1b[?1049lLEFT\n")
        att._ask_next()
        shown = _read_all(shown_r)
        assert b"LEFT" in shown and b"the sandbox asks to connect: GET 127.0.0.2:80 (request 7)" in shown
    finally:
        for fd in (master, slave, shown_r, shown_w):
            os.close(fd)
