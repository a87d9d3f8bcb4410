"""``warren run`` and ``warren exec``: thin clients of the warm supervisor.

They send the request with this process's stdio descriptors, relay signals and the
exit status, and nothing else. The user's terminal is never handed to the sandbox:
when a standard stream is a terminal, the command gets a pseudo-terminal made inside
the sandbox, whose master end comes back here and is relayed (raw mode, window size,
Ctrl-C as a byte the inner terminal turns into SIGINT). Whatever the command leaves
behind cannot read what the user types after it returned.

If this process is killed (even SIGKILL), the connection closes and warren kills the
command's whole tree.

The native front end (native/warren.c) sends the plain requests itself and, when what
comes back is anything but the plain case, hands the connection over to this module
(``WARREN_NATIVE_RESUME``, ``take_over``): the rest — messages, hints, exit codes — is
then done here, so there is one implementation of it.
"""

from __future__ import annotations

import errno
import os
import select
import struct

from .. import jsonc, protocol, wire
from ..client import checks, connect
from ..client.relay import Relay
from ..errors import SandboxError, WarrenError
from ..terminal import printable

TYPE_CHECKING = False
if TYPE_CHECKING:
    import signal
    from typing import Any

    from .asking import Questions
else:
    import _signal as signal  # the C module: ``signal`` would load enum (start-up time)

_FORWARD = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
RESUME_VAR = "WARREN_NATIVE_RESUME"

# Set by ``take_over``: the connection the native front end sent the request on, its
# network-event pipe (-1 for exec), and the Started it already read (None: nothing read),
# or UNTAKEN: the connection was reset before any word (its error is read: the socket
# has nothing more to say), the request never read.
UNTAKEN = "untaken"
_handed: tuple[int, int, protocol.Started | str | None] | None = None


def take_over(value: str) -> None:
    """Carry on a request the native front end sent: ``value`` is "SOCK NET STARTED"
    (descriptor numbers, then the JSON of a Started it read, or nothing). It blocked
    the forwarded signals before sending; they are unblocked once ours are in place."""
    global _handed
    import stat

    from .flags import UsageError

    try:
        sock_fd, net_fd, started = value.split(" ", 2)
        sock, net = int(sock_fd), int(net_fd)
        if not stat.S_ISSOCK(os.fstat(sock).st_mode):
            raise ValueError(f"descriptor {sock} is not a socket")
        # the network events' channel: the native side's is a socket (it peeks at it)
        if net != -1 and not stat.S_ISSOCK(os.fstat(net).st_mode):
            raise ValueError(f"descriptor {net} is not a socket")
        msg: protocol.Message | str | None = None
        if started == UNTAKEN:
            msg = UNTAKEN
        elif started:
            msg = protocol.decode(started.encode(), (protocol.Started,))
    except (ValueError, OSError, WarrenError) as e:
        raise UsageError(
            f"{RESUME_VAR} is set but names no connection to carry on ({e})",
            operation="cli",
            hint=f"it is set by warren's native front end only: unset {RESUME_VAR}",
        ) from None
    assert msg is None or isinstance(msg, protocol.Started | str)
    for fd in (sock, net):
        if fd >= 0:
            os.set_inheritable(fd, False)
    _handed = (sock, net, msg)


def handed_reply(op: str, expect: tuple[type[protocol.Message], ...]) -> protocol.Message | None:
    """The reply to a request of one answer (a create) the native front end sent, read
    here on its connection; None when none was handed over, or when the supervisor it
    reached went away without reading it (``connect.request`` then sends it again, to
    the next one, as it does its own). The forwarded signals it blocked are let through
    first: one that came meanwhile acts as it would have on this process."""
    global _handed
    if _handed is None:
        return None
    sock, net, said = _handed
    _handed = None
    if net >= 0:
        os.close(net)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARD)
    if isinstance(said, str):  # UNTAKEN
        os.close(sock)
        connect.forget()
        return None
    msg, _ = connect.reply(wire.Sock(fileno=sock), op, expect)
    return msg


def _terminal_fds() -> list[int]:
    return [fd for fd in (0, 1, 2) if _isatty(fd)]


def _isatty(fd: int) -> bool:
    try:
        return os.isatty(fd)
    except OSError:
        return False


def _size(fd: int) -> tuple[int, int]:
    import fcntl
    import termios

    try:
        rows, cols, _, _ = struct.unpack("HHHH", fcntl.ioctl(fd, termios.TIOCGWINSZ, b"\0" * 8))
        return rows or 24, cols or 80
    except OSError:
        return 24, 80


class Attached:
    def __init__(self, message: protocol.RunRequest | protocol.ExecRequest) -> None:
        self.message = message
        self.argv = message.command.argv
        self.ttys = _terminal_fds()
        self.master = -1
        self.saved_mode: list[Any] | None = None
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.pending: list[int] = []
        self.network = ""
        self.repository: str | None = None
        # Refusals by kind ("METHOD host:port", reason) -> how many, in order of first sight.
        self.refused: dict[tuple[str, str], int] = {}
        self.live = False  # the first of each kind is said as it happens (``_live_notices``)
        # --network ask on a terminal: its waiting connections asked here (``cli.asking``)
        self.questions: Questions | None = None
        self.relay: Relay | None = None
        self.out_fd = 1 if 1 in self.ttys else 2 if 2 in self.ttys else 0

    def run(self) -> int:
        command = self.message.command
        fds = [fd for fd in (0, 1, 2) if fd not in self.ttys]
        command.stdio = [fd in fds for fd in (0, 1, 2)]
        if self.ttys:
            rows, cols = _size(self.ttys[0])
            command.tty = protocol.Tty(rows=rows, cols=cols, fds=self.ttys)
        self.live = _live_notices(self.ttys)
        for sig in (*_FORWARD, signal.SIGWINCH):
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        try:
            try:
                if _handed is not None:
                    signal.pthread_sigmask(signal.SIG_UNBLOCK, _FORWARD)
                    sock, net_r, said = _handed
                    if isinstance(said, str):  # UNTAKEN
                        for fd in (sock, net_r):
                            if fd >= 0:
                                os.close(fd)
                        raise connect.NotTaken
                    return self._follow(wire.Sock(fileno=sock), net_r, said)
                return self._follow(*self._send(fds), None)
            except connect.NotTaken:
                # The supervisor reached went away without reading the request (sent
                # here or by the native front end): nothing ran, nothing was read from
                # our descriptors. Once more, to the next one.
                connect.forget()
            try:
                return self._follow(*self._send(fds), None)
            except connect.NotTaken:
                raise self._lost() from None
        finally:
            signal.set_wakeup_fd(-1)
            self._restore_terminal()
            if self.master >= 0:
                os.close(self.master)

    def _send(self, fds: list[int]) -> tuple[wire.Sock, int]:
        """Connect and send the request with ``fds`` (and, for a run, the write end of a
        new pipe for its proxy's decisions): the connection and that pipe's read end."""
        net_r = -1
        if isinstance(self.message, protocol.RunRequest):
            net_r, net_w = os.pipe2(os.O_CLOEXEC)
            self.message.net_events = True
            try:
                sock = connect.for_run()
            except BaseException:
                os.close(net_r)
                os.close(net_w)
                raise
            if 0 in self.ttys and self.out_fd in self.ttys and os.environ.get("WARREN_ASK") != "0":
                from .asking import Questions

                self.message.net_ask = True
                self.questions = Questions(sock, self.out_fd)
            try:
                connect.send_request(sock, self.message, [*fds, net_w])
            except BaseException:
                sock.close()
                os.close(net_r)
                raise
            finally:
                os.close(net_w)
            return sock, net_r
        sock = connect.supervisor()
        try:
            connect.send_request(sock, self.message, fds)
        except BaseException:
            sock.close()
            raise
        return sock, net_r

    def _follow(self, sock: wire.Sock, net_r: int, already: protocol.Started | None) -> int:
        try:
            return self._loop(sock, net_r, already)
        finally:
            sock.close()
            if net_r >= 0:
                os.close(net_r)

    def _on_signal(self, signum: int, _frame: object) -> None:
        self.pending.append(signum)

    def _raw_terminal(self) -> None:
        if 0 not in self.ttys:
            return
        import termios
        import tty

        try:
            if os.tcgetpgrp(0) == os.getpgrp():  # in the background, leave the terminal alone
                self.saved_mode = termios.tcgetattr(0)
                tty.setraw(0)
        except (termios.error, OSError):
            pass

    def _restore_terminal(self) -> None:
        if self.saved_mode is not None:
            import termios

            _ignoring((termios.error, OSError), termios.tcsetattr, 0, termios.TCSADRAIN, self.saved_mode)
            self.saved_mode = None

    def _loop(self, sock: wire.Sock, net_r: int, already: protocol.Started | None) -> int:
        partial = b""
        relay = self.relay = Relay(sock, self._lost)

        def wake(fd: int) -> bool:
            _drain_pipe(fd, lambda _chunk: None)
            self._deliver(sock)
            return True

        def net(fd: int) -> bool:
            nonlocal partial
            chunk = os.read(fd, 65536)
            partial = self._print_refusals(partial + chunk)
            return bool(chunk)

        def started(msg: protocol.Started, fds: list[int]) -> None:
            self.network = msg.network
            self.repository = msg.repository
            for w in msg.warnings:
                _say(f"warren: WARNING: {w}")
            if msg.ask_name and self.questions is not None:
                self.questions.introduce(msg.ask_name)
            if fds:
                self.master = fds[0]
                relay.on_read(self.master, self._from_command)
                if 0 in self.ttys:
                    relay.on_read(0, self._from_user)
                self._raw_terminal()

        relay.on_read(self.wake_r, wake)
        if net_r >= 0:
            relay.on_read(net_r, net)
        if already is not None:
            relay.heard = True
            started(already, [])
        msg = relay.follow(started)
        assert msg is not None  # no deadline: only the command's exit ends it
        if self.master >= 0:
            _ignoring(OSError, self._catch_up)  # what is left once the command exited
        self._restore_terminal()
        if net_r >= 0:
            os.set_blocking(net_r, False)
            chunks = [partial]
            _drain_pipe(net_r, chunks.append)
            self._print_refusals(b"".join(chunks) + b"\n")
        self._sum_up_refusals()
        for w in msg.warnings:
            _say(f"warren: WARNING: {w}")
        return self._status(msg)

    def _lost(self) -> SandboxError:
        sandbox = self.message.sandbox if isinstance(self.message, protocol.ExecRequest) else None
        return connect.lost_command(self.message.TAG, sandbox)

    def _status(self, msg: protocol.Exited) -> int:
        code = protocol.exit_code(msg.status)
        if msg.timed_out:
            if msg.limit is not None:
                # What may have held it up: a fork or an allocation failing at the limit
                # (a build retrying forks until the timeout). The kill was the timeout's.
                from .hints import limit_reached

                _say(f"warren: {limit_reached(msg.limit, 0)}")
            _say(
                f"warren: the command ran past its timeout of {self.message.command.timeout} s and was killed"
            )
            return 124
        if msg.limit is not None:
            from .hints import limit_reached

            _say(f"warren: {limit_reached(msg.limit, code)}")
        if code != 0:
            from .hints import after_failure

            for hint in after_failure(self.argv, self.network, self.repository):
                _say(f"warren: hint: {hint}")
        return code

    def _deliver(self, sock: wire.Sock) -> None:
        while self.pending:
            sig = self.pending.pop(0)
            if sig == signal.SIGWINCH:
                if self.master >= 0 and self.ttys:
                    import fcntl
                    import termios

                    rows, cols = _size(self.ttys[0])
                    size = struct.pack("HHHH", rows, cols, 0, 0)
                    _ignoring(OSError, fcntl.ioctl, self.master, termios.TIOCSWINSZ, size)
                continue
            _ignoring(OSError, wire.send, sock, protocol.Signal(signal=int(sig)))

    def _from_command(self, fd: int) -> bool:
        more = self._copy(fd, self.out_fd)
        self._ask_next()
        return more

    def _from_user(self, fd: int) -> bool:
        """Keys for the command, or the answer to the question on the terminal."""
        if self.questions is None or not self.questions.asked:
            return self._copy(fd, self.master)
        key = os.read(fd, 64)
        if not key:
            return False
        self.questions.answer(key)
        self._ask_next()
        return True

    def _ask_next(self) -> None:
        """Open the next question when one may be asked; the command's output is held
        back exactly while one is open."""
        if self.questions is None or self.relay is None or self.master < 0:
            return
        if self.questions.waiting and not self.questions.asked and self.master in self.relay.readers:
            self._catch_up()
        asking = self.saved_mode is not None and self.questions.next()
        if asking:
            self.relay.readers.pop(self.master, None)
        elif self.master not in self.relay.readers:
            self.relay.on_read(self.master, self._from_command)

    def _catch_up(self) -> None:
        """Relay what the command has written so far, without waiting for more: before
        a question is asked (its output and the connection's event come by different
        descriptors, in no set order, so a switch to the alternate screen made before
        the connection could be unread yet; a read of the pty that finds nothing first
        flushes what the kernel still holds for it), and once the command exited."""
        os.set_blocking(self.master, False)
        try:
            while self._copy(self.master, self.out_fd):
                pass
        except BlockingIOError:
            pass
        finally:
            os.set_blocking(self.master, True)

    def _copy(self, src: int, dst: int) -> bool:
        try:
            data = os.read(src, 65536)
        except OSError as e:
            if e.errno == errno.EIO:  # the pty's other side is closed
                return False
            raise
        if not data:
            return False
        if src == self.master and self.questions is not None:
            self.questions.watch(data)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(dst, view) :]
            except BlockingIOError:
                select.select([], [dst], [])
        return True

    def _print_refusals(self, data: bytes) -> bytes:
        """Decisions arrive as JSON lines (``net.log``); refusals are counted by kind, the
        first of each said at once when that is safe (``self.live``), escaped."""
        lines, _, rest = data.rpartition(b"\n")
        for line in lines.splitlines():
            event: Any
            try:
                event = jsonc.loads(line.decode(errors="replace"))
                if self.questions is not None and self.questions.event(event):
                    continue
                if event["allowed"] or event.get("kind", "request") != "request":
                    continue
                kind = (
                    printable(f"{event['method']} {event['host']}:{event['port']}"),
                    printable(str(event["reason"])),
                )
            except (ValueError, KeyError, TypeError):
                continue
            seen = self.refused.get(kind, 0)
            self.refused[kind] = seen + 1
            if self.live and not seen:
                _say(f"warren: network: refused {kind[0]}: {kind[1]}")
        self._ask_next()
        return rest

    def _sum_up_refusals(self) -> None:
        """Once the command ended (its terminal given back): one line per kind of refusal,
        with how many there were; a kind said already is repeated only for its count."""
        for (what, reason), count in self.refused.items():
            if not self.live:
                _say(
                    f"warren: network: refused {what}"
                    + (f" ({count} times)" if count > 1 else "")
                    + f": {reason}"
                )
            elif count > 1:
                _say(f"warren: network: refused {what} ({count} times in all): {reason}")
        self.refused.clear()


def _live_notices(ttys: list[int]) -> bool:
    """Whether a notice may be written while the command runs: stderr is a terminal the
    command does not draw on (its stdout is not one: no full-screen program can be
    overwritten), or WARREN_LIVE_NOTICES=1 asks for it. Otherwise each kind is said once
    the command ended, counted: a log or an agent's captured output gets no line per
    retry in the middle of the command's own."""
    asked = os.environ.get("WARREN_LIVE_NOTICES")
    if asked is not None:
        return asked == "1"
    return _isatty(2) and 1 not in ttys


def _say(line: str) -> None:
    data = (line.replace("\n", "\r\n") if _isatty(2) else line).encode(errors="replace") + b"\n"
    _ignoring(OSError, os.write, 2, data)


def _ignoring(errors: type[BaseException] | tuple[type[BaseException], ...], fn: Any, *args: Any) -> None:
    """``fn(*args)``, ignoring ``errors`` (contextlib is not loaded on the fast path)."""
    try:  # noqa: SIM105 - the point is not to load contextlib
        fn(*args)
    except errors:
        pass


def _drain_pipe(fd: int, take: Any) -> None:
    """Read a non-blocking pipe until nothing is left now."""
    try:
        while chunk := os.read(fd, 65536):
            take(chunk)
    except BlockingIOError:
        pass


def _workspace(spec: dict[str, object]) -> str | None:
    workspace = spec.get("workspace")
    return workspace if isinstance(workspace, str) else None


def run(spec: dict[str, object], profile: str | None, argv: list[str], timeout: float | None = None) -> int:
    message = protocol.RunRequest(
        spec=protocol.Spec.of(spec),
        caller=protocol.Caller(
            cwd=checks.caller_cwd(_workspace(spec)), env=dict(os.environ), config=True, profile=profile
        ),
        command=protocol.Command(argv=argv, timeout=timeout),
    )
    return Attached(message).run()


def run_json(spec: dict[str, object], profile: str | None, argv: list[str], timeout: float | None) -> int:
    """``run --json``: the command runs with its output captured (stdin is /dev/null),
    then the result is one JSON document on stdout, in the form the HTTP API's run
    answers; the exit status is still the command's (124 for a timeout)."""
    import json

    from .. import codec
    from ..client.local import LocalTransport
    from ..client.transport import Command
    from ..policy.spec import from_mapping

    result = LocalTransport().run(
        from_mapping(spec, "flags"),
        Command.checked("run", argv, timeout=timeout),
        config=True,
        profile=profile,
    )
    print(json.dumps(codec.result(result)))
    return 124 if result.timed_out else result.exit_code


def exec_(name: str, argv: list[str], cwd: str | None, env: dict[str, str], timeout: float | None) -> int:
    message = protocol.ExecRequest(
        sandbox=name, command=protocol.Command(argv=argv, cwd=cwd, env=env, timeout=timeout), origin="cli"
    )
    return Attached(message).run()


__all__ = ["exec_", "run"]
