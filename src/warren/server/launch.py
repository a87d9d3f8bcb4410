"""The one launch path: prepare the host for a plan, then clone its PID 1.

Used for every sandbox, one-shot or long-lived, so whatever is added here (the
directories a preset needs, the sandbox's TMPDIR beside the workspace, the ancestor guard,
cgroups next) is added once. Order
matters: warren creates what it must create *before* snapshotting the ancestors'
metadata, so its own mkdir is never reported as the sandbox's doing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import socket
from dataclasses import dataclass, field

from .._core import cgroups, clone, guard, safepath
from ..errors import SetupError
from ..plan.model import Plan
from . import boxsecrets, marks, unshare
from .hostwatch import HostWatch
from .markwatch import MarkWatch

TMP_RECORD_PREFIX = "tmpdir-"


@dataclass
class Scratch:
    """The sandbox's TMPDIR as made: ``name`` in the directory ``parent_fd`` (opened
    by warren while making it, so removal never walks the path again)."""

    path: str
    parent_fd: int
    name: str
    record: str | None  # its record file (for the next supervisor's sweep), if any


@dataclass
class Launched:
    pid: int  # PID 1, as the host sees it
    pidfd: int
    control: socket.socket  # the supervisor's end of PID 1's control channel
    guard: list[guard.DirState]
    scratch: Scratch | None = None  # the TMPDIR warren made (outside the workspace)
    cgroups: list[str] = field(default_factory=list)  # the sandbox's own, one per controller
    record_dir: str | None = None
    # ("LIMIT:KEY", fd) of the counter files that tell a limit was reached; every exec's
    # helper gets them (it reads them before and after its command)
    counters: list[tuple[str, int]] = field(default_factory=list)
    trust_bundle: str | None = None  # written for secrets (server.boxsecrets), removed at the end
    marks: marks.Marks | None = None  # booted ahead: the host as PID 1 is cloned to set up from
    mark_watch: MarkWatch | None = None  # ... and whether it is still that, told by the kernel
    # a long-lived sandbox's directories whose entries its read rules name one by one
    host_watch: HostWatch | None = None


def launch(
    plan: Plan,
    *,
    oneshot: bool,
    ahead: bool = False,
    record_dir: str | None = None,
    tmp_records: str | None = None,
    trust: bytes | None = None,
    layers: dict[int, list[int]] | None = None,
) -> Launched:
    """``ahead``: a one-shot sandbox booted before its command is known (``ahead``);
    ``record_dir``: where the sandbox's cgroups are listed until removed (so a
    crashed supervisor's successor finds them: ``cgroups.sweep``); ``tmp_records``:
    the same for its TMPDIR (``sweep_scratch``); ``trust``: the trust bundle to write at
    ``plan.net.trust_bundle`` (secrets); ``layers``: overlay layers given by descriptor
    (``server.restack.clone_own``), by index; the caller's, who closes them."""
    for path in plan.create_dirs:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise SetupError.from_os(
                e,
                f"cannot create tool cache {path}",
                "mkdir",
                path,
                hint="create it yourself or drop the preset",
            ) from None
    if plan.limits is not None and plan.limits.refused:
        raise SetupError(
            f"cannot place the sandbox in your cgroups: {plan.limits.refused[0]}",
            operation="cgroup",
            hint="the sandbox must count against your own cgroups: stop the supervisor (`warren shutdown`) "
            "and run warren from this group, so the next one starts here; or make your group writable "
            "for your uid (cgroup2: delegate it)",
        )
    unshare.own_inodes(plan.host_workspace or plan.workspace, plan.unshare)
    bundle = plan.net.trust_bundle if trust is not None else None
    if bundle is not None and trust is not None:
        boxsecrets.write_bundle(bundle, trust)
    try:
        scratch = _make_scratch(plan, tmp_records) if plan.scratch else None
    except BaseException:
        boxsecrets.remove_bundle(bundle)
        raise
    try:
        groups = cgroups.create(plan.limits.cgroups, plan.uid, record_dir) if plan.limits else []
    except BaseException:
        _remove_scratch(scratch)
        boxsecrets.remove_bundle(bundle)
        raise
    states = guard.snapshot(plan.guarded)
    # Before PID 1 lists the directories its rules name entry by entry: a change after
    # the listing is then one the watch saw.
    host_watch = None if oneshot else HostWatch.start(plan)
    tasks: list[tuple[str, int]] = []
    mark_watch: MarkWatch | None = None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        # The sandbox's own groups, and the caller's own where it gets none (``joins``).
        tasks = _open_tasks([*groups, *(plan.limits.joins if plan.limits else ())])
        # Once everything warren makes for the sandbox is made, just before the clone.
        taken: marks.Marks | None = None
        if ahead:
            # Watched from before the marks are taken: a change after is queued there.
            mark_watch = MarkWatch.start(plan)
            taken = marks.take(plan)
            if mark_watch is not None and not mark_watch.confirm(plan):
                mark_watch = None
        # PID 1 enters its cgroups first thing: everything in the sandbox descends
        # from it, inside them.
        pid = clone.start_pid1(plan, theirs, oneshot=oneshot, cgroup_tasks=tasks, ahead=ahead, layers=layers)
    except BaseException:
        ours.close()
        if host_watch is not None:
            host_watch.close()
        if mark_watch is not None:
            mark_watch.close()
        cgroups.remove(groups, record_dir)
        _remove_scratch(scratch)
        boxsecrets.remove_bundle(bundle)
        raise
    finally:
        theirs.close()
        for _path, fd in tasks:
            os.close(fd)

    counters = cgroups.counter_files(groups, plan.limits.counters) if plan.limits else []
    return Launched(
        pid,
        os.pidfd_open(pid),
        ours,
        states,
        scratch,
        groups,
        record_dir,
        counters,
        bundle,
        taken,
        mark_watch,
        host_watch,
    )


def _open_tasks(groups: list[str]) -> list[tuple[str, int]]:
    try:
        return cgroups.open_tasks(groups)
    except OSError as e:
        raise cgroups.cannot_enter(e) from None


# Cgroups still busy when their sandbox ended (a task of it still leaving on a loaded
# host, past ``cgroups.remove``'s half second): tried again by the supervisor's timers
# (``retry_busy``), recorded all the while for a successor's sweep.
_busy: list[tuple[list[str], str | None]] = []


def retry_busy() -> None:
    """Remove what ``restore`` found busy, once each (called a few times a second)."""
    for item in list(_busy):
        if cgroups.remove(*item, wait=0):
            _busy.remove(item)


def restore(launched: Launched) -> list[str]:
    """After the sandbox ended: remove its cgroups (a busy one is tried again by
    ``retry_busy``, and stays recorded for a successor's sweep), then what
    ``restore_host`` does, unless done already."""
    for _name, fd in launched.counters:
        os.close(fd)
    launched.counters = []
    for group in launched.cgroups:
        # Without a pid namespace (the degraded mode) nothing dies with PID 1: what
        # is left in the sandbox's own groups goes now (with one, they are empty).
        cgroups.kill_all(group)
    if not cgroups.remove(launched.cgroups, launched.record_dir):
        _busy.append((list(launched.cgroups), launched.record_dir))
    launched.cgroups = []
    return restore_host(launched)


def restore_host(launched: Launched) -> list[str]:
    """Once nothing of the sandbox runs: remove its TMPDIR and its trust bundle, put the
    guarded directories' metadata back (what is done is not done again: a one-shot's
    run has this done before PID 1's exit, ``Box.run_over``)."""
    boxsecrets.remove_bundle(launched.trust_bundle)
    launched.trust_bundle = None
    repairs = [*_remove_scratch(launched.scratch), *guard.restore(launched.guard)]
    launched.scratch = None
    launched.guard = []
    return repairs


def _make_scratch(plan: Plan, record_dir: str | None) -> Scratch:
    """The sandbox's TMPDIR: a new directory (mode 0700, never one that is there
    already) made beneath the caller's directory ``plan.scratch_base`` without
    following a link, recorded first so a supervisor killed before removing it leaves
    it to the next one's sweep."""
    assert plan.scratch and plan.scratch_base
    base, path = plan.scratch_base, plan.scratch
    rel = os.path.relpath(path, base)
    parts = rel.split("/")
    record = None
    fd = -1
    try:
        if record_dir is not None:
            os.makedirs(record_dir, mode=0o700, exist_ok=True)
            record = os.path.join(record_dir, TMP_RECORD_PREFIX + secrets.token_hex(8))
            with open(record, "x") as f:
                f.write(f"{base}\n{rel}\n")
        fd = safepath.open_dir(base)
        for part in parts[:-1]:  # [.cache/]warren/tmp in the caller's cache: shared by sandboxes
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o700, dir_fd=fd)
            sub = safepath.dir_beneath(fd, part)
            os.close(fd)
            fd = sub
            if os.fstat(fd).st_uid != os.geteuid():
                raise OSError(errno.EPERM, "not yours", os.path.join(base, part))
        os.mkdir(parts[-1], 0o700, dir_fd=fd)
    except OSError as e:
        if fd >= 0:
            os.close(fd)
        if record:
            with contextlib.suppress(OSError):
                os.unlink(record)
        raise SetupError.from_os(
            e,
            f"cannot create the sandbox's TMPDIR {path}: {e.strerror}",
            "mkdir",
            path,
            hint=f"check that {base} is a directory of yours, or set TMPDIR to a directory on another "
            "filesystem (the sandbox's private /tmp is then its TMPDIR)",
        ) from None
    return Scratch(path, fd, parts[-1], record)


def _remove_scratch(made: Scratch | None) -> list[str]:
    """Remove the sandbox's TMPDIR with everything in it, never following a link the
    sandbox planted there (it could write it until it ended)."""
    if made is None or made.parent_fd < 0:
        return []
    try:
        safepath.remove_tree(made.parent_fd, made.name)
    except (OSError, RecursionError) as e:
        return [f"could not remove the sandbox's TMPDIR {made.path}: {e}; the next supervisor tries again"]
    finally:
        os.close(made.parent_fd)
        made.parent_fd = -1
    if made.record:
        with contextlib.suppress(OSError):
            os.unlink(made.record)
    return []


def sweep_scratch(record_dir: str) -> int:
    """Remove the TMPDIRs of sandboxes a killed supervisor left (from their records),
    never following a link; returns how many could not be removed."""
    try:
        names = [n for n in os.listdir(record_dir) if n.startswith(TMP_RECORD_PREFIX)]
    except OSError:
        return 0
    left = 0
    for name in names:
        record = os.path.join(record_dir, name)
        try:
            with open(record) as f:
                base, rel = f.read().splitlines()[:2]
        except (OSError, ValueError):
            continue
        if not base.startswith("/") or rel.startswith("/") or ".." in rel.split("/"):
            continue
        try:
            fd = safepath.open_dir(base)
        except FileNotFoundError:
            fd = -1
        except OSError:
            left += 1
            continue
        try:
            if fd >= 0:
                safepath.remove_tree(fd, rel)
        except FileNotFoundError:
            pass
        except (OSError, RecursionError):
            left += 1
            continue
        finally:
            if fd >= 0:
                os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(record)
    return left
