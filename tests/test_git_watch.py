"""An exec in a sandbox with repositories answers without waiting for their sync when
the command changed nothing that sync carries to the host: the supervisor keeps an
inotify watch on each repository's tree (``_core.dirwatch``), drained before each sync,
and the exec's helper only asks whether anything is queued. What must hold:

- the watch says "changed" for every kind of change at the tree's top level (a write,
  a new file, a rename over, a removal, a mode change) and "unchanged" once drained;
- the helper waits for the sync exactly when something is queued (unit, on socket
  pairs: the supervisor's end never answers in the first case);
- a sync while an exec of the sandbox runs (the round twice a second, the end of the
  exec before, read as the next one is handed, another sandbox's on the same
  repository) leaves the repository's watch as it is
  (it still syncs): a queue drained while that command ran read, once it ended, as
  "nothing changed" while that sync had not yet written the host's index (the one way
  found for a gate's failure of the live test below, as root);
- fidelity, live and judged from the host, as root and uid 1001: after each exec that
  stages, commits or moves HEAD, host git sees it the moment the exec returns, round
  after round, with execs that change nothing between them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import GIT_ENV, Layout, host_git
from warren import PolicySpec, Sandbox
from warren._core import dirwatch
from warren._core.shim import Shim


def _opened(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def test_the_watch_sees_every_change_at_the_top_level_and_nothing_once_drained(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "index").write_text("a")
    fd = _opened(tree)
    watch = dirwatch.watch(fd)
    assert watch is not None
    try:
        changes = [
            lambda: (tree / "index").write_text("b"),
            lambda: (tree / "HEAD").write_text("ref: refs/heads/main\n"),
            lambda: ((tree / "index.lock").write_text("c"), os.rename(tree / "index.lock", tree / "index")),
            lambda: (tree / "HEAD").unlink(),
            lambda: os.chmod(tree / "index", 0o600),
        ]
        assert not dirwatch.changed([watch])
        for change in changes:
            change()
            assert dirwatch.changed([watch]), change
            dirwatch.drain(watch)
            assert not dirwatch.changed([watch])
        # a change below the top level (the host's own data, bound in) is not the sync's
        (tree / "sub" / "x").write_text("y")
        assert not dirwatch.changed([watch])
    finally:
        os.close(watch)
        os.close(fd)


def _shim(synced: int, watches: list[int]) -> Shim:
    shim = Shim.__new__(Shim)
    shim.synced, shim.watches = synced, watches
    return shim


def _answered_after(delay: float, sock: socket.socket) -> threading.Thread:
    def answer() -> None:
        sock.recv(1)  # the helper's end of writing
        time.sleep(delay)
        sock.send(b"s")

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    return thread


def test_the_helper_waits_for_the_sync_only_when_something_is_queued(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    fd = _opened(tree)
    watch = dirwatch.watch(fd)
    assert watch is not None
    try:
        # Nothing queued: the helper does not wait, though the supervisor never answers.
        supervisor, helper = socket.socketpair()
        t = time.monotonic()
        _shim(helper.detach(), [watch])._in_step()
        assert time.monotonic() - t < 1.0
        assert supervisor.recv(1) == b""  # told of the end all the same
        supervisor.close()
        # A change queued: it waits for the sync's answer.
        (tree / "index").write_text("x")
        supervisor, helper = socket.socketpair()
        thread = _answered_after(0.3, supervisor)
        t = time.monotonic()
        _shim(helper.detach(), [watch])._in_step()
        assert time.monotonic() - t >= 0.25
        thread.join(5)
        supervisor.close()
        # No watch at all (none could be had): it always waits.
        supervisor, helper = socket.socketpair()
        thread = _answered_after(0.3, supervisor)
        t = time.monotonic()
        _shim(helper.detach(), [])._in_step()
        assert time.monotonic() - t >= 0.25
        thread.join(5)
        supervisor.close()
    finally:
        os.close(watch)
        os.close(fd)


def test_the_helper_still_waits_when_the_sync_drains_the_watches_on_its_report(tmp_path: Path) -> None:
    """The helper's report of the command's end wakes the supervisor, whose sync drains
    the trees' watches first thing: the helper reads them before it reports, so a change
    still makes it wait for the sync. Control: read after the report (the order the
    trail's report first had), the drained queue says "nothing changed" and the client
    would hear of the end before the host's index had it."""
    from warren import protocol

    tree = tmp_path / "tree"
    tree.mkdir()
    fd = _opened(tree)
    watch = dirwatch.watch(fd)
    assert watch is not None

    def draining_supervisor(sock: socket.socket) -> threading.Thread:
        def run() -> None:
            sock.recv(4096)  # the report
            dirwatch.drain(watch)  # the sync's first step
            time.sleep(0.3)
            with contextlib.suppress(OSError):  # the control's helper did not wait: gone
                sock.send(b"s")

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    exited = protocol.Exited(status=0)
    try:
        for before in (True, False):
            (tree / "index").write_text(str(before))
            supervisor, helper = socket.socketpair()
            shim = _shim(helper.detach(), [watch])
            shim.extra = {}
            thread = draining_supervisor(supervisor)
            t = time.monotonic()
            wait = shim._changed() if before else None
            shim._report(exited)
            time.sleep(0.1)  # the supervisor has drained by now
            shim._in_step(wait)
            waited = time.monotonic() - t >= 0.25
            assert waited is before, ("read before the report" if before else "control", waited)
            thread.join(5)
            supervisor.close()
    finally:
        os.close(watch)
        os.close(fd)


def test_a_sync_while_an_exec_runs_leaves_its_watch_as_it_is(tmp_path: Path) -> None:
    from warren import protocol
    from warren.plan import CallerFacts
    from warren.server import ahead, gitkeeper, links, planning

    ws = tmp_path / "ws"
    ws.mkdir()
    assert host_git(ws, "init", "-q").returncode == 0
    home = tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "XDG_DATA_HOME": str(home / "data"), "PATH": os.environ.get("PATH", "/usr/bin")}
    caller, msg_caller = CallerFacts.here(env=env, cwd=str(ws)), protocol.Caller(cwd=str(ws), env=env)
    keeper = gitkeeper.GitKeeper()
    planner = planning.Planner(str(tmp_path / "state"), links.LinkScanner(), keeper)
    request = ahead.Request({"workspace": str(ws)}, caller, msg_caller, None, None, long_lived=True)
    _plan, found, _host = planner.plan(request)
    lease = keeper.lease(found)
    other = keeper.lease(planner.plan(request)[1])  # another sandbox on the same repository
    try:
        (shadow,) = lease.shadows
        assert other.shadows == [shadow] and shadow.watch is not None
        dirwatch.drain(shadow.watch)
        running = {7}  # an exec of the first sandbox runs (``Box.active``)
        rounds = [
            ("the round, an exec running", running, keeper.tick, True),
            ("the round, none", set(), keeper.tick, False),
            ("the end of the exec before, another running", running, lambda: keeper.sync(lease), True),
            ("the end of an exec, none other", set(), lambda: keeper.sync(lease), False),
            ("another sandbox's exec ended, one running here", running, lambda: keeper.sync(other), True),
        ]
        for what, execs, sync, queued in rounds:
            lease.running = execs
            # The running command's write in the sandbox's tree, then the sync.
            (Path(shadow.tree) / "description").write_text(f"{what}\n")
            sync()
            assert dirwatch.changed([shadow.watch]) is queued, what
            dirwatch.drain(shadow.watch)
            # Synced either way: the host has the write.
            assert (ws / ".git" / "description").read_text() == f"{what}\n", what
    finally:
        keeper.release(other)
        keeper.release(lease)


@pytest.fixture
def repo_box(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path
) -> tuple[Path, Sandbox]:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (layout.workspace.parent / "githome").mkdir(exist_ok=True)
    ws = layout.workspace
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "first"]):
        assert host_git(ws, *args).returncode == 0
    return ws, Sandbox.create(PolicySpec(workspace=str(ws)))


def test_host_git_sees_each_exec_the_moment_it_returns(repo_box: tuple[Path, Sandbox]) -> None:
    ws, box = repo_box
    env = {**GIT_ENV, "HOME": str(ws.parent / "githome")}
    for i in range(8):
        assert box.exec(["true"]).exit_code == 0  # nothing changed: answered at once
        r = box.exec(["sh", "-c", f"echo {i} > f{i} && git add f{i}"], env=env)
        # Read at once, in this process: a sync still running would not have written it yet.
        assert f"f{i}".encode() in (ws / ".git" / "index").read_bytes(), i
        assert r.exit_code == 0, r
        staged = host_git(ws, "diff", "--cached", "--name-only").stdout.split()
        assert f"f{i}" in staged, (i, staged)
        if i % 2:
            r = box.exec(["git", "commit", "-qm", f"c{i}"], env=env)
            assert r.exit_code == 0, r
            assert host_git(ws, "log", "-1", "--format=%s").stdout.strip() == f"c{i}"
            assert host_git(ws, "diff", "--cached", "--name-only").stdout == ""
    r = box.exec(["git", "checkout", "-q", "-b", "other"], env=env)
    assert r.exit_code == 0, r
    assert host_git(ws, "rev-parse", "--abbrev-ref", "HEAD").stdout.strip() == "other"
    assert (
        subprocess.run(
            ["git", "-C", str(ws), "status", "--porcelain"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
        ).stdout
        == ""
    )


def test_host_git_sees_a_commit_in_a_linked_worktree_the_moment_the_exec_returns(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state_home: Path
) -> None:
    """A commit in a worktree the host made changes its entry's ``index`` and logs, and
    nothing at the top of the git directory: the watch covers the worktrees' entries, so
    the exec's end waits for the sync that carries them (the host's status of the
    worktree was seen half a round behind its log under load)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    (layout.workspace.parent / "githome").mkdir(exist_ok=True)
    ws = layout.workspace
    for args in (
        ["init", "-q", "-b", "main"],
        ["commit", "-q", "--allow-empty", "-m", "first"],
        ["worktree", "add", "-q", "-b", "task", "wt"],
    ):
        assert host_git(ws, *args).returncode == 0
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    env = {**GIT_ENV, "HOME": str(ws.parent / "githome")}
    for i in range(4):
        r = box.exec(
            ["sh", "-c", f"echo {i} > wt/f{i} && git -C wt add f{i} && git -C wt commit -qm w{i}"], env=env
        )
        assert r.exit_code == 0, r
        # At once, in this process: a sync still to come would not have written them yet.
        assert f"f{i}".encode() in (ws / ".git" / "worktrees" / "wt" / "index").read_bytes(), i
        assert host_git(ws / "wt", "log", "-1", "--format=%s").stdout.strip() == f"w{i}"
        assert host_git(ws / "wt", "--no-optional-locks", "status", "--porcelain").stdout == ""
