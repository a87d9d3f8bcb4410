"""The mount plan: where writable roots are bound, what is masked, hidden or fresh.

This is where the heart of warren's fidelity is decided: writable roots that live on
the same host mount are exposed through ONE read-write bind of their deepest common
ancestor, so hardlinks and renames between them stay on one mount. Everything else
inside that bind is masked read-only at the mount level, and Landlock (ABI >= 2, with
REFER) confines writes to the roots themselves. Pure.

Roots under ``/tmp`` are grafted one by one into the sandbox's fresh ``/tmp``, never
through a shared ancestor: the sandbox's ``/tmp`` is always writable, and a Landlock
rule granting that covers everything below it, so a host directory between a grafted
bind and its roots would be writable too (new files beside the workspace, the
workspace renamed away). A grafted bind that is itself the root exposes none; what a
shared bind would have shown around them is grafted first as a read-only view
(``tmp_views``), which no Landlock rule can make writable. The price: hardlinks and
renames between two roots under ``/tmp`` are EXDEV (warned about at launch).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

from .facts import HostFacts, mount_of
from .model import MountKind, MountOp

# warren's scratch directory for a sandbox (``tmpdir``), beside the workspace or higher
SCRATCH_PREFIX = ".warren-tmp-"

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
# The fresh directory the sandbox may write in: roots under it are never shared.
WRITABLE_FRESH = "/tmp"
# The entries of /proc outside the processes' own directories that take a write (kernel
# tunables, devices' settings, pressure triggers; a root caller is root to their modes):
# Landlock refuses writes to /proc unless the policy allows nested user namespaces, and
# then these read-only mounts still do.
PROC_READONLY = (
    "/proc/sys",
    "/proc/sysrq-trigger",
    "/proc/irq",
    "/proc/bus",
    "/proc/acpi",
    "/proc/scsi",
    "/proc/mtrr",
    "/proc/pressure",
    "/proc/latency_stats",
)


def within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def overlaid_base(path: str) -> str | None:
    for base in OVERLAID:
        if within(path, base):
            return base
    return None


def _common_ancestor(paths: Iterable[str]) -> str:
    return os.path.commonpath(list(paths))


def strip_nested(roots: list[str]) -> list[str]:
    """Drop roots inside other roots: the outer grant already covers them."""
    kept: list[str] = []
    for root in sorted(roots, key=len):
        if not any(within(root, k) for k in kept):
            kept.append(root)
    return kept


@dataclass(frozen=True)
class Group:
    mount_at: str
    roots: tuple[str, ...]
    overlaid: str | None


def group_writable_roots(roots: Iterable[str], facts: HostFacts) -> list[Group]:
    """Partition writable roots by host mount (and overlaid directory)."""
    by_key: dict[tuple[int, str | None], list[str]] = {}
    groups = []
    for root in strip_nested(list(roots)):
        base = overlaid_base(root)
        if base == WRITABLE_FRESH:
            # Grafted alone, so no host directory lies between the bind and the root
            # (the fresh directory above it is writable: see the module docstring).
            groups.append(Group(root, (root,), base))
            continue
        entry = mount_of(root, facts.mounts)
        by_key.setdefault((entry.mount_id if entry else -1, base), []).append(root)
    for (mount_id, base), members in by_key.items():
        entry = next((m for m in facts.mounts if m.mount_id == mount_id), None)
        ancestor = _common_ancestor(members)
        # Never bind above the host mount's own root (it would span other mounts),
        # nor above the overlaid directory the roots are grafted into.
        floor = entry.mount_point if entry else "/"
        if base and len(base) > len(floor):
            floor = base
        if not within(ancestor, floor):
            ancestor = floor
        for at, part in _unshared(ancestor, members):
            groups.append(Group(at, tuple(sorted(part)), base))
    return sorted(groups, key=lambda g: (g.overlaid is not None, g.mount_at.count("/"), g.mount_at))


def tmp_views(groups: Iterable[Group], facts: HostFacts) -> list[str]:
    """Where roots under /tmp would have shared a mount: their common ancestors there
    (split below directories never shared), each shown read-only beneath the roots'
    own grafts, so the siblings a shared mount would have shown stay visible."""
    by_mount: dict[int, list[str]] = {}
    for g in groups:
        if g.overlaid == WRITABLE_FRESH:
            entry = mount_of(g.mount_at, facts.mounts)
            by_mount.setdefault(entry.mount_id if entry else -1, []).append(g.mount_at)
    out: list[str] = []
    for members in by_mount.values():
        ancestor = _common_ancestor(members)
        if not within(ancestor, WRITABLE_FRESH):
            ancestor = WRITABLE_FRESH
        out.extend(at for at, part in _unshared(ancestor, members) if len(part) > 1)
    return out


# A shared mount exposes the metadata of the directories between its top and the
# roots (chmod, utimes): never at the root or a directory the whole system shares.
NEVER_SHARED = frozenset(
    ("/", "/tmp", "/var/tmp", "/var", "/home", "/usr", "/opt", "/srv", "/etc", "/mnt", "/media")
)


def _unshared(ancestor: str, members: list[str]) -> list[tuple[str, list[str]]]:
    """``members`` under ``ancestor``, split below it as far as it is NEVER_SHARED."""
    if ancestor not in NEVER_SHARED or len(members) == 1:
        return [(ancestor if len(members) > 1 else members[0], members)]
    by_child: dict[str, list[str]] = {}
    for m in members:
        child = PurePosixPath(m).relative_to(ancestor).parts[0]
        by_child.setdefault(child, []).append(m)
    out: list[tuple[str, list[str]]] = []
    for part in by_child.values():
        out.extend(_unshared(_common_ancestor(part), part))
    return out


def split_warnings(groups: list[Group], facts: HostFacts) -> list[str]:
    """Roots on one host filesystem that still end up on two mounts: say so."""
    out = []
    by_mount: dict[int, list[Group]] = {}
    for g in groups:
        entry = mount_of(g.roots[0], facts.mounts)
        by_mount.setdefault(entry.mount_id if entry else -1, []).append(g)
    for members in by_mount.values():
        inside = [g for g in members if g.overlaid]
        outside = [g for g in members if not g.overlaid]
        for g in inside if outside else []:
            # No mount inside can hold both: the one that could is the filesystem's root
            # with the host's own /tmp in it (docs/known-limits.md). Say what to do.
            others = ", ".join(r for other in outside for r in other.roots)
            out.append(
                f"{', '.join(g.roots)} is under {g.overlaid}: links and renames to {others} cannot "
                f"work inside (EXDEV: uv and pip copy, several times slower); move it out of "
                f"{g.overlaid}, e.g. under your home"
            )
        if len(outside) > 1:
            # Split because the directory they share is one every user shares (/, /var/tmp,
            # /srv, ...): a mount there would open its directories' metadata. warren's own
            # scratch directory (``tmpdir``) is named to nobody: what it costs is the user's
            # directories' affair, and only theirs are named.
            named = [[r for r in g.roots if not _scratch(r)] for g in outside]
            named = [roots for roots in named if roots]
            if len(named) < 2:
                continue
            top = _common_ancestor([g.mount_at for g in outside])
            out.append(
                f"{' and '.join(', '.join(roots) for roots in named)} share no directory below "
                f"{top} that warren may bind writable: hardlinks and renames between them fail "
                "inside (EXDEV: uv and pip copy); keep the workspace under your home, beside the "
                "caches"
            )
    return out


def _scratch(root: str) -> bool:
    return PurePosixPath(root).name.startswith(SCRATCH_PREFIX)


def tmp_notes(groups: list[Group], facts: HostFacts) -> list[str]:
    """Roots under /tmp on one host filesystem: each a mount of its own (a known limit,
    shown by ``warren plan``; the tools say so themselves when they copy)."""
    by_mount: dict[int, list[str]] = {}
    for g in groups:
        if g.overlaid == WRITABLE_FRESH:
            entry = mount_of(g.mount_at, facts.mounts)
            by_mount.setdefault(entry.mount_id if entry else -1, []).extend(g.roots)
    return [
        f"{', '.join(roots)} are on one host filesystem under {WRITABLE_FRESH}, which the sandbox gets "
        "fresh and writable: each is a mount of its own there, so hardlinks and renames between them "
        f"fail with EXDEV (uv: 'falling back to full copy'). Keep them outside {WRITABLE_FRESH} to share "
        "one mount."
        for roots in by_mount.values()
        if len(roots) > 1
    ]


def mask_ops(group: Group) -> list[MountOp]:
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
        if any(within(directory, r) for r in group.roots):
            continue
        # Entries replaced by fresh mounts later need no mask of their own.
        fresh = {PurePosixPath(p).name for p in OVERLAID if str(PurePosixPath(p).parent) == directory}
        ops.append(
            MountOp(
                MountKind.MASK,
                directory,
                keep=tuple(sorted(keep[directory] | fresh)),
                why="read-only at the mount level: only the writable roots below are writable",
            )
        )
    return ops


@dataclass(frozen=True)
class MountPlan:
    ops: tuple[MountOp, ...]
    groups: tuple[Group, ...]
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()


def dev_ops(present: Callable[[str], bool], tmp_size: int | None, mkdir: bool = False) -> list[MountOp]:
    """A minimal /dev: a tmpfs (``mkdir``: made first) with the host's device nodes that
    are ``present``, private pseudo-terminals and shared memory, and the usual links."""
    ops = [MountOp(MountKind.TMPFS, "/dev", why="minimal /dev", mode=0o755, mkdir=mkdir)]
    for node in DEV_NODES:
        if present(f"/dev/{node}"):
            ops.append(MountOp(MountKind.BIND_DEV, f"/dev/{node}", f"/dev/{node}", why="device node"))
    ops.append(MountOp(MountKind.DEVPTS, "/dev/pts", why="private pseudo-terminals", mkdir=True))
    ops.append(
        MountOp(
            MountKind.TMPFS, "/dev/shm", why="private shared memory", mode=0o1777, mkdir=True, size=tmp_size
        )
    )
    ops.extend(MountOp(MountKind.SYMLINK, f"/dev/{name}", dest) for name, dest in DEV_LINKS)
    return ops


def plan_mounts(
    writable: list[str],
    readable: list[str],
    denied: list[tuple[str, str]],
    hidden_candidates: list[str],
    facts: HostFacts,
    shared: bool,
    tmp_size: int | None = None,
    repository: str | None = None,
    place: tuple[str, str] | None = None,
    review: tuple[str, str] | None = None,
    link: tuple[str, str] | None = None,
) -> MountPlan:
    """The mount steps, in the order the kernel needs them. ``shared``: writable roots
    on one filesystem share one bind (needs Landlock >= 2 to confine them); otherwise
    one bind per root. ``denied`` pairs each path with where the rule came from.
    ``repository``: the root of a git repository the workspace lies in, whose ``.git``
    is outside it: under a fresh directory it is grafted read-only beneath the
    workspace's bind, so git inside finds it as on the host. ``place``: (where the
    workspace is seen, its host directory): mirrored there; ``link``: the same, reached
    through a symbolic link instead (the workspace stays on its host mount). ``review``: (workspace,
    layer directory): the workspace is an overlay of the host's, after every writable
    root and graft, before what hides or protects files inside it."""
    warnings: list[str] = []
    ops: list[MountOp] = [MountOp(MountKind.ROOT_VIEW, "/", "/", why="the host, read-only and nosuid")]
    if shared:
        groups = group_writable_roots(writable, facts)
    else:
        groups = [Group(r, (r,), overlaid_base(r)) for r in strip_nested(writable)]
    warnings.extend(split_warnings(groups, facts))

    def add_group(g: Group) -> None:
        why = "writable roots " + ", ".join(g.roots) + " share this one mount"
        if len(g.roots) == 1 and g.roots[0] == g.mount_at:
            why = "writable root"
        ops.append(MountOp(MountKind.BIND_RW, g.mount_at, g.mount_at, why=why, mkdir=g.overlaid is not None))
        ops.extend(mask_ops(g))

    for g in groups:
        if g.overlaid is None:
            add_group(g)
    if place is not None:
        ops.append(shadow_op(place[0]))
    if link is not None:
        ops.append(shadow_op(link[0], link_to=link[1]))

    ops.append(MountOp(MountKind.TMPFS, "/tmp", why="private /tmp", mode=0o1777, size=tmp_size))
    ops.extend(dev_ops(lambda path: facts.kind(path) != "missing", tmp_size))

    hidden: list[str] = []
    for path in hidden_candidates:
        if not path or not path.startswith("/") or facts.kind(path) != "dir":
            continue
        if any(within(path, h) for h in hidden) or within(path, "/tmp"):
            continue
        hidden.append(path)
        ops.append(
            MountOp(
                MountKind.TMPFS,
                path,
                why="hide host sockets (docker.sock, session bus, ...)",
                mode=0o755,
                readonly=True,
            )
        )
    # Read-only views grafted before the writable roots under a fresh directory: what
    # lies around roots under /tmp (a shared mount would have shown it), and a git
    # repository above the workspace. Read-only mounts: nothing of the host's there is
    # writable, whatever Landlock grants on /tmp.
    views = {
        at: "the host's directory around writable roots under /tmp, read-only"
        for at in tmp_views(groups, facts)
    }
    if repository and overlaid_base(repository):
        views[repository] = (
            "the git repository the workspace lies in, read-only (git finds it as on the host)"
        )
    # --read paths under a fresh directory, grafted here too: before the writable roots,
    # so a root inside one (a workspace in a directory given with --read) is bound on top
    # of it and stays writable.
    for path in sorted(readable, key=lambda v: (v.count("/"), v)):
        if overlaid_base(path) is None or any(within(path, w) for w in writable):
            continue
        if not any(within(path, at) for at in views):
            views[path] = "read-only graft into a fresh directory"
    for at in sorted(views, key=lambda v: (v.count("/"), v)):
        ops.append(MountOp(MountKind.BIND_RO, at, at, why=views[at], mkdir=True))
    for g in groups:
        if g.overlaid is not None:
            add_group(g)

    visible_grafts = [g.mount_at for g in groups if g.overlaid is not None] + list(views)
    if review is not None:
        workspace, layer = review
        ops.append(
            MountOp(
                MountKind.REVIEW,
                workspace,
                workspace,
                why="review mode: the host's workspace read-only beneath a layer of the sandbox's own "
                "(warren diff / apply / discard)",
                mkdir=overlaid_base(workspace) is not None,
                layers=(f"{layer}/upper", f"{layer}/work"),
            )
        )
        visible_grafts.append(workspace)

    def visible(path: str) -> bool:
        base = overlaid_base(path)
        return base is None or any(within(path, a) for a in visible_grafts)

    # What is visible now (the host view, the grafts) shows the host's files, so what is
    # denied beneath it is hidden below; a --read path inside a writable root is bound
    # read-only over it.
    for path in readable:
        if any(within(path, w) for w in writable):
            ops.append(
                MountOp(
                    MountKind.BIND_RO,
                    path,
                    path,
                    why="read-only inside a writable root",
                    mkdir=not visible(path),
                )
            )

    for git in facts.git:
        # The sandbox-side git directory: its top level (config, hooks, HEAD, the
        # index) is warren's tree, never the host's; a mount point cannot be renamed
        # or removed, so no sandbox moves it aside to plant its own.
        ops.append(
            MountOp(
                MountKind.BIND_RW,
                git.path,
                git.tree,
                why="git directory inside: its top level is warren's, host git never reads what the "
                "sandbox writes there",
            )
        )
        for name in git.shared:
            sub = f"{git.path}/{name}"
            ops.append(MountOp(MountKind.BIND_RW, sub, sub, why="the host's own git data, shared"))
    for path in facts.git_files:
        ops.append(
            MountOp(MountKind.BIND_RO, path, path, why="a .git file names the git directory host git uses")
        )

    # Other files linked from outside get an inode of their own before launch
    # (Plan.unshare): no mount. One whose content must stay unreadable cannot be copied.
    for path, dev, ino, secret in facts.outside_links:
        if secret and visible(path):
            why = "a hard link to a file outside the writable roots that is denied or unreadable to you"
            ops.append(MountOp(MountKind.DENY_FILE, path, why=why, ident=(dev, ino)))

    for path, source in denied:
        if visible(path):  # under a fresh directory the host's copy is not there to hide
            ops.extend(_deny_op(path, source, facts))

    if place is not None:
        at, source = place
        ops.append(
            MountOp(
                MountKind.MIRROR,
                at,
                source,
                why=f"the workspace {source} as the sandbox sees it there (its git directories, "
                "denied files and read-only paths too)",
            )
        )
    ops.append(MountOp(MountKind.PROC, "/proc", why="fresh /proc: only the sandbox's processes"))
    for path in PROC_READONLY:
        ops.append(MountOp(MountKind.RO_SELF, path, why="kernel tunables stay read-only"))
    return MountPlan(tuple(ops), tuple(groups), tuple(warnings), tuple(tmp_notes(groups, facts)))


def shadow_op(at: str, link_to: str | None = None) -> MountOp:
    """The mount point of a workspace seen at ``at``, a path the host need not have: its
    parent shadowed (a fresh read-only tmpfs showing the parent's entries as the sandbox
    saw them, bound back, with ``at`` an empty directory among them), so the mount point
    is made in the sandbox's own tmpfs, never on the host. After the host-side writable
    roots, whose binds the shadow keeps; before every fresh directory. ``link_to``:
    ``at`` is a symbolic link to that path instead of a mount point."""
    parent, name = os.path.split(at)
    made = f"a link to {link_to}" if link_to else name
    return MountOp(
        MountKind.SHADOW,
        parent,
        source=link_to,
        keep=(name,),
        why=f"the host's {parent} as the sandbox saw it, with {made} made inside the sandbox only",
    )


def _deny_op(path: str, source: str, facts: HostFacts) -> list[MountOp]:
    kind = facts.kind(path)
    why = f"denied ({source})"
    if kind == "dir":
        return [MountOp(MountKind.TMPFS, path, why=why, mode=0o000, readonly=True)]
    if kind in ("file", "other"):
        return [MountOp(MountKind.DENY_FILE, path, why=why)]
    return []


def guarded_ancestors(groups: Iterable[Group]) -> tuple[str, ...]:
    """Directories on a shared mount above its writable roots: Landlock stops entries
    being made or removed there, not chmod/utimes, so their metadata is guarded."""
    out: set[str] = set()
    for g in groups:
        for root in g.roots:
            if root == g.mount_at:
                continue
            cur = PurePosixPath(g.mount_at)
            out.add(str(cur))
            for part in PurePosixPath(root).relative_to(g.mount_at).parts[:-1]:
                cur = cur / part
                out.add(str(cur))
    return tuple(sorted(out))
