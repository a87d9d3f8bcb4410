"""A large root's directories, each watched (``server.repowatch``): its repositories are
answered from what changed, never stale. A repository missed is one whose ``.git`` a
sandbox may write without warren's tree over it, so every answer here is compared with
a fresh walk of the same tree (``gitfind.find`` without memory), after each kind of
change a host or a sandbox can make, and the cases where the watches cannot be
believed (a mount, a lost queue, a tree past the budget) are shown to walk again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren._core import safepath
from warren.server import gitfind, gitkeeper, repowatch

# The supervisor's own bookkeeping of a tree it watches, on the host: the same for any
# caller (the sandboxes that rely on it run in both halves: test_linkwalk_optimistic,
# test_git_protection's watched workspaces); the mode-000 case needs uid 1001 anyway.
pytestmark = pytest.mark.caller_independent(half="user")


def _tree(root: Path, dirs: int = 40) -> None:
    for i in range(dirs):
        (root / "node_modules" / f"p{i}" / "lib").mkdir(parents=True)
        (root / "node_modules" / f"p{i}" / "lib" / "i.js").write_text("1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "init", "-q", str(root / "node_modules" / "p3")], check=True)


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[tuple[Path, int, repowatch.WatchedRoot]]:
    root = tmp_path / "ws"
    root.mkdir()
    _tree(root)
    fd = safepath.open_dir(str(root))
    w = repowatch.WatchedRoot(fd, repowatch.budget())
    try:
        yield root, fd, w
    finally:
        w.close()
        os.close(fd)


def _same(fd: int, w: repowatch.WatchedRoot) -> gitfind.Found:
    """The watched answer, which must be the fresh walk's."""
    got = w.find(fd)
    fresh = gitfind.find(fd)
    assert (got.gitdirs, got.gitfiles) == (fresh.gitdirs, fresh.gitfiles)
    return got


def test_each_change_to_the_tree_is_answered_as_a_fresh_walk_answers_it(
    watched: tuple[Path, int, repowatch.WatchedRoot], tmp_path: Path
) -> None:
    root, fd, w = watched
    assert _same(fd, w).gitdirs == [".git", "node_modules/p3/.git"]
    nm = root / "node_modules"
    outside = tmp_path / "outside"
    subprocess.run(["git", "init", "-q", str(outside / "repo")], check=True)
    steps = [
        ("a .git made in a leaf", lambda: (nm / "p7" / "lib" / ".git").mkdir()),
        ("a .git removed", lambda: shutil.rmtree(nm / "p7" / "lib" / ".git")),
        (
            "a new directory holding a repository",
            lambda: subprocess.run(["git", "init", "-q", str(nm / "new" / "deep" / "r")], check=True),
        ),
        ("a directory with a repository renamed", lambda: (nm / "p3").rename(nm / "p3-moved")),
        ("a repository moved in from outside", lambda: (outside / "repo").rename(nm / "p9" / "in")),
        ("a repository moved out", lambda: (nm / "p9" / "in").rename(outside / "repo")),
        (
            "a .git file naming a git directory",
            lambda: (nm / "p11" / ".git").write_text("gitdir: ../p3-moved/.git\n"),
        ),
        ("its content no longer naming one", lambda: (nm / "p11" / ".git").write_text("\n")),
        ("uv's empty marker", lambda: (nm / "p12" / ".git").write_text("")),
        (
            "a bare repository made",
            lambda: subprocess.run(["git", "init", "-q", "--bare", str(nm / "p13" / "b.git")], check=True),
        ),
        (
            "a directory swapped for a link to a repository",
            lambda: (shutil.rmtree(nm / "p14"), (nm / "p14").symlink_to(nm / "p3-moved")),
        ),
        ("a tree removed whole", lambda: shutil.rmtree(nm / "p3-moved")),
        (
            "a submodule's git directory in .git/modules",
            lambda: subprocess.run(
                ["git", "init", "-q", "--bare", str(root / ".git" / "modules" / "sub")], check=True
            ),
        ),
    ]
    for what, change in steps:
        change()
        _same(fd, w)
        assert w.walks == 1, f"walked again after: {what}"


def test_a_directory_that_cannot_be_opened_is_walked_once_it_can(
    watched: tuple[Path, int, repowatch.WatchedRoot],
) -> None:
    """A directory made unreadable (mode 000) is listed, not opened, so not watched: it
    is tried again at every answer, and what was made in it meanwhile is found."""
    root, fd, w = watched
    if os.geteuid() == 0:
        pytest.skip("root opens a directory of mode 000 (CI runs this as uid 1001)")
    locked = root / "node_modules" / "locked"
    locked.mkdir(mode=0)
    try:
        _same(fd, w)
        assert "node_modules/locked" in w.unopened
    finally:
        locked.chmod(0o755)
    (locked / ".git").mkdir()  # no watch there to tell of it
    assert "node_modules/locked/.git" in _same(fd, w).gitdirs
    assert "node_modules/locked" not in w.unopened


def test_a_lost_queue_walks_everything_again_and_expects_nothing_of_the_next_walk(
    watched: tuple[Path, int, repowatch.WatchedRoot],
) -> None:
    """More events than the kernel queues for an instance (``max_queued_events``): the
    overflow is seen, the tree walked again with watches afresh, and no hard-link walk
    is expected clean across it (anything may have come meanwhile)."""
    root, fd, w = watched
    clean, _ = w.begin()
    _same(fd, w)
    assert w.predict(fd, clean)
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        queued = int(f.read())
    many = root / "node_modules" / "many"
    many.mkdir()
    _same(fd, w)
    for i in range(queued + 10):
        (many / f"d{i}").mkdir()
    (many / "d5" / ".git").mkdir()  # past the overflow: only a walk again sees it
    assert not w.predict(fd, clean)
    assert "node_modules/many/d5/.git" in _same(fd, w).gitdirs
    assert w.walks == 2
    assert not w.predict(fd, clean)  # a new epoch: the old verdict is void
    assert w.predict(fd, w.begin()[0])


_MOUNTED = r"""
import json, os, subprocess, sys
from warren._core import safepath
from warren.server import repowatch
root = sys.argv[1]
parent = os.path.dirname(root)
fd = safepath.open_dir(root)
w = repowatch.WatchedRoot(fd, repowatch.budget())
got = {"before": w.find(fd).gitdirs}
clean = w.begin()[0]
def mount(*args):
    subprocess.run(["mount", *args], check=True)
os.mkdir(os.path.join(parent, "elsewhere"))
mount("-t", "tmpfs", "tmpfs", os.path.join(parent, "elsewhere"))
got["elsewhere"] = (w.find(fd).gitdirs, w.walks, w.predict(fd, clean))
mount("-t", "tmpfs", "tmpfs", os.path.join(root, "node_modules", "p5"))
os.mkdir(os.path.join(root, "node_modules", "p5", ".git"))  # in the new mount: no event here
got["beneath"] = (w.find(fd).gitdirs, w.walks, w.predict(fd, clean))
mount("--bind", parent, parent)  # above: what the root's name leads to may differ now
got["above"] = (w.find(fd).gitdirs, w.walks)
print(json.dumps(got))
"""


def test_a_mount_at_the_tree_walks_everything_again_and_one_elsewhere_does_not(tmp_path: Path) -> None:
    """A mount shows a tree and raises no event on the directory it covers: the mount
    table's change beneath the root (or above it) is seen, and the tree walked again; a
    mount anywhere else (a container started, another test's tmpfs) leaves the watches
    and the last walk's verdict as they were. In a mount namespace of the test's own,
    which any user may make."""
    root = tmp_path / "ws"
    root.mkdir()
    _tree(root)
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", sys.executable, "-c", _MOUNTED, str(root)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert "node_modules/p5/.git" not in got["before"]
    assert got["elsewhere"] == [got["before"], 1, True]
    gitdirs, walks, expected = got["beneath"]
    assert "node_modules/p5/.git" in gitdirs and walks == 2 and not expected
    assert got["above"][1] == 3 and "node_modules/p5/.git" in got["above"][0]


def test_the_mounts_near_a_root_are_those_at_it_above_it_and_beneath_it() -> None:
    table = (
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw\n"
        "2 1 0:5 / /home rw - ext4 /dev/sdb1 rw\n"
        "3 2 0:6 / /home/u/my\\040ws/m rw - tmpfs tmpfs rw\n"
        "4 2 0:7 / /home/u/my\\040wsx rw - tmpfs tmpfs rw\n"
        "5 1 0:8 / /var/lib/containers/x rw - overlay overlay rw\n"
        "6 2 0:9 / /home/u/my\\040ws rw - tmpfs tmpfs rw\n"
    )
    near = repowatch.mounts_near("/home/u/my ws", table)
    assert sorted(e.mount_id for e in near) == [1, 2, 3, 6]
    assert sorted(e.mount_id for e in repowatch.mounts_near("/", table)) == [1, 2, 3, 4, 5, 6]


def test_a_tree_past_the_budget_is_not_watched(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    root.mkdir()
    _tree(root, dirs=10)
    fd = safepath.open_dir(str(root))
    try:
        with pytest.raises(repowatch._TooMany):
            repowatch.WatchedRoot(fd, allowed=5)
        roots = repowatch.WatchedRoots()
        assert roots.find(str(root), fd, large=True) is not None
        assert roots.get(str(root)) is not None
        (root / "node_modules" / "more").mkdir()
        roots.roots[str(root)].allowed = roots.roots[str(root)].watches  # full now
        assert roots.find(str(root), fd, large=True) is None  # grew past it: not watched
        assert roots.get(str(root)) is None
        assert roots.find(str(root), fd, large=True) is None  # nor tried again soon
    finally:
        os.close(fd)


def test_only_a_local_filesystem_is_watched(tmp_path: Path) -> None:
    fd = safepath.open_dir("/proc/sys")  # procfs: no event tells of its changes
    try:
        assert repowatch.WatchedRoots().find("/proc/sys", fd, large=True) is None
    finally:
        os.close(fd)


def test_a_walk_is_expected_clean_only_while_every_name_made_since_has_one_link(
    watched: tuple[Path, int, repowatch.WatchedRoot], tmp_path: Path
) -> None:
    """``predict``: after a walk that found the root clean (its token), names made since
    are looked at. A file linked in from outside, or a directory moved in holding one,
    ends the prediction until a walk begins and finds the root clean again."""
    root, fd, w = watched
    outside = tmp_path / "outside.txt"
    outside.write_text("the host's\n")
    assert not w.predict(fd, None)  # no walk has found it clean yet
    clean, mark = w.begin()
    w.verified(mark)  # as a walk that found it clean does
    assert w.predict(fd, clean)
    (root / "node_modules" / "p1" / "new.js").write_text("made\n")
    (root / "node_modules" / "made" / "deeper").mkdir(parents=True)
    (root / "node_modules" / "made" / "deeper" / "x.js").write_text("made\n")
    assert w.predict(fd, clean), "new files of one link each"
    os.link(outside, root / "node_modules" / "p2" / "linked.js")
    assert not w.predict(fd, clean)
    (root / "node_modules" / "p2" / "linked.js").unlink()
    assert not w.predict(fd, clean), "ended until a walk finds the root clean again"
    clean, mark = w.begin()
    w.verified(mark)
    assert w.predict(fd, clean)
    moved = tmp_path / "moved" / "sub"
    moved.mkdir(parents=True)
    os.link(outside, moved / "linked.js")
    (tmp_path / "moved").rename(root / "node_modules" / "moved")  # no event for what it holds
    assert not w.predict(fd, clean)


def test_a_link_made_elsewhere_to_a_file_of_the_root_raises_no_event(
    watched: tuple[Path, int, repowatch.WatchedRoot], tmp_path: Path
) -> None:
    """What the prediction cannot see, and why the walk still runs beside the command:
    a name made outside for a file already in the root changes its link count, and no
    directory of the root."""
    root, fd, w = watched
    clean, _ = w.begin()
    os.link(root / "node_modules" / "p1" / "lib" / "i.js", tmp_path / "elsewhere.js")
    assert w.predict(fd, clean)
    assert (root / "node_modules" / "p1" / "lib" / "i.js").stat().st_nlink == 2


def test_a_walks_verdict_holds_only_for_walks_sharing_the_same_roots(tmp_path: Path) -> None:
    """A workspace file linked into a tool cache is nothing to a walk that shares the
    cache (a preset's), and a file linked from outside to one that does not: the next
    walk is expected clean only with the shared roots of the walk that found it so. A
    walk that fails (a file to mask) expects nothing of the next, whatever began before."""
    root = tmp_path / "ws"
    root.mkdir()
    _tree(root)
    keeper = gitkeeper.GitKeeper()
    fd = safepath.open_dir(str(root))
    try:
        assert keeper.watched.find(str(root), fd, large=True) is not None
        cache = ("/home/u/.cache/uv",)
        expected, begun = keeper.link_walk_begins(str(root), fd, cache)
        assert not expected  # nothing known yet
        keeper.link_walk_ends(str(root), begun, cache, ok=True)
        assert keeper.link_walk_begins(str(root), fd, cache)[0]
        assert not keeper.link_walk_begins(str(root), fd, ())[0], "another walk: the cache not shared"
        _, first = keeper.link_walk_begins(str(root), fd, cache)
        _, second = keeper.link_walk_begins(str(root), fd, cache)
        keeper.link_walk_ends(str(root), second, cache, ok=False)
        keeper.link_walk_ends(str(root), first, cache, ok=True)  # began before the failure
        assert not keeper.link_walk_begins(str(root), fd, cache)[0]
    finally:
        keeper.watched.close()
        os.close(fd)
