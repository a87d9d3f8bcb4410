"""``warren run --network ask`` on a terminal: the sandbox's connections that wait for an
answer become questions on the user's terminal, one at a time, answered by one key.

Never written into a full-screen program: the command's output is watched for the
alternate screen (``ESC [ ? 1049 h`` and its older forms), and a question waits while the
program is there (its connection times out if the program never leaves it). While a
question is open the command's output is held back (its own line stays readable) and
the key typed is the answer, not the command's input. Everything shown is escaped: the
host name comes from the sandbox.
"""

from __future__ import annotations

import contextlib
import os

from .. import protocol, wire
from ..terminal import printable

_ENTER = (b"\x1b[?1049h", b"\x1b[?1047h", b"\x1b[?47h")
_LEAVE = (b"\x1b[?1049l", b"\x1b[?1047l", b"\x1b[?47l")
_KEEP = max(len(s) for s in _ENTER) - 1  # bytes kept: a sequence split between two reads
MAX_WAITING = 64  # questions held (the helper's queue holds as many)


class Questions:
    """The requests waiting for this terminal's answer, and the one asked now."""

    def __init__(self, sock: wire.Sock, tty: int) -> None:
        self.sock = sock
        self.tty = tty
        self.waiting: dict[int, str] = {}  # request id -> "METHOD host:port", in order
        self.asked = 0  # the request whose question is on the terminal
        self.alternate = False  # the command is in the alternate screen
        self.tail = b""
        self.name = ""  # the run's name for `warren net`, once the helper said it

    def introduce(self, name: str) -> None:
        """The run asks here, by this name for ``warren net``: said once, before the
        command's output (which may switch to the alternate screen) is read."""
        self.name = printable(name)
        if not self.alternate:
            self._say(
                "warren: connections to hosts not on the list are asked here; in a full-screen "
                f"program, answer from another terminal: warren net {self.name} pending\r\n"
            )

    def watch(self, output: bytes) -> None:
        """The command's output, as it goes to the terminal."""
        seen = self.tail + output
        enter = max(seen.rfind(s) for s in _ENTER)
        leave = max(seen.rfind(s) for s in _LEAVE)
        if enter != leave:  # both -1: no change
            self.alternate = enter > leave
        self.tail = seen[-_KEEP:]

    def event(self, event: dict[str, object]) -> bool:
        """A network event; True when it was about a question (nothing else to say)."""
        if event.get("kind") == "ask":
            if not self.name:  # a supervisor that did not say it in Started
                self.introduce(str(event.get("sandbox", "")))
            return True
        request = event.get("request")
        if not isinstance(request, int) or not request:
            return False
        if event.get("kind") == "pending":
            what = printable(f"{event.get('method')} {event.get('host')}:{event.get('port')}")
            if len(self.waiting) >= MAX_WAITING:  # the end of one was not seen (the log's rate limit)
                self.waiting.pop(next(iter(self.waiting)))
            self.waiting[request] = what
            return True
        # The decision of a connection that waited: answered (here or elsewhere), timed out.
        self.waiting.pop(request, None)
        if request == self.asked:
            self._say(f"\r\nwarren: request {request} ended before an answer here\r\n")
            self.asked = 0
        return False

    def next(self) -> bool:
        """Ask the oldest waiting request, when one waits and none is asked and the
        command is not in the alternate screen; whether a question is open."""
        if self.asked:
            return True
        if not self.waiting or self.alternate:
            return False
        self.asked, what = next(iter(self.waiting.items()))
        self._say(
            f"\r\nwarren: the sandbox asks to connect: {what} (request {self.asked}); "
            "allow it? [y] once, [a] always, [n] no: "
        )
        return True

    def answer(self, key: bytes) -> None:
        """The key typed while a question is open: y, a (approve, always), else reject."""
        request, self.asked = self.asked, 0
        self.waiting.pop(request, None)
        choice = key[:1].lower()
        approve, always = choice in (b"y", b"a"), choice == b"a"
        said = "always allowed" if always else "allowed once" if approve else "refused"
        self._say(f"{said}\r\n")
        message = protocol.NetPolicyRequest(
            sandbox="",
            action="approve" if approve else "reject",
            id=request,
            always=always,
            via="cli terminal",
        )
        with contextlib.suppress(OSError):  # the run is ending: its Exited says the rest
            wire.send(self.sock, message)

    def _say(self, text: str) -> None:
        with contextlib.suppress(OSError):
            os.write(self.tty, text.encode(errors="replace"))
