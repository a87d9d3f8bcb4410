"""A large writable root's directories, each watched: its repositories found from what
changed, and whether any name made there since its last hard-link walk may be a link.

The repository walk (``gitfind``) lists every directory of a root at each launch and
at each sandbox's end: tens of milliseconds for a tree of 10,000 directories (one
``node_modules``), twice per ``warren run``, however little changed. A directory's
entries change only with an inotify event on it, so a root whose every directory is
watched is walked once; from then on only the directories that had an event are
listed again, and the answer costs what changed, not the tree's size.

The same events say which names were made in the root (created, linked or renamed
there) since a moment: the hard-link walk of a launch (``server.linkwalk``) may then
run beside the sandbox's first command rather than before it (``predict``): when the
last walk found no file linked from outside, and every name made since is a file with
one link (or a directory holding only such), the walk is expected to find nothing.
The walk still runs, and decides (``server.box.Box.walked_now``).

What is believed, and when it is not:

- An event on a watched directory: an entry made, removed or renamed there, or the
  directory itself gone from its name. Events are the inode's: they come whoever makes
  the change (the host, any sandbox) and through whichever mount.
- Everything is walked again, with watches afresh, when the queue overflowed, when a
  mount was made, removed or changed at the root, above it or beneath it (a mount
  shows or hides a tree and raises no event: ``/proc/self/mountinfo`` says so, and
  ``mounts_near`` which of its mounts are these), or when the root is not the
  directory it was; and no prediction holds across that (``epoch``). A mount anywhere
  else (a container started, a disk plugged in, another test's tmpfs) changes nothing
  of the root's tree: it is looked at and left.
- Only a root on a filesystem whose every change passes through this kernel
  (``LOCAL``): a network filesystem changed from another machine raises no event.
- Only while the watches fit the budget (``budget``: a share of the user's inotify
  watches, which the user's editor needs too): a root with more directories is not
  watched, and is walked as before (``gitfind``'s change-time memory).
- A link made elsewhere to a file already in the root (``ln ROOT/f ~/f``) raises no
  event here (its count changes, its directory does not): that is what the walk
  beside the command finds, and why it still runs.

A directory that cannot be opened (no permission, replaced by a link meanwhile) is
tried again at every answer, since no event says when it can be; while there is one,
or one deeper than ``DEPTH``, nothing is predicted. What is a ``.git`` file is read
again at every answer: its content changes without an event on the directory.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import stat
import time
from collections import OrderedDict
from dataclasses import dataclass

from .._core import _sys, dirwatch, safepath
from ..plan.facts import MountEntry, parse_mountinfo
from . import gitfind

# The filesystems whose changes all pass through this kernel (``statfs``'s f_type):
# ext2/3/4, xfs, btrfs, tmpfs, f2fs, bcachefs, zfs, overlayfs.
LOCAL = frozenset(
    {0xEF53, 0x58465342, 0x9123683E, 0x01021994, 0xF2F52010, 0xCA451A4E, 0x2FC12FC1, 0x794C7630}
)
MASK = (
    _sys.IN_CREATE
    | _sys.IN_DELETE
    | _sys.IN_MOVED_FROM
    | _sys.IN_MOVED_TO
    | _sys.IN_DELETE_SELF
    | _sys.IN_MOVE_SELF
    | _sys.IN_ONLYDIR
)
_MADE = _sys.IN_CREATE | _sys.IN_MOVED_TO
# The entries of a directory git looks at (``gitfind.kind_of``); any other name made or
# removed there changes nothing of git's unless it is a directory.
GIT_NAMES = frozenset({".git", "HEAD", "objects", "refs"})
MAX_ROOTS = 8  # roots watched at once (the least recently asked about goes first)
MAX_WATCHES = 65536  # at most, over all roots, and at most a quarter of the user's
DEPTH = 64  # as deep as ``gitfind`` walks
FRESH_MAX = 4096  # names made since the last walk that are kept to be looked at
RETRY_AFTER = 600.0  # a root found too large, or not watchable, is not tried again sooner
_serials = itertools.count(1)

Token = tuple[int, int]  # a watched root's serial and epoch (``WatchedRoot.begin``)


def budget() -> int:
    """How many watches all watched roots may hold: a quarter of the user's inotify
    watches (``max_user_watches``), at most ``MAX_WATCHES``."""
    try:
        with open("/proc/sys/fs/inotify/max_user_watches") as f:
            allowed = int(f.read())
    except (OSError, ValueError):
        allowed = 8192
    return min(MAX_WATCHES, allowed // 4)


def _where(fd: int) -> str:
    """Where the kernel says the directory ``fd`` is, as the mount table names paths
    (links resolved, from this process's root)."""
    return os.readlink(f"/proc/self/fd/{fd}")


def mounts_near(path: str, table: str) -> frozenset[MountEntry]:
    """The mounts of a mount table (``/proc/self/mountinfo``'s text) whose mount point
    is ``path``, a directory above it or one beneath it, each as the table says it
    (its id, its options): what a mount made, removed or changed there may change of
    the tree seen at ``path``."""
    below = path.rstrip("/") + "/"
    return frozenset(
        e
        for e in parse_mountinfo(table)
        if e.mount_point == path
        or below.startswith(e.mount_point.rstrip("/") + "/")
        or e.mount_point.startswith(below)
    )


class _TooMany(Exception):
    """The tree has more directories than the watches it may hold."""


@dataclass
class _Dir:
    kind: str  # gitfind's: "", "bare", "dotgit", "dotfile"
    subdirs: tuple[str, ...]  # every subdirectory, ``.git`` and a bare repository's too
    wd: int


class WatchedRoot:
    """One root's directories, each watched (``find``, ``predict``)."""

    def __init__(self, root_fd: int, allowed: int) -> None:
        st = os.fstat(root_fd)
        self.path = ""  # where the kernel says the root is at the last walk (``_where``)
        self.ident = (st.st_dev, st.st_ino)
        self.allowed = allowed
        self.serial = next(_serials)
        self.epoch = 0  # a new one when events may have been missed, or a name is linked
        self.inotify = -1
        self.dirs: dict[str, _Dir] = {}
        self.git: set[str] = set()  # the directories of ``dirs`` with a kind
        self.by_wd: dict[int, str] = {}
        self.unopened: set[str] = set()
        self.deep: set[str] = set()  # directories deeper than ``DEPTH``: not walked
        self.pending: set[str] = set()  # directories to list again (``find``)
        self.why_not = ""  # why the last prediction was not made (``predict``), for the log
        self.stale = False  # the queue overflowed: everything is walked again
        # Names made (files, directories) since a walk that found the root clean began,
        # each with when (``seq``): a walk's clean end forgets those made before it began.
        self.fresh: dict[str, int] = {}
        self.fresh_dirs: dict[str, int] = {}
        self.seq = 0
        self.mounts = os.open("/proc/self/mountinfo", os.O_RDONLY | os.O_CLOEXEC)
        self._poller = select.poll()
        self._poller.register(self.mounts, select.POLLPRI | select.POLLERR)
        self.near: frozenset[MountEntry] = frozenset()  # ``mounts_near`` the root at the last walk
        self.walks = 0  # whole walks made (the tests count them)
        try:
            self._rebuild(root_fd)
        except BaseException:
            self.close()
            raise

    @property
    def watches(self) -> int:
        return len(self.by_wd)

    def close(self) -> None:
        if self.inotify >= 0:
            dirwatch.close(self.inotify)
            self.inotify = -1
        if self.mounts >= 0:
            os.close(self.mounts)
            self.mounts = -1
        self.dirs.clear()
        self.git.clear()
        self.by_wd.clear()

    def find(self, root_fd: int) -> gitfind.Found:
        """What ``gitfind.find`` would answer for the root now. Raises ``_TooMany``
        when the tree has grown past the budget (the root is then not watched)."""
        self.drain()
        st = os.fstat(root_fd)
        if (
            self.stale
            or (st.st_dev, st.st_ino) != self.ident
            or _where(root_fd) != self.path
            or self._mounts_moved()
        ):
            self.ident = (st.st_dev, st.st_ino)
            self._rebuild(root_fd)
        else:
            pending, self.pending = self.pending, set()
            for rel in sorted(pending, key=_depth_first):
                if rel in self.dirs:  # (not gone with a parent listed before it)
                    self._relist(root_fd, rel)
            for rel in sorted(self.unopened, key=_depth_first):
                self._retry(root_fd, rel)
        kept = []
        for rel in self.git:
            kind = self.dirs[rel].kind
            if not self._git_walks_to(rel):
                continue
            if kind != "dotfile" or _names_a_gitdir(root_fd, rel):
                kept.append((rel, kind))
        return gitfind.from_kinds(root_fd, kept)

    def begin(self) -> tuple[Token, int]:
        """A hard-link walk of the root starts now: its token, and the mark to give
        ``verified`` if it finds the root clean (the names made before it began are then
        the walk's to have seen)."""
        self.drain()
        return (self.serial, self.epoch), self.seq

    def verified(self, mark: int) -> None:
        """A walk that began at ``mark`` found the root clean: the names made before it
        need no look any more."""
        self.fresh = {k: v for k, v in self.fresh.items() if v > mark}
        self.fresh_dirs = {k: v for k, v in self.fresh_dirs.items() if v > mark}

    def predict(self, root_fd: int, clean: Token | None) -> bool:
        """Whether a hard-link walk now is expected to find nothing: the walk that began
        at ``clean`` found nothing linked from outside, no event may have been missed
        since, every directory is watched, and each name made since is a file with one
        link (or a directory holding only such). A name found linked ends the
        prediction until a walk finds the root clean again; names looked at are not
        looked at again (from then on they are as any file the last walk saw)."""
        self.drain()
        self.why_not = self._not_expected(clean)
        if self.why_not:
            return False
        expected = self._single_linked(root_fd)
        self.fresh.clear()
        self.fresh_dirs.clear()
        if not expected:
            self.epoch += 1
            self.why_not = "a name made since the last walk has more than one link"
        return expected

    def _not_expected(self, clean: Token | None) -> str:
        """Why no prediction can be made now ("" when one can)."""
        if clean is None:
            return "no walk with these shared roots found the root clean yet"
        if clean != (self.serial, self.epoch):
            return f"the root changed since its clean walk (walk {clean}, now {(self.serial, self.epoch)})"
        if self.stale:
            return "its watch queue overflowed"
        if self.unopened:
            return f"{len(self.unopened)} directories could not be watched"
        if self.deep:
            return f"{len(self.deep)} directories are deeper than watched"
        return ""

    def _single_linked(self, root_fd: int) -> bool:
        for rel in self.fresh:
            try:
                st = safepath.lstat_beneath(root_fd, rel)
            except OSError:
                st = None  # its directory gone or replaced: its parent's event says so
            if st is not None and stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
                return False
        budget = FRESH_MAX
        for rel in self.fresh_dirs:
            budget = _single_links_beneath(root_fd, rel, budget)
            if budget < 0:
                return False
        return True

    # --- the watches -------------------------------------------------------------------

    def _mounts_moved(self) -> bool:
        """Whether a mount at the root, above it or beneath it was made, removed or
        changed since the last walk; the mount table's changes elsewhere are left."""
        if not self._poller.poll(0):
            return False
        return mounts_near(self.path, self._mount_table()) != self.near

    @staticmethod
    def _mount_table() -> str:
        # (As ``hostfacts.gather`` reads it; decoded as ``_where``'s paths are, os.fsdecode.)
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return f.read()

    def drain(self) -> None:
        """What the queue says since the last drain: directories to list again, names
        made (or, the queue having overflowed, everything to walk again)."""
        for wd, mask, name in dirwatch.events(self.inotify):
            if mask & (_sys.IN_Q_OVERFLOW | _sys.IN_UNMOUNT):
                self._lost()
                continue
            rel = self.by_wd.get(wd)
            if mask & _sys.IN_IGNORED:
                if rel is not None:
                    del self.by_wd[wd]
                    if rel == "":
                        self._lost()
                continue
            if rel is None:
                continue
            if mask & (_sys.IN_DELETE_SELF | _sys.IN_MOVE_SELF):
                if rel == "":
                    self._lost()
                else:
                    self.pending.add(rel.rpartition("/")[0])  # its parent's entry changed too
                continue
            path = _join(rel, name)
            self.seq += 1
            if mask & _sys.IN_ISDIR:
                self.pending.add(rel)
                if mask & _MADE:
                    self.fresh_dirs[path] = self.seq
            else:
                if name in GIT_NAMES:
                    self.pending.add(rel)
                if mask & _MADE:
                    self.fresh[path] = self.seq
            if len(self.fresh) + len(self.fresh_dirs) > FRESH_MAX:
                self.fresh.clear()
                self.fresh_dirs.clear()
                self.epoch += 1  # too many to look at: the next walk decides

    def _lost(self) -> None:
        self.stale = True
        self.epoch += 1

    def _rebuild(self, root_fd: int) -> None:
        """Every directory walked and watched afresh (a new instance: watches of
        directories no longer there go with the old one)."""
        if self.inotify >= 0:
            dirwatch.close(self.inotify)
        self.inotify = _sys.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        self.epoch += 1
        self.dirs.clear()
        self.git.clear()
        self.by_wd.clear()
        self.unopened.clear()
        self.deep.clear()
        self.pending.clear()
        self.fresh.clear()
        self.fresh_dirs.clear()
        self.stale = False
        self._poller.poll(0)  # the mount table as it is now (a change after shows next time)
        self.path = _where(root_fd)
        self.near = mounts_near(self.path, self._mount_table())
        self.walks += 1
        self._walk(os.dup(root_fd), "", 0)

    def _walk(self, fd: int, rel: str, depth: int) -> None:
        """``rel`` (its descriptor ``fd``, closed here) and beneath it: watched first,
        then listed, so a change after the listing raises an event."""
        try:
            if depth > DEPTH:
                self.deep.add(rel)
                return
            wd = self._watch(fd)
            kind, subdirs = _listed(fd)
            self._forget(rel)
            self._record(rel, _Dir(kind, subdirs, wd))
            for name in subdirs:
                sub = _join(rel, name)
                try:
                    child = safepath.dir_beneath(fd, name)
                except OSError:
                    self.unopened.add(sub)
                    continue
                self._walk(child, sub, depth + 1)
        finally:
            os.close(fd)

    def _watch(self, fd: int) -> int:
        if len(self.by_wd) >= self.allowed:
            raise _TooMany
        return _sys.inotify_add_watch(self.inotify, f"/proc/self/fd/{fd}", MASK)

    def _relist(self, root_fd: int, rel: str) -> None:
        """A directory whose entries changed: listed again; what left it is forgotten,
        what came is walked."""
        old = self.dirs[rel]
        try:
            fd = safepath.dir_beneath(root_fd, rel) if rel else os.dup(root_fd)
        except OSError:
            self._drop(rel)
            self.unopened.add(rel)
            return
        depth = rel.count("/") + 1 if rel else 0
        try:
            wd = self._watch(fd)
        except BaseException:
            os.close(fd)
            raise
        if wd != old.wd:
            # Another directory under this name now: everything beneath is new.
            self._drop(rel)
            self._walk(fd, rel, depth)
            return
        try:
            kind, subdirs = _listed(fd)
            for name in set(old.subdirs) - set(subdirs):
                self._drop(_join(rel, name))
            self._record(rel, _Dir(kind, subdirs, wd))
            for name in subdirs:
                sub = _join(rel, name)
                if sub in self.dirs or sub in self.deep:
                    continue
                try:
                    child = safepath.dir_beneath(fd, name)
                except OSError:
                    self.unopened.add(sub)
                    continue
                self._walk(child, sub, depth + 1)
        finally:
            os.close(fd)

    def _retry(self, root_fd: int, rel: str) -> None:
        """A directory that could not be opened: walked once it can be, while its parent
        still lists it."""
        parent, _, name = rel.rpartition("/")
        known = self.dirs.get(parent)
        if known is None or name not in known.subdirs:
            self.unopened.discard(rel)
            return
        try:
            fd = safepath.dir_beneath(root_fd, rel)
        except OSError:
            return
        self.unopened.discard(rel)
        self._walk(fd, rel, rel.count("/") + 1)

    def _git_walks_to(self, rel: str) -> bool:
        """Whether ``gitfind``'s walk reaches ``rel``: never inside a ``.git`` directory
        or beneath a bare repository (it reports those with their submodules), nor
        deeper than ``DEPTH``."""
        parts = rel.split("/") if rel else []
        if ".git" in parts or len(parts) > DEPTH:
            return False
        return not any(self.dirs[a].kind == "bare" for a in _ancestors(rel) if a in self.dirs)

    def _record(self, rel: str, d: _Dir) -> None:
        self.dirs[rel] = d
        self.by_wd[d.wd] = rel
        if d.kind:
            self.git.add(rel)
        else:
            self.git.discard(rel)

    def _forget(self, rel: str) -> None:
        """``rel``'s own record (before it is recorded again; its watch stays)."""
        d = self.dirs.pop(rel, None)
        self.git.discard(rel)
        if d is not None and self.by_wd.get(d.wd) == rel:
            del self.by_wd[d.wd]

    def _drop(self, rel: str) -> None:
        """``rel`` and everything beneath it: forgotten, watches removed (a watch that
        now stands for a directory under another name is kept)."""
        self.unopened = {u for u in self.unopened if not _within(u, rel)}
        self.deep = {u for u in self.deep if not _within(u, rel)}
        stack = [rel]
        while stack:
            at = stack.pop()
            d = self.dirs.pop(at, None)
            if d is None:
                continue
            self.git.discard(at)
            stack.extend(_join(at, n) for n in d.subdirs)
            if self.by_wd.get(d.wd) == at:
                del self.by_wd[d.wd]
                with contextlib.suppress(OSError):
                    _sys.inotify_rm_watch(self.inotify, d.wd)


class WatchedRoots:
    """The watched roots of one supervisor, by path: at most ``MAX_ROOTS``, together
    within ``budget()`` watches."""

    def __init__(self) -> None:
        self.roots: OrderedDict[str, WatchedRoot] = OrderedDict()
        self.refused: dict[tuple[int, int], float] = {}  # (dev, ino) of a root -> when

    def find(self, root: str, root_fd: int, large: bool) -> gitfind.Found | None:
        """The repositories of ``root`` from its watches, or None: walk it otherwise
        (not ``large``, not a local filesystem, too many directories, or no inotify
        instance or watch left for this user)."""
        watched = self.roots.get(root)
        if watched is not None:
            self.roots.move_to_end(root)
            try:
                return watched.find(root_fd)
            except (_TooMany, OSError):
                self._close(root)
                self._refuse(root_fd)
                return None
        if not large or not self._may_watch(root_fd):
            return None
        while len(self.roots) >= MAX_ROOTS:
            self._close(next(iter(self.roots)))
        allowed = budget() - sum(w.watches for w in self.roots.values())
        try:
            watched = WatchedRoot(root_fd, allowed)
        except (_TooMany, OSError):
            self._refuse(root_fd)
            return None
        self.roots[root] = watched
        return watched.find(root_fd)

    def get(self, root: str) -> WatchedRoot | None:
        return self.roots.get(root)

    def close(self) -> None:
        for root in list(self.roots):
            self._close(root)

    def _close(self, root: str) -> None:
        watched = self.roots.pop(root, None)
        if watched is not None:
            watched.close()

    def _may_watch(self, root_fd: int) -> bool:
        try:
            st = os.fstat(root_fd)
            local = _sys.fs_type(root_fd) in LOCAL
        except OSError:
            return False
        when = self.refused.get((st.st_dev, st.st_ino))
        return local and (when is None or time.monotonic() - when > RETRY_AFTER)

    def _refuse(self, root_fd: int) -> None:
        with contextlib.suppress(OSError):
            st = os.fstat(root_fd)
            self.refused[(st.st_dev, st.st_ino)] = time.monotonic()


def _listed(fd: int) -> tuple[str, tuple[str, ...]]:
    """A directory's kind for git and its subdirectories (every one), sorted."""
    try:
        with os.scandir(fd) as it:
            entries = {e.name: e for e in it}
    except OSError:
        entries = {}
    kind = gitfind.kind_of(entries)
    return kind, tuple(sorted(n for n, e in entries.items() if gitfind.is_dir(e)))


def _single_links_beneath(root_fd: int, rel: str, budget: int) -> int:
    """What is left of ``budget`` (entries looked at) once every file beneath the
    directory ``rel`` was found to have one link; below zero when one has more, or the
    budget ran out. A directory gone is nothing to look at."""
    try:
        stack = [safepath.dir_beneath(root_fd, rel)]
    except OSError:
        return budget
    try:
        while stack:
            fd = stack.pop()
            try:
                with os.scandir(fd) as it:
                    for e in it:
                        budget -= 1
                        if budget < 0:
                            return budget
                        try:
                            if e.is_dir(follow_symlinks=False):
                                stack.append(safepath.dir_beneath(fd, e.name))
                            elif (
                                e.is_file(follow_symlinks=False)
                                and e.stat(follow_symlinks=False).st_nlink > 1
                            ):
                                return -1
                        except OSError:
                            return -1  # changed under us, or unreadable: not known
            except OSError:
                return -1
            finally:
                os.close(fd)
    finally:
        for fd in stack:
            os.close(fd)
    return budget


def _names_a_gitdir(root_fd: int, rel: str) -> bool:
    try:
        fd = safepath.dir_beneath(root_fd, rel) if rel else os.dup(root_fd)
    except OSError:
        return False
    try:
        return gitfind.is_gitfile(fd, ".git")
    finally:
        os.close(fd)


def _ancestors(rel: str) -> list[str]:
    """The proper ancestors of ``rel`` within the root, the root ("") first."""
    if not rel:
        return []
    parts = rel.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts))]


def _depth_first(rel: str) -> tuple[int, str]:
    """Shallower directories first: a parent listed again before what it held."""
    return (rel.count("/") + 1 if rel else 0, rel)


def _within(path: str, top: str) -> bool:
    return top == "" or path == top or path.startswith(top + "/")


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name
