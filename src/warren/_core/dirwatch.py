"""Whether a directory's entries changed since last asked, without looking at them: an
inotify instance on the directory, reached by a descriptor (no path looked up again).

The supervisor keeps one per repository's sandbox-side git directory (its *tree*, whose
top level holds everything its sync carries to the host: ``server.gitstore``). It
drains the instance right before each sync; an exec's helper only polls it when the
command has ended: nothing queued means the command changed nothing the sync would
carry, so the client hears the exit without waiting for the sync (which still runs).
A change made through another name of a file (a hard link elsewhere) raises no event
here: it reaches the host with the next sync, at most half a second later.
"""

from __future__ import annotations

import contextlib
import os
import select

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
