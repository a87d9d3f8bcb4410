"""The plan of a sandbox on an image: its root, its workspace, its identity. Pure.

The root is an overlay of the image's layers (read-only, never written) under an upper
directory of the sandbox's own on a size-limited tmpfs made in the sandbox's
namespaces: copy-on-write, private to the sandbox, and full at ``--disk`` (ENOSPC
inside; the host's disk is never written). The host's root is not visible: only the
workspace (bound at ``/workspace``, or none: then ``/workspace`` is a directory of the
layer), the ``--write`` and ``--read`` paths (bound where they are on the host) and the
fresh ``/dev`` and ``/proc`` host-root sandboxes get; ``/tmp`` is the image's, in the
sandbox's layer (a fresh tmpfs there would make a rename from TMPDIR into a
``/workspace`` of the layer EXDEV).

A rename of a directory that comes from a lower layer is ``EXDEV`` in an overlay
mounted in a user namespace (no ``redirect_dir`` with ``userxattr``): the plan asks
PID 1's broker to take renames (``Plan.renames``), which makes such a rename a move of
the tree on the same mount (``_core.broker.renames``).

Inside, root is the caller (a single-id map ``0 -> caller``): files the sandbox makes in
a host workspace are the caller's on the host, as with rootless containers. Everything
in the layer is writable, so Landlock grants writes beneath ``/`` (the host paths bound
in are the only host objects, and only the writable ones are bound read-write).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..images.ref import ImageRef
from ..net.allowlist import proxy_env
from ..policy import Policy
from ..policy.model import CA_VARIABLES
from .env import DEFAULT_PATH, passed, private_homes
from .facts import HostFacts
from .model import GitDir, MountKind, MountOp
from .mounts import (
    PROC_READONLY,
    WRITABLE_FRESH,
    Group,
    dev_ops,
    group_writable_roots,
    mask_ops,
    within,
)

WORKSPACE = "/workspace"
ROOT_HOME = "/root"
MIN_DISK = 16 << 20
# The caller's variables that describe the host, not the terminal: the image's own apply.
# The CA bundle variables name host files (passed only when the caller names them).
_HOST_ONLY = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL"})
_HOST_FILES = frozenset(CA_VARIABLES)


# apt drops to its `_apt` user for downloads (setgroups, setresuid), which a sandbox that
# maps one id cannot do: "setgroups (1: Operation not permitted)". Root downloads instead,
# as in rootless containers; made only where the image has apt's configuration directory.
APT_SANDBOX = MountOp(
    MountKind.SEED,
    "/etc/apt/apt.conf.d/00warren-sandbox",
    source="// warren: this sandbox maps one user id; apt cannot switch to _apt for downloads\n"
    'APT::Sandbox::User "root";\n',
    why="apt downloads as root: the sandbox maps one user id, so apt cannot switch to _apt",
)


def default_disk(mem_total: int) -> int:
    """The writable layer is a tmpfs (memory, swappable): a quarter of RAM by default."""
    return max(MIN_DISK, mem_total // 4)


@dataclass(frozen=True)
class ImagePlan:
    mounts: tuple[MountOp, ...]
    writable: tuple[str, ...]  # Landlock: writes beneath these (inside paths)
    guarded: tuple[str, ...]  # ... but not beneath these: shared binds above their roots
    groups: tuple[Group, ...]
    env: dict[str, str]
    cwd: str
    workspace: str  # the workspace as the sandbox sees it
    inner_uid: int
    notes: tuple[str, ...]


def plan_image(
    policy: Policy,
    image: ImageRef,
    caller_env: Mapping[str, str],
    device_exists: Mapping[str, bool],
    mem_total: int,
    *,
    host_workspace: bool,
    tmp_size: int | None,
    cwd: str | None,
    facts: HostFacts,
    outside_links: tuple[tuple[str, int, int, bool], ...] = (),
    git: tuple[GitDir, ...] = (),
    git_files: tuple[str, ...] = (),
) -> ImagePlan:
    """The mounts and the rest for ``policy`` on ``image``. ``host_workspace``: the
    policy's workspace is bound at /workspace (else /workspace lives in the layer)."""
    disk = policy.disk or default_disk(mem_total)
    ops: list[MountOp] = [
        MountOp(
            MountKind.OVERLAY,
            "/",
            why=f"image {image.name} ({image.id[:19]}), copy-on-write: the sandbox's layer is a tmpfs "
            f"of {disk >> 20} MiB",
            layers=tuple(str(p) for p in image.lowerdirs),
            size=disk,
        )
    ]
    workspace = str(policy.workspace)
    ws_writable = any(r.path == policy.workspace for r in policy.writable)
    # The host paths the sandbox writes (workspace, --write, the presets' caches) are
    # grouped as on the host's root (``plan.mounts``): roots on one host filesystem share
    # one bind of their common ancestor, at its host path, so hard links and renames
    # between a cache and the workspace work; the rest of that bind is masked.
    roots = [str(r.path) for r in policy.writable if r.path != policy.workspace and _bound(r.source)]
    if host_workspace and ws_writable:
        roots.append(workspace)
    groups = group_writable_roots(roots, facts) if roots else []
    shared = [g for g in groups if g.mount_at not in g.roots]
    alone = host_workspace and not any(workspace in g.roots and g.mount_at != workspace for g in groups)
    if host_workspace and alone:
        kind = MountKind.BIND_RW if ws_writable else MountKind.BIND_RO
        ops.append(MountOp(kind, WORKSPACE, workspace, why="the workspace (a host directory)", mkdir=True))
    elif host_workspace:
        why = "the workspace, at its host path on a mount it shares with caches (hard links work)"
        ops.append(MountOp(MountKind.SYMLINK, WORKSPACE, workspace, why=why))
    else:
        ops.append(
            MountOp(MountKind.DIR, WORKSPACE, why="the workspace, in the sandbox's own layer", mode=0o755)
        )
    later: list[MountOp] = []  # under /tmp: bound after the sandbox's fresh /tmp
    for g in groups:
        if g.roots == (workspace,) and alone:
            continue
        why = "writable host path" if g.mount_at in g.roots else "writable host paths sharing one mount"
        step = [
            MountOp(MountKind.BIND_RW, g.mount_at, g.mount_at, why=f"{why}: {', '.join(g.roots)}", mkdir=True)
        ]
        step += mask_ops(g)
        (later if g.overlaid == WRITABLE_FRESH else ops).extend(step)
    at_host = [g.mount_at for g in groups if not (g.roots == (workspace,) and alone)]
    ws_inside = WORKSPACE if host_workspace and alone else workspace
    for r in policy.readable:
        if r.source == "--read":
            ops.append(
                MountOp(MountKind.BIND_RO, str(r.path), str(r.path), why="host path (--read)", mkdir=True)
            )
    ops.extend(_git_ops(policy, host_workspace, ws_inside, at_host, git, git_files))
    # /tmp is the image's, in the sandbox's layer (private to it, within --disk), as in a
    # container: a rename from TMPDIR into a /workspace of the layer is then a rename.
    ops.append(MountOp(MountKind.DIR, "/tmp", why="/tmp, in the sandbox's own layer", mode=0o1777))
    ops.append(APT_SANDBOX)
    ops.extend(later)
    ops.extend(dev_ops(lambda path: device_exists.get(path, False), tmp_size, mkdir=True))
    # Denied paths in the host workspace stay hidden at their place under /workspace.
    if host_workspace:
        for r in policy.denied:
            if within(str(r.path), workspace) and str(r.path) != workspace:
                inside = ws_inside + str(r.path)[len(workspace) :]
                ops.append(MountOp(MountKind.DENY_PATH, inside, why=f"denied ({r.source})"))
    # A hard link in a bound host path to a file denied or unreadable outside stays
    # unreadable (the others get an inode of their own before launch: Plan.unshare).
    for path, dev, ino, secret in outside_links:
        if not secret:
            continue
        why = "a hard link to a file outside the writable roots that is denied or unreadable to you"
        if host_workspace and within(path, workspace):
            ops.append(
                MountOp(MountKind.DENY_FILE, ws_inside + path[len(workspace) :], why=why, ident=(dev, ino))
            )
        elif any(within(path, r) for r in roots):
            ops.append(MountOp(MountKind.DENY_FILE, path, why=why, ident=(dev, ino)))
    ops.append(MountOp(MountKind.PROC, "/proc", why="fresh /proc: only the sandbox's processes", mkdir=True))
    for path in PROC_READONLY:
        ops.append(MountOp(MountKind.RO_SELF, path, why="kernel tunables stay read-only"))

    env = _environment(policy, image, caller_env)
    inner_uid = _inner_uid(image.config.user)
    where = cwd if cwd is not None else (image.config.workdir or WORKSPACE)
    if not where.startswith("/"):
        where = f"{WORKSPACE}/{where}"
    notes = [
        f"root: image {image.name}, {len(image.layers)} layer(s); the sandbox's changes go to its own "
        f"layer (tmpfs, {disk >> 20} MiB: ENOSPC inside when full); the host's root is not visible"
    ]
    if shared:
        notes.append(
            "hard links and renames between "
            + "; ".join(", ".join(g.roots) for g in shared)
            + " work: each set shares one mount at its host path"
            + (f" (/workspace is a link to {workspace})" if host_workspace and not alone else "")
            + "; no new entry directly in the directories above it ("
            + ", ".join(_chain(g.mount_at) for g in shared)
            + ")"
        )
    return ImagePlan(
        mounts=tuple(ops),
        writable=("/", *(r for g in shared for r in g.roots)),
        guarded=tuple(g.mount_at for g in shared),
        groups=tuple(groups),
        env=env,
        cwd=where,
        workspace=WORKSPACE,
        inner_uid=inner_uid,
        notes=tuple(notes),
    )


def _chain(path: str) -> str:
    parts = path.strip("/").split("/")[:-1]
    return ", ".join(["/", *("/" + "/".join(parts[: i + 1]) for i in range(len(parts)))])


def _bound(source: str) -> bool:
    """Host paths bound into a sandbox on an image: --write paths and presets' caches."""
    return source == "--write" or source.startswith("preset:")


def bound_roots(policy: Policy) -> list[str]:
    """The host directories a sandbox on an image sees (its workspace when on the host)."""
    out = [str(r.path) for r in policy.writable if _bound(r.source)]
    return [str(policy.workspace), *out] if policy.host_workspace else out


def _git_ops(
    policy: Policy,
    host_workspace: bool,
    ws_inside: str,
    others: list[str],
    git: tuple[GitDir, ...],
    git_files: tuple[str, ...],
) -> list[MountOp]:
    """Git protection as on the host's root (``server.gitstore``), where the
    repositories are inside: the top level of each git directory is warren's tree, the
    host's data directories are bound into it, ``.git`` files are read-only."""
    workspace = str(policy.workspace)

    def inside(path: str) -> str | None:
        if host_workspace and within(path, workspace):
            return ws_inside + path[len(workspace) :]
        return path if any(within(path, o) for o in others) else None

    ops: list[MountOp] = []
    for g in git:
        at = inside(g.path)
        if at is None:
            continue
        why = "git directory inside: its top level is warren's, host git never reads what the sandbox writes"
        ops.append(MountOp(MountKind.BIND_RW, at, g.tree, why=why))
        for name in g.shared:
            ops.append(
                MountOp(MountKind.BIND_RW, f"{at}/{name}", f"{g.path}/{name}", why="the host's own git data")
            )
    for path in git_files:
        at = inside(path)
        if at is not None:
            why = "a .git file names the git directory host git uses"
            ops.append(MountOp(MountKind.BIND_RO, at, path, why=why))
    return ops


def _inner_uid(user: str) -> int:
    """The uid the caller is inside: the image's numeric user, root by default. A user
    given by name maps to root too (its /etc/passwd is the image's, read at launch only
    by the image's own tools): said in the plan's notes by the caller."""
    head = user.split(":", 1)[0]
    return int(head) if head.isdigit() else 0


def _environment(policy: Policy, image: ImageRef, caller_env: Mapping[str, str]) -> dict[str, str]:
    """The image's variables, then the caller's terminal-side ones the policy passes
    (never the host's PATH, HOME, USER), then warren's, then the policy's."""
    env = dict(image.config.env)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", ROOT_HOME if _inner_uid(image.config.user) == 0 else "/")
    env.setdefault("USER", "root" if _inner_uid(image.config.user) == 0 else image.config.user)
    caller, _ = passed(policy, caller_env)
    asked = set(policy.spec.env_pass)
    env.update(
        {k: v for k, v in caller.items() if k not in _HOST_ONLY and (k not in _HOST_FILES or k in asked)}
    )
    env["TMPDIR"] = "/tmp"
    env["WARREN_SANDBOX"] = "1"
    if policy.network == "allow":
        env.update(proxy_env())
    env.update(private_homes(policy, "/tmp"))
    env.update(policy.env)
    return env
