"""Whether a directory's entries changed since last asked, without looking at them: an
inotify instance on the directory, reached by a descriptor (no path looked up again).

The supervisor keeps one per repository's sandbox-side git directory (its *tree*, whose
top level holds everything its sync carries to the host: ``server.gitstore``). It
drains the instance right before each sync; an exec's helper only polls it when the
command has ended: nothing queued means the command changed nothing the sync would
carry, so the client hears the exit without waiting for the sync (which still runs).
A change made through another name of a file (a hard link elsewhere) raises no event
here: it reaches the host with the next sync, at most half a second later.

The other way, one instance watches every such repository's git directory on the host
(``Changed``): a command starts after a sync when the host's changed since the last.
"""

from __future__ import annotations

import contextlib
import errno
import os
import queue
import select
import struct
import threading
from collections.abc import Iterator

from . import _sys

CHANGES = (
    _sys.IN_MODIFY
    | _sys.IN_ATTRIB
    | _sys.IN_CLOSE_WRITE
    | _sys.IN_MOVED_FROM
    | _sys.IN_MOVED_TO
    | _sys.IN_CREATE
    | _sys.IN_DELETE
    | _sys.IN_DELETE_SELF
    | _sys.IN_MOVE_SELF
    | _sys.IN_ONLYDIR
)


def watch(directory: int) -> int | None:
    """An instance watching the directory ``directory`` (a descriptor), or None where
    none can be had (the user's inotify instances used up): then every exec waits."""
    try:
        fd = _sys.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        _sys.inotify_add_watch(fd, f"/proc/self/fd/{directory}", CHANGES)
    except OSError:
        os.close(fd)
        return None
    return fd


def also(fd: int, directory: int) -> None:
    """Watch the directory ``directory`` (a descriptor) too on the instance ``fd``; one
    watched already keeps its watch. Best effort: a directory that cannot be watched
    only makes the sync that carries its changes come with the next round."""
    with contextlib.suppress(OSError):
        _sys.inotify_add_watch(fd, f"/proc/self/fd/{directory}", CHANGES)


# An entry that is a new inode at its name: made, linked or renamed there; or the
# directory itself gone from its name (its watch ends with IN_IGNORED).
ENTRIES = _sys.IN_CREATE | _sys.IN_MOVED_TO | _sys.IN_DELETE_SELF | _sys.IN_MOVE_SELF | _sys.IN_ONLYDIR
_EVENT = struct.Struct("=iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)


class EntryWatches:
    """One inotify instance watching directories, by path, for new entries (``ENTRIES``),
    shared by everyone who asks about them: the supervisor keeps one for all its sandboxes
    (an instance is a per-user resource: 128 by default). Each directory is opened without
    following a final link; one gone is watched again under its name when it comes back
    (``rewatch``).

    A path asked for that is not there (yet) is waited for by a watch on its nearest
    directory that is (``_AWAIT``: a name made or moved in there, a mode changed), and
    looked up again only when that watch saw something. The supervisor asks before every
    request it hands a sandbox, and a policy's denied paths name a dozen directories most
    machines lack (``~/.gradle``, ``/etc/pki``): looking each up every time was a dozen
    failed opens on every exec's path. A path with no directory above it that can be
    watched is looked up at each ``read``."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.paths: dict[int, str] = {}  # watch descriptor -> path
        self.wds: dict[str, int] = {}  # ... and back
        self.missing: set[str] = set()  # asked for, not there (yet)
        self.awaited: dict[str, int] = {}  # a missing path -> the watch on its nearest directory
        self.unawaited: set[str] = set()  # missing, with no such watch: looked up at each read

    def _watch(self, path: str, mask: int) -> int | None:
        """A watch on the directory ``path`` (its final link not followed); None where
        it is not there (or not a directory, or not readable); ``_Exhausted`` where this
        user has no inotify instance or watch left."""
        if self.fd is None:
            try:
                self.fd = _sys.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            except OSError as e:
                raise _Exhausted from e
        try:
            dir_fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            # Added to what the inode's watch has (one watch per inode and instance): a
            # directory watched for itself and for a path beneath it keeps both masks.
            return _sys.inotify_add_watch(self.fd, f"/proc/self/fd/{dir_fd}", mask | _sys.IN_MASK_ADD)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise _Exhausted from e
            return None
        finally:
            os.close(dir_fd)

    def add(self, path: str) -> bool:
        """Watch ``path`` (a directory). False where it cannot be: not there, not a
        directory (then it is ``missing`` and looked up again once its nearest directory
        changes), or this user has no instance or watch left (not ``missing``: the
        caller falls back to comparing the directory's times)."""
        if path in self.wds:
            return True
        try:
            wd = self._watch(path, ENTRIES)
        except _Exhausted:
            return False
        if wd is None:
            if path not in self.missing:
                self.missing.add(path)
                self._await(path)
            return False
        self._stop_awaiting(path)
        self.wds[path] = wd
        self.paths.setdefault(wd, path)  # the same directory under two names: one wd
        return True

    def _await(self, path: str) -> None:
        below, above = path, os.path.dirname(path)
        while above != below:
            try:
                wd = self._watch(above, _AWAIT)
            except _Exhausted:
                break
            if wd is not None:
                self.awaited[path] = wd
                return
            below, above = above, os.path.dirname(above)
        self.unawaited.add(path)

    def _stop_awaiting(self, path: str) -> None:
        self.missing.discard(path)
        self.unawaited.discard(path)
        wd = self.awaited.pop(path, None)
        if wd is not None:
            self._release(wd)

    def _release(self, wd: int) -> None:
        """Remove the watch ``wd`` unless a path is watched or awaited there."""
        if wd in self.paths or wd in self.awaited.values() or self.fd is None:
            return
        with contextlib.suppress(OSError):
            _sys.inotify_rm_watch(self.fd, wd)

    def remove(self, path: str) -> None:
        self._stop_awaiting(path)
        wd = self.wds.pop(path, None)
        if wd is None or path != self.paths.get(wd):
            return
        others = [p for p, w in self.wds.items() if w == wd]
        if others:
            self.paths[wd] = others[0]
            return
        del self.paths[wd]
        self._release(wd)

    def read(self) -> tuple[set[str], bool]:
        """The watched paths that got a new entry (or went) since the last read, and
        whether the queue overflowed (then any may have). Paths whose directory went are
        watched again under their name where one is there now; a missing path is looked
        up again when the watch on its nearest directory saw something."""
        changed: set[str] = set()
        overflow = False
        gone: list[str] = []
        stirred: set[int] = set()
        if self.fd is None:
            return changed, overflow
        while True:
            try:
                data = os.read(self.fd, 65536)
            except (BlockingIOError, OSError):
                break
            if not data:
                break
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                at += _EVENT.size + length
                if mask & _sys.IN_Q_OVERFLOW:
                    overflow = True
                    continue
                stirred.add(wd)
                if not mask & _NEW:
                    continue  # a mode changed beneath it: news only for a path awaited there
                names = [p for p, w in self.wds.items() if w == wd]
                changed.update(names)
                if mask & _sys.IN_IGNORED:
                    gone.extend(names)
        for path in gone:
            wd = self.wds.pop(path, None)
            if wd is not None:
                self.paths.pop(wd, None)
            self.add(path)
        again = [p for p, wd in self.awaited.items() if overflow or wd in stirred]
        for path in [*again, *self.unawaited]:
            old = self.awaited.pop(path, None)
            self.unawaited.discard(path)
            self.missing.discard(path)
            if self.add(path):
                changed.add(path)  # there now: its entries were never listed
            if old is not None:
                self._release(old)
        return changed, overflow


class _Exhausted(Exception):
    """No inotify instance or watch left for this user."""


# What a missing path's nearest directory is watched for: a name made or moved in (a
# directory on the way, or the path itself), a mode changed (one not readable before),
# the directory itself gone (then one further up is watched).
_AWAIT = ENTRIES | _sys.IN_ATTRIB
# A watched directory's change: a new entry, or the directory gone.
_NEW = _sys.IN_CREATE | _sys.IN_MOVED_TO | _sys.IN_DELETE_SELF | _sys.IN_MOVE_SELF | _sys.IN_IGNORED


def events(fd: int) -> Iterator[tuple[int, int, str]]:
    """The events queued on the instance ``fd`` (read without waiting): each one's watch
    descriptor, mask and name (empty for an event of the watched directory itself)."""
    if fd < 0:
        return
    while True:
        try:
            data = os.read(fd, 65536)
        except (BlockingIOError, OSError):
            return
        if not data:
            return
        at = 0
        while at + _EVENT.size <= len(data):
            wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
            at += _EVENT.size
            name = data[at : at + length].split(b"\0", 1)[0]
            at += length
            yield wd, mask, os.fsdecode(name)


_closing: queue.SimpleQueue[int] | None = None


def close(fd: int) -> None:
    """Close an instance off the caller's thread: the last close of one that watched
    something waits for the kernel's grace period (2-20 ms here), which must not hold
    the supervisor's loop (a run's answer waited for it at every sandbox's end in a
    repository). One thread closes them all, in turn."""
    global _closing
    if _closing is None:
        _closing = queue.SimpleQueue()
        threading.Thread(target=_closer, args=(_closing,), name="warren-inotify-close", daemon=True).start()
    _closing.put(fd)


def _closer(fds: queue.SimpleQueue[int]) -> None:
    while True:
        fd = fds.get()
        with contextlib.suppress(OSError):
            os.close(fd)


class Changed:
    """One inotify instance on many directories' entries (``CHANGES``), each under a
    key: whether a key's directory changed since it was last asked (``take``), for one
    read when none did. A key that cannot be watched (no instance or watch left for the
    user, its directory gone) reads as changed every time."""

    def __init__(self) -> None:
        self.fd = -1
        self.keys: dict[int, str] = {}  # watch descriptor -> key
        self.wds: dict[str, int] = {}
        self.pending: set[str] = set()

    def add(self, key: str, directory: int) -> None:
        """Watch ``directory`` (a descriptor) under ``key``."""
        self.remove(key)
        with contextlib.suppress(OSError):
            if self.fd < 0:
                self.fd = _sys.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
            wd = _sys.inotify_add_watch(self.fd, f"/proc/self/fd/{directory}", CHANGES)
            self.keys[wd], self.wds[key] = key, wd

    def remove(self, key: str) -> None:
        self.pending.discard(key)
        wd = self.wds.pop(key, None)
        if wd is not None:
            self.keys.pop(wd, None)
            with contextlib.suppress(OSError):
                _sys.inotify_rm_watch(self.fd, wd)

    def take(self, key: str) -> bool:
        """Whether ``key``'s directory changed since the last ``take`` of it."""
        for wd, mask, _name in events(self.fd):
            if mask & _sys.IN_Q_OVERFLOW:
                self.pending.update(self.wds)
            got = self.keys.get(wd)
            if got is not None:
                self.pending.add(got)
                if mask & _sys.IN_IGNORED:  # the directory is gone: changed from now on
                    del self.keys[wd], self.wds[got]
        if key not in self.wds:
            return True
        if key in self.pending:
            self.pending.discard(key)
            return True
        return False


def changed(watches: list[int]) -> bool:
    """Something is queued on one of ``watches`` (nothing is read: the supervisor's)."""
    poller = select.poll()
    for fd in watches:
        poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, OSError):
        while os.read(fd, 65536):
            pass
