"""``_core.dirwatch.close``: an inotify instance closed off the caller's thread (its last
close waits for the kernel's grace period), each one closed, in turn."""

from __future__ import annotations

import os
import time
from pathlib import Path

from warren._core import _sys, dirwatch


def _instance(watched: Path) -> int:
    fd = _sys.inotify_init1(os.O_CLOEXEC)
    d = os.open(watched, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _sys.inotify_add_watch(fd, f"/proc/self/fd/{d}", _sys.IN_CREATE)
    finally:
        os.close(d)
    return fd


def _open(fd: int) -> bool:
    try:
        return os.readlink(f"/proc/self/fd/{fd}") == "anon_inode:inotify"
    except OSError:
        return False


def test_instances_given_to_close_are_closed(tmp_path: Path) -> None:
    fds = [_instance(tmp_path) for _ in range(5)]
    assert all(_open(fd) for fd in fds)
    for fd in fds:
        dirwatch.close(fd)
    deadline = time.monotonic() + 10
    while any(_open(fd) for fd in fds) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(_open(fd) for fd in fds)
