"""Descriptors numbered past 1024, which ``select()`` refuses: a supervisor with a
hundred or so sandboxes holds them (each keeps about ten there), and so may a client
process with many connections open (warren's own HTTP service). Each wait of warren's
on such a descriptor is a ``poll``. As root and as uid 1001 (whose soft limit is 1024:
the tests raise it to the hard one, as the supervisor does for itself).
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import wire
from warren.client.sandbox import Sandbox
from warren.policy import PolicySpec, build
from warren.server import statedir

PAST = 1100  # descriptors held open: the next one made is numbered past 1024


@pytest.fixture
def room() -> Iterator[None]:
    """This process's soft descriptor limit raised for ``PAST`` and more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < PAST + 200:
        pytest.skip(f"the hard descriptor limit ({hard}) leaves no room for {PAST} descriptors")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, PAST + 200), hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _supervisor() -> tuple[str, int]:
    Sandbox.list()  # started, if it was not
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    return found


def _highest_descriptor(pid: int) -> int:
    return max(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))


def test_a_review_sandbox_whose_descriptors_are_numbered_past_1024_takes_its_checkpoints(
    state_home: Path, tmp_path: Path, room: None
) -> None:
    """A review sandbox takes a checkpoint before each command: the supervisor waits
    for its PID 1 to say it is quiet, and for the process in its namespaces to stack
    the layers again. Made while ``PAST`` idle connections fill the supervisor's
    lower descriptors, the sandbox's are numbered past 1024 (read from /proc)."""
    token, pid = _supervisor()
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    held: list[socket.socket] = []
    try:
        held = [wire.connect(wire.abstract_name(token)) for _ in range(PAST - 100)]
        sb = Sandbox.create(build(PolicySpec(workspace=str(ws), review=True)))
    finally:
        for sock in held:
            sock.close()
    assert _highest_descriptor(pid) > 1024, "the sandbox's descriptors are not past 1024"
    for n in range(3):
        r = sb.exec(["sh", "-c", f"echo {n} >> a.txt"])
        assert r.exit_code == 0, r.stderr
    assert len(sb.checkpoints()) >= 3
    assert (ws / "a.txt").read_text() == "a\n", "a review sandbox wrote the host's workspace"
    assert sb.exec(["cat", "a.txt"]).stdout == b"a\n0\n1\n2\n"
    sb.rollback(sb.checkpoints()[0].id)
    assert sb.exec(["cat", "a.txt"]).stdout == b"a\n"


CLIENT = """
import os, resource, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, {past} + 200), hard))
held = [os.open("/dev/null", os.O_RDONLY) for _ in range({past})]
from warren import PolicySpec, Sandbox
sb = Sandbox.create(PolicySpec(workspace=sys.argv[1]))
print(sb.exec(["echo", "ok"]).stdout.decode(), end="")
sb.remove()
"""


def test_a_client_holding_descriptors_past_1024_starts_the_supervisor(
    state_home: Path, tmp_path: Path, room: None
) -> None:
    """The client waits for the supervisor it starts to say it is ready on a pipe,
    numbered past 1024 in a process holding ``PAST`` descriptors."""
    ws = tmp_path / "ws"
    ws.mkdir()
    assert statedir.read_address(statedir.location(os.environ)) is None, "a supervisor runs already"
    started = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-c", CLIENT.format(past=PAST), str(ws)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (r.returncode, r.stdout) == (0, "ok\n"), r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None, "the client did not start the supervisor"
    assert time.monotonic() - started < 60
