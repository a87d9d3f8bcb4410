"""Plan: policy + host facts -> exactly what the launcher will do. Pure.

This is where the mount plan is decided (DESIGN.md section 3). The result is a value
you can print (``warren plan``), compare in tests and hand to the launcher, which
executes it step by step without making decisions of its own.

The key decision: writable roots that live on the same host mount (and under the
same overlaid directory such as /tmp) are exposed through ONE read-write bind of
their deepest common ancestor, so hardlinks and renames between them stay on one
mount. Everything else inside that bind is masked read-only at the mount level, and
Landlock (ABI >= 2, with REFER) confines writes to the roots themselves.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import PurePosixPath

from . import seccomp as _seccomp
from .errors import HostError
from .hostinfo import HostFacts, mount_of
from .netpolicy import proxy_env
from .policy import Policy, Root

# --- Landlock access rights (include/uapi/linux/landlock.h) ---------------------
LL_EXECUTE = 1 << 0
LL_WRITE_FILE = 1 << 1
LL_READ_FILE = 1 << 2
LL_READ_DIR = 1 << 3
LL_REMOVE_DIR = 1 << 4
LL_REMOVE_FILE = 1 << 5
LL_MAKE_CHAR = 1 << 6
LL_MAKE_DIR = 1 << 7
LL_MAKE_REG = 1 << 8
LL_MAKE_SOCK = 1 << 9
LL_MAKE_FIFO = 1 << 10
LL_MAKE_BLOCK = 1 << 11
LL_MAKE_SYM = 1 << 12
LL_REFER = 1 << 13
LL_TRUNCATE = 1 << 14
LL_IOCTL_DEV = 1 << 15
LL_SCOPE_ABSTRACT_UNIX = 1 << 0
LL_SCOPE_SIGNAL = 1 << 1

_ABI_FS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_READ = LL_EXECUTE | LL_READ_FILE | LL_READ_DIR
_WRITE_TREE = (
    LL_WRITE_FILE
    | LL_REMOVE_DIR
    | LL_REMOVE_FILE
    | LL_MAKE_DIR
    | LL_MAKE_REG
    | LL_MAKE_SOCK
    | LL_MAKE_FIFO
    | LL_MAKE_SYM
    | LL_REFER
    | LL_TRUNCATE
)
_DEVICE = LL_READ_FILE | LL_WRITE_FILE | LL_TRUNCATE | LL_IOCTL_DEV

_RIGHT_NAMES = {
    LL_EXECUTE: "execute",
    LL_WRITE_FILE: "write_file",
    LL_READ_FILE: "read_file",
    LL_READ_DIR: "read_dir",
    LL_REMOVE_DIR: "remove_dir",
    LL_REMOVE_FILE: "remove_file",
    LL_MAKE_CHAR: "make_char",
    LL_MAKE_DIR: "make_dir",
    LL_MAKE_REG: "make_reg",
    LL_MAKE_SOCK: "make_sock",
    LL_MAKE_FIFO: "make_fifo",
    LL_MAKE_BLOCK: "make_block",
    LL_MAKE_SYM: "make_sym",
    LL_REFER: "refer",
    LL_TRUNCATE: "truncate",
    LL_IOCTL_DEV: "ioctl_dev",
}


def handled_fs(abi: int) -> int:
    return _ABI_FS.get(abi, (1 << 16) - 1) if abi >= 1 else 0


def right_names(mask: int) -> list[str]:
    return [name for bit, name in _RIGHT_NAMES.items() if mask & bit]


# --- the plan as data -------------------------------------------------------------

# Directories the sandbox gets fresh: a writable root under one of them is grafted
# onto the fresh mount, so it cannot share a mount with roots outside it.
OVERLAID = ("/tmp", "/dev", "/proc", "/run", "/var/run")
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
DEV_LINKS = (
    ("ptmx", "pts/ptmx"),
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
)
PROC_READONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus")


@dataclass(frozen=True)
class MountOp:
    """One step of the mount plan, executed in order by the launcher.

    kinds:
      root_view     clone the host's / recursively, read-only and nosuid, as the new root
      bind_rw       clone ``source`` from the host, read-only below, writable on top
      mask          read-only bind over every entry of ``target`` not named in ``keep``
      tmpfs         a fresh tmpfs (``readonly`` for hiding, ``mode`` for permissions)
      bind_dev      bind the host device node ``source`` onto ``target``
      devpts        a new devpts instance
      symlink       ``target`` -> ``source`` (inside a fresh tmpfs)
      dir           create directory ``target`` with ``mode`` (inside a fresh tmpfs)
      bind_ro       clone ``source`` from the host read-only onto ``target``
      deny_file     bind /dev/null over a file
      proc          a fresh procfs for the sandbox's pid namespace
      ro_self       re-bind ``target`` onto itself read-only (inside /proc)
    """

    kind: str
    target: str
    source: str | None = None
    why: str = ""
    keep: tuple[str, ...] = ()
    mode: int | None = None
    readonly: bool = False
    mkdir: bool = False  # create the mount point (it lies in a fresh tmpfs)


@dataclass(frozen=True)
class LandlockRule:
    path: str
    access: int
    why: str
    is_dir: bool = True


@dataclass(frozen=True)
class LandlockPlan:
    abi: int
    handled: int
    scoped: int
    rules: tuple[LandlockRule, ...]


@dataclass(frozen=True)
class Plan:
    mounts: tuple[MountOp, ...]
    landlock: LandlockPlan | None
    seccomp: _seccomp.SeccompPlan
    uid_map: str
    gid_map: str
    uid: int
    gid: int
    env: dict[str, str]
    cwd: str
    hostname: str
    new_session: bool
    cap_last_cap: int
    create_dirs: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    groups: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())
    network: str = "none"
    allow_hosts: tuple[str, ...] = ()
    resolve: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["seccomp"] = {
            "machine": self.seccomp.machine,
            "denied": list(self.seccomp.denied),
            "deny_new_userns": self.seccomp.deny_new_userns,
            "instructions": len(self.seccomp.program),
        }
        if self.landlock is not None:
            data["landlock"] = {
                "abi": self.landlock.abi,
                "handled": right_names(self.landlock.handled),
                "scoped": self.landlock.scoped,
                "rules": [
                    {"path": r.path, "access": right_names(r.access), "why": r.why}
                    for r in self.landlock.rules
                ],
            }
        data["groups"] = [{"mount_at": a, "roots": list(r)} for a, r in self.groups]
        return data


# --- planning -------------------------------------------------------------------


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _overlaid_base(path: str) -> str | None:
    for base in OVERLAID:
        if _within(path, base):
            return base
    return None


def _common_ancestor(paths: Iterable[str]) -> str:
    return os.path.commonpath(list(paths))


def _strip_nested(roots: list[str]) -> list[str]:
    """Drop roots inside other roots: the outer grant already covers them."""
    kept: list[str] = []
    for root in sorted(roots, key=len):
        if not any(_within(root, k) for k in kept):
            kept.append(root)
    return kept


@dataclass(frozen=True)
class _Group:
    mount_at: str
    roots: tuple[str, ...]
    overlaid: str | None


def group_writable_roots(roots: Iterable[str], facts: HostFacts) -> list[_Group]:
    """Partition writable roots by host mount (and overlaid directory)."""
    by_key: dict[tuple[int, str | None], list[str]] = {}
    for root in _strip_nested(list(roots)):
        entry = mount_of(root, facts.mounts)
        key = (entry.mount_id if entry else -1, _overlaid_base(root))
        by_key.setdefault(key, []).append(root)
    groups = []
    for (mount_id, base), members in by_key.items():
        entry = next((m for m in facts.mounts if m.mount_id == mount_id), None)
        ancestor = _common_ancestor(members)
        # Never bind above the host mount's own root (it would span other mounts),
        # nor above the overlaid directory the roots are grafted into.
        floor = entry.mount_point if entry else "/"
        if base and len(base) > len(floor):
            floor = base
        if not _within(ancestor, floor):
            ancestor = floor
        groups.append(_Group(ancestor, tuple(sorted(members)), base))
    return sorted(groups, key=lambda g: (g.overlaid is not None, g.mount_at.count("/"), g.mount_at))


def _split_warnings(groups: list[_Group], facts: HostFacts) -> list[str]:
    """Roots on one host filesystem that still end up on two mounts: say so."""
    out = []
    by_mount: dict[int, list[_Group]] = {}
    for g in groups:
        entry = mount_of(g.roots[0], facts.mounts)
        by_mount.setdefault(entry.mount_id if entry else -1, []).append(g)
    for members in by_mount.values():
        inside = [g for g in members if g.overlaid]
        outside = [g for g in members if not g.overlaid]
        for g in inside:
            for other in outside:
                out.append(
                    f"{', '.join(g.roots)} (under {g.overlaid}, which the sandbox gets fresh) and "
                    f"{', '.join(other.roots)} are on one host filesystem but cannot share a mount: "
                    "hardlinks and renames between them will fail with EXDEV (uv: 'falling back "
                    f"to full copy'). Keep workspace and caches both outside {g.overlaid}, or both in it."
                )
    return out


def _mask_ops(group: _Group) -> list[MountOp]:
    """Read-only masks for every directory between the bind and its roots."""
    keep: dict[str, set[str]] = {}
    for root in group.roots:
        if root == group.mount_at:
            return []  # the bind is itself a writable root: nothing to mask
        rel = PurePosixPath(root).relative_to(group.mount_at)
        cur = PurePosixPath(group.mount_at)
        for part in rel.parts:
            keep.setdefault(str(cur), set()).add(part)
            cur = cur / part
    ops = []
    for directory in sorted(keep, key=lambda d: (d.count("/"), d)):
        if any(_within(directory, r) for r in group.roots):
            continue
        # Entries replaced by fresh mounts later need no mask of their own.
        fresh = {PurePosixPath(p).name for p in OVERLAID if str(PurePosixPath(p).parent) == directory}
        ops.append(
            MountOp(
                "mask",
                directory,
                keep=tuple(sorted(keep[directory] | fresh)),
                why="read-only at the mount level: only the writable roots below are writable",
            )
        )
    return ops


def make_plan(policy: Policy, facts: HostFacts, *, cwd: str | None = None) -> Plan:
    if not facts.machine_supported:
        raise HostError(
            "this architecture is not supported",
            operation="plan",
            hint="warren supports Linux on x86_64 and aarch64",
        )
    warnings: list[str] = []
    writable = [str(r.path) for r in policy.writable]
    use_landlock = facts.landlock_abi >= 2
    if not use_landlock:
        warnings.append(
            f"Landlock ABI {facts.landlock_abi} (< 2): falling back to one bind mount per "
            "writable root; hardlinks and renames between writable roots (uv cache -> "
            "workspace) will fail with EXDEV, and ancestor directories of writable roots "
            "are protected only by mounts. Use Linux >= 5.19 with Landlock enabled."
        )

    ops: list[MountOp] = [
        MountOp("root_view", "/", "/", why="the host, read-only and nosuid"),
    ]
    if use_landlock:
        groups = group_writable_roots(writable, facts)
    else:
        groups = [_Group(r, (r,), _overlaid_base(r)) for r in _strip_nested(writable)]
    warnings.extend(_split_warnings(groups, facts))
    for base in ("/dev", "/proc"):
        for g in groups:
            if g.overlaid == base:
                raise HostError(
                    f"writable root {g.roots[0]} is inside {base}",
                    operation="plan",
                    path=g.roots[0],
                    hint=f"the sandbox gets a fresh {base}; choose a path elsewhere",
                )

    def add_group(g: _Group) -> None:
        why = "writable roots " + ", ".join(g.roots) + " share this one mount"
        if len(g.roots) == 1 and g.roots[0] == g.mount_at:
            why = "writable root"
        ops.append(MountOp("bind_rw", g.mount_at, g.mount_at, why=why, mkdir=g.overlaid is not None))
        ops.extend(_mask_ops(g))

    for g in groups:
        if g.overlaid is None:
            add_group(g)

    ops.append(MountOp("tmpfs", "/tmp", why="private /tmp", mode=0o1777))
    ops.append(MountOp("tmpfs", "/dev", why="minimal /dev", mode=0o755))
    for node in DEV_NODES:
        if facts.kind(f"/dev/{node}") != "missing":
            ops.append(MountOp("bind_dev", f"/dev/{node}", f"/dev/{node}", why="device node"))
    ops.append(MountOp("devpts", "/dev/pts", why="private pseudo-terminals", mkdir=True))
    ops.append(MountOp("tmpfs", "/dev/shm", why="private shared memory", mode=0o1777, mkdir=True))
    for name, dest in DEV_LINKS:
        ops.append(MountOp("symlink", f"/dev/{name}", dest))

    hidden: list[str] = []
    for path in ("/run", "/var/run", facts.env.get("XDG_RUNTIME_DIR", "")):
        if not path or not path.startswith("/") or facts.kind(path) != "dir":
            continue
        if any(_within(path, h) for h in hidden) or _within(path, "/tmp"):
            continue
        hidden.append(path)
        ops.append(
            MountOp(
                "tmpfs",
                path,
                why="hide host sockets (docker.sock, session bus, ...)",
                mode=0o755,
                readonly=True,
            )
        )
    for g in groups:
        if g.overlaid is not None:
            add_group(g)

    # A Landlock rule granting writes on /tmp would also cover the host directories
    # between a grafted group's bind and its roots (Landlock follows the path up
    # through mount points). Then /tmp itself stays read-only and temporary files go
    # to a private directory inside it.
    tmp_shared = any(g.overlaid == "/tmp" and g.mount_at not in g.roots for g in groups)
    tmpdir = "/tmp/.warren-tmp" if tmp_shared else "/tmp"
    if tmp_shared:
        ops.append(
            MountOp("dir", tmpdir, why="private TMPDIR (/tmp holds the writable roots' bind)", mode=0o1777)
        )

    visible_grafts = [g.mount_at for g in groups if g.overlaid is not None]

    def visible(path: str) -> bool:
        base = _overlaid_base(path)
        return base is None or any(_within(path, a) for a in visible_grafts)

    for root in policy.readable:
        path = str(root.path)
        inside_writable = any(_within(path, w) for w in writable)
        if inside_writable or not visible(path):
            ops.append(
                MountOp(
                    "bind_ro",
                    path,
                    path,
                    why="read-only inside a writable root"
                    if inside_writable
                    else "read-only graft into a fresh directory",
                    mkdir=not visible(path),
                )
            )

    for root in policy.denied:
        ops.extend(_deny_op(root, facts, visible(str(root.path))))

    ops.append(MountOp("proc", "/proc", why="fresh /proc: only the sandbox's processes"))
    for path in PROC_READONLY:
        ops.append(MountOp("ro_self", path, why="kernel tunables stay read-only"))

    landlock = _landlock_plan(facts, writable, tmpdir) if use_landlock else None
    env = _environment(policy, facts, tmpdir)
    run_cwd = _cwd(policy, cwd or facts.cwd)
    create = tuple(str(r.path) for r in policy.writable if r.create)
    return Plan(
        mounts=tuple(ops),
        landlock=landlock,
        seccomp=_seccomp.build(allow_nested=policy.allow_nested),
        uid_map=f"{facts.uid} {facts.uid} 1",
        gid_map=f"{facts.gid} {facts.gid} 1",
        uid=facts.uid,
        gid=facts.gid,
        env=env,
        cwd=run_cwd,
        hostname="warren",
        new_session=not facts.stdin_is_tty,
        cap_last_cap=facts.cap_last_cap,
        create_dirs=create,
        warnings=tuple(warnings),
        groups=tuple((g.mount_at, g.roots) for g in groups),
        network=policy.network,
        allow_hosts=policy.allowed_hosts,
        resolve=tuple(sorted(policy.resolve.items())),
    )


def _deny_op(root: Root, facts: HostFacts, visible: bool) -> list[MountOp]:
    path = str(root.path)
    if not visible:
        return []  # under a fresh directory: the host's copy is not there to hide
    kind = facts.kind(path)
    why = f"denied ({root.source})"
    if kind == "dir":
        return [MountOp("tmpfs", path, why=why, mode=0o000, readonly=True)]
    if kind in ("file", "other"):
        return [MountOp("deny_file", path, "/dev/null", why=why)]
    return []


def _landlock_plan(facts: HostFacts, writable: list[str], tmpdir: str) -> LandlockPlan:
    abi = facts.landlock_abi
    handled = handled_fs(abi)
    write = _WRITE_TREE & handled
    device = _DEVICE & handled
    rules = [LandlockRule("/", _READ, "read and execute everywhere the mounts show")]
    for path in _strip_nested(writable):
        rules.append(LandlockRule(path, _READ | write, "writable root (with REFER)"))
    rules.append(LandlockRule(tmpdir, _READ | write, "private temporary files"))
    rules.append(LandlockRule("/dev/shm", _READ | write, "private shared memory"))
    for node in ("null", "zero", "full", "tty"):
        if facts.kind(f"/dev/{node}") != "missing":
            rules.append(LandlockRule(f"/dev/{node}", device, "device", is_dir=False))
    rules.append(LandlockRule("/dev/pts", device, "pseudo-terminals"))
    scoped = (LL_SCOPE_ABSTRACT_UNIX | LL_SCOPE_SIGNAL) if abi >= 6 else 0
    return LandlockPlan(abi=abi, handled=handled, scoped=scoped, rules=tuple(rules))


def _environment(policy: Policy, facts: HostFacts, tmpdir: str) -> dict[str, str]:
    env = {k: v for k, v in facts.env.items() if policy.passes_env(k)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin")
    env.setdefault("HOME", facts.home)
    env["TMPDIR"] = tmpdir
    env["WARREN_SANDBOX"] = "1"
    if policy.network == "allow":
        env.update(proxy_env())
    env.update(policy.env)
    return env


def _cwd(policy: Policy, caller_cwd: str) -> str:
    workspace = str(policy.workspace)
    real = os.path.realpath(caller_cwd)
    return real if _within(real, workspace) else workspace
