"""What a sandbox's setup takes from the host besides its plan, as a value to compare.

A plan names paths; the launch and PID 1 act on whatever those paths are *when they
run*: a bind or a Landlock rule holds the inode it found, a mask over a denied directory
covers that very directory (one put there later is not covered), a ``MASK`` step binds
read-only each entry it lists at that moment. Two launches of equal plans make equal
sandboxes only if those were the same both times. ``take`` records them: the identity
(device, inode, type; through a link and of the link itself) of every path the plan
names, and the entries (name, inode) of the directories masked entry by entry and of
the guarded ones. A sandbox booted ahead (``ahead``) is used only while its marks are
what they were at its launch.

Reads only, and nothing is opened: ``lstat``, the filesystem's handle of a path
(``name_to_handle_at``, which opens nothing) and the names in the listed directories.
"""

from __future__ import annotations

import os
import stat

from .._core import kernel
from ..plan.landlock import covered_dirs
from ..plan.model import MountKind, Plan
from ..plan.mounts import SCRATCH_PREFIX

Marks = tuple[tuple[str, object], ...]
ENTRIES = "entries of "


def paths_of(plan: Plan) -> list[str]:
    """Every host path ``plan``'s launch and setup resolve."""
    paths: set[str] = set()
    for op in plan.mounts:
        paths.add(op.target)
        if op.source is not None and op.source.startswith("/"):
            paths.add(op.source)
        paths.update(op.layers)
    if plan.landlock is not None:
        paths.update(rule.path for rule in plan.landlock.rules)
    for _at, group in plan.groups:
        paths.update(group)
    for git in plan.git:
        paths.update((git.path, git.tree, *(os.path.join(git.path, d) for d in git.shared)))
    paths.update(plan.git_files)
    paths.update(plan.guarded)
    paths.update(plan.create_dirs)
    paths.update(p for p in (plan.scratch, plan.scratch_base, plan.workspace, plan.host_workspace) if p)
    return sorted(p for p in paths if p.startswith("/"))


def take(plan: Plan) -> Marks:
    """The marks of ``plan`` on this host now."""
    marks: list[tuple[str, object]] = [(path, _identity(path)) for path in paths_of(plan)]
    listed = {op.target for op in plan.mounts if op.kind is MountKind.MASK} | set(plan.guarded)
    if plan.landlock is not None and plan.image is None:
        listed.update(covered_dirs(plan.landlock))  # their entries get a read rule each
    marks.extend((ENTRIES + path, _entries(path)) for path in sorted(listed))
    return tuple(marks)


def still(then: Marks, now: Marks) -> bool:
    """Whether a sandbox set up from ``then`` is what one set up from ``now`` would be:
    every path the same file, and every entry of a listed directory now one that was
    there then (an entry gone since is gone for the sandbox too: the kernel detaches a
    mount whose mount point is removed; one added since was never masked)."""
    return difference(then, now) is None


def rules_only(plan: Plan) -> frozenset[str]:
    """The listed directories whose entries matter to the sandbox's read rules alone
    (neither masked entry by entry nor guarded): PID 1 lists them when it builds its
    ruleset, and builds it again when told to (``protocol.Refresh``)."""
    if plan.landlock is None or plan.image is not None:
        return frozenset()
    masked = {op.target for op in plan.mounts if op.kind is MountKind.MASK}
    return frozenset(covered_dirs(plan.landlock)) - masked - set(plan.guarded)


def difference(then: Marks, now: Marks, skip: frozenset[str] = frozenset()) -> str | None:
    """What makes ``still`` false, in words (the first such path), or None; the entries
    of the directories in ``skip`` not compared."""
    if len(then) != len(now):
        return "the paths the plan names"
    for (key, was), (key_now, is_) in zip(then, now, strict=True):
        if key != key_now:
            return "the paths the plan names"
        if key.startswith(ENTRIES) and key[len(ENTRIES) :] in skip:
            continue
        if key.startswith(ENTRIES) and isinstance(was, tuple) and isinstance(is_, tuple):
            had = {name for name, _ in was}
            entries = {(name, ident) for name, ident in is_ if name in had or not _scratch(ident, name)}
            new = sorted({name for name, _ in entries} - had)
            if new:
                return f"{key[len(ENTRIES) :]} has a new entry ({new[0]})"
            if not entries <= set(was):
                changed = sorted(name for name, ident in entries if (name, ident) not in set(was))
                return f"{os.path.join(key[len(ENTRIES) :], changed[0])} is another file"
        elif was != is_:
            return f"{key} is another file" if is_ is not None and was is not None else f"{key} came or went"
    return None


def _scratch(ident: object, name: str) -> bool:
    """A directory named as warren names another sandbox's TMPDIR beside a workspace
    (``plan.tmpdir``: ``.warren-tmp-<random>``, made for each sandbox and removed after
    it): one made since a boot is no difference. Sibling workspaces' sandboxes make them
    in their common parent at every launch, which made every sandbox booted ahead for
    the other workspace stale. A sandbox sees such a directory read-only either way: a
    fresh one's mask binds it read-only, and in one booted before it came the mount of
    the parent shows it under the same Landlock rules that cover whatever appears there
    after any sandbox's launch (read and execute, no write)."""
    return (
        name.startswith(SCRATCH_PREFIX)
        and isinstance(ident, tuple)
        and len(ident) > 2
        and ident[2] == stat.S_IFDIR
    )


def _identity(path: str) -> tuple[object, ...] | None:
    """Device, inode, type and the filesystem's handle (an inode number freed and
    given to a new file, as ext4 does at once for ``rm -r d; mkdir d``, is another
    handle); through a link, the same of its target too."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    ident: tuple[object, ...] = (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode), kernel.file_handle(path))
    if stat.S_ISLNK(st.st_mode):
        try:
            target = os.stat(path)
        except OSError:
            return ident
        real = os.path.realpath(path)
        return (*ident, target.st_dev, target.st_ino, stat.S_IFMT(target.st_mode), kernel.file_handle(real))
    return ident


def _entries(path: str) -> tuple[tuple[str, object], ...] | None:
    try:
        with os.scandir(path) as it:
            names = sorted(entry.name for entry in it)
    except OSError:
        return None
    return tuple((name, _identity(os.path.join(path, name))) for name in names)
