"""Trees a sandbox nests as deep as it likes, met by host-side code that walks them.

A loop of ``mkdir d; cd d`` knows no PATH_MAX. Host code that recursed per directory
(removing a sandbox's TMPDIR, an E2B sandbox's home, a failed snapshot; copying a layer
or a home into a snapshot) stopped at Python's recursion limit with a RecursionError:
the TMPDIR stayed in the user's cache for ever (every later supervisor failed again), a
failed snapshot left its partial copy, and the error was no typed one. Now removal
walks any depth with a bounded number of descriptors, and a copy refuses, typed, a tree
deeper than ``safepath.MAX_DEPTH`` and leaves nothing. Judged on the host, as root and
as uid 1001; the controls show each tree is really deeper than the recursion limit and
is seen by the detector where warren leaves it alone.
"""

from __future__ import annotations

import errno
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import PolicySpec, Sandbox
from warren._core import safepath
from warren.errors import SetupError
from warren.images.ref import ImageRef
from warren.server import snapshots

DEEP = 1500  # past Python's recursion limit (1000), where the recursive walkers failed
DEEP_INSIDE = 1100  # the same, made by a sandbox on a disk (slower than the tmpfs of the others)


def _nest(where: Path, depth: int) -> None:
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)


def _depth(where: Path) -> int:
    """How many ``d`` directories nest in ``where``: walked by descriptor, never by a
    path (which passes PATH_MAX) or a recursion."""
    fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY)
    n = 0
    try:
        while True:
            try:
                sub = os.open("d", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return n
            os.close(fd)
            fd, n = sub, n + 1
    finally:
        os.close(fd)


@pytest.fixture
def outside_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A base beside which the sandbox's TMPDIR is a host directory (a workspace under
    /tmp keeps it in the sandbox's private /tmp)."""
    base = Path("/var/tmp") / f"warren-deep-{os.getpid()}"
    (base / "ws").mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(base / "cache"))
    yield base
    top = os.open(base.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        safepath.remove_tree(top, base.name)
    finally:
        os.close(top)


def test_a_tree_deeper_than_the_recursion_limit_left_in_tmpdir_is_removed_at_the_end(
    outside_tmp: Path,
) -> None:
    script = (
        "import os\n"
        "print(os.environ['TMPDIR'])\n"
        "os.chdir(os.environ['TMPDIR'])\n"
        f"for _ in range({DEEP_INSIDE}):\n"
        "    os.mkdir('d'); os.chdir('d')\n"
    )
    sb = Sandbox.create(PolicySpec(workspace=str(outside_tmp / "ws")))
    try:
        r = sb.exec(["python3", "-c", script])
        assert r.exit_code == 0, r.stderr.decode()
        tmpdir = Path(r.stdout.decode().strip())
        # The control: the tree is on the host, deeper than a recursion could walk.
        assert tmpdir.is_relative_to(outside_tmp / "cache"), tmpdir  # a host directory, not /tmp
        assert _depth(tmpdir) == DEEP_INSIDE > sys.getrecursionlimit()
    finally:
        sb.remove()
    assert not tmpdir.exists(), "the sandbox's TMPDIR is left on the host"


@pytest.fixture
def shm() -> Iterator[Path]:
    """A directory on a tmpfs: thousands of nested directories cost milliseconds there,
    seconds on a loaded ext4."""
    base = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="warren-deep-"))
    yield base
    top = os.open(base.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        safepath.remove_tree(top, base.name)
    finally:
        os.close(top)


def test_safepath_removes_and_refuses_to_copy_a_tree_of_any_depth(shm: Path) -> None:
    tmp_path = shm
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    _nest(src, DEEP)
    s, d = os.open(src, os.O_RDONLY | os.O_DIRECTORY), os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    before = len(os.listdir("/proc/self/fd"))
    try:
        with pytest.raises(OSError) as deep:
            safepath.copy_tree(s, d, 1 << 30)
        assert deep.value.errno == errno.ELOOP and str(safepath.MAX_DEPTH) in str(deep.value)
    finally:
        os.close(s)
        os.close(d)
    assert len(os.listdir("/proc/self/fd")) == before - 2  # no descriptor kept
    top = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert _depth(src) == DEEP  # the control: the tree is there, as deep as made
        os.chmod(src / "d", 0o500)  # a directory whose entries its mode protects
        assert safepath.remove_tree(top, "dst") and safepath.remove_tree(top, "src")
    finally:
        os.close(top)
    assert sorted(os.listdir(tmp_path)) == []


def test_safepath_copies_a_tree_within_the_depth_bound_as_it_is(shm: Path) -> None:
    """The fidelity beside it: a tree as deep as the bound is copied whole, its sparse
    file without holes filled."""
    src, dst = shm / "src", shm / "dst"
    src.mkdir()
    dst.mkdir()
    _nest(src, safepath.MAX_DEPTH)
    with open(src / "sparse", "wb") as f:
        f.truncate(1 << 30)
        f.write(b"head")
    s, d = os.open(src, os.O_RDONLY | os.O_DIRECTORY), os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
    try:
        # a block or so of data, and a block per name (the directories and the file)
        assert safepath.copy_tree(s, d, 2 << 20) <= (64 << 10) + (safepath.MAX_DEPTH + 1) * safepath.NAME_COST
    finally:
        os.close(s)
        os.close(d)
    assert _depth(dst) == safepath.MAX_DEPTH
    st = (dst / "sparse").stat()
    assert st.st_size == 1 << 30 and st.st_blocks * 512 <= 64 << 10, (st.st_size, st.st_blocks)
    assert (src / "sparse").stat().st_size > 2 << 20  # the control: its length is past the copy's limit


def test_a_copy_counts_its_names_so_a_tree_of_empty_files_is_not_free(shm: Path) -> None:
    """A home of many empty files costs the disk its names (inodes, directory blocks):
    the copy charges a block per name against its limit and stops, leaving its partial
    tree to the caller's removal; the control, the same tree under a limit that holds
    its names, is copied whole."""
    src = shm / "src"
    src.mkdir()
    for i in range(2000):
        (src / f"f{i}").touch()
    for limit, whole in ((1000 * safepath.NAME_COST, False), (2001 * safepath.NAME_COST, True)):
        dst = shm / f"dst{limit}"
        dst.mkdir()
        s, d = os.open(src, os.O_RDONLY | os.O_DIRECTORY), os.open(dst, os.O_RDONLY | os.O_DIRECTORY)
        try:
            if whole:
                assert safepath.copy_tree(s, d, limit) == 2000 * safepath.NAME_COST
                assert len(os.listdir(dst)) == 2000
            else:
                with pytest.raises(OSError) as over:
                    safepath.copy_tree(s, d, limit)
                assert over.value.errno == errno.EFBIG and len(os.listdir(dst)) <= 1000
        finally:
            os.close(s)
            os.close(d)


def test_a_snapshot_of_a_layer_too_deep_is_refused_typed_and_leaves_nothing(shm: Path) -> None:
    tmp_path = shm
    root = tmp_path / "state"
    root.mkdir()
    layer = tmp_path / "layer"
    (layer / "root").mkdir(parents=True)
    _nest(layer / "root", DEEP)
    image = ImageRef(name="/img", id="sha256:x", layers=())
    fd = os.open(layer, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(SetupError) as refused:
            snapshots.take(str(root), "dev", fd, image, None)
        assert refused.value.errno == errno.ELOOP and "deeper than" in refused.value.message
        assert str(safepath.MAX_DEPTH) in refused.value.hint
        assert os.listdir(root / snapshots.DIR) == []
        # The control and the fidelity: the same layer with its tree within the bound is
        # saved whole.
        top = os.open(layer / "root", os.O_RDONLY | os.O_DIRECTORY)
        try:
            safepath.remove_tree(top, "d")
        finally:
            os.close(top)
        _nest(layer / "root", safepath.MAX_DEPTH - 1)
        snap = snapshots.take(str(root), "dev", fd, image, None)
    finally:
        os.close(fd)
    assert _depth(Path(snapshots.layer_path(str(root), snap.id)) / "root") == safepath.MAX_DEPTH - 1
