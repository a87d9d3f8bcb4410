"""A supervisor killed while its sandbox lives never sees that sandbox end (the sandbox
dies with it), so never adopts the repositories it made. The next supervisor adopts
them before it serves anything (``server.gitleases``): host git runs nothing the dead
sandbox wrote, and git inside the next sandbox still sees what it set. Judged on the
host, as root and as an unprivileged user, each with a private state (and supervisor)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from conftest import Layout, host_git, host_marker, run_cli, shut_down_supervisor
from test_git_protection import IDENTITY, NESTED, evil_script
from warren.server import gitleases, statedir

# A repository made inside, with a program host git would run (its fsmonitor, a hook),
# named by the outer repository's index in the sandbox (test_git_protection's); and a
# process left running, by which the test knows when the sandbox has died.
LEFT_RUNNING = "nohup sleep {token} >/dev/null 2>&1 &\n"


@pytest.fixture
def repo(state_home: Path, layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (layout.workspace.parent / "githome").mkdir(exist_ok=True)
    ws = layout.workspace
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(ws, *args).returncode == 0
    return ws


def _running(token: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes() == f"sleep\0{token}\0".encode():
                return True
        except OSError:
            pass
    return False


def _records() -> list[str]:
    where = Path(statedir.location(os.environ)) / gitleases.DIRECTORY
    return sorted(p.name for p in where.iterdir() if not p.name.startswith("."))


# A process holding the state directory's lock a moment (argv[1]), as a killed
# supervisor does until its last thread has exited: it says when it holds it.
HOLD_LOCK = (
    "import fcntl, os, sys, time\n"
    "fd = os.open(sys.argv[1], os.O_RDWR)\n"
    "fcntl.flock(fd, fcntl.LOCK_EX)\n"
    "print('held', flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
)


@pytest.mark.parametrize("lock", ["released", "held a moment"])
def test_a_repository_made_by_a_sandbox_of_a_killed_supervisor_is_adopted_by_the_next(
    layout: Layout, repo: Path, lock: str
) -> None:
    """``held a moment``: the dead supervisor's lock outlives its sandbox (its last
    thread exits a moment after them; a gate's loaded run found it): the next command
    waits for the next supervisor, which adopts first, rather than running inline,
    where nothing is adopted and host git then ran what the sandbox wrote."""
    marker = host_marker()
    token = f"{9000 + os.getpid() % 900}.{uuid.uuid4().int % 10**6}"
    name = f"git{os.getpid()}{uuid.uuid4().hex[:6]}"
    made = run_cli(["create", "--write", str(layout.cache), name], cwd=repo)
    assert made.returncode == 0, made.stderr
    script = IDENTITY + NESTED.format(evil=evil_script(marker)) + LEFT_RUNNING.format(token=token)
    r = run_cli(["exec", name, "sh", "-c", script], cwd=repo)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 30
    while not _running(token):  # nohup's exec of sleep may come after the exec's answer
        assert time.monotonic() < deadline, "the process left running never ran"
        time.sleep(0.02)
    assert _records(), "the sandbox's lease is recorded while it lives"
    # The supervisor dies without a word; its sandbox with it.
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    os.kill(found[1], signal.SIGKILL)
    deadline = time.monotonic() + 30
    while _running(token):
        assert time.monotonic() < deadline, "the sandbox outlived its supervisor"
        time.sleep(0.05)
    # The control: what the sandbox left on the host is armed (read without running git
    # there: host git in it would run the fsmonitor now).
    config = (repo / "sub" / ".git" / "config").read_text()
    assert "fsmonitor" in config and (repo / "sub" / ".git" / "hooks" / "post-checkout").exists()
    holder = None
    if lock == "held a moment":
        path = Path(statedir.location(os.environ)) / statedir.LOCK_FILE
        argv = [sys.executable, "-c", HOLD_LOCK, str(path), "0.7"]
        holder = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    # The next command starts the next supervisor, which adopts it before the launch.
    again = layout.run(["sh", "-c", "git -C sub config core.fsmonitor; git -C sub log -1 --format=%s"])
    if holder is not None:
        assert holder.wait(10) == 0
    assert again.returncode == 0, again.stderr
    # Inside, the repository keeps what the sandbox set.
    assert again.stdout.split() == [f"{repo}/evil.sh", "s"]
    for args in (["status"], ["-C", "sub", "status"], ["-C", "sub", "checkout", "-q", "-b", "x"]):
        host_git(repo, *args)
    assert not marker.exists(), "host git ran what a sandbox of the killed supervisor wrote"
    assert host_git(repo, "-C", "sub", "config", "core.fsmonitor").returncode == 1
    assert not (repo / "sub" / ".git" / "hooks" / "post-checkout").exists()
    # Records go with their leases: none is left once the supervisor has ended its sandboxes.
    run_cli(["rm", "-f", name], cwd=repo)
    shut_down_supervisor()
    assert _records() == []


def test_records_that_cannot_be_read_or_name_what_is_gone_are_dropped_and_the_supervisor_serves(
    layout: Layout, repo: Path, tmp_path: Path
) -> None:
    """What the next supervisor finds may be damaged (a disk that filled mid-write) or
    name a root removed since: each is said in the log and removed; nothing stops it."""
    shut_down_supervisor()
    where = Path(statedir.location(os.environ)) / gitleases.DIRECTORY
    where.mkdir(parents=True, exist_ok=True)
    (where / "0123456789abcdef.json").write_text('{"known": ')
    (where / "fedcba9876543210.json").write_text('{"known": {"%s": []}, "env": {}}' % (tmp_path / "gone"))
    r = layout.run(["true"])
    assert r.returncode == 0, r.stderr
    assert not {"0123456789abcdef.json", "fedcba9876543210.json"} & set(_records())
    log = (Path(statedir.location(os.environ)) / statedir.LOG_FILE).read_text()
    assert "a lease's record that cannot be read (0123456789abcdef.json): removed" in log


def test_a_lease_that_cannot_be_recorded_is_a_typed_error_and_the_supervisor_serves_on(
    layout: Layout, repo: Path
) -> None:
    """Without its record a lease would leave what its sandbox makes unadopted after a
    crash: the launch is refused, typed, with a hint; once the records can be kept
    again, the next launch works."""
    shut_down_supervisor()
    where = Path(statedir.location(os.environ)) / gitleases.DIRECTORY
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text("not a directory")
    r = layout.run(["true"])
    assert r.returncode == 125 and "Traceback" not in r.stderr, r.stderr
    assert "cannot record the sandbox's repositories in warren's state directory" in r.stderr, r.stderr
    assert "hint:" in r.stderr, r.stderr
    where.unlink()
    again = layout.run(["sh", "-c", "echo ran"])
    assert (again.returncode, again.stdout) == (0, "ran\n"), again.stderr
