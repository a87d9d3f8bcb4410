"""The supervisor's sync of a repository after each command: what it reads again.

Judged by what is read and by what a stamp says: a git file changed in a way that keeps
its size and mtime is still seen as changed (its ctime moved), and an unchanged file is
not read again once its last change is old."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.server import gitstore


def test_a_sync_reads_a_git_file_again_only_when_it_may_have_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stamp of a git file carries a digest of its content; after a command the
    supervisor reuses the digest only for a file whose stat is unchanged and whose last
    change was old when the digest was taken. A change that keeps size and mtime
    (rewritten, mtime set back) is still seen: its ctime moved."""
    (tmp_path / "HEAD").write_bytes(b"ref: refs/heads/main\n")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    reads: list[str] = []
    real_read = gitstore.safepath.read_file

    def counting(dirfd: int, name: str, limit: int) -> bytes:
        reads.append(name)
        return real_read(dirfd, name, limit)

    monkeypatch.setattr(gitstore.safepath, "read_file", counting)
    memo = gitstore.Shadow("p", "s", (), fd, fd, fd)
    try:
        first = gitstore._stamp(fd, "HEAD", memo)
        assert gitstore._stamp(fd, "HEAD", memo) == first and len(reads) == 2  # changed just now: read
        monkeypatch.setattr(gitstore, "RACY_NS", 0)  # as if the change were long ago
        assert gitstore._stamp(fd, "HEAD", memo) == first and len(reads) == 2  # reused
        st = os.stat(tmp_path / "HEAD")
        (tmp_path / "HEAD").write_bytes(b"ref: refs/heads/evil\n")  # same size
        os.utime(tmp_path / "HEAD", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back
        changed = gitstore._stamp(fd, "HEAD", memo)
        assert changed[4] != first[4] and changed[5] != first[5] and len(reads) == 3
    finally:
        os.close(fd)


def test_a_worktree_entry_git_removes_inside_is_not_filled_again_midway(tmp_path: Path) -> None:
    """The tree of a worktree the host made gets ``commondir`` when it is first seen (git
    inside needs it), never again: a later round finding it gone is git's ``worktree
    remove`` underway inside, whose rmdir of the entry a new file would fail
    ("Directory not empty", seen under load)."""
    host, tree = tmp_path / "git", tmp_path / "tree"
    entry = host / "worktrees" / "wt"
    entry.mkdir(parents=True)
    (entry / "HEAD").write_bytes(b"ref: refs/heads/task\n")
    (entry / "gitdir").write_bytes(f"{tmp_path}/wt/.git\n".encode())
    (entry / "commondir").write_bytes(b"../..\n")
    tree.mkdir()
    gfd = os.open(host, os.O_RDONLY | os.O_DIRECTORY)
    tfd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    shadow = gitstore.Shadow(str(host), "s", (), gfd, tfd, tfd)
    state: dict[str, object] = {}
    try:
        gitstore._sync_worktrees(shadow, state, None)
        assert (tree / "worktrees" / "wt" / "commondir").read_bytes() == b"../..\n"  # first seen
        (tree / "worktrees" / "wt" / "commondir").unlink()  # git inside, removing the entry
        gitstore._sync_worktrees(shadow, state, None)
        assert not (tree / "worktrees" / "wt" / "commondir").exists()
    finally:
        os.close(gfd)
        os.close(tfd)


@contextlib.contextmanager
def _entry_on_both_sides(host: Path, tree: Path) -> Iterator[gitstore.Shadow]:
    """A linked worktree's entry ``wt`` in the host's git directory ``host`` and in
    warren's tree of it, alike, and the ``Shadow`` that syncs them (its descriptors
    closed after)."""
    for side in (host, tree):
        entry = side / "worktrees" / "wt"
        entry.mkdir(parents=True)
        (entry / "HEAD").write_bytes(b"ref: refs/heads/task\n")
        (entry / "gitdir").write_bytes(f"{host.parent}/wt/.git\n".encode())
        (entry / "commondir").write_bytes(b"../..\n")
    gfd = os.open(host, os.O_RDONLY | os.O_DIRECTORY)
    tfd = os.open(tree, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield gitstore.Shadow(str(host), "s", (), gfd, tfd, tfd)
    finally:
        os.close(gfd)
        os.close(tfd)


def test_a_worktree_entry_removed_inside_during_a_round_is_not_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round lists the tree's entries, then git inside removes one (``worktree prune``)
    before the round reaches it: the round makes nothing there again (it did: an empty
    directory the host then kept, the prune undone), and the next round removes the
    host's entry as inside."""
    host, tree = tmp_path / "git", tmp_path / "tree"
    state: dict[str, object] = {}
    with _entry_on_both_sides(host, tree) as shadow:
        gitstore._sync_worktrees(shadow, state, None)  # both sides known
        listed = gitstore._dir_names

        removed: list[bool] = []

        def stale(fd: int | None) -> set[str]:
            names = listed(fd)
            if not removed and fd is not None and os.path.samestat(os.fstat(fd), os.stat(tree / "worktrees")):
                shutil.rmtree(tree / "worktrees" / "wt")  # git inside, right after the listing
                removed.append(True)
                return names | {"wt"}
            return names

        monkeypatch.setattr(gitstore, "_dir_names", stale)
        gitstore._sync_worktrees(shadow, state, None)
        assert not (tree / "worktrees" / "wt").exists()  # not made again
        monkeypatch.setattr(gitstore, "_dir_names", listed)
        gitstore._sync_worktrees(shadow, state, None)
        assert not (host / "worktrees" / "wt").exists()  # removed on the host, as inside


def test_a_worktree_entry_removed_inside_after_a_round_synced_it_goes_from_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A round syncs an entry both sides hold, then git inside removes it (``worktree
    remove``) before the round ends: the next round removes the host's entry as inside.
    The round took what it knew from a listing made at its end, which no longer held the
    entry, so the next one took the host's for new and made it again inside, empty:
    its ``HEAD`` "may not go" from then on, every round, and the host kept the entry (seen
    under a gate's load)."""
    host, tree = tmp_path / "git", tmp_path / "tree"
    state: dict[str, object] = {}
    with _entry_on_both_sides(host, tree) as shadow:
        gitstore._sync_worktrees(shadow, state, None)  # both sides known
        (tree / "worktrees" / "wt" / "HEAD").write_bytes(b"ref: refs/heads/other\n")  # a change to sync
        synced = gitstore._sync_worktree

        def then_removed(*args: object, **kwargs: object) -> list[str]:
            done = synced(*args, **kwargs)  # type: ignore[arg-type]
            shutil.rmtree(tree / "worktrees" / "wt")  # git inside, right after the round's sync
            return done

        monkeypatch.setattr(gitstore, "_sync_worktree", then_removed)
        gitstore._sync_worktrees(shadow, state, None)
        assert (host / "worktrees" / "wt" / "HEAD").read_bytes() == b"ref: refs/heads/other\n"
        monkeypatch.setattr(gitstore, "_sync_worktree", synced)
        done = gitstore._sync_worktrees(shadow, state, None)
        assert not (tree / "worktrees" / "wt").exists(), done  # not made again inside
        assert not (host / "worktrees" / "wt").exists(), done  # removed on the host, as inside


def test_a_worktree_file_held_back_is_said_once_not_every_round(tmp_path: Path) -> None:
    """A sandbox that removes its worktree's ``HEAD`` (which may not go) and leaves it so:
    the host's is kept, and the supervisor's log says so once, not at every command's
    round; said again once it has been let through and is held back anew."""
    host, tree = tmp_path / "git", tmp_path / "tree"
    state: dict[str, object] = {}
    head = tree / "worktrees" / "wt" / "HEAD"
    with _entry_on_both_sides(host, tree) as shadow:
        assert gitstore._sync_worktrees(shadow, state, None) == []
        head.unlink()
        said = [gitstore._sync_worktrees(shadow, state, None) for _ in range(3)]
        assert [len(s) for s in said] == [1, 0, 0] and "HEAD may not go" in said[0][0], said
        assert (host / "worktrees" / "wt" / "HEAD").read_bytes() == b"ref: refs/heads/task\n"
        head.write_bytes(b"ref: refs/heads/other\n")  # let through
        assert gitstore._sync_worktrees(shadow, state, None) == []
        assert (host / "worktrees" / "wt" / "HEAD").read_bytes() == b"ref: refs/heads/other\n"
        head.unlink()
        assert len(gitstore._sync_worktrees(shadow, state, None)) == 1  # held anew: said again
