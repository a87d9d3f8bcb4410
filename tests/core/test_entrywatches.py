"""``_core.dirwatch.EntryWatches``: directories watched by path for new entries, and a
path not there yet waited for by a watch on its nearest directory, not looked up again
on every read (the supervisor reads before every request it hands a sandbox)."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren._core import _sys, dirwatch
from warren.server import hostwatch


@pytest.fixture
def watches() -> Iterator[dirwatch.EntryWatches]:
    w = dirwatch.EntryWatches()
    yield w
    if w.fd is not None:
        os.close(w.fd)


def _watch_count(w: dirwatch.EntryWatches) -> int:
    assert w.fd is not None
    with open(f"/proc/self/fdinfo/{w.fd}") as f:
        return sum(1 for line in f if line.startswith("inotify wd:"))


def _opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the module opens from now on."""
    seen: list[str] = []
    real = os.open

    def counting(path: str, *args: int, **kwargs: int) -> int:
        seen.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(dirwatch.os, "open", counting)
    return seen


def test_a_missing_directory_is_looked_up_again_only_when_a_directory_above_it_changes(
    watches: dirwatch.EntryWatches, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / "a" / "b" / "c"
    assert not watches.add(str(deep))
    assert str(deep) in watches.missing
    opened = _opens(monkeypatch)
    for _ in range(20):  # nothing happened: nothing looked up
        assert watches.read() == (set(), False)
    assert opened == []
    (tmp_path / "unrelated").mkdir()  # a change where it waits: looked up once
    assert watches.read() == (set(), False)
    assert opened.count(str(deep)) == 1
    (tmp_path / "a").mkdir()
    assert watches.read() == (set(), False)
    (tmp_path / "a" / "b").mkdir()
    assert watches.read() == (set(), False)
    deep.write_text("a file, not a directory")
    assert watches.read() == (set(), False)
    deep.unlink()
    deep.mkdir()
    assert watches.read() == ({str(deep)}, False)  # there now: its entries were never listed
    assert str(deep) not in watches.missing and not watches.awaited
    (deep / "entry").write_text("x")
    assert watches.read() == ({str(deep)}, False)
    assert watches.read() == (set(), False)


def test_a_directory_moved_in_where_one_was_awaited_is_watched(
    watches: dirwatch.EntryWatches, tmp_path: Path
) -> None:
    target = tmp_path / "cache" / "tool"
    assert not watches.add(str(target))
    made = tmp_path / "elsewhere"
    (made / "tool").mkdir(parents=True)
    made.rename(tmp_path / "cache")
    assert watches.read() == ({str(target)}, False)


def test_a_directory_awaited_at_is_replaced_and_one_further_up_is_watched(
    watches: dirwatch.EntryWatches, tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    path = tmp_path / "a" / "b"
    assert not watches.add(str(path))
    shutil.rmtree(tmp_path / "a")
    assert watches.read() == (set(), False)
    (tmp_path / "a").mkdir()
    assert watches.read() == (set(), False)
    path.mkdir()
    assert watches.read() == ({str(path)}, False)


def test_watches_made_for_awaiting_go_with_the_paths(watches: dirwatch.EntryWatches, tmp_path: Path) -> None:
    (tmp_path / "here").mkdir()
    assert watches.add(str(tmp_path / "here"))
    assert not watches.add(str(tmp_path / "here" / "missing-1"))  # awaited at a watched directory
    assert not watches.add(str(tmp_path / "gone" / "missing-2"))  # awaited at tmp_path
    assert _watch_count(watches) == 2
    watches.remove(str(tmp_path / "here"))
    assert _watch_count(watches) == 2  # still awaited there
    watches.remove(str(tmp_path / "here" / "missing-1"))
    watches.remove(str(tmp_path / "gone" / "missing-2"))
    assert _watch_count(watches) == 0
    assert not watches.missing and not watches.awaited


def test_a_directory_watched_and_awaited_at_still_reports_only_new_entries(
    watches: dirwatch.EntryWatches, tmp_path: Path
) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "file").write_text("x")
    assert watches.add(str(home))
    assert not watches.add(str(home / ".gradle"))
    os.chmod(home / "file", 0o600)  # a mode changed: not a new entry of the home
    assert watches.read() == (set(), False)
    (home / "new").write_text("x")
    assert watches.read() == ({str(home)}, False)


def test_no_watch_left_is_told_apart_from_a_missing_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watches used up: the caller compares the directories' times instead (a missing
    directory is not that: it is awaited)."""

    def exhausted(_fd: int, path: str, _mask: int) -> int:
        raise OSError(errno.ENOSPC, "no watch left", path)

    monkeypatch.setattr(_sys, "inotify_add_watch", exhausted)
    w = dirwatch.EntryWatches()
    try:
        assert not w.add(str(tmp_path))
        assert str(tmp_path) not in w.missing
    finally:
        if w.fd is not None:
            os.close(w.fd)
    watch = hostwatch.HostWatch((str(tmp_path),))
    try:
        assert not watch.watched
        assert not watch.changed()
        (tmp_path / "new").mkdir()
        assert watch.changed()  # from the directory's times
    finally:
        watch.close()
