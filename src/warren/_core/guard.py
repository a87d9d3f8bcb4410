"""Ancestor guard: undo metadata changes to the directories above writable roots.

Writable roots that share one mount expose the directories between the mount's top
and the roots on a read-write mount. Landlock stops entries being created or removed
there, but Landlock does not cover chmod, chown-free metadata or times, so a sandboxed
process that owns those directories (the caller's own, or / for a root caller) could
change their mode, times or POSIX ACLs (an ACL rewrites the mode, and a default ACL
outlives the sandbox in the mode of every file made there later). The broker and the
seccomp filter refuse each such call; this module is the second line: it snapshots
them before a run and puts them back afterwards (at the end of a one-shot run, or when a long-lived sandbox
stops), reporting what it had to undo. It is a repair, not a prevention:
during the run the change is visible on the host.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass

# The xattrs that are POSIX ACLs: writing one changes who may do what, and the mode.
ACLS = ("system.posix_acl_access", "system.posix_acl_default")


@dataclass(frozen=True)
class DirState:
    path: str
    mode: int
    atime_ns: int
    mtime_ns: int
    names: frozenset[str]
    acls: tuple[tuple[str, bytes | None], ...] = ()


def _acls(path: str) -> tuple[tuple[str, bytes | None], ...]:
    """Each ACL's raw value, None where there is none (or the filesystem has none)."""
    out: list[tuple[str, bytes | None]] = []
    for name in ACLS:
        try:
            out.append((name, os.getxattr(path, name, follow_symlinks=False)))
        except OSError as e:
            if e.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                raise
            out.append((name, None))
    return tuple(out)


def snapshot(paths: Iterable[str]) -> list[DirState]:
    """Mode, times and ACLs of ``paths`` (the plan's ``guarded`` directories), taken after
    warren created what it creates itself and before the sandbox starts."""
    states = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        try:
            names = frozenset(os.listdir(path))
        except OSError:
            names = frozenset()
        try:
            acls = _acls(path)
        except OSError:
            acls = ()
        states.append(DirState(path, stat.S_IMODE(st.st_mode), st.st_atime_ns, st.st_mtime_ns, names, acls))
    return states


def _names(path: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(path))
    except OSError:
        return frozenset()


def _times_set(st: os.stat_result, before: DirState) -> bool:
    """Whether the directory's times were set by a call (utimes), not moved by an entry
    made, renamed or removed in it. An entry change stamps the modification and change
    times with one clock reading (equal to the nanosecond); a time that is set leaves
    the change time at the moment of the call and the modification time where it was
    set. The host's own entry changes (``git config --global`` renames a lock file over
    ``~/.gitconfig``: the same names before and after) are the host's, not a repair."""
    if st.st_mtime_ns == before.mtime_ns:
        return False
    if st.st_mtime_ns == st.st_ctime_ns:
        return False  # as an entry change stamps it (or a utimes to "now", which moves nothing back)
    return _names(before.path) == before.names


def restore(states: list[DirState]) -> list[str]:
    """Put back ACLs, mode and modification time; return one message per repair."""
    notes = []
    for before in states:
        # ACLs first: setting or removing one changes the mode, which is put back next.
        notes.extend(_restore_acls(before))
        try:
            st = os.stat(before.path)
        except OSError:
            continue
        if stat.S_IMODE(st.st_mode) != before.mode:
            try:
                os.chmod(before.path, before.mode)
                notes.append(
                    f"the sandbox changed the mode of {before.path} to "
                    f"{stat.S_IMODE(st.st_mode):o}; restored {before.mode:o}"
                )
            except OSError as e:
                notes.append(f"the sandbox changed the mode of {before.path}; restoring failed: {e}")
        if _times_set(st, before):
            # Landlock forbids entries being added or removed in these directories, so
            # with the same entries a new mtime came from utimes() on the directory
            # itself; with other entries, from the host (not the sandbox's doing).
            try:
                os.utime(before.path, ns=(before.atime_ns, before.mtime_ns))
                notes.append(f"the sandbox changed the times of {before.path}; restored")
            except OSError as e:
                notes.append(f"the sandbox changed the times of {before.path}; restoring failed: {e}")
    return notes


def _restore_acls(before: DirState) -> list[str]:
    try:
        now = dict(_acls(before.path))
    except OSError:
        return []
    notes = []
    for name, value in before.acls:
        if now.get(name) == value:
            continue
        try:
            if value is None:
                os.removexattr(before.path, name, follow_symlinks=False)
            else:
                os.setxattr(before.path, name, value, follow_symlinks=False)
            notes.append(f"the sandbox changed the ACL {name} of {before.path}; restored")
        except OSError as e:
            notes.append(f"the sandbox changed the ACL {name} of {before.path}; restoring failed: {e}")
    return notes
