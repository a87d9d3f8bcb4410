"""The library's connection made ahead (``client.connect.stand_by``): once a request is
sent, the library connects again and says ``Standby``; the supervisor accepts and
verifies that connection then, and holds it apart from the clients that wait
(``server.connections``), so the next exec is read the moment it is sent. What must
hold: the next request goes on it; a held connection keeps no supervisor alive; a
request sent on one that is closed as it goes is sent again, once, on a new one; a
forked child never speaks on its parent's; the supervisor takes a request after a
standby on the same connection, and refuses a standby that carries a payload.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from pathlib import Path

import pytest

from warren import PolicySpec, Sandbox, build, protocol, wire
from warren.client import connect
from warren.server import statedir


def _held() -> tuple[int, socket.socket] | None:
    return connect._standing.get(statedir.location(os.environ))


def _sandbox(tmp_path: Path) -> Sandbox:
    ws = tmp_path / "ws"
    ws.mkdir()
    return Sandbox.create(build(PolicySpec(workspace=str(ws))))


def _supervisor_pid() -> int:
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    return found[1]


def test_an_exec_goes_on_the_connection_made_while_the_one_before_ran(
    tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sb = _sandbox(tmp_path)
    assert sb.exec(["true"]).ok
    held = _held()
    assert held is not None and held[0] == os.getpid()
    before = held[1]
    made: list[str] = []
    real = wire.connect
    monkeypatch.setattr(wire, "connect", lambda name: made.append(name) or real(name))
    assert sb.exec(["sh", "-c", "echo out; echo err >&2; exit 3"]).exit_code == 3
    # One connection made: the next one, ahead. The exec itself went on the one held.
    assert len(made) == 1
    assert before.fileno() == -1  # used, then closed
    after = _held()
    assert after is not None and after[1] is not before and after[1].fileno() >= 0
    result = sb.exec(["sh", "-c", "echo out; echo err >&2"])
    assert (result.stdout, result.stderr) == (b"out\n", b"err\n")


def test_a_connection_made_ahead_keeps_no_supervisor_alive(
    tmp_path: Path, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARREN_SUPERVISOR_IDLE", "1")
    sb = _sandbox(tmp_path)
    assert sb.exec(["true"]).ok
    pid = _supervisor_pid()
    sb.remove()
    assert _held() is not None  # made while the stop was asked for
    pidfd = os.pidfd_open(pid)
    try:
        # It holds no sandbox: it exits after its idle second, the held connection
        # (not a client that waits) notwithstanding.
        assert select.select([pidfd], [], [], 20)[0], "the supervisor stayed for a connection made ahead"
    finally:
        os.close(pidfd)
    # The held connection is closed at the other end now: not used, a new supervisor
    # is started and serves.
    (tmp_path / "again").mkdir()
    again = _sandbox(tmp_path / "again")
    assert _supervisor_pid() != pid
    assert again.exec(["echo", "hi"]).stdout == b"hi\n"


def test_a_request_on_a_connection_closed_as_it_is_sent_goes_again_once(
    tmp_path: Path, state_home: Path
) -> None:
    sb = _sandbox(tmp_path)
    assert sb.exec(["true"]).ok
    # What a supervisor that lets a held connection go (its five minutes over, or room
    # made) as the request comes does: it closes it unread. Here the other end of the
    # held connection is ours, and closes once the request has arrived on it.
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    held = _held()
    assert held is not None
    held[1].close()
    connect._standing[statedir.location(os.environ)] = (os.getpid(), ours)
    arrived: list[bool] = []

    def close_when_asked() -> None:
        arrived.append(bool(select.select([theirs], [], [], 20)[0]))
        theirs.close()  # its request unread: the client's side is reset

    closer = threading.Thread(target=close_when_asked)
    closer.start()
    result = sb.exec(["sh", "-c", "echo ran >> count; cat count"])
    closer.join()
    assert arrived == [True]  # the request went on the held connection first
    assert result.ok and result.stdout == b"ran\n"  # then once, on a new one
    assert (tmp_path / "ws" / "count").read_text() == "ran\n"


def test_a_forked_child_never_speaks_on_its_parents_connection(tmp_path: Path, state_home: Path) -> None:
    sb = _sandbox(tmp_path)
    assert sb.exec(["true"]).ok
    held = _held()
    assert held is not None
    mine = held[1]
    pid = os.fork()
    if pid == 0:  # the child: its own connection, and the parent's copy closed here only
        code = 1
        try:
            result = sb.exec(["echo", "child"])
            theirs = _held()
            ok = result.stdout == b"child\n" and theirs is not None and theirs[0] == os.getpid()
            code = 0 if ok else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    # The parent's is still open (the supervisor holds it: the child's close of its
    # copy ended nothing) and is the one the next exec goes on.
    assert _held() == (os.getpid(), mine) and mine.fileno() >= 0
    assert sb.exec(["echo", "parent"]).stdout == b"parent\n"
    assert mine.fileno() == -1


def test_the_supervisor_answers_a_request_after_a_standby_on_the_same_connection(
    tmp_path: Path, state_home: Path
) -> None:
    sb = _sandbox(tmp_path)
    token, _pid = statedir.read_address(statedir.location(os.environ)) or ("", 0)
    sock = wire.connect(wire.abstract_name(token))
    try:
        wire.send(sock, protocol.Standby())
        time.sleep(0.2)  # held apart meanwhile
        wire.send(sock, protocol.GetRequest(name=sb.name))
        sock.settimeout(10)
        reply, _, _ = wire.recv(sock, (protocol.SandboxInfo,))
        assert isinstance(reply, protocol.SandboxInfo) and reply.name == sb.name
    finally:
        sock.close()


def test_a_standby_with_a_payload_is_refused(tmp_path: Path, state_home: Path) -> None:
    _sandbox(tmp_path)
    token, _pid = statedir.read_address(statedir.location(os.environ)) or ("", 0)
    sock = wire.connect(wire.abstract_name(token))
    try:
        wire.send(sock, protocol.Standby(), b"unexpected")
        sock.settimeout(10)
        reply, _, _ = wire.recv(sock, (protocol.Error,))
        assert isinstance(reply, protocol.Error)
        assert "standby request carries no payload" in reply.error.message
    finally:
        sock.close()
