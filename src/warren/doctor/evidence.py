"""Evidence about where the doctor runs: mounts, filesystem types, ids, confinement.

Owns reading /proc (mountinfo, uid_map, status) and stat-ing the probed locations.
Everything here is a fact measured at run time and kept as plain data, so that the
diagnosis (``diagnose.py``) stays a pure function of it. Must not judge anything.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from . import _kernel

# Filesystems that forward operations to another kernel or daemon, which checks
# credentials with its own idea of who the caller is.
PASSTHROUGH_FS = frozenset({"virtiofs", "9p", "fuse", "fuseblk", "nfs", "nfs4", "cifs", "smb3"})


@dataclass(frozen=True)
class MountEntry:
    mount_id: int
    parent_id: int
    dev: str  # "major:minor" of the superblock: two binds of one filesystem share it
    root: str  # the directory of that filesystem the mount shows (bind source)
    mount_point: str
    options: str
    fstype: str
    source: str
    super_options: str

    @property
    def read_only(self) -> bool:
        return "ro" in self.options.split(",")


def _unescape(text: str) -> str:
    # mountinfo escapes space, tab, newline and backslash as \ooo octal.
    out, i = [], 0
    while i < len(text):
        if text[i] == "\\" and text[i + 1 : i + 4].isdigit() and len(text[i + 1 : i + 4]) == 3:
            out.append(chr(int(text[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> tuple[MountEntry, ...]:
    entries = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        a, b = left.split(), right.split()
        if len(a) < 6 or len(b) < 2:
            continue
        entries.append(
            MountEntry(
                mount_id=int(a[0]),
                parent_id=int(a[1]),
                dev=a[2],
                root=_unescape(a[3]),
                mount_point=_unescape(a[4]),
                options=a[5],
                fstype=b[0],
                source=_unescape(b[1]),
                super_options=b[2] if len(b) > 2 else "",
            )
        )
    return tuple(entries)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def _within(path: str, parent: str) -> bool:
    return parent == "/" or path == parent or path.startswith(parent.rstrip("/") + "/")


def mount_for(path: str, mounts: tuple[MountEntry, ...]) -> MountEntry | None:
    """The mount ``path`` is on: by statx mount id when the kernel reports it, else the
    last-mounted entry with the longest mount point above the path."""
    mnt_id = _kernel.statx_mount_id(path)
    if mnt_id is not None:
        for m in mounts:
            if m.mount_id == mnt_id:
                return m
    real = os.path.realpath(path)
    best: MountEntry | None = None
    for m in mounts:
        if _within(real, m.mount_point) and (best is None or len(m.mount_point) >= len(best.mount_point)):
            best = m
    return best


@dataclass(frozen=True)
class Location:
    """One place the doctor probes: the workspace, a cache, a tool cache or $TMPDIR."""

    role: str  # "workspace", "cache", "tool-cache:uv", "tmpdir"
    path: str
    exists: bool
    probe_dir: str  # where the scratch dir goes: path, or its nearest existing ancestor
    mount_id: int | None = None
    dev: str | None = None
    fstype: str | None = None
    mount_point: str | None = None
    mount_root: str | None = None
    mount_source: str | None = None
    mount_options: str = ""
    super_options: str = ""
    read_only: bool = False
    owner_uid: int | None = None
    mode: str | None = None
    dac_writable: bool | None = None  # access(W_OK): file permissions only, no LSM

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Process:
    """Who the doctor runs as and what confines it."""

    kernel: str = ""
    machine: str = ""
    uid: int = 0
    gid: int = 0
    uid_map: str = "0 0 4294967295"
    gid_map: str = "0 0 4294967295"
    overflow_uid: int = 65534
    no_new_privs: bool | None = None
    seccomp: str | None = None  # "disabled", "strict", "filter"
    seccomp_filters: int | None = None
    landlock_abi: int = 0
    cwd: str | None = None
    cwd_deleted: bool = False
    cwd_link: str | None = None  # /proc/self/cwd, which names a deleted cwd

    @property
    def user_namespace(self) -> bool:
        """True when ids are remapped: anything but the initial namespace's identity map."""
        return " ".join(self.uid_map.split()) != "0 0 4294967295"

    def to_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["user_namespace"] = self.user_namespace
        return d


@dataclass(frozen=True)
class Evidence:
    process: Process
    locations: tuple[Location, ...] = ()
    mounts: tuple[MountEntry, ...] = field(default=(), repr=False)

    def location(self, role: str) -> Location | None:
        return next((loc for loc in self.locations if loc.role == role), None)


_SECCOMP_MODES = {"0": "disabled", "1": "strict", "2": "filter"}


def gather_process() -> Process:
    status: dict[str, str] = {}
    for line in (_read("/proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        status[key] = value.strip()
    cwd: str | None
    try:
        cwd = os.getcwd()
        deleted = False
    except FileNotFoundError:
        cwd, deleted = None, True
    except OSError:
        cwd, deleted = None, False
    try:
        link: str | None = os.readlink("/proc/self/cwd")
    except OSError:
        link = None
    if link is not None and link.endswith(" (deleted)"):
        deleted = True
    nnp = status.get("NoNewPrivs")
    filters = status.get("Seccomp_filters")
    overflow = (_read("/proc/sys/kernel/overflowuid") or "65534").strip()
    return Process(
        kernel=platform.release(),
        machine=platform.machine(),
        uid=os.geteuid(),
        gid=os.getegid(),
        uid_map=" ".join((_read("/proc/self/uid_map") or "").split()) or "unknown",
        gid_map=" ".join((_read("/proc/self/gid_map") or "").split()) or "unknown",
        overflow_uid=int(overflow) if overflow.isdigit() else 65534,
        no_new_privs=None if nnp is None else nnp == "1",
        seccomp=_SECCOMP_MODES.get(status.get("Seccomp", "")),
        seccomp_filters=int(filters) if filters and filters.isdigit() else None,
        landlock_abi=_kernel.landlock_abi(),
        cwd=cwd,
        cwd_deleted=deleted,
        cwd_link=link,
    )


def nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.isdir(p) and p != "/":
        p = os.path.dirname(p)
    return p


def gather_location(role: str, path: str, mounts: tuple[MountEntry, ...]) -> Location:
    path = os.path.abspath(path)
    exists = os.path.isdir(path)
    probe_dir = path if exists else nearest_existing(path)
    m = mount_for(probe_dir, mounts)
    try:
        st = os.stat(probe_dir)
        owner: int | None = st.st_uid
        mode: str | None = oct(st.st_mode & 0o7777)
    except OSError:
        owner = mode = None
    return Location(
        role=role,
        path=path,
        exists=exists,
        probe_dir=probe_dir,
        mount_id=None if m is None else m.mount_id,
        dev=None if m is None else m.dev,
        fstype=None if m is None else m.fstype,
        mount_point=None if m is None else m.mount_point,
        mount_root=None if m is None else m.root,
        mount_source=None if m is None else m.source,
        mount_options="" if m is None else m.options,
        super_options="" if m is None else m.super_options,
        read_only=False if m is None else m.read_only,
        owner_uid=owner,
        mode=mode,
        dac_writable=os.access(probe_dir, os.W_OK | os.X_OK),
    )


def read_mounts() -> tuple[MountEntry, ...]:
    return parse_mountinfo(_read("/proc/self/mountinfo") or "")


def tool_caches(env: Mapping[str, str], home: str) -> list[tuple[str, str]]:
    """(tool, cache directory) for uv, pip, npm and cargo, as each tool resolves it: uv
    ignores a relative XDG_CACHE_HOME (as the XDG specification says), pip takes it
    relative to its working directory (here, this process's). (The probe is
    self-contained: ``warren.xdg``'s rule spelled out.)"""
    cargo = env.get("CARGO_HOME") or os.path.join(home, ".cargo")
    raw = env.get("XDG_CACHE_HOME") or ""
    uv_xdg = os.path.normpath(raw) if raw.startswith("/") else os.path.join(home, ".cache")
    pip_xdg = os.path.abspath(raw or os.path.join(home, ".cache"))
    return [
        ("uv", env.get("UV_CACHE_DIR") or os.path.join(uv_xdg, "uv")),
        ("pip", env.get("PIP_CACHE_DIR") or os.path.join(pip_xdg, "pip")),
        ("npm", env.get("npm_config_cache") or env.get("NPM_CONFIG_CACHE") or os.path.join(home, ".npm")),
        ("cargo", os.path.join(cargo, "registry")),
    ]
