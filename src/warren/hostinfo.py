"""Facts about this host that the planner needs, gathered once, read-only.

Owns: parsing /proc/self/mountinfo, probing the Landlock ABI, the caller's ids and
environment, and what kind of thing each relevant path is. Nothing here changes
the system; ``HostFacts`` is plain data so tests can build one by hand.
"""

from __future__ import annotations

import functools
import os
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import _sys


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    root: str
    mount_point: str
    options: str
    fstype: str
    source: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")


def _unescape(field_: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as octal.
    out, i = [], 0
    while i < len(field_):
        code = field_[i + 1 : i + 4]
        if field_[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(code, 8)))
            i += 4
        else:
            out.append(field_[i])
            i += 1
    return "".join(out)


_parsed: tuple[str, tuple[MountEntry, ...]] = ("", ())


def parse_mountinfo(text: str) -> tuple[MountEntry, ...]:
    """Parse /proc/self/mountinfo; the last result is reused while the text is unchanged."""
    global _parsed
    if text == _parsed[0]:
        return _parsed[1]
    entries = []
    for line in text.splitlines():
        if not line.strip():
            continue
        left, _, right = line.partition(" - ")
        parts = left.split()
        rparts = right.split()
        entries.append(
            MountEntry(
                mount_id=int(parts[0]),
                parent_id=int(parts[1]),
                root=_unescape(parts[3]),
                mount_point=_unescape(parts[4]),
                options=parts[5],
                fstype=rparts[0] if rparts else "",
                source=_unescape(rparts[1]) if len(rparts) > 1 else "",
            )
        )
    _parsed = (text, tuple(entries))
    return _parsed[1]


def mount_of(path: str, mounts: Iterable[MountEntry]) -> MountEntry | None:
    """The mount a path lives on: the deepest mount point above it, topmost if stacked."""
    best: MountEntry | None = None
    for entry in mounts:
        mp = entry.mount_point
        inside = path == mp or mp == "/" or path.startswith(mp.rstrip("/") + "/")
        if inside and (best is None or len(mp) >= len(best.mount_point)):
            best = entry
    return best


PathKind = str  # "dir" | "file" | "symlink" | "other" | "missing"


def path_kind(path: str) -> PathKind:
    try:
        st = os.lstat(path)
    except OSError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    if stat.S_ISDIR(st.st_mode):
        return "dir"
    if stat.S_ISREG(st.st_mode):
        return "file"
    return "other"


@dataclass(frozen=True)
class HostFacts:
    uid: int
    gid: int
    home: str
    env: Mapping[str, str]
    cwd: str
    mounts: tuple[MountEntry, ...]
    landlock_abi: int
    cap_last_cap: int
    machine_supported: bool
    path_kinds: Mapping[str, PathKind] = field(default_factory=dict)
    stdin_is_tty: bool = False

    def kind(self, path: str) -> PathKind:
        return self.path_kinds.get(path, "missing")


# Paths whose kind the planner asks about beyond the policy's own.
FIXED_PATHS = (
    "/run",
    "/var/run",
    "/tmp",
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/random",
    "/dev/urandom",
    "/dev/tty",
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
)


@functools.cache
def _cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 40


@functools.cache
def _kernel_landlock_abi() -> int:
    return _sys.landlock_abi()


def _landlock_abi(env: Mapping[str, str]) -> int:
    """The kernel's Landlock ABI. WARREN_LANDLOCK_ABI may only lower it, to rehearse
    what warren does on an older kernel (the fallback and its warning)."""
    abi = _kernel_landlock_abi()
    forced = env.get("WARREN_LANDLOCK_ABI")
    if forced is not None and forced.isdigit():
        return min(abi, int(forced))
    return abi


def gather(extra_paths: Iterable[str] = (), env: Mapping[str, str] | None = None) -> HostFacts:
    env = dict(os.environ if env is None else env)
    with open("/proc/self/mountinfo") as f:
        mounts = parse_mountinfo(f.read())
    paths = set(FIXED_PATHS) | set(extra_paths)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime:
        paths.add(runtime)
    try:
        stdin_tty = os.isatty(0)
    except OSError:
        stdin_tty = False
    return HostFacts(
        uid=os.getuid(),
        gid=os.getgid(),
        home=env.get("HOME") or os.path.expanduser("~"),
        env=env,
        cwd=os.getcwd(),
        mounts=mounts,
        landlock_abi=_landlock_abi(env),
        cap_last_cap=_cap_last_cap(),
        machine_supported=_sys.supported_machine() and sys.platform == "linux",
        path_kinds={p: path_kind(p) for p in paths},
        stdin_is_tty=stdin_tty,
    )


def gather_for(policy_paths: Iterable[Path], env: Mapping[str, str] | None = None) -> HostFacts:
    return gather((str(p) for p in policy_paths), env)
