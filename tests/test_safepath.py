"""The host side's access to sandbox-writable directories never follows a planted link."""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest

from warren._core import safepath


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path, int]:
    box = tmp_path / "box"
    box.mkdir()
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    fd = safepath.open_dir(str(box))
    yield box, victim, fd
    os.close(fd)


def test_write_atomic_over_a_planted_symlink_replaces_the_link_not_its_target(tree) -> None:
    box, victim, fd = tree
    (box / "config").symlink_to(victim)
    safepath.write_atomic(fd, "config", b"new\n")
    assert victim.read_text() == "precious\n"
    assert not (box / "config").is_symlink()
    assert (box / "config").read_text() == "new\n"


def test_a_link_in_the_parent_path_is_refused(tree) -> None:
    box, victim, fd = tree
    (box / "sub").symlink_to(victim.parent)
    with pytest.raises(OSError) as e:
        safepath.write_atomic(fd, "sub/victim", b"owned\n")
    assert e.value.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR)
    assert victim.read_text() == "precious\n"


def test_dotdot_cannot_leave_the_directory(tree) -> None:
    _box, _victim, fd = tree
    with pytest.raises(OSError) as e:
        safepath.open_beneath(fd, "../victim", os.O_RDONLY)
    assert e.value.errno == errno.EXDEV


def test_one_entry_is_opened_never_through_a_link(tree) -> None:
    """A name of the directory itself (the walks' fast path, plain openat with
    O_NOFOLLOW) refuses a link to a directory or a file, as the resolve flags do; a
    real subdirectory opens; ``..`` still cannot leave."""
    box, victim, fd = tree
    (box / "real").mkdir()
    (box / "to-dir").symlink_to(victim.parent)
    (box / "to-file").symlink_to(victim)
    child = safepath.dir_beneath(fd, "real")
    assert os.fstat(child).st_ino == (box / "real").stat().st_ino
    os.close(child)
    for name in ("to-dir", "to-file"):
        with pytest.raises(OSError) as e:
            safepath.dir_beneath(fd, name)
        assert e.value.errno in (errno.ELOOP, errno.ENOTDIR), name
        with pytest.raises(OSError) as e:
            safepath.open_beneath(fd, name, os.O_RDONLY)
        assert e.value.errno == errno.ELOOP, name
    with pytest.raises(OSError) as e:
        safepath.dir_beneath(fd, "..")
    assert e.value.errno == errno.EXDEV
    assert victim.read_text() == "precious\n"


def test_write_in_place_refuses_a_planted_link(tree) -> None:
    box, victim, fd = tree
    (box / "config").symlink_to(victim)
    with pytest.raises(OSError):
        safepath.write_in_place(fd, "config", b"owned\n")
    assert victim.read_text() == "precious\n"


def test_write_atomic_keeps_the_old_file_when_writing_fails(tree) -> None:
    box, _victim, fd = tree
    (box / "f").write_bytes(b"old")

    def chunks():
        yield b"partial"
        raise OSError(errno.ENOSPC, "no space")

    with pytest.raises(OSError):
        safepath.write_atomic(fd, "f", chunks())
    assert (box / "f").read_bytes() == b"old"
    assert os.listdir(box) == ["f"]  # no temporary left


def test_write_atomic_keeps_the_mode_and_temp_names_are_unguessable(tree) -> None:
    box, _victim, fd = tree
    (box / "run.sh").write_text("old")
    os.chmod(box / "run.sh", 0o751)
    safepath.write_atomic(fd, "run.sh", b"new")
    assert (box / "run.sh").stat().st_mode & 0o777 == 0o751
    assert safepath.temp_name("config") != safepath.temp_name("config")


def test_remove_tree_removes_links_not_their_targets(tree) -> None:
    box, victim, fd = tree
    (box / "t" / "d").mkdir(parents=True)
    (box / "t" / "d" / "f").write_text("x")
    (box / "t" / "outside").symlink_to(victim.parent)
    (box / "t" / "file-link").symlink_to(victim)
    assert safepath.remove_tree(fd, "t")
    assert not (box / "t").exists()
    assert victim.read_text() == "precious\n"
    assert not safepath.remove_tree(fd, "t")


def test_read_file_refuses_links_and_bounds_size(tree) -> None:
    box, victim, fd = tree
    (box / "l").symlink_to(victim)
    with pytest.raises(OSError):
        safepath.read_file(fd, "l", 100)
    (box / "big").write_bytes(b"x" * 200)
    with pytest.raises(OSError) as e:
        safepath.read_file(fd, "big", 100)
    assert e.value.errno == errno.EFBIG
    assert safepath.read_file(fd, "big", 200) == b"x" * 200


def test_read_file_never_waits_on_a_fifo(tree) -> None:
    """A FIFO where a file was (a sandbox swaps one in between a walk's look and its
    read): refused at once, not waited on (a child reads, so a wait fails the test
    instead of holding it)."""
    box, _victim, fd = tree
    os.mkfifo(box / ".git")
    pid = os.fork()
    if pid == 0:
        try:
            safepath.read_file(fd, ".git", 4096)
            os._exit(1)
        except OSError as e:
            os._exit(0 if e.errno == errno.EINVAL else 2)
        finally:
            os._exit(3)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("the read waited on the FIFO")


def _temp(tree: Path, name: str, age: float) -> Path:
    path = tree / safepath.temp_name(name)
    path.write_bytes(b"half of it")
    then = path.stat().st_mtime - age
    os.utime(path, (then, then))
    return path


def test_a_write_removes_what_a_killed_writer_of_that_name_left(tree) -> None:
    import subprocess
    import sys

    tree, _victim, _fd = tree

    stale = _temp(tree, "f.txt", safepath.STALE_AFTER + 5)
    fresh = _temp(tree, "f.txt", 0)  # maybe a writer between creating and claiming it
    other = _temp(tree, "g.txt", safepath.STALE_AFTER + 5)  # another name's: not looked at
    claimed = _temp(tree, "f.txt", safepath.STALE_AFTER + 5)
    # A live writer (another process) holds its claim while this write runs.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); "
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
            str(claimed),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        fd = safepath.open_dir(str(tree))
        try:
            safepath.write_atomic(fd, "f.txt", b"whole\n")
        finally:
            os.close(fd)
        assert (tree / "f.txt").read_bytes() == b"whole\n"
        assert not stale.exists()
        assert fresh.exists() and other.exists() and claimed.exists()
    finally:
        holder.communicate("")
    # Its writer gone, the claimed one goes with the next write.
    fd = safepath.open_dir(str(tree))
    try:
        safepath.write_atomic(fd, "f.txt", b"again\n")
    finally:
        os.close(fd)
    assert not claimed.exists() and fresh.exists() and other.exists()


def test_the_sweep_never_follows_a_link_named_like_a_temp(tree) -> None:
    box, victim, fd = tree
    then = victim.stat().st_mtime - safepath.STALE_AFTER - 5
    os.utime(victim, (then, then))
    link = box / safepath.temp_name("f.txt")
    link.symlink_to(victim)
    assert safepath.sweep(fd, "f.txt") == 0
    assert link.is_symlink() and victim.read_text() == "precious\n"


def test_stays_beneath_follows_links_only_while_they_stay_inside(tree) -> None:
    box, victim, fd = tree
    (box / "inner").mkdir()
    (box / "in").symlink_to("inner")
    (box / "up").symlink_to("..")
    (box / "abs").symlink_to(victim)
    (box / "loop").symlink_to("loop")
    assert safepath.stays_beneath(fd, "in/not-yet/made.txt")  # missing parts: the rest is checked
    assert safepath.stays_beneath(fd, "inner/../in")
    assert safepath.stays_beneath(fd, "")
    for rel in ("up/victim", "up", "abs", "../victim", "in/../../victim", "loop/x"):
        assert not safepath.stays_beneath(fd, rel), rel
    assert victim.read_text() == "precious\n"
