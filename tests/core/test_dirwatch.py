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


def _dir(path: Path) -> int:
    path.mkdir()
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def test_changed_tells_each_directory_once_per_change(tmp_path: Path) -> None:
    """``Changed``: of two directories on one instance, only the one written reads as
    changed, once; again after the next change (a write, a rename over, a removal)."""
    a, b = _dir(tmp_path / "a"), _dir(tmp_path / "b")
    watch = dirwatch.Changed()
    try:
        watch.add("a", a)
        watch.add("b", b)
        assert not watch.take("a") and not watch.take("b")
        (tmp_path / "a" / "index").write_text("1")
        assert watch.take("a") and not watch.take("a")
        assert not watch.take("b")
        (tmp_path / "b" / "new").write_text("2")
        os.rename(tmp_path / "b" / "new", tmp_path / "b" / "index")
        assert watch.take("b") and not watch.take("a")
        (tmp_path / "a" / "index").unlink()
        assert watch.take("a")
        watch.remove("a")
        assert "a" not in watch.wds and watch.take("b") is False
    finally:
        os.close(a)
        os.close(b)
        if watch.fd >= 0:
            os.close(watch.fd)


def test_changed_reads_a_directory_it_cannot_watch_as_changed_every_time(tmp_path: Path) -> None:
    """A directory gone (its watch ended) or never watched (no instance or watch left)
    reads as changed at every ``take``: its sync is never skipped."""
    a = _dir(tmp_path / "a")
    watch = dirwatch.Changed()
    try:
        watch.add("a", a)
        assert not watch.take("a")
        os.close(a)
        os.rmdir(tmp_path / "a")
        assert watch.take("a") and watch.take("a")
        assert watch.take("never added") and watch.take("never added")
    finally:
        if watch.fd >= 0:
            os.close(watch.fd)
