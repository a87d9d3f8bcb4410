"""A pause by freezer and a task in the kernel's exit (``cgroups.freeze``): such a task
cannot be frozen, and freeing a large memory takes the kernel long (seconds on a loaded
host), so a freeze waits for it instead of failing; one that fails names the tasks it
found, not only that it failed. And a process that vforks (``posix_spawn``, as PID 1
starts a spare's exec stub) does not keep its group from freezing.

Judged on real groups: the v1 freezer where this caller may make one beneath its own
(root here), else a cgroup2 group beneath its own (uid 1001 in CI: the group delegated to
it). The group's one process touches 1 GiB and is killed; the freeze starts while it is
in its exit (its ``PF_EXITING`` read from /proc)."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from warren._core import cgroups, procs
from warren.errors import SandboxError

_TOUCH = """
import time
b = bytearray(1 << 30)
b[::4096] = b"x" * (len(b) // 4096)
print("ready", flush=True)
time.sleep(60)
"""


def _own_group() -> str | None:
    """A group beneath this process's own that it may freeze, made here; None if none."""
    own = cgroups.own_paths()
    name = f"warren-test-freeze-{secrets.token_hex(4)}"
    candidates = []
    if "freezer" in own:
        candidates.append(os.path.join(cgroups.ROOT, "freezer", own["freezer"].lstrip("/"), name))
    if "" in own:
        for v2_root in (os.path.join(cgroups.ROOT, "unified"), cgroups.ROOT):
            if os.path.exists(os.path.join(v2_root, "cgroup.controllers")):
                candidates.append(os.path.join(v2_root, own[""].lstrip("/"), name))
                break
    for path in candidates:
        try:
            os.mkdir(path)
        except OSError:
            continue
        if os.access(os.path.join(path, "cgroup.procs"), os.W_OK):
            return path
        os.rmdir(path)
    return None


@pytest.fixture
def group() -> Iterator[str]:
    path = _own_group()
    if path is None:
        pytest.skip("no freezer group this caller may make beneath its own (v1 freezer or cgroup2)")
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            cgroups.freeze(path, False)
        cgroups.remove([path], None, wait=10)  # retried while its killed process leaves
        assert not os.path.exists(path), f"{path} is left"


def _in_its_exit(group: str) -> subprocess.Popen[bytes]:
    """A process of ``group`` that touched 1 GiB, killed: returned once it reads as in
    its exit (still in the group)."""
    child = subprocess.Popen([sys.executable, "-c", _TOUCH], stdout=subprocess.PIPE)
    with open(os.path.join(group, "cgroup.procs"), "w") as f:
        f.write(str(child.pid))
    assert child.stdout is not None
    assert child.stdout.readline() == b"ready\n"
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while not (procs.exiting(child.pid) and child.pid in _tasks(group)):
        assert time.monotonic() < deadline, "the killed process never read as in its exit"
    return child


def _count(pipe: int) -> int:
    """Bytes waiting in ``pipe`` (the vforking loop writes one per turn), read away."""
    n = 0
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(pipe, 65536):
            n += len(chunk)
    return n


def _tasks(group: str) -> list[int]:
    return cgroups._tasks(group, cgroups.is_v2(group))


def test_a_freeze_waits_for_a_task_in_its_exit(group: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual wait, shortened below the exit's time: only the wait for the exit is left.
    monkeypatch.setattr(cgroups, "FREEZE_WAIT", 0.0)
    child = _in_its_exit(group)
    try:
        cgroups.freeze(group, True)  # raised "did not freeze" before
        assert child.pid not in _tasks(group)  # frozen once it was gone
    finally:
        cgroups.freeze(group, False)
        child.wait()


def test_a_freeze_that_fails_names_the_tasks_it_found(group: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "FREEZE_WAIT", 0.0)
    monkeypatch.setattr(cgroups, "FREEZE_EXIT_WAIT", 0.0)
    # The exit takes tens of milliseconds: a try whose process was gone before the freeze
    # looked (a loaded host) is made again.
    for _try in range(3):
        child = _in_its_exit(group)
        try:
            cgroups.freeze(group, True)
        except SandboxError as e:
            raised = str(e)
            thawed = cgroups._done(group, cgroups.is_v2(group), False)  # undone by the failed freeze itself
            break
        finally:
            cgroups.freeze(group, False)
            child.wait()
    else:
        pytest.fail("three freezes with a task in its exit did not fail")
    assert f"{child.pid} (python" in raised and "in its exit" in raised
    assert thawed


_VFORKS = """
import os
while True:
    os.waitpid(os.posix_spawn("/bin/true", ["true"], {}), 0)
    os.write(1, b".")
"""


def test_a_process_that_vforks_does_not_keep_its_group_from_freezing(group: str) -> None:
    # The v1 freezer asked each task once, when the freeze was written: a vfork's parent
    # that went to wait for its child just after (the child frozen before its exec) was
    # never frozen, and the freeze failed after 2 s (about one freeze in ten here).
    child = subprocess.Popen([sys.executable, "-c", _VFORKS], stdout=subprocess.PIPE)
    assert child.stdout is not None
    out = child.stdout.fileno()
    os.set_blocking(out, False)
    try:
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(child.pid))
        time.sleep(0.1)
        for _ in range(200):
            cgroups.freeze(group, True)  # raised "did not freeze" before (the parent in kernel_clone)
            cgroups.freeze(group, False)
            time.sleep(0.005)  # thawed, it is caught elsewhere in its loop next time
        cgroups.freeze(group, True)
        try:
            _count(out)
            time.sleep(0.2)
            assert _count(out) == 0  # control: frozen, it runs no more
        finally:
            cgroups.freeze(group, False)
        time.sleep(0.2)
        assert _count(out) > 0  # and thawed, it runs again
    finally:
        child.kill()
        child.wait()
