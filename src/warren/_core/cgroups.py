"""cgroup files: probe what this caller may use, make a sandbox's cgroups, read them, remove them.

A sandbox's cgroups are made *beneath the caller's own* cgroup in each hierarchy
(``/proc/self/cgroup``): nothing is moved out of where it started, so whatever
already limits the caller (a memory cgroup of the machine's management) stays in
charge. Each is named ``warren-<uid>-<token>`` and listed in a record file before it
is made, so a supervisor killed at any moment leaves nothing the next one cannot
find and remove (``sweep``). Decisions live in ``plan.limits``; this module only
reads and writes the files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import time

from ..errors import SetupError
from ..plan.limits import CgroupFacts, CgroupPlan, Hierarchy

ROOT = "/sys/fs/cgroup"
V1_CONTROLLERS = ("pids", "memory", "cpu", "freezer")


def own_paths(text: str | None = None) -> dict[str, str]:
    """Controller -> this process's cgroup path (``""`` is cgroup2's key)."""
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


def probe(uid: int) -> CgroupFacts:
    try:
        own = own_paths()
    except OSError:
        return CgroupFacts(uid)
    v1 = []
    for c in V1_CONTROLLERS:
        mount = os.path.join(ROOT, c)
        if c not in own or not os.path.exists(os.path.join(mount, "cgroup.procs")):
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
    for mount in (os.path.join(ROOT, "unified"), ROOT):
        if "" in own and os.path.exists(os.path.join(mount, "cgroup.subtree_control")):
            v2_path = os.path.normpath(mount + own[""])
            with contextlib.suppress(OSError), open(os.path.join(v2_path, "cgroup.controllers")) as f:
                ctrls = tuple(f.read().split())
            writable = os.access(v2_path, os.W_OK)
            break
    return CgroupFacts(uid, tuple(v1), v2_path, ctrls, writable)


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
            os.mkdir(path, 0o755)
            made.append(path)
            for file, value in g.files:
                with open(os.path.join(path, file), "w") as f:
                    f.write(value)
    except OSError as e:
        remove(made, record_dir)
        raise SetupError(
            f"cannot set up the sandbox's cgroup: {e.strerror}",
            operation="cgroup",
            path=e.filename or (made[-1] if made else dirs[0]),
            errno=e.errno,
            hint="run `warren plan` to see how each limit is enforced; a lower limit may be needed",
        ) from None
    return dirs


def open_tasks(dirs: list[str]) -> list[tuple[str, int]]:
    """Each cgroup's ``tasks`` file, opened for writing here, for a new PID 1 to
    enter them itself (``enter_self``). The kernel checks a write against the
    *opener's* credentials, so the descriptors carry this process's right to move
    tasks there, and nothing more: a descriptor moves only its writer."""
    opened: list[tuple[str, int]] = []
    try:
        for path in dirs:
            opened.append((path, os.open(os.path.join(path, "tasks"), os.O_WRONLY | os.O_CLOEXEC)))
    except OSError:
        for _path, fd in opened:
            os.close(fd)
        raise
    return opened


def enter_self(tasks: list[tuple[str, int]]) -> None:
    """Move the calling thread into each cgroup (``open_tasks``), closing the
    descriptors. Run by a single-threaded PID 1 before it does anything, so all it
    ever forks starts inside. Why not the parent writing PID 1's pid into
    ``cgroup.procs``: moving another process (or a whole thread group) takes the
    kernel's global threadgroup lock for writing, which waits for an RCU grace period
    (13 ms median measured here, the largest cost of a `warren run`); a thread moving
    itself through ``tasks`` ("0") does not take it."""
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


def counter(path: str, file: str, key: str) -> int:
    """A ``key value`` line of a flat-keyed file (``oom_kill`` of memory.oom_control)."""
    for line in read(path, file).splitlines():
        k, _, v = line.partition(" ")
        if k == key and v.strip().isdigit():
            return int(v)
    return 0


def controller_of(path: str) -> str:
    rel = os.path.relpath(path, ROOT)
    return rel.split(os.sep, 1)[0]


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
        if not remove(dirs, record_dir, wait=0.2):
            busy += 1
        elif not dirs:
            with contextlib.suppress(OSError):
                os.unlink(record_path(record_dir, name))
    return busy
