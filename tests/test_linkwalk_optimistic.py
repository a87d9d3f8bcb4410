"""The hard-link walk beside the first command (``Box.start_walk``): in a workspace whose
directories are watched (``server.repowatch``) and whose last walk found nothing linked
from outside, a command starts while the walk runs, its writes waiting in the walk's
window, so a launch does not cost the workspace's size. What must hold, judged on the
host, with the native continuer answering the window after the walk and with the
Python broker (``WARREN_NATIVE_CONTINUER=0``):

- the command starts during the walk, and its first write comes only after the walk;
- a file of the workspace linked from outside without a name made in the workspace
  (``ln ws/f ~/f``: nothing a watch sees) and opened by such a command is never written
  through that link, not even through ``/proc/self/fd`` once the walk is done: the
  sandbox is stopped, the file given its own inode, the run told why;
- a name linked into the workspace from outside (seen by the watches) makes the walk
  come first again, as before: the command writes a copy of its own, and succeeds;
- after the walk, the first command's calls behave as anyone's: writes, renames, links
  inside, chmod; a set-id bit and a link to outside still refused.

The walk is held back ``DELAY`` seconds (``WARREN_LINK_WALK_DELAY``) and every tree is
large (``WARREN_NATIVE_WALK=1``); each test checks from the command's own clock whether
it started during the hold or after it."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import held_walk_state, large_tree, run_cli, server_of
from test_direct_handoff import _wait_spare
from warren import PolicySpec, Sandbox
from warren._core import continuer
from warren.errors import WarrenError

DELAY = 2.0  # the walk's hold: room for a launch on a machine busy with both halves


@pytest.fixture(scope="module", params=["native", "python"])
def state_home(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setenv("WARREN_NATIVE_CONTINUER", "0")
        else:
            assert continuer.program() is not None, "warren-continuer.so is not installed (run scripts/setup)"
        yield from held_walk_state(tmp_path_factory, DELAY)


@pytest.fixture
def native_only(state_home: Path) -> None:
    """What does not depend on who answers the window once the walk is done: with the
    native continuer only (the Python broker's case is the same code)."""
    if os.environ.get("WARREN_NATIVE_CONTINUER") == "0":
        pytest.skip("the same with the Python broker answering the window")


@pytest.fixture(scope="module")
def ws(state_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace of 300 directories, walked clean once (the walk before its first
    command, since nothing is known of it yet; its directories are watched from that
    launch on): the next walk is expected to find nothing."""
    path = tmp_path_factory.mktemp("opt") / "ws"
    path.mkdir()
    large_tree(path)
    _walked_first(path)
    return path


def _walked_first(path: Path) -> None:
    began = time.time()
    started = _started(run_cli(["run", "--", "sh", "-c", "date +%s.%N"], cwd=path, timeout=120).stdout)
    assert started >= began + DELAY, "the first walk of a workspace comes before its command"


def _started(stdout: str) -> float:
    return float(stdout.split("\n", 1)[0])


def _during(began: float, stamp: float) -> bool:
    """Whether ``stamp`` (a command's clock) fell while the walk begun after ``began`` was
    held back."""
    return stamp < began + DELAY


def _outside(tmp_path: Path, text: str = "the host's\n") -> Path:
    out = tmp_path / "outside"
    out.mkdir(exist_ok=True)
    host = out / "file.txt"
    host.write_text(text)
    return host


@pytest.fixture(scope="module")
def few(state_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace of three directories, walked clean once. Its hard-link walk goes
    after launch (every tree is past ``treewalk.SMALL`` entries here; a project with its
    venv is, with some hundred directories), so its directories are watched however few
    (``gitkeeper.find``'s ``watch``), and the next walk is expected to find nothing."""
    path = tmp_path_factory.mktemp("few") / "ws"
    (path / "a" / "b").mkdir(parents=True)
    (path / "a" / "f").write_text("x")
    _walked_first(path)
    return path


@pytest.mark.parametrize("via", ["run", "exec"])
def test_a_file_linked_from_outside_since_the_last_walk_is_never_written_through(
    native_only: None, ws: Path, tmp_path: Path, via: str
) -> None:
    """``ln ws/f outside/f`` on the host: the watches see nothing (no name made in the
    workspace), the command starts during the walk and holds the file open. The walk
    finds the link: the sandbox is stopped before the command's write through
    ``/proc/self/fd`` goes on; judged on the host.

    The case needs a launch that expected nothing linked. A launch that walked first
    instead (the supervisor's log says why) is judged on the host too, then the case is
    made once more: seen in two gates of four as uid 1001, with both halves running."""
    _never_written_through(ws, tmp_path, via)


def test_in_a_workspace_of_few_directories_too(native_only: None, few: Path, tmp_path: Path) -> None:
    """The same attack where the workspace has three directories: watched because its
    walk goes after launch, its command starts during the walk, and the file outside is
    never written; judged on the host."""
    _never_written_through(few, tmp_path, "run")


def _never_written_through(ws: Path, tmp_path: Path, via: str) -> None:
    walked_first: list[str] = []
    for attempt in (1, 2):
        host, victim, began, out, err, code = _attack(ws, tmp_path / f"try{attempt}", via)
        # Judged on the host first: never written through the link, whatever else happened.
        assert host.read_text() == "the workspace's\n", ("written through the link", out, err)
        assert host.stat().st_nlink == 1 and victim.stat().st_nlink == 1  # its own inode now
        # The case itself: the command started during the walk (the launch expected
        # nothing linked), so the sandbox was stopped before its write. A command started
        # after the walk (a launch that walked first) wrote a copy of its own: safe.
        stamp = _started(out) if out else None
        if stamp is not None and _during(began, stamp):
            break
        walked_first.append(f"began {began:.3f}, started {stamp}, held {DELAY} s: {out!r} {err!r}")
    else:
        pytest.fail(f"both launches walked first, the case was never made: {walked_first}")
    assert "wrote" not in out, (out, err)
    assert code != 0
    # An exec's sandbox was stopped under it: its client asks why, and says so.
    assert "is linked from outside the workspace" in err and "run the command again" in err, err
    # The next command works (the workspace is clean again), and writes its own copy.
    r = run_cli(["run", "--", "sh", "-c", f"echo again >> {victim.name}"], cwd=ws, timeout=120)
    assert r.returncode == 0, r.stderr
    assert host.read_text() == "the workspace's\n"


def _attack(ws: Path, where: Path, via: str) -> tuple[Path, Path, float, str, str, int]:
    """A workspace file linked from outside after its last walk, held open by a command
    that writes through ``/proc/self/fd`` once the walk is done: the file outside, the
    victim, when the command was asked for, its output, error and exit code."""
    where.mkdir()
    victim = ws / f"victim-{via}-{where.name}.txt"
    victim.write_text("the workspace's\n")
    # A launch looks at the names made since the last walk: the victim, one link then,
    # is as any file of the workspace from here on (what the fixture's walks saw). The
    # command writes a file, so its run ends only once its own walk has: a walk still
    # going when the link below is made would find it and give the victim an inode of
    # its own before the next command (seen once, under a gate's load).
    done = f"walked-{via}-{where.name}"
    assert run_cli(["run", "--", "sh", "-c", f": > {done}"], cwd=ws, timeout=120).returncode == 0
    host = where / "outside.txt"
    os.link(victim, host)
    script = (
        f"exec 3<{victim.name}; date +%s.%N; sleep {DELAY + 1}; echo planted >> /proc/self/fd/3; echo wrote"
    )
    began = time.time()
    if via == "run":
        r = run_cli(["run", "--", "sh", "-c", script], cwd=ws, timeout=120)
        return host, victim, began, r.stdout, r.stderr, r.returncode
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    streamed: list[bytes] = []  # what it printed as it came: its exec ends with the sandbox
    try:
        got = box.exec(["sh", "-c", script], timeout=60, on_stdout=streamed.append)
        err, code = got.stderr.decode(), got.exit_code
    except WarrenError as e:
        err, code = str(e), -1
    finally:
        box.remove()
    return host, victim, began, b"".join(streamed).decode(), err, code


@pytest.mark.parametrize("via", ["run", "exec"])
def test_a_command_that_fails_during_the_walk_is_answered_with_its_own_failure(
    native_only: None, few: Path, via: str
) -> None:
    """A command started in the walk's window that fails on its own (nothing linked from
    outside: its sandbox goes on) is answered with its exit code and output. (Its helper
    first waits a moment to know whether PID 1 is ending, ``pid1.COMMAND_END_WAIT``: a
    write the window held fails with ENOSYS when the walk finds a link and PID 1 goes,
    and then the client hears the supervisor's reason, not the command's failure.)"""
    script = "date +%s.%N; echo out; echo err >&2; exit 3"
    began = time.time()
    if via == "run":
        r = run_cli(["run", "--", "sh", "-c", script], cwd=few, timeout=120)
        out, err, code = r.stdout, r.stderr, r.returncode
    else:
        box = Sandbox.create(PolicySpec(workspace=str(few)))
        try:
            got = box.exec(["sh", "-c", script], timeout=60)
            out, err, code = got.stdout.decode(), got.stderr.decode(), got.exit_code
            assert box.exec(["true"]).exit_code == 0  # the sandbox goes on
        finally:
            box.remove()
    assert (code, out.split("\n", 1)[1], err) == (3, "out\n", "err\n"), (code, out, err)
    assert _during(began, _started(out)), "the command started after the walk: the case was not made"


def test_a_name_linked_in_from_outside_makes_the_walk_come_first(
    native_only: None, ws: Path, tmp_path: Path
) -> None:
    """``ln outside/f ws/f`` on the host (as a host `uv sync` links its cache into
    `.venv`): a name made in the workspace, which the watches see, linked: the walk
    comes before the command, which writes a copy of its own and succeeds."""
    host = _outside(tmp_path)
    os.link(host, ws / "linked-in.txt")
    began = time.time()
    r = run_cli(["run", "--", "sh", "-c", "date +%s.%N; echo mine >> linked-in.txt"], cwd=ws, timeout=120)
    assert r.returncode == 0, r.stderr
    assert not _during(began, _started(r.stdout)), "the command started before the walk"
    assert host.read_text() == "the host's\n"
    assert (ws / "linked-in.txt").read_text() == "the host's\nmine\n"
    # Clean again: the next command starts during the walk.
    began = time.time()
    r = run_cli(["run", "--", "sh", "-c", "date +%s.%N"], cwd=ws, timeout=120)
    assert r.returncode == 0 and _during(began, _started(r.stdout)), (r.stdout, r.stderr)


CALLS = """
set -e
date +%s.%N
echo one > calls-a.txt
date +%s.%N
: > calls-a.txt
echo two >> calls-a.txt
mv calls-a.txt calls-b.txt
ln calls-b.txt calls-c.txt
chmod 600 calls-b.txt
python3 - <<'EOF'
import os
os.truncate("calls-b.txt", 2)
try:
    os.chmod("calls-b.txt", 0o4755)
    print("setuid: allowed")
except OSError as e:
    print("setuid:", e.errno)
try:
    os.link("calls-b.txt", "../linked-out.txt")
    print("link out: allowed")
except OSError as e:
    print("link out:", e.errno)
EOF
stat -c '%a %h %s' calls-b.txt
"""


def test_a_command_starts_during_the_walk_and_its_calls_after_it_behave_as_anyones(ws: Path) -> None:
    """Started during the walk, its first write waits for the walk's end; its calls
    from then on are answered by the native thread (or the Python broker) as the calls
    of a command started later are."""
    outside = ws.parent / "linked-out.txt"  # beside the workspace: read-only in the sandbox
    began = time.time()  # (the walk is held from the launch on)
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    try:
        got = box.exec(["sh", "-c", CALLS], timeout=60)
        lines = got.stdout.decode().splitlines()
        assert got.exit_code == 0, got
        assert _during(began, float(lines[0])), "it did not start during the walk"
        assert not _during(began, float(lines[1])), "its write did not wait for the walk"
        assert lines[2] == "setuid: 1"  # EPERM: no set-id bit, as for any command
        assert lines[3].startswith("link out:") and lines[3] != "link out: allowed"
        assert lines[4] == "600 2 2"
        assert not outside.exists()
        assert (ws / "calls-b.txt").read_text() == "tw"
        server = server_of(box.pid1)
        tasks = f"/proc/{server}/task"
        threads = {Path(f"{tasks}/{t}/comm").read_text().strip() for t in os.listdir(tasks)}
        native = os.environ.get("WARREN_NATIVE_CONTINUER") != "0"
        assert (continuer.THREAD in threads) == native, threads
        # A command started after the walk: the same answers.
        again = box.exec(["sh", "-c", "echo later > calls-d.txt && cat calls-d.txt"])
        assert again.exit_code == 0 and again.stdout == b"later\n", again
    finally:
        box.remove()


# Where the command's stdin comes from: the mount of the open file, looked up in the
# sandbox's own mount table (0: a mount the sandbox does not have, the host's /dev: the
# supervisor opened it), then whether it reads its end at once.
STDIN = (
    "date +%s.%N; m=$(sed -n 's/^mnt_id:[[:space:]]*//p' /proc/self/fdinfo/0); "
    'grep -c "^$m " /proc/self/mountinfo; cat; echo end'
)


@pytest.fixture
def clean(state_home: Path, tmp_path: Path) -> Path:
    """A workspace of its own, walked clean once (the others' tests leave names with two
    links in theirs, after which a walk comes first again)."""
    path = tmp_path / "ws"
    (path / "a" / "b").mkdir(parents=True)
    (path / "a" / "f").write_text("x")
    _walked_first(path)
    return path


def test_a_command_given_to_the_stub_during_the_walk_has_dev_null_from_the_supervisor(
    native_only: None, clean: Path
) -> None:
    """The exec stub of a spare forked in the walk's window takes the command from the
    supervisor itself, as after the walk: its stdin, which the client left unattached, is
    the host's /dev/null opened by the supervisor (not a mount of the sandbox), so the
    stub opens nothing for writing, which would wait for the walk; it reads its end at
    once, and the command starts during the walk. (A few tries while the walk is held:
    an exec that comes before the supervisor has heard of the spare goes through PID 1
    and the helper, which opens /dev/null itself; each command reads its end either way.)"""
    began = time.time()
    box = Sandbox.create(PolicySpec(workspace=str(clean)))
    seen: list[list[str]] = []
    try:
        while time.time() < began + DELAY - 0.5 and ["0", "end"] not in (s[1:] for s in seen):
            _wait_spare(box.pid1)
            time.sleep(0.2)  # its stub said it waits, and the supervisor heard of the spare
            got = box.exec(["sh", "-c", STDIN], timeout=60)
            assert got.exit_code == 0, got
            lines = got.stdout.decode().splitlines()
            assert lines[1:] in (["0", "end"], ["1", "end"]), got
            seen.append(lines)
        direct = [lines for lines in seen if lines[1] == "0"]
        assert direct, f"no command went to the stub while the walk was held: {seen}"
        assert _during(began, float(direct[0][0])), "it did not start during the walk"
    finally:
        box.remove()
