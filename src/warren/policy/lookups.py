"""What resolving a policy looked at on the host, when asked to record it.

Resolving a spec (``resolve.build``, the config files of ``config``) reads the host in
only a few ways: a path looked up (resolved, tested for existence or kind), a directory
listed (a deny glob), a file read whole (a config file). Each goes through here, so
that a caller can record them (``recording``) and know what a resolved policy rests on:
the supervisor watches those paths for a sandbox booted ahead and reuses the policy
while nothing of them changed (``server.policymemo``). Outside ``recording`` these
calls record nothing and cost a context-variable read.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Record:
    """``paths``: looked up, each name on the way (links followed); ``listed``:
    directories whose entries were listed; ``read``: files read whole, as read (None:
    absent). ``loose``: something looked up that cannot be watched (a relative path)."""

    paths: set[str] = field(default_factory=set)
    listed: set[str] = field(default_factory=set)
    read: dict[str, bytes | None] = field(default_factory=dict)
    loose: bool = False


_RECORD: ContextVar[Record | None] = ContextVar("warren_policy_lookups", default=None)


@contextmanager
def recording() -> Iterator[Record]:
    """Record what the code run inside looks at (``Record``)."""
    record = Record()
    token = _RECORD.set(record)
    try:
        yield record
    finally:
        _RECORD.reset(token)


def looked_up(path: str | Path) -> None:
    """``path`` is about to be resolved, or its existence or kind asked."""
    record = _RECORD.get()
    if record is None:
        return
    text = os.fspath(path)
    if not text.startswith("/"):
        record.loose = True
        return
    record.paths.add(text)
    if "/.." in text:
        # ``os.path.realpath`` goes on lexically past a name that is missing ("a/none/..
        # /b" looks up "b" in "a"), where the kernel would stop: its way is watched too.
        record.paths.add(os.path.normpath(text))


def realpath(path: str | Path) -> str:
    """``os.path.realpath``, recorded."""
    looked_up(path)
    return os.path.realpath(path)


# What one name (a path with no link before its last name) is: "missing" (or not
# searchable as a directory), "error" (cannot be looked at), "dir", "file", or a link's
# target (None where it cannot be read).
Kind = str | tuple[str | None]
MAX_LINKS = 40  # as the kernel's own limit on links followed in one lookup


def kind_of(full: str) -> Kind:
    """What the name ``full`` is (``Kind``), its last link not followed."""
    try:
        st = os.lstat(full)
    except (FileNotFoundError, NotADirectoryError):
        return "missing"
    except OSError:
        return "error"
    if stat.S_ISLNK(st.st_mode):
        try:
            return (os.readlink(full),)
        except OSError:
            return (None,)
    return "dir" if stat.S_ISDIR(st.st_mode) else "file"


class Steps:
    """Each name the resolution of the absolute ``path`` looks up, in order, as
    (its directory, with no link in it; the name; what it is, by ``look``; whether it is
    the last name). A link is followed where it stands (at most ``MAX_LINKS``, else
    ELOOP; one whose target cannot be read, an ``OSError``), ``..`` taken lexically, and
    a name that is no link taken as a directory whatever it is: the caller stops where
    that is not what it wants (at a missing name ``os.path.realpath`` goes on
    lexically). ``end``: where the resolution stands, the resolved path once all is
    taken."""

    def __init__(self, path: str, look: Callable[[str], Kind] = kind_of) -> None:
        self.path, self.look, self.end = path, look, "/"

    def __iter__(self) -> Iterator[tuple[str, str, Kind, bool]]:
        todo = [part for part in reversed(self.path.split("/")) if part]
        links = 0
        while todo:
            name = todo.pop()
            if name == ".":
                continue
            if name == "..":
                self.end = os.path.dirname(self.end)  # no link in it: its parent is lexical
                continue
            full = os.path.join(self.end, name)
            found = self.look(full)
            yield self.end, name, found, not todo
            if isinstance(found, tuple):
                links += 1
                target = found[0]
                if target is None:
                    raise OSError(errno.EIO, "a symbolic link that cannot be read", full)
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", self.path)
                if target.startswith("/"):
                    self.end = "/"
                todo.extend(part for part in reversed(target.split("/")) if part)
                continue
            self.end = full


def links_on_the_way(path: str | Path) -> list[tuple[str, str]]:
    """Each symbolic link the resolution of the absolute ``path`` goes through, in
    order: (the link's own path, its directory resolved; what it says), as
    ``os.path.realpath`` resolves it (``Steps``); recorded."""
    looked_up(path)
    found: list[tuple[str, str]] = []
    for directory, name, kind, _last in Steps(os.fspath(path)):
        here = os.path.join(directory, name)
        looked_up(here)
        if isinstance(kind, tuple) and kind[0] is not None:
            found.append((here, kind[0]))
    return found


def lexists(path: str | Path) -> bool:
    """``os.path.lexists``, recorded."""
    looked_up(path)
    return os.path.lexists(path)


def listed(directory: str, matched: list[str]) -> None:
    """``directory``'s entries were listed and ``matched`` taken of them."""
    record = _RECORD.get()
    if record is None:
        return
    looked_up(directory)
    record.listed.add(directory)
    for path in matched:
        looked_up(path)


# A path that names no file: read as absent (``Path.exists`` says False for these).
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


class NotRegular(OSError):
    """The path names something other than a regular file (a FIFO, a device, a
    directory): a config file in a workspace is the sandbox's to make, and a FIFO
    there would hold whoever opened it, a device would never end."""


class TooLarge(OSError):
    """The file is larger than the reader takes."""


class IsLink(OSError):
    """The path is a symbolic link, and the reader follows none (``read_file``'s
    ``follow``): a workspace's config file is the sandbox's to make, and a link made
    there would have the supervisor read a host file the sandbox names."""


def read_file(path: Path, limit: int, follow: bool = True) -> bytes | None:
    """The whole of the regular file at ``path`` (at most ``limit`` bytes), or None
    where there is none; ``NotRegular``, ``TooLarge``, ``IsLink`` (not ``follow``: the
    last name of ``path`` is a link) or another ``OSError`` else. Its open never waits
    (``O_NONBLOCK``: a FIFO). Recorded with what was read."""
    looked_up(path)
    try:
        fd = os.open(
            path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        )
    except OSError as e:
        if e.errno not in _ABSENT:
            raise
        if not follow and e.errno == errno.ELOOP and os.path.islink(path):
            raise IsLink(errno.ELOOP, "a symbolic link", os.fspath(path)) from None
        data: bytes | None = None
    else:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise NotRegular(errno.EINVAL, "not a regular file", os.fspath(path))
            chunks: list[bytes] = []
            size = 0
            while chunk := os.read(fd, min(1 << 16, limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    raise TooLarge(errno.EFBIG, f"larger than {limit} bytes", os.fspath(path))
            data = b"".join(chunks)
        finally:
            os.close(fd)
    record = _RECORD.get()
    if record is not None:
        record.read[os.fspath(path)] = data
    return data
