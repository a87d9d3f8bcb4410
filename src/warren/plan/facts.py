"""Facts the planner needs, as plain data: about this host, and about the caller.

Host facts (the mount table, the Landlock ABI, what kind of thing each relevant path
is, where warren keeps its state) belong to the process that plans — the supervisor,
which is warm and re-reads only what changed. Caller facts (uid, gid, home,
environment, working directory) belong to whoever asked, and arrive with the request.
Nothing here changes the system; tests build both by hand.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .limits import CgroupFacts
from .model import GitDir, LinkWalk


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
    mounts: tuple[MountEntry, ...]
    landlock_abi: int
    cap_last_cap: int
    machine_supported: bool
    path_kinds: Mapping[str, PathKind] = field(default_factory=dict)
    state_dir: str | None = None  # warren's own: hidden in every sandbox, never writable
    # The caller's image store (images.store): the same rule, since its layers are other
    # sandboxes' roots and the store takes a layer already there as made by itself.
    image_store: str | None = None
    # ``warren serve``'s E2B homes (statedir.e2b_homes): hidden the same way, but an E2B
    # sandbox's own home lies beneath it (``make_plan`` keeps only that one in reach).
    e2b_homes: str | None = None

    # Files warren holds secret outside those directories (a `warren serve --token-file`,
    # ``statedir.secret_files``): denied in every sandbox.
    secret_files: tuple[str, ...] = ()

    def own_dirs(self) -> tuple[tuple[str, str], ...]:
        """warren's own directories, with what to call them: never in a sandbox's view."""
        named = (
            (self.state_dir, "warren's state directory"),
            (self.image_store, "warren's image store"),
            (self.e2b_homes, "warren's E2B sandboxes' homes"),
        )
        return tuple((path, what) for path, what in named if path)

    # Files in the workspace also linked from outside the writable roots: (path, dev,
    # ino, secret) — secret when another name is denied or the user cannot read it
    # (server.links finds them).
    outside_links: tuple[tuple[str, int, int, bool], ...] = ()
    # ... or, for a large workspace, the walk that finds them after launch
    # (``server.planning``: then ``outside_links`` is empty)
    link_walk: LinkWalk | None = None
    # Git directories in the writable roots, their trees, and .git files (server.gitstore).
    git: tuple[GitDir, ...] = ()
    git_files: tuple[str, ...] = ()
    # Directories among the asked-about paths that the planning user may write (the
    # supervisor runs as its callers): where warren itself may make a TMPDIR.
    writable_dirs: frozenset[str] = frozenset()
    # For a root caller only: the owner of each asked-about directory. Its commands are
    # uid 0 without capabilities inside, so a writable root another uid owns is not
    # writable there as it is for root on the host (``make_plan`` warns).
    owners: Mapping[str, int] = field(default_factory=dict)
    # Which cgroups this caller may use, and the RAM and CPUs the default limits scale with.
    cgroups: CgroupFacts = field(default_factory=lambda: CgroupFacts(uid=-1))
    mem_total: int = 4 << 30
    # The root of the git repository the workspace lies in when its .git is above the
    # workspace (None when the workspace is a repository of its own, or in none).
    repository: str | None = None
    cpus: int = 1  # the machine's CPUs: the default pids limit scales with them
    # Can a sandbox get namespaces here (``_core.kernel.userns_probe``): "usable", or
    # "unavailable"/"powerless" with the errno seen; otherwise the degraded mode.
    namespaces: tuple[str, int] = ("usable", 0)
    # A free port on the host's loopback for the proxy of a degraded sandbox with network
    # allow (``server.hostfacts.free_loopback_port``); 0 when none is needed.
    proxy_port: int = 0
    # The user's limits in /proc/sys/user (inotify, fanotify) that a sandbox's own user
    # namespace gets a share of (``plan.limits.user_ns_limits``).
    user_counts: tuple[tuple[str, int], ...] = ()

    def kind(self, path: str) -> PathKind:
        return self.path_kinds.get(path, "missing")


@dataclass(frozen=True)
class CallerFacts:
    uid: int
    gid: int
    home: str
    env: Mapping[str, str]
    cwd: str
    # The caller's /proc/PID/cgroup, as the kernel has it (the supervisor reads it for
    # the connected client, never takes it from a request); None: the planning process.
    cgroups: str | None = None

    @classmethod
    def here(cls, env: Mapping[str, str] | None = None, cwd: str | None = None) -> CallerFacts:
        env = dict(os.environ if env is None else env)
        return cls(
            uid=os.getuid(),
            gid=os.getgid(),
            home=env.get("HOME") or os.path.expanduser("~"),
            env=env,
            cwd=cwd or os.getcwd(),
        )


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
    # the system's certificate bundles (plan.secrets covers the one that exists)
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
)


def landlock_abi(kernel_abi: int, env: Mapping[str, str]) -> int:
    """The ABI to plan for. WARREN_LANDLOCK_ABI (the caller's) may only lower the
    kernel's, to rehearse what warren does on an older kernel (the fallback and its
    warning)."""
    forced = env.get("WARREN_LANDLOCK_ABI")
    if forced is not None and forced.isdigit():
        return min(kernel_abi, int(forced))
    return kernel_abi


def enclosing_repository(workspace: str) -> str | None:
    """The directory above ``workspace`` holding the ``.git`` git would find from it
    (None when the workspace has its own, or there is none), as git searches: upward,
    not across a filesystem boundary."""
    try:
        if os.path.lexists(os.path.join(workspace, ".git")):
            return None
        dev = os.stat(workspace).st_dev
    except OSError:
        return None
    path = workspace
    while path != "/":
        path = os.path.dirname(path)
        try:
            if os.stat(path).st_dev != dev:
                return None
        except OSError:
            return None
        if os.path.lexists(os.path.join(path, ".git")):
            return path
    return None


def paths_of(policy_paths: Iterable[Path], caller: CallerFacts) -> list[str]:
    """The paths whose kind a plan for this policy and caller depends on."""
    out = [str(p) for p in policy_paths]
    runtime = caller.env.get("XDG_RUNTIME_DIR")
    if runtime:
        out.append(runtime)
    return out
