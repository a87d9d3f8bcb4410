"""cgroup files: probe what this caller may use, make a sandbox's cgroups, read them, remove them.

A sandbox's cgroups are made *beneath the caller's own* cgroup in each hierarchy: the
caller is the client that asked, whose ``/proc/PID/cgroup`` the supervisor reads from
the kernel through the connection's pidfd (``peer_cgroups``), not the supervisor
itself. Nothing is moved out of where it started, so whatever already limits the
caller (a CI job's pids cgroup, a memory cgroup of the machine's management) stays in
charge; where the sandbox gets no group of its own, ``probe`` says whether PID 1 may
join the caller's group and what a sandbox left in the supervisor's would escape
(``placements``: ``plan.limits.place`` decides). Each is named
``warren-<uid>-<token>`` and listed in a record file before it is made, so a
supervisor killed at any moment leaves nothing the next one cannot find and remove
(``sweep``: it thaws and kills what is left first). Decisions live in
``plan.limits``; this module only reads and writes the files.

cgroup2 (a delegated subtree): a sandbox gets one group holding every controller the
plan enables. Domain controllers can only be handed to children of a group without
processes of its own, so when the supervisor sits in the delegated group itself it
moves into a leaf beneath it (``warren-<uid>-supervisor``): still beneath where it
started; it never moves into a client's group.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import signal
import time

from ..errors import SandboxError, SetupError
from ..plan.limits import V2, CgroupFacts, CgroupPlan, Counter, Hierarchy, Placement
from . import procs

ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("pids", "memory", "cpu", "freezer")
FREEZE_WAIT = 2.0  # seconds a freeze may take before it is undone and reported
# A task in the kernel's exit cannot be frozen and runs nothing of its own again; freeing
# a large memory takes the kernel long (2 GiB: about 0.2 s on a quiet host, seconds on a
# loaded one): while one is there a freeze waits on, this long in all.
FREEZE_EXIT_WAIT = 10.0
EXIT_GONE_WAIT = 0.5


def supervisor_leaf(uid: int) -> str:
    return f"warren-{uid}-supervisor"


def own_paths(text: str | None = None) -> dict[str, str]:
    """Controller -> this process's cgroup path (``""`` is cgroup2's key); or the
    paths of another process's ``/proc/PID/cgroup`` text."""
    if text is None:
        with open("/proc/self/cgroup") as f:
            text = f.read()
    out: dict[str, str] = {}
    for line in text.splitlines():
        _id, _, rest = line.partition(":")
        ctrls, _, path = rest.partition(":")
        for c in ctrls.split(","):
            out[c] = path
    return out


def peer_cgroups(pid: int, pidfd: int) -> str:
    """The ``/proc/PID/cgroup`` text of a connected client, as the kernel has it: read
    through its ``/proc`` directory, opened and *then* checked to belong to the pidfd
    the connection carried (the process is still alive, so its pid was not reused), so
    a recycled pid cannot answer for it. Paths are as this process's cgroup namespace
    sees them, the same view as its ``/sys/fs/cgroup``."""
    try:
        dirfd = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise _client_gone(pid, e) from None
    try:
        try:
            signal.pidfd_send_signal(pidfd, 0)
            fd = os.open("cgroup", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError as e:
            raise _client_gone(pid, e) from None
        with os.fdopen(fd) as f:
            return f.read()
    finally:
        os.close(dirfd)


def _client_gone(pid: int, e: OSError) -> SandboxError:
    return SandboxError.from_os(
        e,
        f"the client (pid {pid}) is gone: its cgroups cannot be read",
        "cgroup",
        f"/proc/{pid}/cgroup",
        hint="the sandbox is placed in its caller's cgroups; ask again from a live process",
    )


@functools.cache
def _mount_of(controllers: tuple[str, ...]) -> str | None:
    """Where a v1 hierarchy (by its controllers) or cgroup2 (``()``) is mounted
    (remembered: a supervisor lives minutes, cgroup mounts for the machine's life)."""
    if not controllers:
        for mount in (os.path.join(ROOT, "unified"), ROOT):
            if os.path.exists(os.path.join(mount, "cgroup.subtree_control")):
                return mount
        return None
    for c in controllers:
        mount = os.path.join(ROOT, c)
        if os.path.exists(os.path.join(mount, "cgroup.procs")):
            return mount
    return None


# v1 controllers whose groups only count or tag: nothing a sandbox could escape.
_COUNTING = ("cpuacct", "perf_event", "net_cls", "net_prio")
_V1_UNLIMITED = 1 << 62
_DELEGATED_FILES = (
    "",
    "cgroup.procs",
    "cgroup.subtree_control",
)  # the user's when delegated  # memory.limit_in_bytes reads 9223372036854771712 when unset


def _limit_files(controllers: tuple[str, ...]) -> tuple[tuple[str, str], ...] | None:
    """(file, its unlimited value) per limit a group of these controllers can set;
    None: a controller whose limits are not known here (any group of it may limit)."""
    if not controllers:  # cgroup2: only the controllers enabled show their files
        return (
            ("pids.max", "max"),
            ("memory.max", "max"),
            ("memory.high", "max"),
            ("memory.swap.max", "max"),
            ("cpu.max", "max"),
            ("io.max", ""),
        )
    files: list[tuple[str, str]] = []
    for c in controllers:
        if c == "pids":
            files.append(("pids.max", "max"))
        elif c == "memory":
            files += [("memory.limit_in_bytes", "v1"), ("memory.memsw.limit_in_bytes", "v1")]
        elif c == "cpu":
            files.append(("cpu.cfs_quota_us", "-1"))
        elif c not in _COUNTING:
            return None
    return tuple(files)


def _unlimited(value: str, unlimited: str) -> bool:
    if unlimited == "v1":
        return value.isdigit() and int(value) >= _V1_UNLIMITED
    return value == unlimited or value.split(" ", 1)[0] == unlimited


def escaped(controllers: tuple[str, ...], caller: str, supervisor: str) -> tuple[str, ...]:
    """The limits set on the caller's side below the group it shares with the
    supervisor: what a sandbox left in the supervisor's group would not count against."""
    common = os.path.commonpath([caller, supervisor])
    files = _limit_files(controllers)
    out: list[str] = []
    d = caller
    while d != common and d.startswith(common + "/"):
        if files is None:
            out.append(f"whatever the {','.join(controllers)} cgroup {d} limits")
        else:
            for file, unlimited in files:
                value = read(d, file).strip()
                if value and not _unlimited(value, unlimited):
                    out.append(f"{file} {value} of {d}")
        d = os.path.dirname(d)
    return tuple(out)


def pids_caps(caller: dict[str, str]) -> tuple[tuple[str, int], ...]:
    """Finite pids.max of the caller's group and its ancestors (v1 pids hierarchy and
    cgroup2), innermost first."""
    out: list[tuple[str, int]] = []
    for key, controllers in (("pids", ("pids",)), ("", ())):
        mount = _mount_of(controllers)
        if key not in caller or mount is None or ".." in caller[key]:
            continue
        d = os.path.normpath(mount + caller[key])
        while d.startswith(mount + "/"):
            value = read(d, "pids.max").strip()
            if value.isdigit():
                out.append((d, int(value)))
            d = os.path.dirname(d)
    return tuple(out)


def placements(uid: int, caller_text: str, own: dict[str, str]) -> tuple[Placement, ...]:
    """Each hierarchy the caller is in (named ones, which hold no controller, aside):
    the caller's group, the supervisor's, whether this uid may move a process into the
    caller's, and (only when the supervisor is outside it) what would be escaped."""
    out: list[Placement] = []
    for line in caller_text.splitlines():
        _id, _, rest = line.partition(":")
        names, _, path = rest.partition(":")
        controllers = tuple(c for c in names.split(",") if c)
        if any(c.startswith("name=") for c in controllers):
            continue
        mount = _mount_of(controllers)
        key = controllers[0] if controllers else ""
        if mount is None or key not in own:
            continue
        kind = controllers or (V2,)
        supervisor = os.path.normpath(mount + own[key])
        if not controllers and os.path.basename(supervisor) == supervisor_leaf(uid):
            supervisor = os.path.dirname(supervisor)
        if ".." in path.split("/"):
            # Outside this supervisor's cgroup namespace: nothing here can reach it.
            out.append(Placement(kind, mount + path, supervisor, False, (f"the cgroup {path} out of reach",)))
            continue
        caller = os.path.normpath(mount + path)
        p = Placement(kind, caller, supervisor, _may_move(controllers, caller, supervisor))
        if not p.within:
            p = Placement(kind, caller, supervisor, p.joinable, escaped(controllers, caller, supervisor))
        out.append(p)
    return tuple(out)


def _may_move(controllers: tuple[str, ...], caller: str, supervisor: str) -> bool:
    """A process of this uid born in ``supervisor`` may move itself into ``caller``
    (cgroup2 also asks for the group both share: the kernel checks its cgroup.procs)."""
    if controllers:
        return os.access(os.path.join(caller, "tasks"), os.W_OK)
    common = os.path.commonpath([caller, supervisor])
    return all(os.access(os.path.join(d, "cgroup.procs"), os.W_OK) for d in (caller, common))


def probe(uid: int, caller_text: str | None = None) -> CgroupFacts:
    """What ``uid`` may do in the caller's cgroups. ``caller_text``: the client's
    ``/proc/PID/cgroup`` (``peer_cgroups``); None: this process is the caller."""
    try:
        with open("/proc/self/cgroup") as f:
            self_text = f.read()
    except OSError:
        return CgroupFacts(uid)
    text = self_text if caller_text is None else caller_text
    own = own_paths(text)
    mine = own_paths(self_text)
    v1 = []
    for c in V1_CONTROLLERS:
        mount = os.path.join(ROOT, c)
        if c not in own or not os.path.exists(os.path.join(mount, "cgroup.procs")) or ".." in own[c]:
            continue
        parent = os.path.normpath(mount + own[c])
        v1.append(
            Hierarchy(
                c, parent, os.access(parent, os.W_OK) and os.access(os.path.join(parent, "tasks"), os.W_OK)
            )
        )
    v2_path = None
    ctrls: tuple[str, ...] = ()
    writable = False
    borrowed = False
    v2_mount = _mount_of(())
    if v2_mount is not None and "" in own and ".." not in own[""]:
        supervisor = os.path.normpath(v2_mount + mine.get("", "/"))
        if os.path.basename(supervisor) == supervisor_leaf(uid):
            supervisor = os.path.dirname(supervisor)  # the delegated group is the one above
        v2_path = os.path.normpath(v2_mount + own[""])
        if os.path.basename(v2_path) == supervisor_leaf(uid):
            v2_path = os.path.dirname(v2_path)
        ctrls, writable = _v2_group(v2_path, supervisor, v2_mount)
        if not writable and v2_path != supervisor and not escaped((), v2_path, supervisor):
            # The caller's group is not delegated (a login session's scope) but the
            # supervisor's is (its own systemd scope), and nothing is set on the
            # caller's side that a group there would escape: the sandbox's group goes
            # beneath the supervisor's, as pause, kill and limits need a group.
            sup_ctrls, sup_writable = _v2_group(supervisor, supervisor, v2_mount)
            if sup_writable:
                v2_path, ctrls, writable, borrowed = supervisor, sup_ctrls, True, True
    return CgroupFacts(
        uid,
        tuple(v1),
        v2_path,
        ctrls,
        writable,
        placements(uid, text, mine),
        pids_caps(own),
        v2_borrowed=borrowed,
    )


def _v2_group(path: str, supervisor: str, mount: str) -> tuple[tuple[str, ...], bool]:
    """(controllers its children may get, delegated) of the cgroup2 group ``path``."""
    ctrls: tuple[str, ...] = ()
    with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.controllers")) as f:
        ctrls = tuple(f.read().split())
    if path != supervisor:
        # A client's group holds the client: only controllers it already hands down
        # can be had (the supervisor moves into a leaf of its own group only).
        enabled = read(path, "cgroup.subtree_control").split()
        ctrls = tuple(c for c in ctrls if c in enabled)
    # Delegated: this uid may make groups there and move its processes into them (from
    # where the supervisor is: the kernel also checks the group both share).
    writable = (
        path != mount
        and all(os.access(os.path.join(path, f), os.W_OK) for f in _DELEGATED_FILES)
        and _may_move((), path, supervisor)
    )
    return ctrls, writable


def record_path(record_dir: str, name: str) -> str:
    return os.path.join(record_dir, name)


def create(groups: tuple[CgroupPlan, ...], uid: int, record_dir: str | None) -> list[str]:
    """Make one cgroup per planned controller and write its limits; returns their
    directories (record first, so a crash in between leaves nothing unlisted)."""
    if not groups:
        return []
    name = f"warren-{uid}-{secrets.token_hex(6)}"
    dirs = [os.path.join(g.parent, name) for g in groups]
    if record_dir is not None:
        os.makedirs(record_dir, mode=0o700, exist_ok=True)
        with open(record_path(record_dir, name), "w") as f:
            f.write("\n".join(dirs) + "\n")
    made: list[str] = []
    try:
        for g, path in zip(groups, dirs, strict=True):
            if g.enable:
                _delegate(g.parent, g.enable, uid)
            os.mkdir(path, 0o755)
            made.append(path)
            for file, value in g.files:
                with open(os.path.join(path, file), "w") as f:
                    f.write(value)
    except OSError as e:
        remove(made, record_dir)
        raise SetupError.from_os(
            e,
            f"cannot set up the sandbox's cgroup: {e.strerror}",
            "cgroup",
            e.filename or (made[-1] if made else dirs[0]),
            hint="run `warren plan` to see how each limit is enforced; a lower limit may be needed",
        ) from None
    return dirs


def _delegate(parent: str, controllers: tuple[str, ...], uid: int) -> None:
    """Let children of ``parent`` (cgroup2) have ``controllers``: with processes of its
    own it cannot, so the supervisor moves into a leaf beneath it first."""
    have = read(parent, "cgroup.subtree_control").split()
    missing = [c for c in controllers if c not in have]
    if not missing:
        return
    line = " ".join(f"+{c}" for c in missing)
    try:
        _write(parent, "cgroup.subtree_control", line)
        return
    except OSError as busy:
        if busy.errno != errno.EBUSY:
            raise
        e = busy
    mount = _mount_of(())
    mine = os.path.normpath(f"{mount}{own_paths().get('', '/')}")
    if parent not in (mine, os.path.dirname(mine)):
        # The caller's group, not the supervisor's: the supervisor never moves into a
        # client's group, and the client's own processes keep it from handing down.
        raise SetupError.from_os(
            e,
            f"cannot enable {' '.join(missing)} for the sandboxes' cgroups in {parent}: "
            "the group has processes of its own",
            "cgroup",
            parent,
            hint="cgroup2 hands controllers only to children of a group without processes: run warren "
            "from a group of its own (e.g. systemd-run --user --scope -p Delegate=yes warren ...)",
        )
    leaf = os.path.join(parent, supervisor_leaf(uid))
    with contextlib.suppress(FileExistsError):
        os.mkdir(leaf, 0o755)
    _write(leaf, "cgroup.procs", "0")  # "0": the writing process itself
    try:
        _write(parent, "cgroup.subtree_control", line)
    except OSError as e:
        others = read(parent, "cgroup.procs").split()
        raise SetupError.from_os(
            e,
            f"cannot enable {' '.join(missing)} for the sandboxes' cgroups in {parent}: {e.strerror}",
            "cgroup",
            parent,
            hint=f"other processes ({', '.join(others[:5])}) live in that group itself; start warren from a "
            "group of its own (e.g. systemd-run --user --scope -p Delegate=yes warren ...)",
        ) from None


def _write(path: str, file: str, value: str) -> None:
    with open(os.path.join(path, file), "w") as f:
        f.write(value)


def is_v2(path: str) -> bool:
    return os.path.exists(os.path.join(path, "cgroup.controllers"))


def kind_of(path: str) -> str:
    """The controller a sandbox's cgroup directory is for: a v1 controller, or V2."""
    return V2 if is_v2(path) else controller_of(path)


def open_tasks(dirs: list[str]) -> list[tuple[str, int]]:
    """Each cgroup's ``tasks`` file (a cgroup2 group's ``cgroup.procs``: cgroup2 moves
    whole processes), opened for writing here, for a new PID 1 to enter them itself
    (``enter_self``). The kernel checks a write against the *opener's* credentials, so
    the descriptors carry this process's right to move tasks there, and nothing more: a
    descriptor moves only its writer."""
    opened: list[tuple[str, int]] = []
    try:
        for path in dirs:
            file = "cgroup.procs" if is_v2(path) else "tasks"
            opened.append((path, os.open(os.path.join(path, file), os.O_WRONLY | os.O_CLOEXEC)))
    except OSError:
        for _path, fd in opened:
            os.close(fd)
        raise
    return opened


def cannot_enter(e: OSError) -> SetupError:
    """Opening a cgroup's tasks (``open_tasks``) or entering it (``enter_self``) failed."""
    return SetupError.from_os(
        e,
        f"cannot move the sandbox into its cgroup: {e.strerror}",
        "cgroup",
        e.filename,
        hint="run `warren plan` to see how each limit is enforced",
    )


def enter_self(tasks: list[tuple[str, int]]) -> None:
    """Move the calling thread into each cgroup (``open_tasks``), closing the
    descriptors. Run by a single-threaded PID 1 before it does anything, so all it
    ever forks starts inside. Why not the parent writing PID 1's pid into
    ``cgroup.procs``: moving another process (or a whole thread group) takes the
    kernel's global threadgroup lock for writing, which waits for an RCU grace period
    (13 ms median measured here, the largest cost of a `warren run`); a thread moving
    itself through ``tasks`` ("0") does not take it. (cgroup2 has no ``tasks``: there
    the process moves itself through ``cgroup.procs`` and the lock is taken.)"""
    try:
        for path, fd in tasks:
            try:
                os.write(fd, b"0")
            except OSError as e:
                raise OSError(e.errno, e.strerror, path) from None
    finally:
        for _path, fd in tasks:
            os.close(fd)


def read(path: str, file: str) -> str:
    try:
        with open(os.path.join(path, file)) as f:
            return f.read()
    except OSError:
        return ""


def flat_value(text: str, key: str) -> str:
    """The value of the ``key value`` line of a flat-keyed cgroup file (``oom_kill`` of
    memory.oom_control, ``frozen`` of cgroup.events); "" when there is none."""
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return v.strip()
    return ""


def controller_of(path: str) -> str:
    rel = os.path.relpath(path, ROOT)
    return rel.split(os.sep, 1)[0]


def counter_files(dirs: list[str], counters: tuple[Counter, ...]) -> list[tuple[str, int]]:
    """(limit, descriptor) of each counter file, opened read-only now: whoever holds
    the descriptor can read the count later from inside the sandbox."""
    by_kind = {kind_of(d): d for d in dirs}
    out = []
    for c in counters:
        if c.controller in by_kind:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(by_kind[c.controller], c.file), os.O_RDONLY | os.O_CLOEXEC)
                out.append((f"{c.limit}:{c.key}", fd))
    return out


def read_counter(fd: int, key: str) -> int:
    """The ``key`` line of a flat-keyed cgroup file, read afresh through ``fd`` (no
    key: the file is one number, such as pids.peak)."""
    try:
        text = os.pread(fd, 65536, 0).decode()
        value = flat_value(text, key) if key else text.strip()
    except OSError:
        return 0
    return int(value) if value.isdigit() else 0


def freezer_of(dirs: list[str]) -> str | None:
    """The group that can freeze the sandbox: its v1 freezer cgroup, else its cgroup2 group."""
    for d in dirs:
        if kind_of(d) == "freezer":
            return d
    return next((d for d in dirs if kind_of(d) == V2), None)


def freeze(path: str, frozen: bool) -> None:
    """Freeze (or thaw) every task of the group and wait until the kernel says it is
    done; a freeze that does not complete in time is undone and reported."""
    v2 = is_v2(path)
    if v2:
        _write(path, "cgroup.freeze", "1" if frozen else "0")
    else:
        _write(path, "freezer.state", "FROZEN" if frozen else "THAWED")
    start = time.monotonic()
    delay = 0.0005
    exiting_at = -1.0  # when a task was last seen in its exit
    while True:
        if _done(path, v2, frozen):
            return
        if frozen and not v2:
            # The v1 freezer asks each task to freeze once, when "FROZEN" is written: a
            # task that was running then and went to sleep after it where no signal
            # wakes it (a vfork's parent waiting for its child, frozen before its exec)
            # is asked no more, and the group stays FREEZING. Written again, the kernel
            # asks again, and that sleep is frozen as it is. (cgroup2 freezes such a
            # sleep itself.)
            _write(path, "freezer.state", "FROZEN")
        now = time.monotonic()
        waited = now - start
        if waited > FREEZE_WAIT:
            tasks = [d for d in map(procs.describe_task, _tasks(path, v2)) if d is not None]
            if any(in_exit for _d, in_exit in tasks):
                exiting_at = now
            # A task at its exit's very end is listed no more a moment before the kernel
            # counts it gone (cgroup2 says "frozen" then): that moment is waited for too.
            if frozen and waited < FREEZE_EXIT_WAIT and now - exiting_at < EXIT_GONE_WAIT:
                time.sleep(delay)
                continue
            if frozen:
                freeze(path, False)
            seen = "; ".join(d for d, _in_exit in tasks[:8]) + ("; ..." if len(tasks) > 8 else "")
            raise SandboxError(
                f"the sandbox's tasks did not {'freeze' if frozen else 'thaw'} within {waited:.1f} s"
                + (f" (its tasks then: {seen})" if seen else ""),
                operation="pause" if frozen else "resume",
                path=path,
                hint="a task may be stuck in the kernel (D state, e.g. on a hung NFS mount); try again",
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _done(path: str, v2: bool, frozen: bool) -> bool:
    """Whether the kernel says the group is frozen (``frozen``), or thawed."""
    if v2:
        return flat_value(read(path, "cgroup.events"), "frozen") == ("1" if frozen else "0")
    return read(path, "freezer.state").strip() == ("FROZEN" if frozen else "THAWED")


def _tasks(path: str, v2: bool) -> list[int]:
    """Every task (thread) of the group and the groups beneath it, by id."""
    out: list[int] = []
    for top, _dirs, _files in os.walk(path):
        out += [int(t) for t in read(top, "cgroup.threads" if v2 else "tasks").split() if t.isdigit()]
    return out


def kill_all(path: str) -> None:
    """SIGKILL every task of the group (cgroup2 has cgroup.kill; v1: one by one)."""
    if is_v2(path):
        with contextlib.suppress(OSError):
            _write(path, "cgroup.kill", "1")
            return
    for pid in read(path, "cgroup.procs").split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


def remove(dirs: list[str], record_dir: str | None, wait: float = 0.5) -> bool:
    """rmdir each (retrying while exiting tasks leave); True when all are gone, and
    then the record goes too."""
    deadline = time.monotonic() + wait
    left = list(dirs)
    while left:
        for path in list(left):
            try:
                os.rmdir(path)
                left.remove(path)
            except FileNotFoundError:
                left.remove(path)
            except OSError as e:
                if e.errno != errno.EBUSY:
                    left.remove(path)  # not ours to fix (EACCES): nothing left to retry
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    if not left and record_dir is not None and dirs:
        with contextlib.suppress(OSError):
            os.unlink(record_path(record_dir, os.path.basename(dirs[0])))
    return not left


def sweep(record_dir: str) -> int:
    """Remove the cgroups of sandboxes that are gone (a previous supervisor was
    killed); returns how many records remain (still busy)."""
    try:
        names = os.listdir(record_dir)
    except OSError:
        return 0
    busy = 0
    for name in names:
        if not name.startswith("warren-"):
            continue
        try:
            with open(record_path(record_dir, name)) as f:
                dirs = [
                    d for d in f.read().splitlines() if d.startswith(ROOT + "/") and d.endswith("/" + name)
                ]
        except OSError:
            continue
        for d in dirs:
            # A sandbox frozen when its supervisor died: its tasks can only die (of the
            # parent-death signal, pending since) once thawed.
            if kind_of(d) == "freezer" or (is_v2(d) and read(d, "cgroup.freeze").strip() == "1"):
                with contextlib.suppress(OSError, SandboxError):
                    freeze(d, False)
            kill_all(d)
        if not remove(dirs, record_dir, wait=0.2):
            busy += 1
        elif not dirs:
            with contextlib.suppress(OSError):
                os.unlink(record_path(record_dir, name))
    return busy
