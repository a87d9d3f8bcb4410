"""Resource-limit probes: which mechanisms this host offers the calling user.

warren limits a sandbox with cgroup v1 controllers made beneath the caller's own
cgroups (pids, memory, cpu; the freezer to pause), with RLIMIT_NPROC set inside the
sandbox's own user namespace, and with tmpfs ``size=``. Whether each works depends on
the host *and* the caller, and permission bits do not tell (root ignores them, a
read-only cgroupfs or a security module overrides them), so every probe tries the
real thing as the caller: it makes a cgroup and removes it, forks against
RLIMIT_NPROC in a fresh user namespace, fills a 1 MiB tmpfs. What it measured goes
into the result's ``facts``.

Leaves nothing behind: each cgroup made is removed before the probe returns (one that
cannot be is reported as ``cleanup``), every process forked is reaped, and mounts live
in a mount namespace that ends with the child that made it. Decides no causes (that is
``diagnose.py``); only which of the three pause mechanisms the measured facts give.
"""

from __future__ import annotations

import errno as _errno
import json
import os
import platform
import resource
import secrets
import select
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field, replace
from functools import partial
from typing import NoReturn

from . import _kernel
from .evidence import Evidence, MountEntry
from .probe_base import ProbeFailure, ProbeResult, ProbeSkipped, _op, _result, describe

LOCATION = "limits"
V1_CONTROLLERS = ("pids", "memory", "cpu", "freezer")
# The file warren writes in a sandbox's cgroup of each controller: a new cgroup
# without it cannot carry the limit.
V1_LIMIT_FILE = {
    "pids": "pids.max",
    "memory": "memory.limit_in_bytes",
    "cpu": "cpu.cfs_quota_us",
    "freezer": "freezer.state",
}
# The names pause/resume uses for its mechanism, in the order it prefers them.
PAUSE_FREEZER = "cgroup1 freezer"
PAUSE_CGROUP2 = "cgroup2 cgroup.freeze"
PAUSE_SIGNALS = "signals (SIGSTOP/SIGCONT)"
CHILD_PREFIX = "warren-doctor-"
NPROC_LIMIT = 3
TMPFS_SIZE = 1 << 20
_TMPFS_TARGETS = ("/tmp", "/var/tmp", "/mnt", "/dev")  # any directory will do; it is private
_CHILD_TIMEOUT = 10.0
_RMDIR_WAIT = 0.5

FactsFn = Callable[[dict[str, object]], str]


@dataclass
class Caller:
    """Who asks, where its cgroups are, and what a probe could not remove."""

    uid: int
    gid: int
    own: dict[str, str] | None  # controller -> own cgroup (/proc/self/cgroup; cgroup2 is "")
    mounts: tuple[MountEntry, ...]
    left_behind: list[str] = field(default_factory=list)


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller -> this process's cgroup, from /proc/self/cgroup; cgroup2's key is ``""``."""
    own: dict[str, str] = {}
    for line in text.splitlines():
        _id, _, rest = line.partition(":")
        controllers, sep, path = rest.partition(":")
        if sep:
            for c in controllers.split(","):
                own[c] = path
    return own


def own_dir(mounts: Sequence[MountEntry], own: str) -> str | None:
    """The directory of cgroup ``own`` under the first mount of its hierarchy that shows
    it: a container's cgroupfs is often mounted with only its own subtree as root."""
    for m in mounts:
        root = m.root.rstrip("/")
        if own == m.root or own.startswith(root + "/"):
            return os.path.normpath(m.mount_point + "/" + own[len(root) :])
    return None


def _v1_mounts(controller: str, mounts: Sequence[MountEntry]) -> list[MountEntry]:
    return [m for m in mounts if m.fstype == "cgroup" and controller in m.super_options.split(",")]


def _unseen(hierarchy: str, own: str, mounts: Sequence[MountEntry]) -> str:
    # In a cgroup namespace /proc/self/cgroup is relative to its root and a mount made
    # outside it shows a root like "/..": the own cgroup has no path through it.
    roots = ", ".join(sorted({m.root for m in mounts}))
    return f"own {hierarchy} cgroup {own} is not visible through its mounts (mount root {roots})"


def _owner(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f" (owned by uid {st.st_uid}, mode {oct(st.st_mode & 0o7777)})"


def _words(path: str) -> list[str]:
    try:
        with open(path) as f:
            return f.read().split()
    except OSError:
        return []


def _try_child(ctx: Caller, parent: str, read: str | None = None) -> tuple[list[str], list[str]]:
    """mkdir a uniquely named cgroup beneath ``parent``, list the files the kernel gave
    it (and the words of ``read``), and remove it again."""
    child = os.path.join(parent, f"{CHILD_PREFIX}{os.getpid()}-{secrets.token_hex(4)}")
    try:
        os.mkdir(child)
    except OSError as e:
        err = _errno.errorcode.get(e.errno or 0, str(e.errno))
        why = f"not writable by uid {ctx.uid}: mkdir beneath {parent} -> {err}{_owner(parent)}"
        raise ProbeFailure("mkdir", why, e.errno) from e
    try:
        return sorted(os.listdir(child)), _words(os.path.join(child, read)) if read else []
    finally:
        _remove_cgroup(ctx, child)


def _remove_cgroup(ctx: Caller, path: str) -> None:
    # A cgroup no task ever entered is normally removable at once; EBUSY is retried
    # briefly in case the kernel still holds it.
    deadline = time.monotonic() + _RMDIR_WAIT
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if e.errno != _errno.EBUSY or time.monotonic() > deadline:
                ctx.left_behind.append(f"{path}: {describe(e)}")
                return
        time.sleep(0.005)


# --- cgroup v1 and cgroup2 --------------------------------------------------------


def cgroup1(controller: str, ctx: Caller, facts: dict[str, object]) -> str:
    facts.update(controller=controller, mount_point=None, own_cgroup=None, directory=None, usable=False)
    mounts = _v1_mounts(controller, ctx.mounts)
    if not mounts:
        raise ProbeFailure(
            "mountinfo",
            f"no cgroup v1 hierarchy has the {controller} controller (not mounted, or on cgroup2)",
        )
    facts["mount_point"] = mounts[0].mount_point
    own = None if ctx.own is None else ctx.own.get(controller)
    if own is None:
        raise ProbeFailure("/proc/self/cgroup", f"this process is in no {controller} cgroup")
    facts["own_cgroup"] = own
    parent = own_dir(mounts, own)
    if parent is None:
        raise ProbeFailure("mountinfo", _unseen(controller, own, mounts))
    facts["directory"] = parent
    files, _ = _try_child(ctx, parent)
    needed = V1_LIMIT_FILE[controller]
    if needed not in files:
        raise ProbeFailure("mkdir", f"a cgroup made beneath {parent} has no {needed}")
    facts["usable"] = True
    use = "pause freezes sandboxes with it" if controller == "freezer" else "sandboxes get limits from it"
    return f"usable: {use} ({needed} in cgroups beneath {parent})"


def cgroup2(ctx: Caller, facts: dict[str, object]) -> str:
    facts.update(
        mount_point=None,
        own_cgroup=None,
        directory=None,
        controllers=[],
        subtree_control=[],
        child_controllers=None,
        bound_to_v1=[],
        writable=False,
        freeze=False,
    )
    mounts = [m for m in ctx.mounts if m.fstype == "cgroup2"]
    if not mounts:
        raise ProbeFailure("mountinfo", "no cgroup2 mount")
    facts["mount_point"] = mounts[0].mount_point
    own = None if ctx.own is None else ctx.own.get("")
    if own is None:
        raise ProbeFailure("/proc/self/cgroup", "this process is in no cgroup2 cgroup (no 0:: line)")
    facts["own_cgroup"] = own
    parent = own_dir(mounts, own)
    if parent is None:
        raise ProbeFailure("mountinfo", _unseen("cgroup2", own, mounts))
    facts["directory"] = parent
    controllers = _words(os.path.join(parent, "cgroup.controllers"))
    subtree = _words(os.path.join(parent, "cgroup.subtree_control"))
    bound = [c for c in ("memory", "pids", "cpu") if c not in controllers and _v1_mounts(c, ctx.mounts)]
    facts.update(controllers=controllers, subtree_control=subtree, bound_to_v1=bound)
    bound_note = f"; {', '.join(bound)} bound to cgroup v1" if bound else ""
    where = (
        f"at {mounts[0].mount_point}, own cgroup {own} (controllers: {' '.join(controllers) or 'none'}, "
        f"for its children: {' '.join(subtree) or 'none'}{bound_note})"
    )
    try:
        files, child_controllers = _try_child(ctx, parent, read="cgroup.controllers")
    except ProbeFailure as f:
        raise ProbeFailure(f.operation, f"{where}: {f.message}", f.errno) from None
    freeze = "cgroup.freeze" in files
    facts.update(writable=True, freeze=freeze, child_controllers=child_controllers)
    got = "cgroup.freeze (pause without a freezer controller)" if freeze else "no cgroup.freeze"
    return (
        f"{where}: writable by uid {ctx.uid}; a child gets {got} and controllers: "
        f"{' '.join(child_controllers) or 'none'}; warren takes from it what no writable cgroup v1 "
        "controller gives (each sandbox gets a group here: limits by the controllers above, pause, kill)"
    )


# --- probes in a forked child -----------------------------------------------------


def _idle_until_closed(keep: int) -> NoReturn:
    """In a forked process: hold no descriptor but ``keep``, wait until its writer
    closes, exit. Holding nothing else lets every pipe above see its end."""
    try:
        os.closerange(3, keep)
        os.closerange(keep + 1, 1 << 16)
        os.read(keep, 1)
    finally:
        os._exit(0)


@contextmanager
def _idle_processes(count: int) -> Iterator[int]:
    """Up to ``count`` idle processes of this user, reaped on exit; yields how many."""
    r, w = os.pipe()
    pids: list[int] = []
    try:
        for _ in range(max(count, 0)):
            pid = os.fork()
            if pid == 0:
                _idle_until_closed(r)
            pids.append(pid)
        yield len(pids)
    finally:
        os.close(w)
        os.close(r)
        for pid in pids:
            os.waitpid(pid, 0)


def _child_main(fn: Callable[[], dict[str, object]], r: int, w: int) -> NoReturn:
    try:
        os.close(r)
        try:
            out: dict[str, object] = {"ok": fn()}
        except ProbeFailure as f:
            out = {"failed": [f.operation, f.message, f.errno]}
        except BaseException as e:
            out = {"crashed": f"{type(e).__name__}: {e}"}
        os.write(w, json.dumps(out).encode())
    finally:
        os._exit(0)


def _read_until_eof(fd: int, timeout: float) -> bytes | None:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def in_child(fn: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Run ``fn`` in a forked child, which may unshare namespaces and lower its limits
    without touching the doctor, and return what it returned. A ProbeFailure there is
    raised here again."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        _child_main(fn, r, w)
    os.close(w)
    data: bytes | None = None
    try:
        data = _read_until_eof(r, _CHILD_TIMEOUT)
    finally:
        os.close(r)
        if data is None:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the probe's child process gave no answer within {_CHILD_TIMEOUT:g} s")
    out = json.loads(data)
    if "failed" in out:
        operation, message, err = out["failed"]
        raise ProbeFailure(operation, message, err)
    if "crashed" in out:
        raise RuntimeError(out["crashed"])
    result = out["ok"]
    assert isinstance(result, dict)
    return result


def _write_proc(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_user_namespace(uid: int, gid: int, also: int = 0) -> None:
    """unshare a user namespace (and the namespaces ``also`` names) and map the caller's
    own uid and gid to themselves, as warren does for a sandbox."""
    try:
        _op("unshare(CLONE_NEWUSER)", _kernel.unshare, _kernel.CLONE_NEWUSER | also)
        _op("write /proc/self/setgroups", _write_proc, "/proc/self/setgroups", "deny")
        _op("write /proc/self/uid_map", _write_proc, "/proc/self/uid_map", f"{uid} {uid} 1")
        _op("write /proc/self/gid_map", _write_proc, "/proc/self/gid_map", f"{gid} {gid} 1")
    except ProbeFailure as f:
        why = f"no user namespace for uid {uid}: {f.operation} -> {f.message}"
        raise ProbeFailure(f.operation, why, f.errno) from None


def tasks_of(uid: int, enough: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) whose real uid is ``uid``,
    among the processes this /proc shows; counting stops past ``enough``."""
    count = 0
    for entry in os.listdir("/proc"):
        if count > enough:
            break
        if not entry.isdigit():
            continue
        try:
            # /proc/PID belongs to the task's effective uid: a cheap filter before reading
            # its status (a non-dumpable task shows as root and is missed: an undercount).
            if os.stat(f"/proc/{entry}").st_uid != uid:
                continue
            with open(f"/proc/{entry}/status") as f:
                status = f.read()
        except OSError:
            continue  # it exited meanwhile
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if fields.get("Uid", "").split()[:1] == [str(uid)]:
            count += int(fields.get("Threads", "1").strip() or 1)
    return count


def _fork_under_nproc(uid: int, gid: int) -> dict[str, object]:
    enter_user_namespace(uid, gid)
    resource.setrlimit(resource.RLIMIT_NPROC, (NPROC_LIMIT, NPROC_LIMIT))
    r, w = os.pipe()
    pids: list[int] = []
    err: int | None = None
    try:
        # N attempts: N - 1 fit beside this process; the Nth must be refused.
        for _ in range(NPROC_LIMIT):
            try:
                pid = os.fork()
            except OSError as e:
                err = e.errno
                break
            if pid == 0:
                _idle_until_closed(r)
            pids.append(pid)
    finally:
        os.close(w)
        os.close(r)
        for pid in pids:
            os.waitpid(pid, 0)
    return {"forked": len(pids), "errno": err}


def nproc_per_userns(ctx: Caller, facts: dict[str, object]) -> str:
    ruid = os.getuid()  # RLIMIT_NPROC counts tasks by real uid
    n = NPROC_LIMIT
    seen = tasks_of(ruid, enough=n)
    # The verdict needs the caller to own more tasks outside than the limit inside;
    # idle helpers make up the difference when it runs almost alone.
    with _idle_processes(n + 1 - seen) as helpers:
        outside = seen + helpers
        out = in_child(lambda: _fork_under_nproc(ruid, ctx.gid))
    forked, err = out["forked"], out["errno"]
    assert isinstance(forked, int) and (err is None or isinstance(err, int))
    facts.update(limit=n, tasks_outside=outside, helpers=helpers, forked=forked, errno=err)
    facts["kernel"] = platform.release()
    tried = f"with RLIMIT_NPROC={n} in a new user namespace"
    if err == _errno.EAGAIN and forked == n - 1 and outside > n:
        facts["per_user_namespace"] = True
        return (
            f"per user namespace: with RLIMIT_NPROC={n} a new user namespace held {n} tasks (the next fork: "
            f"EAGAIN) while uid {ruid} has at least {outside} outside it"
            + (f" (including {helpers} idle helper(s) this probe forked)" if helpers else "")
            + "; a sandbox's RLIMIT_NPROC caps the whole sandbox"
        )
    facts["per_user_namespace"] = None  # undecided, unless the count shows otherwise below
    if err is None and ruid == 0:
        raise ProbeSkipped(
            f"not applicable to uid 0: the kernel never applies RLIMIT_NPROC to root ({tried}, all "
            f"{forked} forks tried succeeded), so root's pids limit must come from a cgroup"
        )
    if err is None:
        raise ProbeFailure("fork", f"{tried} nothing stopped {forked} forks")
    if err == _errno.EAGAIN and forked < n - 1:
        facts["per_user_namespace"] = False
        raise ProbeFailure(
            "fork",
            f"{tried} only {forked} fork(s) succeeded: the kernel counted uid {ruid}'s {outside}+ tasks "
            f"outside the namespace too (kernel {platform.release()})",
            err,
        )
    raise ProbeFailure("fork", f"{tried} fork failed after {forked}: {_errno.errorcode.get(err, err)}", err)


def _fill_tmpfs(uid: int, gid: int) -> dict[str, object]:
    enter_user_namespace(uid, gid, _kernel.CLONE_NEWNS)
    # Private first: nothing mounted below may propagate back to the caller's mounts.
    _op("mount(MS_PRIVATE)", _kernel.mount, None, "/", None, _kernel.MS_REC | _kernel.MS_PRIVATE)
    target = next((d for d in _TMPFS_TARGETS if os.path.isdir(d)), None)
    if target is None:
        raise ProbeFailure("mount", f"none of {', '.join(_TMPFS_TARGETS)} exists to mount a tmpfs on")
    flags = _kernel.MS_NOSUID | _kernel.MS_NODEV
    _op("mount(tmpfs)", _kernel.mount, "tmpfs", target, "tmpfs", flags, f"size={TMPFS_SIZE}")
    st = os.statvfs(target)
    fd = _op("create", os.open, os.path.join(target, "fill"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    written, err = 0, None
    chunk = bytes(64 << 10)
    try:
        while written < 2 * TMPFS_SIZE:
            try:
                written += os.write(fd, chunk)
            except OSError as e:
                err = e.errno
                break
    finally:
        os.close(fd)
    return {"target": target, "statvfs_bytes": st.f_blocks * st.f_frsize, "written": written, "errno": err}


def tmpfs_size(ctx: Caller, facts: dict[str, object]) -> str:
    out = in_child(lambda: _fill_tmpfs(ctx.uid, ctx.gid))
    facts.update(size=TMPFS_SIZE, **out)
    written, err, total = out["written"], out["errno"], out["statvfs_bytes"]
    assert isinstance(written, int) and isinstance(total, int) and (err is None or isinstance(err, int))
    stop = "no error" if err is None else _errno.errorcode.get(err, str(err))
    seen = f"a size=1M tmpfs took {written:,} bytes, then {stop} (statvfs: {total:,} bytes)"
    if err == _errno.ENOSPC and TMPFS_SIZE // 2 <= written <= TMPFS_SIZE:
        return f"enforced in a user+mount namespace: {seen}; --tmp-size caps /tmp and /dev/shm"
    raise ProbeFailure("write", f"in a user+mount namespace {seen}", err)


# --- the decision and the runner --------------------------------------------------


def pause_mechanism(results: Sequence[ProbeResult]) -> str:
    """How pause/resume stops a sandbox, from the measured rows: a freezer this caller
    can write is atomic; signals work everywhere."""
    by_id = {r.id: r for r in results if r.location == LOCATION}
    freezer, v2 = by_id.get("cgroup1_freezer"), by_id.get("cgroup2")
    if freezer is not None and freezer.status == "pass":
        return PAUSE_FREEZER
    if v2 is not None and v2.status == "pass" and v2.facts.get("freeze") is True:
        return PAUSE_CGROUP2
    return PAUSE_SIGNALS


def _pause_row(results: Sequence[ProbeResult]) -> ProbeResult:
    mechanism = pause_mechanism(results)
    row = ProbeResult("pause", "how pause/resume stops a sandbox", LOCATION, "pass", False)
    row = replace(row, facts={"mechanism": mechanism})
    if mechanism == PAUSE_FREEZER:
        return replace(row, detail=f"{mechanism}: a sandbox's cgroup is frozen as one")
    if mechanism == PAUSE_CGROUP2:
        return replace(row, detail=f"{mechanism}: a sandbox's cgroup2 child is frozen as one")
    return replace(
        row,
        status="fail",
        message=f"{mechanism}: no freezer this caller can write (neither cgroup1_freezer nor a cgroup2 "
        "child with cgroup.freeze)",
    )


def _measure(probe_id: str, title: str, fn: FactsFn) -> ProbeResult:
    facts: dict[str, object] = {}
    r = _result(probe_id, title, LOCATION, False, lambda: fn(facts))
    return replace(r, facts=facts)


def _own_cgroups() -> dict[str, str] | None:
    try:
        with open("/proc/self/cgroup") as f:
            return parse_proc_cgroup(f.read())
    except OSError:
        return None


def run_limit_probes(evidence: Evidence) -> list[ProbeResult]:
    """One row per mechanism: each cgroup v1 controller warren uses, cgroup2,
    RLIMIT_NPROC per user namespace, tmpfs size=, and the pause mechanism they give."""
    p = evidence.process
    ctx = Caller(p.uid, p.gid, _own_cgroups(), evidence.mounts)
    results = [
        _measure(
            f"cgroup1_{c}", f"cgroup v1 {c}: make a cgroup beneath the caller's own", partial(cgroup1, c, ctx)
        )
        for c in V1_CONTROLLERS
    ]
    results.append(
        _measure("cgroup2", "cgroup2: make a cgroup beneath the caller's own", partial(cgroup2, ctx))
    )
    results.append(
        _measure(
            "nproc_per_userns", "RLIMIT_NPROC counted per user namespace", partial(nproc_per_userns, ctx)
        )
    )
    results.append(_measure("tmpfs_size", "tmpfs size= in a user+mount namespace", partial(tmpfs_size, ctx)))
    results.append(_pause_row(results))
    for left in ctx.left_behind:
        results.append(
            ProbeResult(
                "cleanup", "remove the probe's cgroup", LOCATION, "error", True, message=f"left {left}"
            )
        )
    return results
