"""Whether the host paths a sandbox booted ahead rests on (its ``marks``) may have changed
since they were taken, told by the kernel instead of by taking them again.

Taking the marks again costs a few ms to a few tens of ms (an ``lstat`` and a file
handle per path, every entry of the listed directories), on the path of the run that
uses the sandbox. A path names another file only once a directory entry on the way to
it changed (made, removed, renamed, replaced; a link's target is reached through
entries too) or a mount moved. So, before the marks are taken, ``start`` resolves every
path the plan names component by component, following links as the kernel does, and
watches (inotify) each directory a name was looked up in, for those names; the listed
directories (``marks.ENTRIES``) for any new entry; and the mount table (``POLLPRI`` on
``/proc/self/mountinfo``). ``confirm`` resolves them again once the marks are taken: a
change in between may have come before a watch did, and then the watch is not used.

``unchanged`` is True only while nothing of that was queued since; anything queued (or
lost: a full queue) makes it False for good, and the caller takes the marks again, as
before. No watch (the user's inotify instances or watches used up, a directory the
user cannot read, too many links) is the same: the marks are taken again.

``replaced`` is narrower and needs no marks: a name on the way to a path the plan
itself names (not one reached only through a listed directory's entry) was removed
or moved away, so that path is another file now, or none, and the sandbox is
certainly not the one a fresh launch would make (a workspace deleted and made again,
as a harness copying a project anew does). The supervisor stops such a sandbox without
planning the request again. (A name moved away and back is the one case where the
marks would have agreed: that sandbox is stopped for nothing, and the next run
launches, as with no sandbox booted.)
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import time
from collections.abc import Iterable

from .._core import _sys
from ..plan.landlock import covered_dirs
from ..plan.model import MountKind, Plan
from ..plan.mounts import SCRATCH_PREFIX
from ..policy import lookups as _lookups
from . import marks

# A name made, removed or renamed in a watched directory; the directory itself gone.
_NAMES = _sys.IN_CREATE | _sys.IN_DELETE | _sys.IN_MOVED_FROM | _sys.IN_MOVED_TO
_SELF = _sys.IN_DELETE_SELF | _sys.IN_MOVE_SELF
_NEW = _sys.IN_CREATE | _sys.IN_MOVED_TO
_UNMOUNT = 0x2000  # IN_UNMOUNT: the filesystem under a watch went
_EVENT = struct.Struct("=iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
# Names like a sandbox's TMPDIR's removed from a listed directory, remembered per watch
# (``_scratch_made``): a sandbox whose workspace another's watch lists can make and remove
# such names without end; past this many the watch says changed, and the marks judge.
SCRATCH_GONE_MAX = 1024
# seconds a watch nobody wants is kept (``_Shared.sweep``): past a sandbox booted ahead's
# life (``ahead.IDLE``), so the next one booted for the same request finds it
IDLE_KEEP = 90.0

# directory (resolved, no link in it) -> the names looked up in it
Lookups = dict[str, set[str]]
# A name of a watched directory gone from it: removed, or renamed to another.
_AWAY = _sys.IN_DELETE | _sys.IN_MOVED_FROM


def lookups(plan: Plan) -> tuple[Lookups, frozenset[str], Lookups] | None:
    """The names ``plan``'s paths are looked up by, per directory; the listed
    directories (resolved) whose every new entry counts; and, of the names, those on
    the way to a path the plan names itself (``marks.paths_of``; the rest lead to where
    a listed directory's link points). None where a path cannot be followed (a directory
    the caller cannot search, a loop of links)."""
    names: Lookups = {}
    seen: _Seen = {}  # one lookup per name for the whole call: the paths share most of theirs
    for path in marks.paths_of(plan):
        if _chain(path, names, seen) is False:
            return None
    firm = {directory: set(found) for directory, found in names.items()}
    wild: set[str] = set()
    for path in sorted(_listed(plan)):
        real = _chain(path, names, seen)
        if real is False:
            return None
        if not isinstance(real, str):
            continue
        wild.add(real)
        # An entry of a listed directory is marked through a link: where it leads counts.
        try:
            with os.scandir(real) as it:
                links = [entry.path for entry in it if entry.is_symlink()]
        except OSError:
            continue
        for link in links:
            if _chain(link, names, seen) is False:
                return None
    return names, frozenset(wild), firm


def lookups_of(paths: Iterable[str], listed: Iterable[str]) -> tuple[Lookups, frozenset[str], Lookups] | None:
    """As ``lookups``, for any absolute ``paths`` (each looked up, its last link
    followed) and ``listed`` directories (every new entry counts), None where one cannot
    be followed. No name is on a planned path's way (``replaced`` says nothing)."""
    names: Lookups = {}
    seen: _Seen = {}
    for path in sorted(paths):
        if _chain(path, names, seen) is False:
            return None
    wild: set[str] = set()
    for path in sorted(listed):
        real = _chain(path, names, seen)
        if real is False:
            return None
        if isinstance(real, str):
            wild.add(real)
    return names, frozenset(wild), {}


def _listed(plan: Plan) -> set[str]:
    listed = {op.target for op in plan.mounts if op.kind is MountKind.MASK} | set(plan.guarded)
    if plan.landlock is not None and plan.image is None:
        listed.update(covered_dirs(plan.landlock))
    return listed


# What each name was found to be (``lookups.Kind``), in one ``lookups`` call.
_Seen = dict[str, _lookups.Kind]


def _chain(path: str, out: Lookups, seen: _Seen | None = None) -> str | bool | None:
    """Record in ``out`` each (directory, name) looked up to resolve ``path`` (its last
    link followed too, as ``marks`` does). The resolved path, None where the path ends
    before its end (a name missing, or a file where a directory should be: the lookups
    up to there are recorded), False where it cannot be followed. ``seen``: what each
    name was found to be, kept for the next paths of the same call."""

    def look(full: str) -> _lookups.Kind:
        if seen is None:
            return _lookups.kind_of(full)
        found = seen.get(full)
        if found is None:
            found = seen[full] = _lookups.kind_of(full)
        return found

    walk = _lookups.Steps(path, look)
    try:
        for directory, name, found, last in walk:
            out.setdefault(directory, set()).add(name)
            if found == "missing":
                return None
            if found == "error":
                return False
            if found == "file" and not last:
                return None
    except OSError:
        return False  # a loop of links, or one that cannot be read
    return walk.end


def relevant(mask: int, name: str, names: set[str] | None, wild: bool, gone_before: bool = False) -> bool:
    """Whether an event (``mask``, ``name``) in a directory whose looked-up ``names``
    (None: the directory is not on any path) and listing (``wild``) count changes
    what the marks would say. ``gone_before``: ``name`` was removed from the directory
    since the watch began."""
    if mask & (_sys.IN_Q_OVERFLOW | _sys.IN_IGNORED | _UNMOUNT | _SELF):
        return True
    if wild and mask & _NEW and not _scratch_made(mask, name, gone_before):
        return True
    return bool(mask & _NAMES) and names is not None and name in names


def _scratch_made(mask: int, name: str, gone_before: bool) -> bool:
    """A directory made (not moved in) with the name warren gives another sandbox's
    TMPDIR beside a workspace: the marks count no such directory made since a boot as a
    difference (``marks._scratch``), so neither does the watch, or every sandbox booted
    ahead for one of two sibling workspaces went stale at each launch in the other, and
    its run took the marks again on its path (about 3 ms for a plain run). Not where
    the name was removed since the watch began: then it was there at the boot, and is
    another directory now, which the marks do count."""
    return (
        bool(mask & _sys.IN_CREATE and mask & _sys.IN_ISDIR)
        and name.startswith(SCRATCH_PREFIX)
        and not gone_before
    )


class _Shared:
    """The supervisor's one inotify instance for every sandbox booted ahead: closing an
    instance that watched something waits for the kernel's grace period (5-20 ms, on a
    run's path when its sandbox is used). A directory watched for two sandboxes is one
    watch (the kernel gives its inode one descriptor), whose events go to both.

    A watch nobody subscribes to any more is not removed at once: it is kept idle (its
    events go nowhere) until ``sweep``, which the supervisor calls while nobody waits.
    Removing the last watch of an inode costs the kernel tens of microseconds, and a
    booted sandbox lets go of its watches on its run's path (about 36 of them for a plain
    run here, half a millisecond), while the next one booted watches the same
    directories again."""

    def __init__(self) -> None:
        self.fd = -1
        self.subscribers: dict[int, list[MarkWatch]] = {}
        self.idle: dict[int, float] = {}  # watch descriptor -> since when nobody wants it

    def add(self, path: str, watch: MarkWatch) -> int | None:
        if self.fd < 0:
            try:
                self.fd = _sys.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError:
                return None
        try:
            dir_fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            wd = _sys.inotify_add_watch(self.fd, f"/proc/self/fd/{dir_fd}", _NAMES | _SELF | _UNMOUNT)
        except OSError:
            return None
        finally:
            os.close(dir_fd)
        self.idle.pop(wd, None)
        subscribers = self.subscribers.setdefault(wd, [])
        if watch not in subscribers:
            subscribers.append(watch)
        return wd

    def remove(self, wd: int, watch: MarkWatch) -> None:
        """``watch`` no longer wants ``wd``; nobody else wanting it, it is idle."""
        subscribers = self.subscribers.get(wd)
        if subscribers is None or watch not in subscribers:
            return
        subscribers.remove(watch)
        if not subscribers:
            del self.subscribers[wd]
            self.idle[wd] = time.monotonic()

    def sweep(self, now: float, keep: float = IDLE_KEEP) -> None:
        """Remove the watches idle for more than ``keep`` seconds."""
        for wd in [wd for wd, since in self.idle.items() if now - since > keep]:
            del self.idle[wd]
            with contextlib.suppress(OSError):
                _sys.inotify_rm_watch(self.fd, wd)

    def read(self) -> None:
        """Hand what is queued to the watches it concerns."""
        while self.fd >= 0:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                for subscribers in self.subscribers.values():
                    for watch in subscribers:
                        watch.stale = True
                return
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                name = os.fsdecode(data[at + _EVENT.size : at + _EVENT.size + length].rstrip(b"\0"))
                at += _EVENT.size + length
                if mask & _sys.IN_Q_OVERFLOW:
                    concerned = [w for subscribers in self.subscribers.values() for w in subscribers]
                else:
                    concerned = list(self.subscribers.get(wd, ()))
                for watch in concerned:
                    names, wild = watch.wds.get(wd, (None, False))
                    if wild and mask & _AWAY and name.startswith(SCRATCH_PREFIX) and not watch.stale:
                        if len(watch.scratch_gone) >= SCRATCH_GONE_MAX:
                            watch.stale = True  # the memory's budget: the marks judge instead
                        watch.scratch_gone.add((wd, name))
                    if relevant(mask, name, names, wild, (wd, name) in watch.scratch_gone):
                        watch.stale = True
                    if mask & _AWAY and watch.replaced_by is None and name in watch.firm.get(wd, ()):
                        watch.replaced_by = os.path.join(watch.paths.get(wd, "?"), name)
                if mask & _sys.IN_IGNORED:
                    self.subscribers.pop(wd, None)  # the kernel removed it
                    self.idle.pop(wd, None)


_SHARED = _Shared()


def due(now: float) -> bool:
    """Whether a watch has been idle long enough to be let go (``sweep``)."""
    return any(now - since > IDLE_KEEP for since in _SHARED.idle.values())


def sweep(now: float) -> None:
    """Let go of the watches no sandbox booted ahead has wanted for a while (the
    supervisor, while nobody waits)."""
    _SHARED.sweep(now)


class MarkWatch:
    """The watch of one sandbox booted ahead."""

    def __init__(self, mounts: int, found: tuple[Lookups, frozenset[str], Lookups]) -> None:
        self.mounts, self.found = mounts, found
        self.wds: dict[int, tuple[set[str] | None, bool]] = {}
        self.firm: dict[int, set[str]] = {}  # watch descriptor -> names on a planned path's way
        self.paths: dict[int, str] = {}  # watch descriptor -> its directory (for the log)
        self.stale = False
        # names like a sandbox's TMPDIR's removed since the start (``_scratch_made``)
        self.scratch_gone: set[tuple[int, str]] = set()
        # the first name on a planned path's way removed or moved away (``replaced``)
        self.replaced_by: str | None = None

    @classmethod
    def start(cls, plan: Plan) -> MarkWatch | None:
        """Watch what ``plan``'s marks rest on (call it before taking them)."""
        return cls.over(lookups(plan))

    @classmethod
    def over(cls, found: tuple[Lookups, frozenset[str], Lookups] | None) -> MarkWatch | None:
        """Watch the names and listed directories of ``found`` (``lookups``,
        ``lookups_of``) and the mount table; None where that cannot be done."""
        if found is None:
            return None
        try:
            mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return None
        _SHARED.read()  # what is queued from before is not about this sandbox
        watch = cls(mounts, found)
        names, wild, firm = found
        for path in sorted(set(names) | wild):
            if not watch._add(path, names.get(path), path in wild, firm.get(path, set())):
                watch.close()
                return None
        return watch

    def _add(self, path: str, names: set[str] | None, wild: bool, firm: set[str]) -> bool:
        wd = _SHARED.add(path, self)
        if wd is None:
            return False
        self.firm.setdefault(wd, set()).update(firm)
        self.paths.setdefault(wd, path)
        # The same directory under two paths (a bind mount): one watch, both its names.
        had_names, had_wild = self.wds.get(wd, (None, False))
        merged = None if names is None and had_names is None else {*(names or ()), *(had_names or ())}
        self.wds[wd] = (merged, wild or had_wild)
        return True

    def confirm(self, plan: Plan) -> bool:
        """Once the marks are taken: whether the paths still resolve through what is
        watched (else a change may have come before its watch: the watch is let go)."""
        if lookups(plan) != self.found:
            self.close()
            return False
        return True

    def unchanged(self) -> bool:
        """Whether nothing the marks rest on changed since ``start`` (False for good once
        something did; the caller then takes the marks again)."""
        if self.stale or self.mounts < 0:
            return False
        poller = select.poll()
        poller.register(self.mounts, select.POLLPRI)
        if poller.poll(0):
            self.stale = True  # the mount table changed
            return False
        _SHARED.read()
        return not self.stale

    def replaced(self) -> str | None:
        """A path on the way to one the plan names whose name was removed or moved
        away since ``start`` (the first such), or None: where it is not None, the
        sandbox can be stopped unchecked (the marks could not agree). Reads what is
        queued; a closed watch says nothing new."""
        if self.mounts >= 0:
            _SHARED.read()
        return self.replaced_by

    def close(self) -> None:
        self.stale = True
        for wd in self.wds:
            _SHARED.remove(wd, self)
        self.wds.clear()
        if self.mounts >= 0:
            with contextlib.suppress(OSError):
                os.close(self.mounts)
        self.mounts = -1
