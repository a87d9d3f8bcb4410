"""The supervisor copies files out of places a sandbox writes: a repository's
sandbox-side git files (``gitstore.copy_file``, at each sync) and a workspace file
linked from outside (``unshare``, in the hard-link walk). Each looks at the file, then
opens it: a FIFO swapped in between held that open (a thread of the walk, or the
supervisor's loop at a sync) until a writer came, which none does. The opens no longer
wait, and what is not the regular file looked at is not copied. Each case runs the
copy in a child that must end within 10 s (root and uid 1001)."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from warren._core import safepath
from warren.server import gitstore, unshare


def _ends(fn: Callable[[], int]) -> int:
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(fn())
        except BaseException:
            os._exit(99)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the copy waited on the FIFO")


def test_a_git_file_swapped_for_a_fifo_after_the_look_is_not_copied(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    (src / "ORIG_HEAD").write_text("0" * 40 + "\n")
    os.mkfifo(src / "HEAD")
    looked = os.stat(src / "ORIG_HEAD")
    real_stat = os.stat

    def as_before(path: object, *args: object, **kwargs: object) -> os.stat_result:
        # The look saw a regular file; the FIFO came after it.
        return looked if path == "HEAD" else real_stat(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", as_before)
    sfd, dfd = safepath.open_dir(str(src)), safepath.open_dir(str(dst))
    try:
        assert _ends(lambda: gitstore.copy_file(sfd, dfd, "HEAD") or 0) == 0
    finally:
        os.close(sfd)
        os.close(dfd)
    assert not (dst / "HEAD").exists()
    monkeypatch.undo()
    sfd, dfd = safepath.open_dir(str(src)), safepath.open_dir(str(dst))
    try:
        gitstore.copy_file(sfd, dfd, "ORIG_HEAD")
    finally:
        os.close(sfd)
        os.close(dfd)
    assert (dst / "ORIG_HEAD").read_text() == "0" * 40 + "\n", "a regular file is copied as before"


def test_a_linked_file_swapped_for_a_fifo_after_the_scan_is_not_copied(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "data").write_text("x")
    key = (os.stat(ws / "data").st_dev, os.stat(ws / "data").st_ino)
    os.unlink(ws / "data")
    os.mkfifo(ws / "data")
    pfd = safepath.open_dir(str(ws))
    try:
        # -1: not the file scanned (1 once the exit code is an unsigned byte).
        assert _ends(lambda: 1 if unshare._copy(pfd, "data", ".tmp-copy", key) == -1 else 0) == 1
    finally:
        os.close(pfd)
    assert stat.S_ISFIFO(os.lstat(ws / "data").st_mode) and not (ws / ".tmp-copy").exists()
