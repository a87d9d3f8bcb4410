"""The hard-link walk of a large workspace made after launch (``server.linkwalk``):
nothing the sandbox runs starts before it has ended (a command asked for meanwhile
waits in the supervisor), so no process there can hold a workspace file the walk has
not yet given its own inode; judged from the host. The walk is held back a few seconds
(``WARREN_LINK_WALK_DELAY``) and every tree counts as large (``WARREN_NATIVE_WALK=1``),
and each test checks that its command was asked for while the walk was held back and
started only after it: a test it could pass without the hold proves nothing."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import held_walk_state
from warren import PolicySpec, Sandbox
from warren._core.procs import table
from warren.server import links

DELAY = 3.0  # room for a launch on a machine busy with both halves of the suite


@pytest.fixture(scope="module")
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from held_walk_state(tmp_path_factory, DELAY)


@pytest.fixture
def ws(tmp_path: Path, state_home: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def _after_walk(box: Sandbox, script: str, before: float) -> object:
    """Spawn ``script`` (the walk is held back ``DELAY`` seconds from the launch, which
    came after ``before``), wait for it, and check it was asked for while the walk ran
    and started only once the walk had ended: it prints the time it started first."""
    asked = time.time()
    assert asked < before + DELAY, "the command was not asked for while the walk was held back"
    proc = box.spawn(["sh", "-c", "date +%s.%N; " + script])
    assert proc.wait(timeout=30) is not None  # type: ignore[attr-defined]
    text = proc.output().text  # type: ignore[attr-defined]
    started = float(text.split("\n", 1)[0])
    assert started >= before + DELAY, (started - before, "it started during the walk")
    return proc


def _linked_from_outside(tmp_path: Path, name: str, inside: Path) -> Path:
    """A host file ``outside/name`` reading "original", hard-linked as ``inside``."""
    outside = tmp_path / "outside"
    outside.mkdir()
    host = outside / name
    host.write_text("original\n")
    os.link(host, inside)
    return host


def test_a_write_asked_for_during_the_walk_waits_and_never_reaches_the_outside_file(
    ws: Path, tmp_path: Path
) -> None:
    host = _linked_from_outside(tmp_path, "config.txt", ws / "config.txt")
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        proc = _after_walk(box, "echo evil > config.txt", before)
        assert proc.wait(timeout=30) == 0  # type: ignore[attr-defined]
        assert host.read_text() == "original\n"
        assert host.stat().st_nlink == 1
        assert (ws / "config.txt").read_text() == "evil\n"
        # A command started after the walk writes at once (and its own inode).
        r = box.exec(["sh", "-c", "echo again >> config.txt && cat config.txt"])
        assert r.exit_code == 0 and r.stdout == b"evil\nagain\n", r
        assert host.read_text() == "original\n"
    finally:
        box.remove()


def test_a_file_opened_for_reading_cannot_be_opened_again_for_writing_after_the_walk(
    ws: Path, tmp_path: Path
) -> None:
    """The attack a command started during the walk would have: open a workspace file
    linked from outside for reading (nothing holds a read), wait for the walk, then open
    it again for writing through ``/proc/self/fd`` (or link it back by that name): the
    descriptor would still name the outside inode. Every command starts after the walk,
    so the descriptor it gets is the file's own inode; judged on the host."""
    host = _linked_from_outside(tmp_path, "cache-entry.py", ws / "module.py")
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        script = (
            "exec 3< module.py; sleep 0.2; "
            "python3 -c \"import os; w = os.open('/proc/self/fd/3', os.O_WRONLY | os.O_APPEND); "
            "os.write(w, b'planted\\\\n')\"; "
            "ln -L /proc/self/fd/3 again.py 2>/dev/null; echo more >> again.py 2>/dev/null; true"
        )
        proc = _after_walk(box, script, before)
        assert proc.wait(timeout=30) == 0, proc.output()  # type: ignore[attr-defined]
        assert host.read_text() == "original\n"
        assert host.stat().st_nlink == 1
        assert (ws / "module.py").read_text().startswith("original\nplanted\n")  # its own inode
    finally:
        box.remove()


def test_a_rename_into_a_walked_directory_asked_for_during_the_walk_cannot_hide_a_linked_file(
    ws: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    host = outside / "key.txt"
    host.write_text("original\n")
    # "a" is walked before "z" (and the walk may be anywhere when the rename comes):
    # moved from z into a, the file would be counted twice there and its outside name
    # would hide behind the count, were the rename not held until the walk ended.
    (ws / "a").mkdir()
    (ws / "z").mkdir()
    os.link(host, ws / "z" / "key.txt")
    os.link(ws / "z" / "key.txt", ws / "a" / "seen.txt")
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        proc = _after_walk(box, "mv z/key.txt a/key.txt; echo evil > a/key.txt", before)
        assert proc.wait(timeout=30) == 0  # type: ignore[attr-defined]
        assert host.read_text() == "original\n"
        assert (ws / "a" / "key.txt").read_text() == "evil\n"
        # Names the file had inside still share its (new) inode, as on the host.
        assert (ws / "a" / "seen.txt").read_text() == "evil\n"
    finally:
        box.remove()


def _spares(pid1: int) -> list[int]:
    """PID 1's children waiting as spares: a helper with its one command's process."""
    children: dict[int, list[int]] = {}
    for pid, ppid, _state in table():
        children.setdefault(ppid, []).append(pid)
    return [h for h in children.get(pid1, []) if len(children.get(h, [])) == 1]


def _inside_pid(pid: int) -> int:
    """A host process's pid as its sandbox numbers it."""
    with open(f"/proc/{pid}/status") as f:
        return int(next(line for line in f if line.startswith("NSpid:")).split()[-1])


def test_a_request_after_the_walk_never_goes_to_the_spare_pid1_lets_go_for_it(ws: Path) -> None:
    """The spare PID 1 forked during the walk carries the walk's filter, and PID 1 lets
    it go when it hears the walk has ended. The supervisor lets go of it as it says so:
    a request handed to it then would race PID 1 letting it go (the helper was killed
    by SIGPIPE telling PID 1 it was taken: a "connection lost" seen in CI). PID 1 is
    stopped from the host across the walk's end, and a request asked for then must be
    served by a helper PID 1 forks once it runs again, never by that spare (without
    the change it was: the command's parent was the spare)."""
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        deadline = time.monotonic() + 10
        while not (spares := _spares(box.pid1)):
            assert time.monotonic() < deadline, "no spare was forked during the walk"
            time.sleep(0.02)
        spare = _inside_pid(spares[0])
        time.sleep(0.2)  # the supervisor has heard of it
        assert time.time() < before + DELAY - 0.5, "the walk was not held back long enough"
        os.kill(box.pid1, signal.SIGSTOP)
        outcome: list[object] = []
        asker = threading.Thread(
            target=lambda: outcome.append(box.exec(["sh", "-c", "echo $PPID"]).stdout.decode())
        )
        try:
            time.sleep(max(0.0, before + DELAY + 1.0 - time.time()))  # the walk has ended
            asker.start()
            asker.join(1.0)
        finally:
            os.kill(box.pid1, signal.SIGCONT)
        asker.join(30)
        assert outcome, "the request was not served"
        assert int(str(outcome[0])) != spare, "the spare PID 1 lets go of was handed the request"
        assert box.exec(["echo", "after"]).stdout == b"after\n"
    finally:
        box.remove()


def test_hard_links_within_the_workspace_behave_as_on_the_host(ws: Path) -> None:
    (ws / "one").write_text("first\n")
    os.link(ws / "one", ws / "two")
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        proc = _after_walk(box, "echo second > one; cat two", before)
        assert proc.wait(timeout=30) == 0  # type: ignore[attr-defined]
        assert proc.output().text.endswith("\nsecond\n")  # type: ignore[attr-defined]
        assert (ws / "two").read_text() == "second\n"
        assert (ws / "one").stat().st_ino == (ws / "two").stat().st_ino  # not copied: nothing outside
    finally:
        box.remove()


def test_a_denied_path_inside_another_is_counted_with_it(tmp_path: Path) -> None:
    """``denied_linked_elsewhere`` with nested denied paths (as the default list has:
    a directory and files beneath it, with and without a trailing slash): a file's names
    under the outer one are all its names there, and a link out of either is found."""
    outer = tmp_path / "outer"
    inner = outer / "inner"
    inner.mkdir(parents=True)
    (inner / "key").write_text("k")
    os.link(inner / "key", outer / "key-too")
    denied = [str(inner), str(outer) + "/", str(inner / "key"), str(tmp_path / "missing")]
    assert links.denied_linked_elsewhere(denied) is None, "both names are under the outer path"
    os.link(inner / "key", tmp_path / "elsewhere")
    assert links.denied_linked_elsewhere(denied) in {str(inner / "key"), str(outer / "key-too")}
    os.unlink(tmp_path / "elsewhere")
    assert links.denied_linked_elsewhere([str(inner), str(inner / "key")]) == str(inner / "key"), (
        "the outer path not denied: its name is another name"
    )


def test_a_denied_file_with_two_links_takes_the_walk_before_launch(ws: Path, tmp_path: Path) -> None:
    denied = tmp_path / "private"
    denied.mkdir()
    secret = denied / "token"
    secret.write_text("TOPSECRET\n")
    secret.chmod(0o644)
    assert links.denied_linked_elsewhere([str(denied)]) is None
    os.link(secret, ws / "token")
    assert links.denied_linked_elsewhere([str(denied)]) == str(secret)
    # Both names under the denied path: no other name anywhere.
    os.link(secret, denied / "again")
    assert links.denied_linked_elsewhere([str(denied)]) == str(denied / "again")
    os.unlink(ws / "token")
    assert links.denied_linked_elsewhere([str(denied)]) is None
    os.link(secret, ws / "token")
    box = Sandbox.create(PolicySpec(workspace=str(ws), deny=[str(denied)]))
    try:
        start = time.monotonic()
        r = box.exec(["sh", "-c", "cat token; echo written > mine; echo end"])
        # Walked before launch (the sandbox's writes do not wait for a walk after it).
        assert time.monotonic() - start < DELAY
        assert b"TOPSECRET" not in r.stdout + r.stderr, r
        assert r.stdout.endswith(b"end\n"), r
        assert secret.read_text() == "TOPSECRET\n"
    finally:
        box.remove()


def test_a_file_to_mask_found_after_launch_fails_every_write_with_eacces(ws: Path, tmp_path: Path) -> None:
    denied = tmp_path / "private"
    denied.mkdir()
    secret = denied / "token"
    secret.write_text("TOPSECRET\n")
    before = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(ws), deny=[str(denied)]))
    try:
        # Linked in from the host after the launch's check, before the walk: the walk
        # finds a file it would have to mask, which a running sandbox cannot get.
        os.link(secret, ws / "token")
        proc = _after_walk(box, "echo x > mine; echo status=$?", before)
        got = proc.output()  # type: ignore[attr-defined]
        assert "status=" in got.text and "status=0" not in got.text, got
        assert b"Permission denied" in got.stderr, got
        assert not (ws / "mine").exists()
        r = box.exec(["sh", "-c", "echo y > later; echo status=$?; mv token moved; echo mv=$?"])
        assert b"status=" in r.stdout and b"status=0" not in r.stdout and b"mv=1" in r.stdout, r
        assert b"Permission denied" in r.stderr, r
        assert (ws / "token").exists() and secret.read_text() == "TOPSECRET\n"
    finally:
        box.remove()


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_walk_after_launch_gives_linked_files_their_own_inode_natively_and_in_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    import selectors

    from warren.plan.model import LinkWalk
    from warren.server import linkwalk

    monkeypatch.setenv("WARREN_NATIVE_WALK", native)
    monkeypatch.setenv("WARREN_LINK_WALK_DELAY", "0")
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("original\n")
    os.link(outside, ws / "d" / "f.txt")
    os.link(ws / "d" / "f.txt", ws / "g.txt")
    walk = LinkWalk((str(ws),), (), (), (str(ws),), str(ws))
    sel = selectors.DefaultSelector()
    ended: list[linkwalk.Job] = []
    job = linkwalk.Job(walk, sel, ended.append)
    for key, _ in sel.select(30):
        assert key.data == ("walked", job)
        job.on_end()
    assert ended == [job] and job.ok, job.error
    assert job.found == 2
    assert outside.stat().st_nlink == 1
    assert (ws / "d" / "f.txt").stat().st_ino == (ws / "g.txt").stat().st_ino != outside.stat().st_ino
    # Given up (its sandbox ended): the loop hears nothing of it, nobody is told.
    os.link(outside, ws / "h.txt")
    job = linkwalk.Job(walk, sel, ended.append)
    job.cancel()
    time.sleep(0.5)
    assert not sel.get_map() and ended == [ended[0]]
