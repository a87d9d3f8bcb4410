"""The repository walk's per-directory memory (``server.gitfind``): what it may skip and
what it must still see. A repository missed at launch is one whose ``.git`` a sandbox
may write without warren's tree over it, so each skip is checked against the change
that would make it stale."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from warren._core import safepath, treewalk
from warren.server import gitfind


def _tree(root: Path) -> None:
    for d in ("a/b/c", "a/d", "x"):
        (root / d).mkdir(parents=True)
    time.sleep(gitfind.RACY_NS / 1e9 + 0.02)  # older than the racy window: remembered


def _find(root: Path, memory: gitfind.Memory | None = None) -> list[str]:
    """What the walk with this memory finds; the native walk (no memory: it reads every
    directory) must find the same."""
    fd = safepath.open_dir(str(root))
    try:
        found = sorted(gitfind.find(fd, memory).gitdirs)
        tree = treewalk.walk(fd, links=False, git=True)
        assert tree is not None, "warren-walk is not installed (run scripts/setup)"
        assert sorted(gitfind.find(fd, tree=tree).gitdirs) == found
        return found
    finally:
        os.close(fd)


def test_a_git_directory_made_where_the_memory_said_nothing_is_found_with_the_mtime_set_back(
    tmp_path: Path,
) -> None:
    """In a remembered leaf (``a/b/c``) and a remembered directory with subdirectories
    (``a``): a ``.git`` made, then each directory's mtime set back to what it was, as
    a sandbox can (utimensat). The change time moved, and the walk reads it."""
    _tree(tmp_path)
    memory: gitfind.Memory = {}
    assert _find(tmp_path, memory) == []
    # The memory holds an answer that would be stale: nothing for git there.
    assert memory["a/b/c"][2] == "" and memory["a"][2] == ""
    for d in ("a/b/c", "a"):
        st = (tmp_path / d).stat()
        (tmp_path / d / ".git").mkdir()
        os.utime(tmp_path / d, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert (tmp_path / d).stat().st_mtime_ns == st.st_mtime_ns  # set back
    assert _find(tmp_path, memory) == ["a/.git", "a/b/c/.git"]
    assert _find(tmp_path) == ["a/.git", "a/b/c/.git"]  # and without memory, the same


def test_an_unchanged_leaf_is_stat_ed_not_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path)
    memory: gitfind.Memory = {}
    opened: list[str] = []
    real = safepath.dir_beneath

    def counting(fd: int, rel: str) -> int:
        opened.append(rel)
        return real(fd, rel)

    monkeypatch.setattr(safepath, "dir_beneath", counting)
    _find(tmp_path, memory)
    assert sorted(opened) == ["a", "b", "c", "d", "x"]  # control: the first walk opens all
    opened.clear()
    _find(tmp_path, memory)
    assert sorted(opened) == ["a", "b"]  # the leaves c, d and x: one stat each
    (tmp_path / "x" / "new").mkdir()  # a leaf no more
    opened.clear()
    _find(tmp_path, memory)
    assert sorted(opened) == ["a", "b", "new", "x"]


def test_a_remembered_leaf_replaced_by_a_link_to_a_repository_is_not_followed(tmp_path: Path) -> None:
    ws, elsewhere = tmp_path / "ws", tmp_path / "elsewhere"
    ws.mkdir()
    (elsewhere / ".git").mkdir(parents=True)
    _tree(ws)
    memory: gitfind.Memory = {}
    assert _find(ws, memory) == []
    os.rmdir(ws / "x")
    os.symlink(elsewhere, ws / "x")
    assert _find(ws, memory) == []
    assert _find(elsewhere) == [".git"]  # control: what the link names is a repository
