"""Limits of long-lived sandboxes: pause and resume, the idle timeout, and execs told
which limit they ran into (or refused a start, typed, at the pids limit).

Judged from the host: a counter file the sandbox's process writes, the processes' states
and cgroup files as the host sees them, processes left behind (a token in their command
line). Root gets the cgroup1 freezer and cgroup limits here; uid 1001 gets signals and
rlimits, and each test asserts what that caller gets. Bombs run under the outer safety
net of ``test_limits.Net``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import WARREN, Layout, comm
from test_limits import (
    MEMORY_BOMB,
    ROOT_CGROUPS,
    Net,
    _forker,
    _host_pids_with,
    _leftovers,
    _records,
    _v2_before,  # noqa: F401 - autouse: leftovers are this test's own
    _v2_delegated,
)
from test_procs_signal import LEADERLESS_COUNTER, advances
from warren import LocalTransport, PolicySpec, Sandbox
from warren._core import procs
from warren.errors import LimitReached, PolicyError, SandboxPaused, WarrenError
from warren.policy import config
from warren.policy.limits import parse
from warren.server import statedir

# Counts every 20 ms into ./count, with a check that its 32 MiB of memory still hold
# what it wrote there at the start.
COUNTER = (
    "import os, sys, time\n"
    "b = bytearray(32 << 20)\n"
    "b[::4096] = b'w' * len(b[::4096])\n"
    "i = 0\n"
    "while True:\n"
    "    i += 1\n"
    "    ok = b[::4096].count(b'w') == len(b[::4096])\n"
    "    with open('count.tmp', 'w') as f: f.write(f'{i} {ok}')\n"
    "    os.replace('count.tmp', 'count')\n"
    "    time.sleep(0.02)\n"
)


def _count(ws: Path) -> tuple[int, str]:
    for _ in range(50):
        with contextlib.suppress(FileNotFoundError, ValueError):
            n, ok = (ws / "count").read_text().split()
            return int(n), ok
        time.sleep(0.02)
    raise AssertionError("the counter never wrote")


def _wait(predicate: object, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def _host_tree(pid1: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = Path(f"/proc/{name}/stat").read_text()
                kids.setdefault(int(stat[stat.rindex(")") + 2 :].split()[1]), []).append(int(name))
    out, todo = [], [pid1]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _state(pid: int) -> str:
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2 :].split()[0]
    return ""


def _group(state: Path, part: str) -> Path:
    """The sandbox's cgroup whose path has ``part`` ("/freezer/", "/unified/")."""
    record = state / "warren" / "cgroups" / _records(state)[0]
    return Path(next(d for d in record.read_text().split() if part in d))


def _pause_mechanism(layout: Layout) -> str:
    out = subprocess.run(
        [*WARREN, "plan", "--json", "-w", str(layout.workspace)], capture_output=True, text=True, check=True
    )
    return str(json.loads(out.stdout)["limits"]["pause"])


@pytest.fixture
def sandbox(state_home: Path, layout: Layout) -> Iterator[Sandbox]:
    sb = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="pz")
    yield sb
    with contextlib.suppress(Exception):
        sb.remove()


# --- pause and resume -----------------------------------------------------------------


def test_pause_stops_all_work_and_resume_continues_where_it_was(
    sandbox: Sandbox, layout: Layout, state_home: Path
) -> None:
    ws = layout.workspace
    sandbox.spawn(["python3", "-c", COUNTER])
    assert _wait(lambda: (ws / "count").exists() and _count(ws)[0] >= 3)
    sandbox.pause()
    assert Sandbox.get("pz").info.state == "paused"
    listed = json.loads(subprocess.run([*WARREN, "ls", "--json"], capture_output=True, text=True).stdout)
    assert [s["state"] for s in listed if s["name"] == "pz"] == ["paused"]
    frozen_at, _ = _count(ws)
    cpu = sandbox.stats().cpu_time
    time.sleep(0.6)
    assert _count(ws)[0] == frozen_at  # nothing ran: 30 ticks would have passed
    assert abs(sandbox.stats().cpu_time - cpu) < 0.02
    tree = _host_tree(sandbox.pid1)
    how = _pause_mechanism(layout)
    expected = os.environ.get("WARREN_TEST_EXPECT_PAUSE")
    if expected:  # scripts/test knows what this host offers this caller: no silent fallback
        assert how == expected
    if how == "cgroup1 freezer":
        assert _group(state_home, "/freezer/").joinpath("freezer.state").read_text().strip() == "FROZEN"
    elif how == "cgroup2 cgroup.freeze":
        events = _group(state_home, "/unified/").joinpath("cgroup.events").read_text()
        assert "frozen 1" in events.splitlines()
        members = _group(state_home, "/unified/").joinpath("cgroup.procs").read_text().split()
        assert sorted(map(int, members)) == sorted(tree)  # the whole sandbox, nothing else
    else:
        assert how.startswith("signals")
        assert len(tree) >= 3 and {_state(p) for p in tree} <= {"T", "t"}, [(p, _state(p)) for p in tree]
    with pytest.raises(SandboxPaused, match="paused"):
        sandbox.exec(["true"])
    cli = subprocess.run([*WARREN, "exec", "pz", "true"], capture_output=True, text=True)
    assert cli.returncode == 125 and "warren resume pz" in cli.stderr and "Traceback" not in cli.stderr
    kept = subprocess.run([*WARREN, "rm", "pz"], capture_output=True, text=True)
    assert kept.returncode == 125 and "is paused" in kept.stderr and "rm -f pz" in kept.stderr
    sandbox.pause()  # again: nothing changes
    sandbox.resume()
    assert _wait(lambda: _count(ws)[0] > frozen_at + 3)
    assert _count(ws)[1] == "True"  # its memory held what it wrote before the pause
    assert sandbox.exec(["echo", "on"]).stdout == b"on\n"
    assert Sandbox.get("pz").info.state == "running"
    subprocess.run([*WARREN, "pause", "pz"], check=True)
    subprocess.run([*WARREN, "resume", "pz"], check=True)
    assert sandbox.exec(["true"]).exit_code == 0
    # The thaw guards of the pauses (one each where a freezer paused) ended with the resumes.
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    assert _wait(lambda: not _guards(found[1]), 5)


def _guards(supervisor: int) -> list[int]:
    """The thaw guards of a supervisor's paused sandboxes: named so by the Python guard,
    and from its exec (its command line) by the native one."""
    return [p for p in procs.descendants(supervisor) if "warren-thaw" in (comm(p), _argv0(p))]


def _argv0(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    return ""


def test_pause_stops_the_threads_of_a_process_whose_leader_exited(sandbox: Sandbox, layout: Layout) -> None:
    """Whatever this caller pauses with (scripts/test runs uid 1001 with signals or a
    cgroup2 group, root with the v1 freezer): judged by a counter on the host."""
    count = str(layout.workspace / "zcount")
    sandbox.spawn(["python3", "-c", LEADERLESS_COUNTER, "zcount"])
    leader = _wait(lambda: [p for p in _host_tree(sandbox.pid1) if _state(p) == "Z" and procs.running(p)])
    assert leader, "the counter's main thread did not exit"
    assert advances(count)  # the control: it counts while the sandbox runs
    sandbox.pause()
    assert not advances(count, 0.4), f"paused by {_pause_mechanism(layout)}, a thread kept counting"
    sandbox.resume()
    assert advances(count)


def test_a_paused_sandbox_stops_and_is_removed_cleanly(sandbox: Sandbox, state_home: Path) -> None:
    token = f"{random.getrandbits(30)}"
    sandbox.exec(["sh", "-c", f"setsid sleep 300.{token} & sleep 301.{token} &"])
    # sh returns once both are forked; each execs its sleep a moment later
    assert _wait(lambda: len(_host_pids_with(token)) == 2, 10), _host_pids_with(token)
    sandbox.pause()
    start = time.monotonic()
    sandbox.remove()
    assert time.monotonic() - start < 10
    assert _wait(lambda: not _host_pids_with(token), 5)
    # Its groups go once their last frozen task has died, as the processes above do.
    assert _wait(lambda: _leftovers(state_home) == [], 5), _leftovers(state_home)
    assert [s.name for s in Sandbox.list()] == []


@pytest.mark.parametrize("kill", ["supervisor", "its group", "supervisor, python guard"])
def test_supervisor_killed_while_paused_leaves_no_process(
    kill: str, state_home: Path, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frozen tasks cannot die until thawed: the supervisor's thaw guard thaws them when
    it dies, so the parent-death signal takes them at once, not at the next start. The
    native guard (``native/thaw.c``) runs in a session of its own, so a kill of the
    supervisor's whole process group (a service manager's stop, a terminal's hangup)
    leaves it to thaw; the Python guard (``WARREN_NATIVE_THAW=0``, or no C compiler at
    install) is tested with the supervisor killed alone."""
    from warren.server import pause

    python_guard = kill.endswith("python guard")
    if python_guard:
        monkeypatch.setenv("WARREN_NATIVE_THAW", "0")
    elif pause.program() is None:
        pytest.skip("warren-thaw is not built here (no C compiler at install)")
    sandbox = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="pz")
    token = f"{random.getrandbits(30)}"
    sandbox.exec(["sh", "-c", f"setsid sleep 300.{token} &"])
    sandbox.pause()
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    if _pause_mechanism(layout).startswith("cgroup"):
        # (The Python guard names itself once it runs, a moment after the pause's answer.)
        assert _wait(lambda: len(_guards(found[1])) == 1, 5), _guards(found[1])
        (guard,) = _guards(found[1])
        # The native guard is a program of its own (a few pages); the Python one a clone
        # of the spawner, with the supervisor's command line.
        assert (_argv0(guard) == pause.NAME) != python_guard, _argv0(guard)
    if kill == "its group":
        assert os.getpgid(found[1]) != os.getpgid(0)  # a session of its own: not this test's
        os.killpg(os.getpgid(found[1]), signal.SIGKILL)
    else:
        os.kill(found[1], signal.SIGKILL)
    assert _wait(lambda: not _host_pids_with(token), 5), "frozen processes outlived their supervisor"
    listed = subprocess.run([*WARREN, "ls"], capture_output=True, text=True, check=True).stdout
    assert "dead" in listed
    assert _wait(lambda: _leftovers(state_home) == [], 5), _leftovers(state_home)


def test_pause_over_the_cli_on_an_unknown_sandbox_is_a_typed_error(state_home: Path) -> None:
    r = subprocess.run([*WARREN, "pause", "nope"], capture_output=True, text=True)
    assert r.returncode == 125 and "no sandbox named nope" in r.stderr and "hint:" in r.stderr


# --- idle timeout -----------------------------------------------------------------------


def test_idle_timeout_stops_a_sandbox_nobody_uses(state_home: Path, layout: Layout) -> None:
    token = f"{random.getrandbits(30)}"
    made = subprocess.run(
        [*WARREN, "create", "-w", str(layout.workspace), "--idle-timeout", "2s", "idle"],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stderr
    sb = Sandbox.get("idle")
    sb.spawn(["sleep", f"300.{token}"])  # a background process is not use
    info = next(s for s in Sandbox.list() if s.name == "idle")
    assert info.idle_timeout == 2.0 and time.time() - info.last_active < 2
    listed = subprocess.run([*WARREN, "ls"], capture_output=True, text=True).stdout
    # `ls` shows the timeout beside the idle time while the sandbox runs; on a loaded host
    # the 2 s may be up before `ls` starts, and the reason says it then.
    assert "/2s" in listed or "stopped after 2s without a request (idle timeout)" in listed, listed
    assert _wait(lambda: Sandbox.list()[0].state == "stopped", 10)
    assert "idle timeout" in Sandbox.list()[0].reason
    assert _wait(lambda: not _host_pids_with(token), 5)
    # Its cgroups go once its last task has left (on a loaded host after the stop: the
    # supervisor tries again a few times a second).
    assert _wait(lambda: _leftovers(state_home) == [], 5), _leftovers(state_home)


def test_execs_and_requests_keep_a_sandbox_alive(state_home: Path, layout: Layout) -> None:
    sb = Sandbox.create(PolicySpec(workspace=str(layout.workspace), idle_timeout="2s"), name="busy")
    # One exec running longer than the timeout: in use all along.
    assert sb.exec(["sleep", "3.5"]).exit_code == 0
    assert sb.alive
    # Requests more often than the timeout: still in use.
    for _ in range(4):
        sb.files.write("f", "x")
        time.sleep(1)
    assert sb.alive
    # stats and ls are not use: asked for all along, it stops all the same.
    deadline = time.monotonic() + 10
    while sb.alive and time.monotonic() < deadline:
        with contextlib.suppress(WarrenError):
            sb.stats()
        subprocess.run([*WARREN, "ls"], capture_output=True, check=False)
        time.sleep(0.3)
    assert not sb.alive
    assert "idle timeout" in Sandbox.list()[0].reason


def test_idle_timeout_values_are_checked_and_a_workspace_may_only_shorten_it(tmp_path: Path) -> None:
    assert parse(None, None, None, None, "t", "10m").idle_timeout == 600
    assert parse(None, None, None, None, "t", 90).idle_timeout == 90
    assert parse(None, None, None, None, "t", "1.5h").idle_timeout == 5400
    for bad in ("0", "soon", "-5m", True):
        with pytest.raises(PolicyError, match="idle_timeout"):
            parse(None, None, None, None, "t", bad)
    r = subprocess.run(
        [*WARREN, "create", "-w", str(tmp_path), "--idle-timeout", "later", "x"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 125 and "idle_timeout" in r.stderr and "hint:" in r.stderr
    ws = tmp_path / "ws"
    ws.mkdir()
    user = tmp_path / "user.toml"
    user.write_text('idle_timeout = "10m"\n')
    (ws / "warren.toml").write_text('idle_timeout = "1h"\n')
    assert config.load_spec(ws, None, env={}, home=tmp_path, user_config=user).limits("t").idle_timeout == 600
    (ws / "warren.toml").write_text('idle_timeout = "1m"\n')
    assert config.load_spec(ws, None, env={}, home=tmp_path, user_config=user).limits("t").idle_timeout == 60


# --- limits reached by an exec --------------------------------------------------------------


@pytest.fixture
def net(state_home: Path) -> Iterator[Net]:
    n = Net(state_home)
    yield n
    n.close()


def test_exec_says_which_limit_it_hit(net: Net, layout: Layout) -> None:
    ws = str(layout.workspace)
    made = net.run(["create", "-w", ws, "--memory", "96M", "--pids", "24", "lim"], layout.workspace)
    assert made.returncode == 0, made.stderr
    try:
        bomb = net.run(["exec", "lim", "python3", "-c", MEMORY_BOMB], layout.workspace)
        # The sleepers hold the exec's output open: short ones, so it ends soon and they
        # have left the pids budget to the next command.
        fork = net.run(["exec", "lim", *_forker(40, sleep=3)], layout.workspace)
        env = {**os.environ, "XDG_STATE_HOME": str(net.state)}
        sb = Sandbox.get("lim", transport=LocalTransport(env))
        lib = sb.exec(["python3", "-c", MEMORY_BOMB])
        after = net.run(["exec", "lim", "echo", "fine"], layout.workspace)
    finally:
        net.run(["rm", "-f", "lim"], layout.workspace)
    if ROOT_CGROUPS:
        assert bomb.returncode == 137 and bomb.stderr.strip().splitlines()[-1] == (
            "warren: killed: memory limit 96M reached"
        )
        assert "warren: pids limit 24 reached" in fork.stderr
        assert lib.exit_code == 137 and lib.limit == "memory limit 96M reached"
    else:  # rlimits: the command sees the failure itself, and no counter says more
        assert bomb.returncode == 1 and "MemoryError" in bomb.stderr and "warren:" not in bomb.stderr
        assert lib.limit is None and b"MemoryError" in lib.stderr
        assert int(fork.stdout.split()[-1]) <= 24 + 8
    assert after.returncode == 0 and after.stdout == "fine\n"  # the sandbox is still usable


def test_a_command_that_ran_past_its_timeout_says_the_limit_it_hit(net: Net, layout: Layout) -> None:
    """A command held up at a limit (a fork failing, retried: here it waits for ever)
    until its timeout: the timeout killed it, and the limit it ran into is said too,
    by the CLI and in the library's result (the CLI said only the timeout)."""
    ws = str(layout.workspace)
    made = net.run(["create", "-w", ws, "--pids", "24", "held"], layout.workspace)
    assert made.returncode == 0, made.stderr
    # Python forks its sleepers (at most the limit; they outlive the timeout), then the
    # shell becomes `sleep`: no fork is left to fail there, and it runs until its timeout.
    held = ["sh", "-c", '"$@"; exec sleep 60', "sh", *_forker(40, sleep=3)]
    try:
        cli = net.run(["exec", "--timeout", "2", "held", *held], layout.workspace)
        time.sleep(3)  # the sleepers have ended: room again
        env = {**os.environ, "XDG_STATE_HOME": str(net.state)}
        lib = Sandbox.get("held", transport=LocalTransport(env)).exec(held, timeout=2)
    finally:
        net.run(["rm", "-f", "held"], layout.workspace)
    timeout = "warren: the command ran past its timeout of 2.0 s and was killed"
    assert cli.returncode == 124 and lib.timed_out, (cli.stderr, lib)
    if ROOT_CGROUPS:
        assert cli.stderr.strip().splitlines()[-2:] == [
            "warren: pids limit 24 reached (a fork or an allocation failed)",
            timeout,
        ], cli.stderr
        assert lib.limit == "pids limit 24 reached"
    else:  # rlimits: no counter says which limit a fork failed at
        assert cli.stderr.strip().splitlines()[-1] == timeout and "limit" not in cli.stderr
        assert lib.limit is None


# Keeps the sandbox at its pids limit: forks sleepers, and takes again any slot freed.
FILLER = (
    "import os, time\n"
    "end = time.monotonic() + 60\n"
    "while time.monotonic() < end:\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(90)\n"
    "            os._exit(0)\n"
    "    except OSError:\n"
    "        time.sleep(0.001)\n"
)


def test_exec_at_the_pids_limit_is_refused_typed_and_the_sandbox_recovers(net: Net, layout: Layout) -> None:
    made = net.run(["create", "-w", str(layout.workspace), "--pids", "24", "full"], layout.workspace)
    assert made.returncode == 0, made.stderr
    sb = Sandbox.get("full", transport=LocalTransport({**os.environ, "XDG_STATE_HOME": str(net.state)}))
    try:
        filler = sb.spawn(["python3", "-c", FILLER])
        assert _wait(lambda: sb.stats().pids >= 24, 30), sb.stats()
        # At the limit an exec either runs (a helper forked ahead of time was there) or
        # is refused, typed: never anything else. A few tries meet a refusal; on a loaded
        # machine the filler may be slow to take back the slots each exec frees (all of
        # five ran once, at load 12), so up to twenty there, stopping at the first refusal.
        outcomes = []
        for _ in range(20 if ROOT_CGROUPS else 5):
            outcomes.append(net.run(["exec", "full", "echo", "hi"], layout.workspace))
            if outcomes[-1].returncode != 0:
                break
        for r in outcomes:
            assert (r.returncode, r.stdout) == (0, "hi\n") or r.returncode == 126, r
            assert "Traceback" not in r.stderr
        refused = [r for r in outcomes if r.returncode == 126]
        for _ in range(3):  # the library: a Result, or LimitReached
            with contextlib.suppress(LimitReached):
                assert sb.exec(["true"]).exit_code == 0
        if ROOT_CGROUPS:
            assert refused, outcomes
            assert "pids limit (24)" in refused[0].stderr and "hint:" in refused[0].stderr
        else:
            # RLIMIT_NPROC binds the commands, not warren's helpers: execs still start.
            assert refused == []
        # Listing and killing still work at the limit: that is how room is made again.
        assert any(p.spawn_id == filler.id for p in sb.processes())
        filler.kill(signal.SIGKILL)  # its whole group: the sleepers too
        assert _wait(lambda: sb.stats().pids < 12, 10), sb.stats()
        assert sb.exec(["echo", "back"]).stdout == b"back\n"
    finally:
        net.run(["rm", "-f", "full"], layout.workspace)


# --- a delegated group from systemd ----------------------------------------------------


def _fake_systemd(tmp_path: Path, fail: bool) -> dict[str, str]:
    """A user manager's socket and a `systemd-run` that records its arguments and runs
    the command after `--` (or fails, like one that cannot reach the user bus)."""
    import socket

    runtime = tmp_path / "run"
    (runtime / "systemd").mkdir(parents=True)
    socket.socket(socket.AF_UNIX).bind(str(runtime / "systemd" / "private"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "systemd-run"
    body = "exit 1" if fail else 'while [ "$1" != "--" ]; do shift; done; shift; exec "$@"'
    fake.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > "$XDG_RUNTIME_DIR/args"\n{body}\n')
    fake.chmod(0o755)
    return {"XDG_RUNTIME_DIR": str(runtime), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("fail", [False, True], ids=["scope", "systemd-run-fails"])
def test_the_supervisor_asks_systemd_for_a_delegated_scope(
    state_home: Path, layout: Layout, tmp_path: Path, fail: bool
) -> None:
    """Where the caller's cgroup2 group is not delegated and a user manager runs, the
    supervisor is started in a transient scope with Delegate=yes (systemd-run); where
    systemd-run fails, it starts as before and says so in its log. (No systemd runs on
    this machine: the manager's side is a stand-in, warren's side is real.)"""
    env = _fake_systemd(tmp_path, fail)
    ws = layout.workspace
    made = subprocess.run(
        [*WARREN, "create", "-w", str(ws), "sc"], env={**os.environ, **env}, capture_output=True, text=True
    )
    try:
        assert made.returncode == 0, made.stderr
        ran = subprocess.run(
            [*WARREN, "exec", "sc", "echo", "ok"], env={**os.environ, **env}, capture_output=True, text=True
        )
        assert ran.stdout == "ok\n"
    finally:
        subprocess.run([*WARREN, "rm", "-f", "sc"], env={**os.environ, **env}, capture_output=True)
    args_file = Path(env["XDG_RUNTIME_DIR"]) / "args"
    if _v2_delegated():
        assert not args_file.exists()  # already in a delegated group: nothing to ask for
        return
    args = args_file.read_text().split("\n")
    assert args[:7] == ["--user", "--scope", "--quiet", "--collect", "-p", "Delegate=yes", "--unit"], args
    assert args[8] == "--" and "daemon" in args
    log = (state_home / "warren" / "supervisor.log").read_text()
    assert ("could not start a scope" in log) == fail
