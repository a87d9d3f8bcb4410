"""An exec in a long-lived sandbox goes from the supervisor to the spare helper's
command process itself (the exec stub, confined already), with the command's stdio,
while the helper gets the request without them and follows the command: the helper's
wake-up and work are off the command's path. What must hold:

- the supervisor gives the stub the command only when the stub says it waits (its
  first byte, looked at and left for the helper); a Python launcher, a stub not ready
  yet, or a spare that is gone get the request the way they did before (unit tests of
  ``Box.hand`` on socket pairs, the stub's side read back);
- an unused spare that PID 1 lets go leaves no stub waiting: the supervisor lets go of
  its copy of the stub's channel once the helper's channel ends;
- what the helper did, the stub now does as the helper would (live, judged from the
  host and by results): a relative cwd, the default directory removed (its nearest
  ancestor, said in a warning), a PATH search that finds nothing (CommandNotFound with
  the PATH searched), a non-executable file first in PATH, PATH set by the request,
  stdin given or /dev/null.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import selectors
import socket
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import Layout, comm, server_of
from test_direct_handoff import _wait_spare
from warren import PolicySpec, Sandbox, protocol, wire
from warren._core import execstub, shim
from warren._core.procs import table
from warren.errors import CommandNotFound, ExecError
from warren.server.box import Box
from warren.server.supervisor import Supervisor


class _Sent:
    def __init__(self) -> None:
        self.calls: list[tuple[protocol.Message, list[int]]] = []

    def __call__(self, msg: protocol.Message, fds: list[int] | None = None) -> None:
        self.calls.append((msg, list(fds or [])))


def _box(first: bytes | None) -> tuple[Box, socket.socket, socket.socket, socket.socket, _Sent]:
    """A Box holding a spare helper's channel and a copy of the helper's end of its
    stub's; returns it with the helper's end of the first, the helper's own copy of
    the second and the stub's end of it. ``first``: what the stub said (None: nothing
    yet)."""
    spare, helper = socket.socketpair()
    stub_mine, stub = socket.socketpair()
    helper_stub = stub_mine.dup()  # the helper's: the same open socket as the supervisor's
    if first is not None:
        stub.sendall(first)
    box = Box.__new__(Box)
    sent = _Sent()
    box.sel = selectors.DefaultSelector()
    box.spare, box.spare_stub = spare, stub_mine
    box.sel.register(spare, selectors.EVENT_READ, ("spare", box))
    box.launched = SimpleNamespace(counters=[])  # type: ignore[assignment]
    box.send = sent  # type: ignore[method-assign]
    return box, helper, helper_stub, stub, sent


def _handoff() -> protocol.Handoff:
    command = protocol.Command(argv=["echo", "hi"], env={}, stdio=[False, True, True])
    return protocol.Handoff(request=protocol.ExecRequest(sandbox="x", command=command), extra=["active"])


def _fds(n: int) -> list[int]:
    return [os.open(os.devnull, os.O_RDONLY) for _ in range(n)]


def _inode(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def _received(sock: socket.socket) -> tuple[bytes, list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(sock, 1 << 20, 8, socket.MSG_DONTWAIT)
    return data, fds


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_waiting_stub_gets_the_command_and_the_helper_the_rest() -> None:
    """The stub gets all three stdio descriptors, /dev/null where the client attached
    none (stdin here), opened by the supervisor and closed once sent: the stub opens
    nothing itself (a writing open that would wait in the hard-link walk's window)."""
    box, helper, helper_stub, stub, sent = _box(execstub.READY)
    conn, out, err, active = _fds(4)
    request = execstub.request("/w", "echo", -1, ["echo", "hi"], {}, search=True)
    before = _open_fds()
    box.hand(_handoff(), conn, [out, err], [active], request)
    assert _open_fds() == before - 2  # both channels of the spare let go, no /dev/null kept
    assert box.spare is None and box.spare_stub is None and not box.sel.get_map()
    assert sent.calls == []  # not through PID 1
    data, fds = _received(helper)
    msg = protocol.decode(data[wire.PREFIX.size :])
    assert isinstance(msg, protocol.Handoff) and msg.launched
    assert [_inode(fd) for fd in fds] == [_inode(conn), _inode(active)]  # no stdio
    assert helper_stub.recv(1) == execstub.READY  # the byte was left for the helper
    data, fds = _received(stub)
    null = os.stat(os.devnull)
    assert data == request
    assert [_inode(fd) for fd in fds] == [(null.st_dev, null.st_ino), _inode(out), _inode(err)]
    assert os.fstat(fds[0]).st_rdev == null.st_rdev
    assert fcntl.fcntl(fds[0], fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDWR


def test_the_stubs_request_gives_every_stdio_descriptor() -> None:
    """What the supervisor builds for the stub: no /dev/null for the stub to open, with
    stdin attached or not (``Box.hand`` fills in the ones not attached)."""
    plan = SimpleNamespace(cwd="/w", workspace="/w", scratch="", env={"PATH": "/usr/bin"}, unset_env=())
    for stdio in ([False, True, True], [True, True, True], [False, False, False]):
        command = protocol.Command(argv=["true"], env={}, stdio=stdio)
        request = shim.stub_request(plan, command)  # type: ignore[arg-type]
        assert request is not None
        fields = request[4:].split(b"\0")
        assert fields[5] == b"000", fields


def test_without_dev_null_the_helper_gets_the_stdio(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where /dev/null cannot be opened (a host without it): the helper gets the
    request with the stdio, as for a Python launcher, and the stub gets nothing."""
    import warren.server.box as box_module

    box, helper, _helper_stub, stub, _sent = _box(execstub.READY)
    conn, out, err, active = _fds(4)

    def refused(path: str, *args: object) -> int:
        raise FileNotFoundError(2, "No such file or directory", path)

    monkeypatch.setattr(box_module.os, "open", refused)
    box.hand(_handoff(), conn, [out, err], [active], execstub.request("/w", "echo", -1, ["echo"], {}))
    monkeypatch.undo()
    data, fds = _received(helper)
    msg = protocol.decode(data[wire.PREFIX.size :])
    assert isinstance(msg, protocol.Handoff) and not msg.launched
    assert [_inode(fd) for fd in fds] == [_inode(conn), _inode(out), _inode(err), _inode(active)]
    with pytest.raises(BlockingIOError):
        stub.recv(1, socket.MSG_DONTWAIT)


@pytest.mark.parametrize("first", [execstub.PYTHON, execstub.HARDENED, b"R", None])
def test_a_process_that_is_no_waiting_stub_gets_nothing_from_the_supervisor(first: bytes | None) -> None:
    """A Python launcher, a stub of another format, or one not ready yet: the helper
    gets the request with the stdio, as before, and the stub's channel stays empty."""
    box, helper, helper_stub, stub, sent = _box(first)
    conn, out, err, active = _fds(4)
    request = execstub.request("/w", "echo", -1, ["echo", "hi"], {}, search=True, nulls="100")
    box.hand(_handoff(), conn, [out, err], [active], request)
    data, fds = _received(helper)
    msg = protocol.decode(data[wire.PREFIX.size :])
    assert isinstance(msg, protocol.Handoff) and not msg.launched
    assert [_inode(fd) for fd in fds] == [_inode(conn), _inode(out), _inode(err), _inode(active)]
    if first is not None:
        assert helper_stub.recv(8, socket.MSG_DONTWAIT) == first  # left for the helper
    with pytest.raises(BlockingIOError):
        stub.recv(1, socket.MSG_DONTWAIT)  # nothing from the supervisor
    assert sent.calls == []


def test_a_spare_gone_gets_nothing_and_pid1_gets_the_request_whole() -> None:
    box, helper, helper_stub, stub, sent = _box(execstub.READY)
    helper.close()
    conn, out, err, active = _fds(4)
    request = execstub.request("/w", "echo", -1, ["echo", "hi"], {}, search=True, nulls="100")
    box.hand(_handoff(), conn, [out, err], [active], request)
    ((msg, fds),) = sent.calls
    assert isinstance(msg, protocol.Handoff) and not msg.launched and msg.before == {}
    assert fds == [conn, out, err, active]
    assert helper_stub.recv(1) == execstub.READY
    with pytest.raises(BlockingIOError):
        stub.recv(1, socket.MSG_DONTWAIT)  # the stub got no command: nobody would follow it


def test_the_stubs_channel_is_let_go_when_its_helper_goes_unused() -> None:
    """PID 1 lets an unused spare go (idle) without forking the next: the supervisor,
    which holds a copy of the helper's end of the stub's channel, closes it when the
    helper's channel ends, so the stub sees its end and exits (else it would wait for as
    long as the sandbox lives)."""
    box = Box.__new__(Box)
    box.sel = selectors.DefaultSelector()
    box.spare = box.spare_stub = None
    spare_mine, helper = socket.socketpair()
    stub_mine, stub = socket.socketpair()
    box._control_message(protocol.Spare(), [spare_mine.detach(), stub_mine.detach()])
    assert box.spare is not None and box.spare_stub is not None
    helper.close()  # the helper went
    ((key, _mask),) = box.sel.select(timeout=5)
    kind, obj = key.data
    assert (kind, obj) == ("spare", box)
    Supervisor._event(None, kind, obj, _mask)  # type: ignore[arg-type]  # what the loop does with it
    assert box.spare is None and box.spare_stub is None and not box.sel.get_map()
    stub.settimeout(5)
    assert stub.recv(1) == b""  # its end: the stub exits


@pytest.fixture
def sb(layout: Layout, state_home: Path) -> Sandbox:
    """A live sandbox under a supervisor of this test's own (``state_home`` removes it
    and shuts that supervisor down)."""
    return Sandbox.create(PolicySpec(workspace=str(layout.workspace)))


def _ready(sb: Sandbox) -> None:
    """The spare helper and its stub wait (so the next exec goes to the stub directly
    where there is one)."""
    _wait_spare(sb.pid1)
    time.sleep(0.05)


def test_what_the_helper_did_the_stub_does_the_same(sb: Sandbox, layout: Layout) -> None:
    ws = layout.workspace
    (ws / "sub").mkdir()
    _ready(sb)
    assert sb.exec(["pwd"], cwd="sub").stdout.decode().strip() == str(ws / "sub")
    _ready(sb)
    r = sb.exec(["sh", "-c", "cat; echo out; echo err >&2; exit 3"], stdin=b"in\n")
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"in\nout\n", b"err\n")
    _ready(sb)
    assert sb.exec(["sh", "-c", "cat; echo end"]).stdout == b"end\n"  # stdin: /dev/null
    _ready(sb)
    with pytest.raises(CommandNotFound) as e:
        sb.exec(["no-such-command-anywhere"])
    assert e.value.hint is not None and "PATH=" in e.value.hint
    bin_a, bin_b = ws / "a", ws / "b"
    bin_a.mkdir()
    bin_b.mkdir()
    (bin_a / "tool").write_text("#!/bin/sh\necho a\n")  # not executable: execve says EACCES
    (bin_b / "tool").write_text("#!/bin/sh\necho b\n")
    (bin_b / "tool").chmod(0o755)
    _ready(sb)
    assert sb.exec(["tool"], env={"PATH": f"{bin_a}:{bin_b}"}).stdout == b"b\n"
    (bin_b / "tool").unlink()
    _ready(sb)
    with pytest.raises(ExecError) as e:
        sb.exec(["tool"], env={"PATH": f"{bin_a}:{bin_b}"})
    assert e.value.errno == 13
    _ready(sb)
    assert sb.exec(["pwd"]).stdout.decode().strip() == str(ws)


def test_the_default_directory_removed_is_its_nearest_ancestor_with_a_warning(
    layout: Layout, state_home: Path
) -> None:
    ws = layout.workspace
    # The parent is writable too, so the policy allows removing the workspace itself.
    box = Sandbox.create(PolicySpec(workspace=str(ws), write=[str(layout.root)]))
    assert box.exec(["rm", "-rf", str(ws)]).exit_code == 0
    assert not ws.exists()
    _ready(box)
    r = box.exec(["pwd"])
    assert (r.exit_code, r.stdout.decode().strip(), r.cwd) == (0, str(layout.root), str(layout.root)), r
    assert "does not exist" in r.warnings[0], r


def test_a_launcher_not_needed_goes_though_the_supervisor_holds_its_channel() -> None:
    """A spare PID 1 lets go discards its command's process while the supervisor may
    still hold a copy of the helper's end of their channel (it lets go of it only once
    the helper has exited): the process never sees that end close, and discarding must
    not wait for it to (it did: the helper and its stub stayed for the sandbox's life)."""
    import signal

    from warren._core.shim import Launcher

    ours, theirs = socket.socketpair()
    held_by_supervisor = ours.dup()
    pid = os.fork()
    if pid == 0:
        ours.close()
        held_by_supervisor.close()
        theirs.recv(1)  # as the stub: waits for a request or its channel's end
        os._exit(0)
    theirs.close()
    launcher = Launcher.__new__(Launcher)
    launcher.pid, launcher.sock = pid, ours

    def too_long(_signum: int, _frame: object) -> None:
        raise TimeoutError("discard waited for a process that never exits")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(10)  # a regression fails here instead of hanging the suite
    try:
        launcher.discard()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        held_by_supervisor.close()
        with contextlib.suppress(ChildProcessError, ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # only if it was left (the regression)
            os.waitpid(pid, 0)
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reaped


def _credentials_sender(pid: int) -> bool:
    """PID 1's child for the sandbox's whole life (``_core.credsend``), not a helper."""
    return comm(pid) == "warren-credsend"


def test_an_unused_spare_goes_with_its_stub(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, state_home: Path
) -> None:
    """PID 1 lets an unused spare go after ``WARREN_SPARE_IDLE`` seconds: the helper and
    its stub both end (judged from the host: PID 1 is left with its credentials sender
    alone), and the next exec is
    served (a spare forked for it)."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    assert box.exec(["true"]).exit_code == 0
    _wait_spare(box.pid1)
    deadline = time.monotonic() + 15
    server = server_of(box.pid1)
    while left := [pid for pid, ppid, _ in table() if ppid == server and not _credentials_sender(pid)]:
        assert time.monotonic() < deadline, f"PID 1 still has {left} after the spare's idle time"
        time.sleep(0.1)
    assert box.exec(["echo", "after"]).stdout == b"after\n"
