"""A long-lived sandbox idle for ``WARREN_SPARE_IDLE`` holds no Python (issue 36): its
keeper (``pid1.Init`` under the native init) leaves once nothing of the sandbox runs,
and the native init alone stays; the next request has the spawner join a new keeper
from outside (``_core.rejoin``), which confines commands as the first one did. Judged
from the host: the processes in the sandbox's pid namespace, the files a command could
and could not write."""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import Layout, joined_helpers, large_tree, loopback_http, sandbox_members
from conftest import network_helper_runs as _netd
from test_envroot import image  # noqa: F401 (the small image: a fixture)
from warren import PolicySpec, Sandbox
from warren._core import nativeinit

pytestmark = [
    pytest.mark.usefixtures("state_home"),
    pytest.mark.skipif(nativeinit.program() is None, reason="warren-init is not built here (no C compiler)"),
]

PROBE = (
    "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
    "echo x > {outside} 2>/dev/null && echo wrote-outside; "
    "echo {n} > made.{n} && echo wrote-workspace"
)


def _members() -> list[str]:
    """The names of the processes in the sandbox's pid namespace (the test's supervisor
    runs one sandbox)."""
    return sandbox_members()


def _until(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: {_members()}"
        time.sleep(0.1)


def _idle() -> bool:
    return _members() == ["warren-init"]


def _idle_outside() -> bool:
    """Idle, and no helper of the supervisor's left in the sandbox's namespaces."""
    return _idle() and not joined_helpers()


def _python() -> bool:
    """A Python process (a keeper, a helper) in the sandbox."""
    return any(name.startswith("python") for name in _members())


def test_an_idle_sandbox_holds_only_the_init_and_its_next_command_is_confined_as_before(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    outside = tmp_path / "outside"
    outside.mkdir()
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    first = box.exec(["sh", "-c", PROBE.format(outside=outside / "a", n=1)], cwd=str(layout.workspace))
    assert _python()  # the keeper, serving
    _until("the keeper left the idle sandbox", _idle)
    again = box.exec(["sh", "-c", PROBE.format(outside=outside / "b", n=2)], cwd=str(layout.workspace))
    assert first.exit_code == again.exit_code == 0, (first, again)
    # the same confinement from the joined keeper as from the first (judged on the host)
    assert first.stdout == again.stdout, (first.stdout, again.stdout)
    assert b"NoNewPrivs:\t1" in again.stdout and b"Seccomp:\t2" in again.stdout, again.stdout
    assert b"CapEff:\t0000000000000000" in again.stdout and b"wrote-outside" not in again.stdout
    assert list(outside.iterdir()) == []
    assert (layout.workspace / "made.2").read_text() == "2\n"
    assert (layout.workspace / "made.2").stat().st_uid == os.getuid()
    # and it leaves again, and serves again: any number of times, any kind of request
    _until("the joined keeper left too", _idle)
    box.files.write(str(layout.workspace / "put.txt"), b"put\n")
    assert (layout.workspace / "put.txt").read_bytes() == b"put\n"
    _until("the joined keeper left too", _idle)
    assert box.files.read(str(layout.workspace / "made.2")) == b"2\n"
    _until("the joined keeper left too", _idle)
    proc = box.spawn(["sh", "-c", "echo spawned > spawned.txt"], cwd=str(layout.workspace))
    assert proc.wait(timeout=30) == 0
    assert (layout.workspace / "spawned.txt").read_text() == "spawned\n"
    for n in range(3, 5):
        _until("the joined keeper left too", _idle)
        assert box.exec(["echo", str(n)]).stdout == f"{n}\n".encode()


def test_a_sandbox_with_network_sheds_its_keeper_and_network_helper_unless_a_port_is_forwarded(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Network through warren's proxy needs nothing of the keeper's (the proxy's socket
    is the network helper's, outside): such a sandbox sheds its keeper too, and its
    network helper (about 3 MB of its own while it runs) once idle; the next
    connection to the proxy starts another, and an allowed host is reached and a denied
    one is not (judged by the servers). What a new helper could not start from keeps
    it: a rule added to the live policy (still in force after the idle time). A
    forwarded port keeps the keeper (its connector, a helper of the keeper's, connects
    inside): kept while a port is forwarded, let go with the last, made again with the
    next."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    ws = layout.workspace
    with loopback_http("127.0.0.2") as (port, asked), loopback_http("127.0.0.3") as (other, refused):
        box = Sandbox.create(
            PolicySpec(workspace=str(ws), network="allow", allow_hosts=[f"127.0.0.2:{port}"])
        )

        def fetch(url: str) -> int:
            return box.exec(["curl", "-fsS", "-o", "/dev/null", "--max-time", "10", url]).exit_code

        assert fetch(f"http://127.0.0.2:{port}/first") == 0
        _until("the keeper left the idle sandbox with network", lambda: _idle() and not _netd())
        assert fetch(f"http://127.0.0.2:{port}/after-join") == 0
        assert fetch(f"http://127.0.0.3:{other}/denied") != 0
        assert asked == ["/first", "/after-join"] and refused == []
        _until("the joined keeper and the network helper left too", lambda: _idle() and not _netd())
        # a connection made by a process started before the helper left, after it left
        waiter = box.spawn(["sh", "-c", f"sleep 3; curl -fsS --max-time 10 http://127.0.0.2:{port}/late"])
        _until("the network helper left with a process running", lambda: not _netd())
        assert waiter.wait(timeout=30) == 0 and asked[-1] == "/late"
        # a rule added while it runs: kept past the idle time
        box.net_allow(f"127.0.0.3:{other}")
        time.sleep(2.5)
        assert _netd()
        assert fetch(f"http://127.0.0.3:{other}/allowed-now") == 0 and refused == ["/allowed-now"]
        box.net_deny(f"127.0.0.3:{other}")
        assert fetch(f"http://127.0.0.3:{other}/denied-again") != 0 and refused == ["/allowed-now"]

        address = box.expose(8000)  # nothing listens yet: the connector alone
        time.sleep(2.5)  # past the idle time
        assert _python(), _members()
        for n in range(2):
            (ws / "index.html").write_text(f"inside {n}\n")
            server = box.spawn(["python3", "-m", "http.server", "--bind", "127.0.0.1", "8000"], cwd=str(ws))
            _until("the server inside listens", lambda a=address: _served(a) is not None)
            assert _served(address) == f"inside {n}\n"
            server.kill()
            server.wait(timeout=30)
            box.unexpose(8000)
            _until("the keeper left once no port was forwarded", _idle)
            address = box.expose(8000)  # a new connector, from a joined keeper
        box.unexpose(8000)


def test_requests_for_the_network_helper_around_its_idle_end_are_all_answered(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The network helper ends when idle: a request for it after that starts another
    (``Box._netd``). One that crosses its end (it looks for none waiting, then ends:
    unread) is asked again of a new one; that window is microseconds wide and this
    test does not force it, only comes around it at random."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    box = Sandbox.create(
        PolicySpec(workspace=str(layout.workspace), network="allow", allow_hosts=["example.invalid:443"])
    )
    rng = random.Random(36)
    ended = 0
    for n in range(8):
        time.sleep(rng.uniform(0.3, 0.9))
        ended += not _netd()
        assert box.net_policy().allowed == ("example.invalid:443",), n
        assert _netd()
    assert ended, "the helper never ended between two requests: nothing was tested"


def _served(address: str) -> str | None:
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}/index.html", timeout=5) as resp:
            return str(resp.read().decode())
    except OSError:
        return None


def test_a_joined_keeper_hardlinks_into_the_repository_s_git_data_as_the_first_did(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository's shared git data is bound into the sandbox, a mount of its own; the
    broker makes a link into it through a descriptor PID 1 opened before the bind
    covered it (``broker.links``), which no later process can open. A leaving keeper
    hands those to the supervisor with its ruleset and the next keeper takes them back:
    a local clone after a join hardlinks its objects, as the one before did."""
    from test_links import _git, _objects

    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    ws = layout.workspace
    _git(ws, "init", "-q")
    (ws / "f").write_text("x\n")
    _git(ws, "add", "f")
    _git(ws, "commit", "-qm", "c")
    here = {ino for ino, _sha in _objects(ws).values()}
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    for n in range(2):
        r = box.exec(["git", "clone", "-q", "--bare", ".", f"bare{n}.git"], cwd=str(ws))
        assert r.exit_code == 0, r
        linked = [ino for ino, _sha in _objects(ws / f"bare{n}.git").values() if ino in here]
        assert linked, f"clone {n}: its objects were copied, not hardlinked"
        _until("the keeper left the idle sandbox", _idle)


def test_a_large_workspace_s_keeper_leaves_after_its_walk_and_the_next_one_holds_no_call(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large workspace is walked for hard links after the launch, PID 1 holding every
    call that changes a file until the walk is done (``broker.window``). A keeper leaves
    only once its window is done, and the next one has none: a command's writes after
    a join go through (they waited for a walk's end that no one would announce)."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    ws = layout.workspace
    large_tree(ws, dirs=1100)  # past ``treewalk.SMALL``: walked after the launch
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    for n in range(3):
        r = box.exec(["sh", "-c", f"echo {n} > written.txt && cat written.txt"], timeout=30)
        assert (r.exit_code, r.stdout) == (0, f"{n}\n".encode()), (n, r)
        _until("the keeper left the idle sandbox", _idle)


def test_a_joined_keeper_s_commands_are_counted_and_paused_as_the_sandbox_s(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A joined keeper is the spawner's child, not PID 1's descendant: what counts a
    sandbox's processes from the host counts its tree too. Its CPU time (its commands'
    included) stays in the sandbox's once it left, and a pause stops a command it
    started (with no freezer: by a signal to each process)."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    box.exec(["true"])
    _until("the keeper left the idle sandbox", _idle)
    before = box.stats().cpu_time
    box.exec(["timeout", "1", "sh", "-c", "while :; do :; done"])
    busy = box.stats().cpu_time
    assert busy - before >= 0.5, (before, busy)
    _until("the joined keeper left too", _idle)
    assert box.stats().cpu_time >= busy  # counted still
    counter = box.spawn(["sh", "-c", "i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.02; done"])
    _until("the counter counts", lambda: (layout.workspace / "count").exists())
    box.pause()
    try:
        time.sleep(0.2)
        paused = (layout.workspace / "count").read_text()
        time.sleep(0.5)
        assert (layout.workspace / "count").read_text() == paused
    finally:
        box.resume()
    _until("the counter counts again", lambda: (layout.workspace / "count").read_text() != paused)
    counter.kill()


def test_a_process_running_in_the_background_keeps_the_keeper(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    proc = box.spawn(["sh", "-c", "sleep 3; echo done > bg.txt"])
    time.sleep(2)  # past the idle time: the process runs, the keeper stays
    assert _python() and "sleep" in _members()
    assert proc.wait(timeout=30) == 0
    assert (layout.workspace / "bg.txt").read_text() == "done\n"
    _until("the keeper left once the process ended", _idle)
    assert box.exec(["cat", "bg.txt"]).stdout == b"done\n"


def test_requests_that_race_the_keeper_s_leaving_are_all_served(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The keeper says it leaves (``Leaving``) and goes only if nothing was sent to it
    since (``LeaveOk``): requests that come around that moment are served by it or by
    the next keeper, never lost."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    rng = random.Random(36)
    for n in range(25):
        time.sleep(rng.uniform(0.45, 0.75))
        r = box.exec(["echo", str(n)])
        assert (r.exit_code, r.stdout) == (0, f"{n}\n".encode()), (n, r)


def test_signals_from_a_command_to_the_init_change_nothing(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the supervisor (outside the sandbox's pid namespace) stops the sandbox
    through its init, and only a keeper says it serves or leaves: a command's signals
    to PID 1 are refused (Landlock's signal scoping, ABI 6) or ignored."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    for sig in ("USR2", "USR1", "TERM", "HUP", "INT"):
        box.exec(["sh", "-c", f"kill -{sig} 1"])
    assert box.exec(["echo", "still"]).stdout == b"still\n"
    # nor can a command read the init (not dumpable)
    peek = box.exec(["sh", "-c", "head -c1 /proc/1/maps >/dev/null 2>&1 && echo read || echo refused"])
    assert peek.stdout == b"refused\n"
    _until("the keeper left the idle sandbox", _idle)
    assert box.exec(["echo", "served"]).stdout == b"served\n"


def test_an_idle_sandbox_is_removed_at_once(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="idle-rm")
    box.exec(["true"])
    _until("the keeper left the idle sandbox", _idle)
    box.remove()
    assert [s.name for s in Sandbox.list()] == []
    _until("nothing of the sandbox left", lambda: _members() == [], timeout=10)


def test_without_the_native_init_pid1_stays_and_serves(
    layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fallback (``WARREN_NATIVE_INIT=0``, or no C compiler at install): PID 1 is
    the Python process it was, serves every request and never leaves."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    monkeypatch.setenv("WARREN_NATIVE_INIT", "0")
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    box.exec(["true"])
    time.sleep(2)
    assert "warren-init" not in _members() and _python()
    assert box.exec(["echo", "ok"]).stdout == b"ok\n"


def test_a_host_file_replaced_while_the_sandbox_had_no_keeper_is_read_as_it_is_now(
    state_home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """The next keeper takes the last one's Landlock ruleset back, and the supervisor's
    word of a host change (``Refresh``, before the request) has it build a new one: a
    file the host replaced by rename while no keeper ran is read as it is now, and a
    denied one stays denied."""
    from test_host_changes import read, replace

    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    base = Path.home() / f".warren-test-{os.getpid()}-{request.node.name[-30:]}"
    try:
        ws, etc = base / "W", base / "etc"
        for d in (ws, etc):
            d.mkdir(parents=True)
        (etc / "passwd").write_text("passwd 1\n")
        (etc / "shadow").write_text("shadow 1\n")
        box = Sandbox.create(PolicySpec(workspace=str(ws), deny=[str(etc / "shadow")]))
        assert read(box, etc / "passwd") == (0, "passwd 1\n")
        _until("the keeper left the idle sandbox", _idle)
        replace(etc / "passwd", "passwd 2\n")
        replace(etc / "shadow", "shadow 2\n")
        assert read(box, etc / "passwd") == (0, "passwd 2\n")
        assert read(box, etc / "shadow")[0] != 0
        _until("the keeper left again", _idle)
        assert read(box, etc / "passwd") == (0, "passwd 2\n")  # the ruleset taken back
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)


def test_an_image_sandbox_sheds_its_keeper_and_a_snapshot_meanwhile_holds_its_moment(
    image: Path,  # noqa: F811
    state_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sandbox on an image sheds its keeper too: its layers are the supervisor's
    (given at ``Ready``), not the keeper's. A snapshot taken while no keeper runs
    stacks the root again without a copy, and a keeper joined after it starts at the
    new root (``setns`` lands on the topmost mount of the namespace's root): what the
    sandbox writes then goes to its new layer, never to the frozen one. Judged by a
    sandbox made from the snapshot, the saved copy on the host, and a fork."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    box = Sandbox.create(PolicySpec(image=str(image), workspace="none"))
    try:
        assert box.exec(["sh", "-c", "echo one > /etc/state"]).exit_code == 0
        _until("the keeper left the idle image sandbox", _idle)
        snap = box.snapshot()
        assert snap.saved is False  # stacked again, not copied
        _until("the keeper and the helper that stacked it left", _idle_outside)
        assert box.exec(["sh", "-c", "echo two > /etc/state"]).exit_code == 0  # a joined keeper's command
        with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
            assert b.exec(["cat", "/etc/state"]).stdout == b"one\n"
        _until("the keeper left again", _idle)
        assert box.exec(["cat", "/etc/state"]).stdout == b"two\n"
        with box.fork() as c:
            assert c.exec(["cat", "/etc/state"]).stdout == b"two\n"
        deadline = time.monotonic() + 60
        while not [s for s in Sandbox.snapshots() if s.id == snap.id and s.saved]:
            assert time.monotonic() < deadline, "the snapshot was never saved"
            time.sleep(0.05)
        saved = state_home / "warren" / "snapshots" / snap.id / "layer" / "etc" / "state"
        assert saved.read_text() == "one\n"  # on the host
    finally:
        box.remove()
        for s in Sandbox.snapshots():
            Sandbox.remove_snapshot(s.id)


def test_a_review_sandbox_sheds_its_keeper_and_checkpoints_and_rollbacks_hold_across_joins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A review sandbox sheds its keeper too (its layers and the host workspace's
    detached mount are the supervisor's), and its helper in the sandbox's namespaces
    (a fork of the supervisor, kept for checkpoints while it is in use): a command's
    changes are checkpointed before the next as ever, a rollback made while neither
    runs undoes them, and the host workspace is untouched throughout (judged on the
    host)."""
    from warren.policy import build

    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    box = Sandbox.create(build(PolicySpec(workspace=str(ws), review=True)))
    try:
        assert box.exec(["sh", "-c", f"echo one > {ws}/a.txt"]).exit_code == 0
        _until("a helper in its namespaces, for checkpoints", lambda: bool(joined_helpers()))
        _until(
            "the keeper and the helper left the idle review sandbox", lambda: _idle() and not joined_helpers()
        )
        assert box.exec(["sh", "-c", f"echo two > {ws}/a.txt; echo new > {ws}/b.txt"]).exit_code == 0
        _until("the keeper and the helper left again", _idle_outside)
        points = box.checkpoints()
        assert [c.command for c in points][-1].startswith("sh -c 'echo two"), points
        back = box.rollback(points[-1].id)  # to before the last command, no keeper running
        assert back.stopped == ""
        assert box.exec(["sh", "-c", f"cat {ws}/a.txt; ls {ws}"]).stdout == b"one\na.txt\n"
        _until("the keeper left again", _idle)
        assert box.exec(["cat", f"{ws}/a.txt"]).stdout == b"one\n"
        assert {(c.kind, c.path) for c in box.diff().changes} == {("modified", "a.txt")}
        assert (ws / "a.txt").read_text() == "a\n" and not (ws / "b.txt").exists()  # the host untouched
    finally:
        box.remove()


def test_a_pause_right_after_use_sheds_the_keeper_unless_a_process_of_the_sandbox_runs(
    layout: Layout, tmp_path: Path
) -> None:
    """A pause may last hours: an idle sandbox's keeper and spare leave first
    (``protocol.LeaveNow``) rather than stay frozen, at the default idle time too.
    Judged on the host: while paused, the sandbox's pid namespace holds the init
    alone; after the resume a joined keeper serves a command confined as the one
    before the pause. A process a command left running keeps the keeper (frozen with
    it), and so does a background process started with ``spawn``."""
    outside = tmp_path / "outside"
    outside.mkdir()
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    first = box.exec(["sh", "-c", PROBE.format(outside=outside / "a", n=1)], cwd=str(layout.workspace))
    assert _python()  # the keeper, and its spare
    box.pause()
    try:
        assert _members() == ["warren-init"]
    finally:
        box.resume()
    again = box.exec(["sh", "-c", PROBE.format(outside=outside / "b", n=2)], cwd=str(layout.workspace))
    assert first.exit_code == again.exit_code == 0 and first.stdout == again.stdout, (first, again)
    assert list(outside.iterdir()) == [] and (layout.workspace / "made.2").read_text() == "2\n"
    # a process a command left running: the keeper stays, frozen with it
    box.exec(["sh", "-c", "sleep 300 >/dev/null 2>&1 &"])
    _until("the background sleep runs", lambda: "sleep" in _members())  # (its sh execs it a moment later)
    box.pause()
    try:
        assert "sleep" in _members() and _python(), _members()
    finally:
        box.resume()
    box.exec(["pkill", "-x", "sleep"])
    # a background process of spawn's: the same
    spawned = box.spawn(["sleep", "300"])
    _until("the spawned sleep runs", lambda: "sleep" in _members())
    box.pause()
    try:
        assert "sleep" in _members() and _python(), _members()
    finally:
        box.resume()
    spawned.kill()
    assert box.exec(["echo", "served"]).stdout == b"served\n"


def test_the_helper_a_joined_keeper_forks_for_its_request_keeps_none_of_it_once_served(
    layout: Layout,
) -> None:
    """A keeper joined for a request forks the helper for it with the request in hand
    (its descriptors by the fork, nothing sent: ``pid1.Init._give``), as its first fork.
    Once it has served it, waiting to serve again (``again``), it holds nothing the
    request brought (read on the host); the supervisor sees no exec still running (the
    first one's end reached it), so a pause then sheds the keeper and the init is alone;
    and after the resume, commands run as before."""
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    box.exec(["true"])
    box.pause()  # sheds the keeper (the test above)
    box.resume()
    assert _members() == ["warren-init"]
    first = box.exec(["sh", "-c", "echo $PPID"])  # the joined keeper's first fork serves it
    assert first.exit_code == 0, first
    if os.getuid() == 0:  # (a helper is not dumpable: only root reads its descriptors)
        # Waiting for the next request, it holds nothing a request brought: none of the
        # sandbox's cgroup counters (a request's), none of the first's descriptors. It
        # lets them go once the command's end is told, which may come just after the
        # client has its result: looked at until then (one it kept, it keeps for good).
        # It may end instead of serving again (the keeper's go later than
        # ``again.GO_WAIT_MS`` under load, or a spare forked first): then the round is
        # made again, the keeper shed first; one that never stays fails.
        helper = _host_pid(box.pid1, int(first.stdout))
        for _ in range(5):
            if helper is not None:
                break
            box.pause()
            box.resume()
            first = box.exec(["sh", "-c", "echo $PPID"])
            assert first.exit_code == 0, first
            helper = _host_pid(box.pid1, int(first.stdout))
        assert helper is not None, "in six rounds, no helper of a joined keeper stayed to serve again"
        deadline = time.monotonic() + 10
        while True:
            held = [_target(helper, fd) for fd in _fds(helper)]
            if not [t for t in held if t.startswith("/sys/fs/cgroup")] or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert not [t for t in held if t.startswith("/sys/fs/cgroup")], held
    assert box.exec(["sh", "-c", "echo $PPID"]).exit_code == 0  # by it again, or another
    box.pause()
    try:
        assert _members() == ["warren-init"]
    finally:
        box.resume()
    assert box.exec(["echo", "served"]).stdout == b"served\n"


def _host_pid(pid1: int, inside: int) -> int | None:
    """The host's pid of the process whose pid is ``inside`` in the pid namespace of
    ``pid1`` (a joined keeper and its helpers are the spawner's descendants, not the
    init's); None when there is none (it has ended)."""
    from warren._core.procs import descendants
    from warren.server import statedir

    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    ns = os.readlink(f"/proc/{pid1}/ns/pid")
    for pid in descendants(found[1]):
        try:
            with open(f"/proc/{pid}/status") as f:
                nspid = f.read().split("NSpid:", 1)[1].split("\n", 1)[0].split()
            same = os.readlink(f"/proc/{pid}/ns/pid") == ns
        except (OSError, IndexError):
            continue
        if same and nspid[-1] == str(inside):
            return pid
    return None


def _fds(pid: int) -> list[str]:
    """The open descriptors of ``pid``: none once it has ended (a helper that did not
    serve again)."""
    try:
        return os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []


def _target(pid: int, fd: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""
