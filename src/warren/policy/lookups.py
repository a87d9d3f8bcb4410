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
from collections.abc import Iterator
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
    if text.startswith("/"):
        record.paths.add(text)
    else:
        record.loose = True


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


def read_file(path: Path) -> bytes | None:
    """The whole of the file at ``path``, or None where there is none; any other
    failure raises (``OSError``). Recorded with what was read."""
    looked_up(path)
    try:
        with open(path, "rb") as f:
            data: bytes | None = f.read()
    except OSError as e:
        if e.errno not in _ABSENT:
            raise
        data = None
    record = _RECORD.get()
    if record is not None:
        record.read[os.fspath(path)] = data
    return data
