"""The native walk of a workspace (``native/walk.c`` through ``_core.treewalk``) gives
the answers of the Python walks it replaces (``server.links``, ``server.gitfind``) on
the same trees, hostile ones included: links (to directories, loops, named like what
git looks for), a directory swapped for a link while walked, 0-mode directories (only
root reads them), names with newlines and invalid UTF-8, trees deeper than any path
can name. And when it is missing or fails, the Python walk answers instead."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren._core import safepath, treewalk
from warren.server import gitfind, links


@pytest.fixture(autouse=True, params=[1, 3], ids=["one-thread", "threads"])
def native(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test with the single walk and with three threads handing each other
    directories (whatever this machine's CPUs)."""
    assert treewalk.program() is not None, "warren-walk is not installed (run scripts/setup)"
    monkeypatch.setattr(treewalk, "THREADS", request.param)


def _linked_python(root: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int, str, str]]:
    with monkeypatch.context() as mp:
        mp.setenv("WARREN_NATIVE_WALK", "0")
        found: list[tuple[int, int, int, str, str]] = []
        links._walk(str(root), found, treewalk.Walks())
    return sorted(found)


def _linked_native(root: Path) -> list[tuple[int, int, int, str, str]]:
    fd = safepath.open_dir(str(root))
    try:
        tree = treewalk.walk(fd, links=True, git=False)
    finally:
        os.close(fd)
    assert tree is not None
    found: list[tuple[int, int, int, str, str]] = []
    for dev, ino, nlink, rel in tree.linked:
        directory, _, name = rel.rpartition("/")
        found.append((dev, ino, nlink, f"{root}/{directory}" if directory else str(root), name))
    return sorted(found)


def _git_both(root: Path) -> tuple[gitfind.Found, gitfind.Found]:
    fd = safepath.open_dir(str(root))
    try:
        tree = treewalk.walk(fd, links=False, git=True)
        assert tree is not None
        return gitfind.find(fd), gitfind.find(fd, tree=tree)
    finally:
        os.close(fd)


def _same(root: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], gitfind.Found]:
    """Both walks of ``root`` in both implementations agree; what they found."""
    python, native = _linked_python(root, monkeypatch), _linked_native(root)
    assert native == python
    git_py, git_native = _git_both(root)
    assert git_native == git_py  # the same findings, in the same order
    return [f"{d}/{n}" for _dev, _ino, _nl, d, n in python], git_py


def _hostile(ws: Path, outside: Path) -> None:
    (outside / ".git").mkdir(parents=True)
    (outside / "secret").write_text("s")
    os.link(outside / "secret", outside / "secret2")  # multiply linked, but not ours
    (ws / "a" / "b").mkdir(parents=True)
    (ws / "a" / "f").write_text("x")
    os.link(ws / "a" / "f", ws / "a" / "b" / "g")
    os.link(outside / "secret", ws / "linked")  # a workspace file linked from outside
    os.symlink(outside, ws / "to-outside")  # never followed
    os.symlink(".", ws / "loop")
    os.symlink("../a", ws / "a" / "b" / "up")
    os.symlink(outside / ".git", ws / "a" / ".git")  # a .git that is a link: nothing
    odd = ["new\nline", "bad\udcff", "tab\tand space", "-dash", ".hidden"]
    for name in odd:
        d = ws / name
        d.mkdir()
        (d / "f").write_text("y")
        os.link(d / "f", d / "g")
        (d / ".git").mkdir()
    # bare shapes: HEAD of any type, objects and refs directories (links are not)
    (ws / "bare" / "objects").mkdir(parents=True)
    (ws / "bare" / "refs").mkdir()
    (ws / "bare" / "HEAD").write_text("ref: refs/heads/main\n")
    (ws / "bare" / "inner" / ".git").mkdir(parents=True)  # not walked for git: in a bare one
    (ws / "notbare" / "objects").mkdir(parents=True)
    os.symlink("objects", ws / "notbare" / "refs")
    (ws / "notbare" / "HEAD").write_text("x")
    # .git files: gitdir, an empty marker (uv's), too large, a fifo
    for name, content in (("gf", "gitdir: ../x\n"), ("marker", ""), ("large", "gitdir: " + "x" * 5000)):
        (ws / name).mkdir()
        (ws / name / ".git").write_text(content)
    (ws / "fifo").mkdir()
    os.mkfifo(ws / "fifo" / ".git")
    # submodules of a .git directory
    (ws / "sub" / ".git" / "modules" / "m" / "objects").mkdir(parents=True)
    (ws / "sub" / ".git" / "modules" / "m" / "HEAD").write_text("x")
    (ws / "sub" / ".git" / "modules" / "a" / "b" / "objects").mkdir(parents=True)
    (ws / "sub" / ".git" / "modules" / "a" / "b" / "HEAD").write_text("x")


def test_both_walks_agree_on_a_hostile_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    _hostile(ws, outside)
    names, git = _same(ws, monkeypatch)
    # control: the trees hold what the detectors look for, and only through real names
    assert f"{ws}/linked" in names and f"{ws}/a/f" in names and f"{ws}/new\nline/g" in names
    assert f"{ws}/bad\udcff/f" in names
    assert not any("secret2" in n or "to-outside" in n or "/loop/" in n for n in names)
    assert git.gitdirs == [
        "-dash/.git",
        ".hidden/.git",
        "bad\udcff/.git",
        "bare",
        "new\nline/.git",
        "sub/.git",
        "sub/.git/modules/a/b",
        "sub/.git/modules/m",
        "tab\tand space/.git",
    ]
    assert git.gitfiles == ["gf/.git"]


def test_a_0_mode_directory_is_walked_as_the_caller_can(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = tmp_path / "ws"
    (ws / "closed" / "in").mkdir(parents=True)
    (ws / "closed" / "f").write_text("x")
    os.link(ws / "closed" / "f", ws / "g")
    (ws / "closed" / "in" / ".git").mkdir()
    os.chmod(ws / "closed", 0)
    try:
        names, git = _same(ws, monkeypatch)
    finally:
        os.chmod(ws / "closed", 0o755)
    if os.getuid() == 0:  # root reads it anyway (CAP_DAC_OVERRIDE)
        assert f"{ws}/closed/f" in names and git.gitdirs == ["closed/in/.git"]
    else:
        assert names == [f"{ws}/g"] and git.gitdirs == []


def test_a_tree_deeper_than_a_path_can_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """300 levels of 30-character names (9,000 bytes: more than PATH_MAX) with a linked
    file at the bottom; repositories at depth 64 (found) and 65 (past the git walk's
    limit, as before)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    name = "d" * 30
    try:
        for depth in range(1, 301):
            os.mkdir(name, dir_fd=fd)
            nfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nfd
            if depth in (64, 65):
                os.mkdir(".git", dir_fd=fd)
        f = os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.close(f)
        os.link("f", "g", src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
    names, git = _same(ws, monkeypatch)
    assert len(names) == 2 and names[0].count("/") == str(ws).count("/") + 301
    assert git.gitdirs == ["/".join([name] * 64) + "/.git"]


def test_a_directory_swapped_for_a_link_while_walked_is_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread swaps a workspace directory with a link to an outside one (a repository
    holding a file linked from elsewhere) as fast as it can while both walks run: no
    walk ever reports what is only reachable through the link."""
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    (outside / ".git").mkdir(parents=True)
    (outside / "x").write_text("x")
    os.link(outside / "x", tmp_path / "x2")
    (ws / "d" / "sub").mkdir(parents=True)
    os.symlink(outside, ws / "swap")
    stop = threading.Event()

    def swapper() -> None:
        fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            while not stop.is_set():
                os.rename("d", "t", src_dir_fd=fd, dst_dir_fd=fd)
                os.rename("swap", "d", src_dir_fd=fd, dst_dir_fd=fd)
                os.rename("d", "swap", src_dir_fd=fd, dst_dir_fd=fd)
                os.rename("t", "d", src_dir_fd=fd, dst_dir_fd=fd)
        finally:
            os.close(fd)

    t = threading.Thread(target=swapper)
    t.start()
    try:
        for _ in range(100):
            linked = _linked_native(ws) + _linked_python(ws, monkeypatch)
            assert linked == [], linked
            python, native = _git_both(ws)
            assert python.gitdirs == native.gitdirs == []
    finally:
        stop.set()
        t.join()
    # control: the same walks of the link's target see what the link leads to
    assert [n for *_, n in _linked_native(outside)] == ["x"]
    assert _git_both(outside)[1].gitdirs == [".git"]


def test_one_pass_serves_both_walks_of_a_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch's ``Walks`` walks a root both need once; the git walk gets that tree only
    for the same directory (another one at that path is walked again)."""
    ws = tmp_path / "ws"
    (ws / ".git").mkdir(parents=True)
    (ws / "f").write_text("x")
    os.link(ws / "f", ws / "g")
    calls: list[tuple[bool, bool]] = []
    real = treewalk.walk

    def counting(
        fd: int, *, links: bool, git: bool, stop: treewalk.Stop | None = None
    ) -> treewalk.Tree | None:
        calls.append((links, git))
        return real(fd, links=links, git=git, stop=stop)

    monkeypatch.setattr(treewalk, "walk", counting)
    walks = treewalk.Walks({str(ws)}, small=0)
    found: list[tuple[int, int, int, str, str]] = []
    links._walk(str(ws), found, walks)
    fd = safepath.open_dir(str(ws))
    try:
        tree = walks.tree(str(ws), fd, links=False, git=True)
    finally:
        os.close(fd)
    assert calls == [(True, True)] and tree is not None and tree.git == [("", "dotgit")]
    assert len(found) == 2
    # control: a different directory now at that path is walked afresh
    links._walk(str(ws), found, walks)
    os.rename(ws, tmp_path / "old")
    (ws / "other").mkdir(parents=True)
    fd = safepath.open_dir(str(ws))
    try:
        tree = walks.tree(str(ws), fd, links=False, git=True)
    finally:
        os.close(fd)
    assert tree is not None and tree.git == [] and calls[-1] == (True, True) and len(calls) == 3


@pytest.fixture
def failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A walk program that dies after half its output."""
    exe = tmp_path / "bin" / "walk"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nprintf 'G\\002'\nexit 0\n")
    exe.chmod(0o755)
    monkeypatch.setattr(treewalk, "_program", str(exe))
    yield


def test_a_failed_native_walk_is_walked_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: None
) -> None:
    monkeypatch.setenv("WARREN_NATIVE_WALK", "1")  # not passed over as a small tree
    ws = tmp_path / "ws"
    (ws / "r" / ".git").mkdir(parents=True)
    (ws / "f").write_text("x")
    os.link(ws / "f", tmp_path / "outside")
    fd = safepath.open_dir(str(ws))
    try:
        assert treewalk.walk(fd, links=True, git=True) is None  # truncated: refused whole
    finally:
        os.close(fd)
    found = links.LinkScanner().scan([str(ws)])
    assert [o.path for o in found] == [f"{ws}/f"]
    fd = safepath.open_dir(str(ws))
    try:
        tree = treewalk.Walks().tree(str(ws), fd, links=False, git=True)
        assert gitfind.find(fd, tree=tree).gitdirs == ["r/.git"]
    finally:
        os.close(fd)


def test_parse_refuses_what_a_finished_walk_does_not_write() -> None:
    ok = b"G\x02\x01\x00\x00\x00aE"
    assert treewalk.parse(ok) == treewalk.Tree(git=[("a", "dotgit")])
    for bad in (b"", ok[:-1], ok + b"E", b"G\x09\x00\x00\x00\x00E", b"L\x00E", b"XE"):
        assert treewalk.parse(bad) is None, bad


def test_a_walk_s_cpu_counts_as_the_supervisor_s(tmp_path: Path) -> None:
    """Booting ahead is refused to requests whose planning took too much of the
    supervisor's CPU (``ahead.SLOW``): the walk's process counts as its own."""
    ws = tmp_path / "ws"
    for d in range(40):
        (ws / str(d)).mkdir(parents=True)
        for f in range(50):
            (ws / str(d) / str(f)).write_text("x")
    before = treewalk._spent
    fd = safepath.open_dir(str(ws))
    try:
        assert treewalk.walk(fd, links=True, git=True) is not None
    finally:
        os.close(fd)
    assert treewalk._spent > before
    assert treewalk.cpu() - time.process_time() == pytest.approx(treewalk._spent, abs=0.01)


def _native_walks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The native walks made from now on, each noted by its ``links`` argument."""
    calls: list[bool] = []
    real = treewalk.walk

    def recording(
        fd: int, *, links: bool, git: bool, stop: treewalk.Stop | None = None
    ) -> treewalk.Tree | None:
        calls.append(links)
        return real(fd, links=links, git=git, stop=stop)

    monkeypatch.setattr(treewalk, "walk", recording)
    return calls


def test_a_small_tree_is_walked_in_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Starting the program costs about what Python takes for a thousand entries: a
    launch walks natively only a tree with more (counted without following a link)."""
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    for n in range(3):
        (ws / "a" / str(n)).write_text("x")
    os.symlink(tmp_path, ws / "up")  # a link to a larger tree: not counted through
    calls = _native_walks(monkeypatch)
    fd = safepath.open_dir(str(ws))
    try:
        assert treewalk.Walks(small=5).tree(str(ws), fd, links=True, git=False) is None
        assert calls == []
        assert os.listdir(fd) == os.listdir(ws)  # the count left the descriptor where it was
        (ws / "a" / "3").write_text("x")
        (ws / "a" / "4").write_text("x")  # 7 entries now
        assert treewalk.Walks(small=5).tree(str(ws), fd, links=True, git=False) is not None
        assert calls == [True]
        monkeypatch.setenv("WARREN_NATIVE_WALK", "1")  # every tree, as the tests ask
        assert treewalk.Walks().tree(str(ws), fd, links=True, git=False) is not None
        assert calls == [True, True]
    finally:
        os.close(fd)


def _workers_nice(pid: int) -> dict[int, int]:
    """The niceness of each thread of ``pid`` but its first (which runs the loader at its
    parent's niceness before the program's ``main``)."""
    seen: dict[int, int] = {}
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            if int(task) == pid:
                continue
            try:
                with open(f"/proc/{pid}/task/{task}/stat") as f:
                    seen[int(task)] = int(f.read().rsplit(")", 1)[1].split()[16])  # field 19: nice
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
    return seen


def test_a_background_walk_runs_its_workers_at_the_background_niceness(tmp_path: Path) -> None:
    """A walk beside a sandbox's first commands (one that may be given up: ``Stop``)
    yields the CPU to them: each of its threads at ``BACKGROUND_NICE``, whoever asks for
    it. The niceness was set from outside once the program had started, by which time it
    had often made a worker at 0 already (one walk in two, with three threads): only the
    supervisor's link-walk thread, niced itself, had its walks at 10 (inherited)."""
    if treewalk.THREADS == 1:
        pytest.skip("a walk with workers: the [threads] run of this test")
    for d in range(100):
        (tmp_path / f"d{d}").mkdir()
        for f in range(100):
            (tmp_path / f"d{d}" / f"f{f}").touch()
    expected = max(treewalk.BACKGROUND_NICE, os.getpriority(os.PRIO_PROCESS, 0))
    seen: dict[int, int] = {}
    for _ in range(10):
        stop, done = treewalk.Stop(), threading.Event()

        def sample(stop: treewalk.Stop = stop, done: threading.Event = done) -> None:
            while not done.is_set():
                proc = stop._proc
                if proc is not None:
                    seen.update(_workers_nice(proc.pid))
                time.sleep(0.0002)

        sampler = threading.Thread(target=sample)
        sampler.start()
        fd = safepath.open_dir(str(tmp_path))
        try:
            assert treewalk.walk(fd, links=True, git=True, stop=stop) is not None
        finally:
            done.set()
            sampler.join()
            os.close(fd)
    assert seen, "no worker of a walk was seen (the premise: each walk takes milliseconds)"
    assert set(seen.values()) == {expected}, sorted(seen.values())


def test_a_tree_that_may_be_small_is_listed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hard-link scan of a root (``links._walk``) walks it in Python first and
    counts as it goes: a small tree (a denied directory, most workspaces) is listed
    once, not counted first and then walked; past the size it gives up, with no
    descriptor left open, and the native walk answers the same. A root the repository
    walk shares, and every tree under ``WARREN_NATIVE_WALK=1``, go as before."""
    ws = tmp_path / "ws"
    (ws / "a").mkdir(parents=True)
    (ws / "a" / "f").write_text("x")
    os.link(ws / "a" / "f", tmp_path / "outside")  # a name outside: the scan notes it
    (ws / "g").write_text("y")  # 3 entries
    counted: list[int] = []
    real_count = treewalk._at_most

    def counting(root_fd: int, limit: int) -> bool:
        counted.append(limit)
        return real_count(root_fd, limit)

    monkeypatch.setattr(treewalk, "_at_most", counting)
    walked = _native_walks(monkeypatch)
    expected = _linked_python(ws, monkeypatch)
    counted.clear()
    assert [name for *_rest, name in expected] == ["f"]

    def scan(walks: treewalk.Walks) -> list[tuple[int, int, int, str, str]]:
        found: list[tuple[int, int, int, str, str]] = []
        links._walk(str(ws), found, walks)
        return sorted(found)

    assert scan(treewalk.Walks(small=5)) == expected
    assert (counted, walked) == ([], [])  # listed once, in Python
    for n in range(4):
        (ws / "a" / str(n)).write_text("x")  # 7 entries: past the size
    before = len(os.listdir("/proc/self/fd"))
    assert scan(treewalk.Walks(small=5)) == expected
    assert (counted, walked) == ([], [True])  # given up, then natively, not counted again
    assert len(os.listdir("/proc/self/fd")) == before
    assert scan(treewalk.Walks({str(ws)}, small=5)) == expected  # shared: counted, as before
    assert counted == [5]
    monkeypatch.setenv("WARREN_NATIVE_WALK", "1")
    counted.clear()
    assert scan(treewalk.Walks()) == expected
    assert walked[-1] is True and counted == [0]
