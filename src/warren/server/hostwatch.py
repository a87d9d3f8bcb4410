"""Keeping a long-lived sandbox's read rules in step with the host as it changes.

Reading is granted by Landlock rules, and a rule binds to the inode it finds. Where a
denied path sits in a directory (``~/.ssh`` in the home, ``/etc/shadow`` in ``/etc``),
that directory's other entries get a rule each (``plan.landlock.covered_dirs``), so a
file the host replaces by rename afterwards (``git config --global`` rewriting
``~/.gitconfig``, apt rewriting ``/etc/passwd``) is a new inode no rule names: unreadable
inside until the rules are built again. The supervisor watches those directories from
before PID 1 lists them; before it hands a request to the sandbox it asks whether one of
them got a new entry, and if so PID 1 builds the ruleset again (``protocol.Refresh``)
for the next command. Denied names stay denied: they are left out of every listing.

One inotify instance serves every sandbox of the supervisor (instances are a per-user
resource, 128 by default): each directory is watched once, and each sandbox remembers
which change of each directory it last saw. Commands already running keep the rules
they started with (a Landlock domain can only narrow).
"""

from __future__ import annotations

import os
from collections import Counter

from .._core.dirwatch import EntryWatches
from ..plan.landlock import covered_dirs
from ..plan.model import Plan

Stamp = tuple[int, int, int, int] | None


class _Shared:
    """The supervisor's watches: a count of changes per directory, and how many
    sandboxes want each."""

    def __init__(self) -> None:
        self.watches = EntryWatches()
        self.changes: Counter[str] = Counter()
        self.wanted: Counter[str] = Counter()

    def want(self, dirs: tuple[str, ...]) -> bool:
        """Watch ``dirs``; False where the user has no instance or watch left (the
        caller then compares the directories' times)."""
        ok = True
        for path in dirs:
            self.wanted[path] += 1
            if not self.watches.add(path) and path not in self.watches.missing:
                ok = False
        return ok

    def release(self, dirs: tuple[str, ...]) -> None:
        for path in dirs:
            self.wanted[path] -= 1
            if self.wanted[path] <= 0:
                del self.wanted[path]
                self.watches.remove(path)

    def poll(self) -> None:
        changed, overflow = self.watches.read()
        for path in self.wanted if overflow else changed:
            self.changes[path] += 1


_SHARED = _Shared()


class HostWatch:
    """One sandbox's view of the shared watches."""

    def __init__(self, dirs: tuple[str, ...]) -> None:
        self.dirs = dirs
        self.watched = _SHARED.want(dirs)
        self.seen = {path: _SHARED.changes[path] for path in dirs}
        # Without a watch: each directory's (device, inode, mtime, ctime). A change in the
        # same clock tick as the listing can be missed this way, which a watch never misses.
        self.stamps: dict[str, Stamp] = {} if self.watched else _stamps(dirs)
        self.closed = False

    @classmethod
    def start(cls, plan: Plan) -> HostWatch | None:
        """The watch for ``plan``'s sandbox (call it before its PID 1 lists the
        directories), or None where nothing is listed entry by entry (no denied path; on
        an image the sandbox's paths are not the host's)."""
        if plan.landlock is None or plan.image is not None:
            return None
        dirs = covered_dirs(plan.landlock)
        return cls(dirs) if dirs else None

    def changed(self) -> bool:
        """Whether one of the directories got a new entry since last asked (the answer is
        then reset: ask right before the ruleset is built again)."""
        if not self.watched:
            stamps = _stamps(self.dirs)
            if stamps == self.stamps:
                return False
            self.stamps = stamps
            return True
        _SHARED.poll()
        seen = {path: _SHARED.changes[path] for path in self.dirs}
        if seen == self.seen:
            return False
        self.seen = seen
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            _SHARED.release(self.dirs)


def _stamps(dirs: tuple[str, ...]) -> dict[str, Stamp]:
    out: dict[str, Stamp] = {}
    for path in dirs:
        try:
            st = os.lstat(path)
        except OSError:
            out[path] = None
            continue
        out[path] = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    return out
