"""The one launch path: prepare the host for a plan, then clone its PID 1.

Used for every sandbox, one-shot or long-lived, so whatever is added here (the
directories a preset needs, the sandbox's TMPDIR in the workspace, the ancestor guard,
cgroups next) is added once. Order
matters: warren creates what it must create *before* snapshotting the ancestors'
metadata, so its own mkdir is never reported as the sandbox's doing.
"""

from __future__ import annotations

import os
import shutil
import socket
from dataclasses import dataclass, field

from .._core import cgroups, clone, guard
from ..errors import SetupError
from ..plan.model import Plan
from . import unshare


@dataclass
class Launched:
    pid: int  # PID 1, as the host sees it
    pidfd: int
    control: socket.socket  # the supervisor's end of PID 1's control channel
    guard: list[guard.DirState]
    scratch: str | None = None  # the TMPDIR warren made in the workspace
    cgroups: list[str] = field(default_factory=list)  # the sandbox's own, one per controller
    record_dir: str | None = None
    # ("LIMIT:KEY", fd) of the counter files that tell a limit was reached; every exec's
    # helper gets them (it reads them before and after its command)
    counters: list[tuple[str, int]] = field(default_factory=list)


def launch(plan: Plan, *, oneshot: bool, record_dir: str | None = None) -> Launched:
    """``record_dir``: where the sandbox's cgroups are listed until removed (so a
    crashed supervisor's successor finds them: ``cgroups.sweep``)."""
    for path in plan.create_dirs:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise SetupError(
                f"cannot create tool cache {path}",
                operation="mkdir",
                path=path,
                errno=e.errno,
                hint="create it yourself or drop the preset",
            ) from None
    unshare.own_inodes(plan.workspace, plan.unshare)
    if plan.scratch:
        _make_scratch(plan.scratch)
    try:
        groups = cgroups.create(plan.limits.cgroups, plan.uid, record_dir) if plan.limits else []
    except BaseException:
        _remove_scratch(plan.scratch)
        raise
    states = guard.snapshot(plan.guarded)
    tasks: list[tuple[str, int]] = []
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        tasks = _open_tasks(groups)
        # PID 1 enters its cgroups first thing: everything in the sandbox descends
        # from it, inside them.
        pid = clone.start_pid1(plan, theirs, oneshot=oneshot, cgroup_tasks=tasks)
    except BaseException:
        ours.close()
        cgroups.remove(groups, record_dir)
        _remove_scratch(plan.scratch)
        raise
    finally:
        theirs.close()
        for _path, fd in tasks:
            os.close(fd)
    counters = cgroups.counter_files(groups, plan.limits.counters) if plan.limits else []
    return Launched(pid, os.pidfd_open(pid), ours, states, plan.scratch, groups, record_dir, counters)


def _open_tasks(groups: list[str]) -> list[tuple[str, int]]:
    try:
        return cgroups.open_tasks(groups)
    except OSError as e:
        raise SetupError(
            f"cannot move the sandbox into its cgroup: {e.strerror}",
            operation="cgroup",
            path=e.filename,
            errno=e.errno,
            hint="run `warren plan` to see how each limit is enforced",
        ) from None


def restore(launched: Launched) -> list[str]:
    """After the sandbox ended: remove its TMPDIR and its cgroups (a busy one stays
    recorded for the next sweep), put the guarded directories' metadata back."""
    for _name, fd in launched.counters:
        os.close(fd)
    launched.counters = []
    cgroups.remove(launched.cgroups, launched.record_dir)
    return [*_remove_scratch(launched.scratch), *guard.restore(launched.guard)]


def _make_scratch(path: str) -> None:
    """The sandbox's TMPDIR in the workspace: a new directory (never one that is
    there already, nor through a symlink), that git ignores."""
    try:
        os.mkdir(path, 0o700)
        # Through the directory's own descriptor: a sandbox that sees the workspace
        # cannot swap the new name for a symlink and have the file written elsewhere.
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(".gitignore", flags, 0o644, dir_fd=dfd)
            try:
                os.write(fd, b"# warren: this sandbox's TMPDIR, removed when it ends\n*\n")
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
    except OSError as e:
        raise SetupError(
            f"cannot create the sandbox's TMPDIR {path}",
            operation="mkdir",
            path=path,
            errno=e.errno,
            hint="make the workspace writable for you, or set TMPDIR to a directory on another filesystem",
        ) from None


def _remove_scratch(path: str | None) -> list[str]:
    if not path or not os.path.lexists(path):
        return []
    if os.path.islink(path) or not os.path.isdir(path):
        return [f"the sandbox replaced its TMPDIR {path} with something else; left it in place"]
    if not _remove_untouched(path):
        shutil.rmtree(path, ignore_errors=True)
    return [f"could not remove the sandbox's TMPDIR {path}"] if os.path.lexists(path) else []


def _remove_untouched(path: str) -> bool:
    """The common case, in three calls: the TMPDIR holds only warren's .gitignore
    (rmtree costs a few tenths of a millisecond on every run). False when it holds
    anything else, for rmtree to deal with; the sandbox has ended, nothing races."""
    try:
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        os.unlink(".gitignore", dir_fd=dfd)
    except FileNotFoundError:
        pass
    except OSError:
        return False
    finally:
        os.close(dfd)
    try:
        os.rmdir(path)
    except OSError:
        return False
    return True
