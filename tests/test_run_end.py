"""A one-shot run is answered once nothing of its sandbox is left, not once its PID 1
has exited: the helper of the run kills and reaps what the command left
(``shim.end_sandbox``), PID 1 says so once its broker makes no call for the sandbox
(``protocol.Emptied``, ``Broker.quiet``), and the supervisor makes the host's end
(repositories, the ancestors' metadata, TMPDIR) and answers. What must hold, judged
from the host, as root and as uid 1001:

- ``end_sandbox`` in a pid namespace of its own: every process the command left
  (in the background, double-forked, in a session of its own) is gone, none a zombie,
  before PID 1 hears "d";
- ``Broker.quiet`` is false while the broker's thread holds a call, or a worker one;
- a run whose command leaves a writer behind returns with that writer gone: the file
  it wrote stays as it is, and the run's output ends (nothing holds the pipe);
- the ancestor guard's repair is made before the run returns, and said by it;
- the TMPDIR a run got is gone when it returns.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN, Layout, run_cli
from warren._core.broker import pool
from warren._core.broker.loop import Broker

_LEFT_BEHIND = r"""
import json, os, socket, sys, time
from warren._core import _sys, shim

def live():
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{name}/comm") as f:
                    comm = f.read().strip()
            except OSError:
                continue
            if fields[0] != "Z":
                out[int(name)] = comm
    return out

ours, theirs = socket.socketpair()
helper = os.fork()
if helper == 0:  # the run's helper: the command's child subreaper, as in a sandbox
    ours.close()
    _sys.prctl(36, 1)  # PR_SET_CHILD_SUBREAPER
    command = os.fork()
    if command == 0:
        os.execvp("sh", ["sh", "-c", "sleep 300 & (sleep 301 &); setsid sleep 302 & exit 0"])
    os.waitpid(command, 0)
    while sum(comm == "sleep" for comm in live().values()) < 3:
        time.sleep(0.01)
    said = shim.end_sandbox(theirs)
    os._exit(0 if said else 1)
theirs.close()
told = ours.recv(1)
left = {pid: comm for pid, comm in live().items() if pid not in (1, helper)}
_, status = os.waitpid(helper, 0)
print(json.dumps({"told": told.decode(), "left": left, "status": status}))
"""


def test_end_sandbox_kills_and_reaps_what_the_command_left() -> None:
    """In a pid namespace of its own (this script its PID 1): the three sleeps a command
    left are gone, not even zombies, when "d" arrives."""
    r = subprocess.run(
        [
            "unshare",
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "--mount-proc",
            sys.executable,
            "-c",
            _LEFT_BEHIND,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got == {"told": "d", "left": {}, "status": 0}, got


def test_the_broker_is_quiet_only_when_it_makes_no_call() -> None:
    broker = Broker(-1, [], set(), pool.Workers(keep=0))
    assert broker.quiet(0.01)
    held = threading.Event()
    go = threading.Event()

    def call() -> None:  # the broker's thread, between reading a call and answering it
        with broker.busy:
            held.set()
            go.wait(10)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        assert held.wait(10)
        assert not broker.quiet(0.05)
    finally:
        go.set()
        thread.join()
    assert broker.quiet(0.01)
    release = threading.Event()
    assert broker.workers.submit(7, release.wait)  # a worker's call under way
    try:
        assert not broker.quiet(0.01)
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while broker.workers.in_flight() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert broker.quiet(0.01)


def _state(tmp_path: Path) -> dict[str, str]:
    return {"XDG_STATE_HOME": str(tmp_path / "state")}


@pytest.fixture
def state(tmp_path: Path) -> Iterator[dict[str, str]]:
    env = _state(tmp_path)
    yield env
    run_cli(["shutdown"], cwd=tmp_path, env=env)


def test_a_writer_the_command_left_is_gone_when_the_run_returns(
    layout: Layout, state: dict[str, str]
) -> None:
    """Five runs of the same request (the first launched, the next ones booted ahead):
    each returns (its output ends: no writer holds the pipe) with the writer it left
    gone, judged by the file it appended to, which stays as it was."""
    out = layout.workspace / "out"
    # The command ends once the writer has written (a gate's load once kept it from
    # running in 50 ms: no file, the case not made).
    script = "(while :; do echo x >> out; done) & until [ -s out ]; do sleep 0.01; done; echo started"
    for _ in range(5):
        out.unlink(missing_ok=True)
        r = run_cli(["run", "--", "sh", "-c", script], cwd=layout.workspace, env=state, timeout=30)
        assert r.returncode == 0 and r.stdout == "started\n", r.stderr
        size = out.stat().st_size
        assert size > 0
        time.sleep(0.3)
        assert out.stat().st_size == size


@pytest.fixture
def home_dir() -> Iterator[Path]:
    """A directory of its own in the caller's home: on the home's mount, so a sandbox
    whose workspace is in it guards it (its metadata is snapshotted and restored)."""
    base = Path.home() / f".warren-test-{os.getpid()}-end"
    (base / "W").mkdir(parents=True)
    try:
        yield base
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_runs_tmpdir_is_gone_when_it_returns(home_dir: Path, tmp_path: Path) -> None:
    """A workspace in the home gets a TMPDIR of its own on the host (one under /tmp has
    the sandbox's private /tmp): gone when each of three runs returns."""
    ws, env = home_dir / "W", _state(tmp_path)
    try:
        for _ in range(3):
            r = run_cli(["run", "--", "sh", "-c", 'echo "$TMPDIR"; touch "$TMPDIR/x"'], cwd=ws, env=env)
            assert r.returncode == 0, r.stderr
            tmpdir = r.stdout.strip()
            assert tmpdir.startswith("/") and not tmpdir.startswith("/tmp"), tmpdir
            assert not os.path.lexists(tmpdir), tmpdir
    finally:
        run_cli(["shutdown"], cwd=ws, env=env)


def test_the_guards_repair_is_made_before_the_run_returns_and_said(home_dir: Path, tmp_path: Path) -> None:
    """The time of a guarded directory set back while a run runs (what a utimes()
    slipping past the filter would do) is put back by the time the run returns, and
    the run says so; twice, the second run on a sandbox booted ahead."""
    ws, env = home_dir / "W", _state(tmp_path)
    plan = json.loads(run_cli(["plan", "--json"], cwd=ws, env=env).stdout)
    assert str(home_dir) in plan["guarded"]
    try:
        for _ in range(2):
            kept = home_dir.stat().st_mtime_ns
            full = {**os.environ, **env}
            with subprocess.Popen(
                [*WARREN, "run", "--", "sh", "-c", "echo up; read line"],
                cwd=ws,
                env=full,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            ) as p:
                assert p.stdout is not None and p.stdout.readline() == "up\n"
                os.utime(home_dir, ns=(kept, kept - 86_400 * 10**9))
                _, err = p.communicate("go\n", timeout=30)
            assert p.returncode == 0, err
            assert home_dir.stat().st_mtime_ns == kept
            assert f"the sandbox changed the times of {home_dir}; restored" in err, err
    finally:
        run_cli(["shutdown"], cwd=ws, env=env)
