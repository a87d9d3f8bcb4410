"""Ancestor guard: undo metadata changes to the directories above writable roots.

Writable roots that share one mount expose the directories between the mount's top
and the roots on a read-write mount. Landlock stops entries being created or removed
there, but Landlock does not cover chmod, chown-free metadata or times, so a sandboxed
process that owns those directories (the caller's own, or / for a root caller) could
change their mode or times. This module snapshots them before a run and puts them
back afterwards (at the end of a one-shot run, or when a long-lived sandbox
stops), reporting what it had to undo. It is a repair, not a prevention:
during the run the change is visible on the host.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class DirState:
    path: str
    mode: int
    atime_ns: int
    mtime_ns: int
    names: frozenset[str]


def snapshot(paths: Iterable[str]) -> list[DirState]:
    """Mode and times of ``paths`` (the plan's ``guarded`` directories), taken after
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
        states.append(DirState(path, stat.S_IMODE(st.st_mode), st.st_atime_ns, st.st_mtime_ns, names))
    return states


def _names(path: str) -> frozenset[str]:
    try:
        return frozenset(os.listdir(path))
    except OSError:
        return frozenset()


def restore(states: list[DirState]) -> list[str]:
    """Put back mode and modification time; return one message per repair."""
    notes = []
    for before in states:
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
        if st.st_mtime_ns != before.mtime_ns and _names(before.path) == before.names:
            # Landlock forbids entries being added or removed in these directories, so
            # with the same entries a new mtime came from utimes() on the directory
            # itself; with other entries, from the host (not the sandbox's doing).
            try:
                os.utime(before.path, ns=(before.atime_ns, before.mtime_ns))
                notes.append(f"the sandbox changed the times of {before.path}; restored")
            except OSError as e:
                notes.append(f"the sandbox changed the times of {before.path}; restoring failed: {e}")
    return notes
