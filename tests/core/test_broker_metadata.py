"""The broker's metadata concern (``_core.broker.metadata`` with ``places``) in this
process, with a stand-in call whose memory is a table of strings: chmod and the like
act inside the writable roots and on the private tmpfs, are refused elsewhere, follow
a link to what it names and judge that, and never touch a denied file's stand-in.
Judged from the host: the mode on disk."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from warren._core.broker import metadata
from warren._core.broker.call import AT_FDCWD
from warren._core.broker.places import Places


class FakeCall:
    """A call of this process: its paths are absolute, its fds this process's."""

    def __init__(self, *args: int, strings: dict[int, bytes]) -> None:
        self.args = args
        self.pid = os.getpid()
        self.strings = strings

    def string(self, address: int, limit: int = 4096) -> bytes | None:
        return self.strings.get(address)

    def resolve(self, dirfd_arg: int, path: bytes) -> bytes:
        assert path.startswith(b"/") and dirfd_arg == AT_FDCWD
        return path

    def their_fd(self, fd_arg: int) -> int:
        return os.dup(fd_arg)


def _chmod(places: Places, path: Path, mode: int) -> int | None:
    call = FakeCall(1, mode, strings={1: os.fsencode(path)})
    return metadata.HANDLERS["chmod"](places, call)  # type: ignore[arg-type]


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o7777


def test_chmod_acts_inside_a_writable_root_and_is_refused_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    inside_file, outside_file = root / "f", outside / "f"
    for f in (inside_file, outside_file):
        f.write_text("x")
        f.chmod(0o644)
    places = Places([str(root)], set(), set())
    assert _chmod(places, inside_file, 0o600) == 0
    assert _chmod(places, outside_file, 0o777) == -errno.EPERM
    assert _mode(inside_file) == 0o600 and _mode(outside_file) == 0o644


def test_a_link_inside_a_root_does_not_carry_chmod_to_what_it_names_outside(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "f").write_text("x")
    (outside / "f").chmod(0o644)
    (root / "link").symlink_to(outside / "f")
    places = Places([str(root)], set(), set())
    assert _chmod(places, root / "link", 0o777) == -errno.EPERM
    assert _mode(outside / "f") == 0o644


def test_a_denied_files_stand_in_is_sealed_even_inside_a_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    stand_in = root / "denied"
    stand_in.write_bytes(b"")
    stand_in.chmod(0)
    st = stand_in.stat()
    places = Places([str(root)], set(), {(st.st_dev, st.st_ino)})
    assert _chmod(places, stand_in, 0o666) == -errno.EPERM
    assert _mode(stand_in) == 0


def test_anything_on_the_private_tmpfs_may_change_wherever_it_is(tmp_path: Path) -> None:
    """The sandbox's own /tmp is told by its device: no root needs to name it."""
    f = tmp_path / "f"
    f.write_text("x")
    f.chmod(0o644)
    places = Places([], {f.stat().st_dev}, set())
    assert _chmod(places, f, 0o600) == 0
    assert _mode(f) == 0o600


def test_old_time_calls_are_not_implemented_so_libc_uses_utimensat() -> None:
    assert metadata.HANDLERS["utimes"](Places([], set(), set()), FakeCall(strings={})) == -errno.ENOSYS  # type: ignore[arg-type]


def test_an_unreadable_path_argument_is_efault_and_changes_nothing(tmp_path: Path) -> None:
    places = Places([str(tmp_path)], set(), set())
    assert metadata.HANDLERS["chmod"](places, FakeCall(99, 0o777, strings={})) == -errno.EFAULT  # type: ignore[arg-type]
