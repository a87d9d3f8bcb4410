"""Every PID 1 is cloned by the spawner, and is still the supervisor's child.

The spawner exists for memory (PID 1s share its unchanging pages instead of each keeping
a private copy of the supervisor's churning heap: ``bench/bench_sandbox.py`` prints the
figure). What must hold, tested here from the host: PID 1's parent is the supervisor (it
reaps it, and PID 1's parent-death signal follows it); the spawner holds no descriptor
but its channel (no client's connection, not the supervisor's listener); it is forked
when the supervisor starts, before any sandbox; a spawner that dies is replaced, and
sandboxes keep starting; it goes with the supervisor.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Layout, loopback_http, memory_holds, network_helpers, spawners
from warren import PolicySpec, Sandbox
from warren._core import credsend, execstub, nativeinit
from warren._core.procs import descendants
from warren.server import statedir


def _supervisor() -> int:
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None, "no supervisor is running"
    return found[1]


def _status(pid: int, key: str) -> list[str]:
    """A field of /proc/PID/status; empty once the process is gone (helpers are brief)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return []
    for line in text.splitlines():
        if line.startswith(key + ":"):
            return line.split()[1:]
    raise AssertionError(f"no {key} in /proc/{pid}/status")


def _children(pid: int) -> list[int]:
    return [p for p in descendants(pid) if _status(p, "PPid") == [str(pid)]]


def _spawners(sup: int) -> list[int]:
    assert sup == _supervisor()
    return spawners()


def _pid1(sup: int) -> list[int]:
    return [p for p in _children(sup) if len(_status(p, "NSpid")) == 2 and _status(p, "NSpid")[1] == "1"]


@pytest.fixture
def box(layout: Layout, state_home: Path) -> Iterator[Sandbox]:
    sb = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    yield sb
    sb.remove()


def test_pid1_is_the_supervisors_child_and_the_spawner_holds_only_its_channel(box: Sandbox) -> None:
    sup = _supervisor()
    assert box.exec(["true"]).exit_code == 0
    pid1s = _pid1(sup)
    assert len(pid1s) == 1, f"PID 1 is not the supervisor's child: children {_children(sup)}"
    spawners = _spawners(sup)
    assert len(spawners) == 1, spawners
    fds = sorted(int(fd) for fd in os.listdir(f"/proc/{spawners[0]}/fd"))
    held = [os.readlink(f"/proc/{spawners[0]}/fd/{fd}") for fd in fds if fd > 2]
    # stdio, its channel to the supervisor and the sealed programs every PID 1 inherits
    # (the exec stub, the credentials sender, the native init; where they were built):
    # nothing a client
    # or another sandbox gave
    stub = [h for h in held if h == "/memfd:warren-exec-stub (deleted)"]
    assert len(stub) == (1 if execstub.program() else 0), held
    sender = [h for h in held if h == "/memfd:warren-credsend (deleted)"]
    assert len(sender) == (1 if credsend.program() else 0), held
    init = [h for h in held if h == "/memfd:warren-init (deleted)"]
    assert len(init) == (1 if nativeinit.program() else 0), held
    others = [h for h in held if h not in stub + sender + init]
    assert len(others) == 1 and others[0].startswith("socket:"), held


def test_a_new_supervisor_forks_its_spawner_before_its_first_sandbox(
    layout: Layout, state_home: Path
) -> None:
    # Started by a request that makes no sandbox: its spawner comes all the same, at its
    # start (``clone.start_spawner``), so that a cold start's first run does not wait for
    # it; that spawner then clones the first PID 1.
    assert Sandbox.list() == []
    sup = _supervisor()
    deadline = time.monotonic() + 10
    while not _spawners(sup) and time.monotonic() < deadline:
        time.sleep(0.02)
    early = _spawners(sup)
    assert len(early) == 1 and _pid1(sup) == [], (early, _children(sup))
    sb = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    try:
        assert sb.exec(["true"]).exit_code == 0
        assert _spawners(sup) == early  # the same one: no second fork at the first clone
        assert sb.pid1 in _pid1(sup)
    finally:
        sb.remove()


def test_a_killed_spawner_is_replaced_and_sandboxes_keep_starting(box: Sandbox, layout: Layout) -> None:
    sup = _supervisor()
    (spawner,) = _spawners(sup)
    os.kill(spawner, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while spawner in _children(sup) and time.monotonic() < deadline:
        time.sleep(0.02)  # reaped by the supervisor, like any child
    second = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    try:
        r = second.exec(["sh", "-c", "echo fine"])
        assert (r.exit_code, r.stdout) == (0, b"fine\n")
        # the new spawner (a new interpreter: ``Spawner.start_fresh``) starts the
        # helpers a review sandbox needs for its checkpoints too
        with Sandbox.create(PolicySpec(workspace=str(layout.workspace), review=True)) as review:
            assert review.exec(["sh", "-c", "echo x > review.txt"]).exit_code == 0
            taken = review.checkpoint()
            assert review.exec(["sh", "-c", "echo y > review.txt"]).exit_code == 0
            review.rollback(taken.id)
            assert review.exec(["cat", "review.txt"]).stdout == b"x\n"
        assert box.exec(["true"]).exit_code == 0  # the first sandbox never noticed
        assert spawner not in _spawners(sup) and len(_spawners(sup)) == 1
        # Both PID 1s are the supervisor's children (a third may be one booted ahead for
        # the next create of this spec: server.ahead).
        assert {box.pid1, second.pid1} <= set(_pid1(sup))
    finally:
        second.remove()


def test_the_spawner_goes_with_the_supervisor(layout: Layout, state_home: Path) -> None:
    Sandbox.create(PolicySpec(workspace=str(layout.workspace)))  # dies with its supervisor
    sup = _supervisor()
    (spawner,) = _spawners(sup)
    pid1s = _pid1(sup)
    os.kill(sup, signal.SIGKILL)
    deadline = time.monotonic() + 10
    # The supervisor too: until its exit has closed its socket, a client's connection
    # (the state fixture's clean-up) is taken and then dropped.
    alive = [sup, spawner, *pid1s]
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _status(p, "State")[:1] not in ([], ["Z"])]
        time.sleep(0.02)
    assert not alive, f"left behind after the supervisor died: {alive}"


def test_a_network_helper_comes_from_the_spawner_or_where_none_runs_from_the_supervisor(
    layout: Layout, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A network helper is cloned by the spawner (``spawner.HELPERS``), so it shares the
    spawner's quiet pages instead of holding a copy of the supervisor's (about 6 MB of
    its own: ``bench/bench_sandbox.py --network``). Judged on the host by what its memory
    holds: another sandbox's name, made after the spawner started, is in the
    supervisor's memory and not in the helper's. Where no spawner runs as the helper
    starts again (killed, none cloned since), the supervisor forks it, as before: it has
    that name then, and the sandbox's network works the same."""
    import secrets

    monkeypatch.setenv("WARREN_SPARE_IDLE", "1")
    ws = layout.workspace
    assert Sandbox.list() == []  # the supervisor and its spawner, before the name exists
    marker = "marker-" + secrets.token_hex(8)
    other = Sandbox.create(PolicySpec(workspace=str(ws)), name=marker)
    with loopback_http("127.0.0.2") as (port, asked):
        spec = PolicySpec(workspace=str(ws), network="allow", allow_hosts=[f"127.0.0.2:{port}"])
        box = Sandbox.create(spec)
        try:
            sup = _supervisor()
            first = box.exec(["curl", "-fsS", "-o", "/dev/null", f"http://127.0.0.2:{port}/first"])
            assert first.exit_code == 0, first
            (helper,) = network_helpers()
            assert _status(helper, "PPid") == [str(sup)]  # the supervisor's child: it reaps it
            assert memory_holds(sup, marker.encode())  # the control
            assert not memory_holds(helper, marker.encode())
            waiter = box.spawn(
                [
                    "sh",
                    "-c",
                    f"while ! test -e go; do sleep 0.05; done; curl -fsS http://127.0.0.2:{port}/late",
                ],
                cwd=str(ws),
            )
            deadline = time.monotonic() + 30
            while network_helpers():
                assert time.monotonic() < deadline, "the idle network helper did not end"
                time.sleep(0.1)
            (spawner,) = _spawners(sup)
            os.kill(spawner, signal.SIGKILL)
            while spawner in _children(sup) and time.monotonic() < deadline:
                time.sleep(0.02)
            (ws / "go").touch()  # the connection starts the next helper
            assert waiter.wait(timeout=30) == 0 and asked == ["/first", "/late"]
            (forked,) = network_helpers()
            assert _spawners(sup) == []  # none was had: the supervisor forked it
            assert _status(forked, "PPid") == [str(sup)] and memory_holds(forked, marker.encode())
        finally:
            box.remove()
            other.remove()


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="the helper is not dumpable: only root reads its memory (uid 1001 runs the review "
    "and snapshot tests, which use it)",
)
def test_a_review_sandbox_s_helper_in_its_namespaces_comes_from_the_spawner(
    layout: Layout, state_home: Path, tmp_path: Path
) -> None:
    """The helper a review sandbox keeps in its namespaces for its checkpoints
    (``joined.Helper``) is cloned by the spawner too, so it holds none of the
    supervisor's later pages: another sandbox's name, made after the spawner started,
    is in the supervisor's memory and not in the helper's (a fork of the supervisor
    would hold it: the test fails on the code before)."""
    import secrets

    from conftest import joined_helpers

    assert Sandbox.list() == []  # the supervisor and its spawner, before the name exists
    marker = "marker-" + secrets.token_hex(8)
    other = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name=marker)
    ws = tmp_path / "review"
    ws.mkdir()
    box = Sandbox.create(PolicySpec(workspace=str(ws), review=True))
    try:
        assert box.exec(["sh", "-c", "echo x > f"], cwd=str(ws)).exit_code == 0
        box.checkpoint()
        deadline = time.monotonic() + 30
        while not joined_helpers():
            assert time.monotonic() < deadline, "no helper in the review sandbox's namespaces"
            time.sleep(0.05)
        (helper,) = joined_helpers()
        sup = _supervisor()
        assert _status(helper, "PPid") == [str(sup)]  # the supervisor's child: it reaps it
        assert memory_holds(sup, marker.encode())  # the control
        assert not memory_holds(helper, marker.encode())
        assert box.exec(["sh", "-c", "echo y > f"], cwd=str(ws)).exit_code == 0
        assert box.rollback(box.checkpoints()[-1].id).stopped == ""
        assert (ws / "f").exists() is False  # the host workspace untouched (review)
        assert box.exec(["cat", "f"], cwd=str(ws)).stdout == b"x\n"
    finally:
        box.remove()
        other.remove()


def test_a_paused_sandbox_s_python_thaw_guard_comes_from_the_spawner(
    layout: Layout, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox paused by its freezer has a guard that thaws it if the supervisor dies
    (``pause._thaw_guard``; ``test_limits_live.py`` kills the supervisor). A sandbox may
    stay paused for hours: the guard is native where it was built (``warren-thaw``,
    ``test_limits_live.py``), else — here, ``WARREN_NATIVE_THAW=0`` — cloned by the
    spawner, so it holds none of the supervisor's later pages (another sandbox's name,
    made after the spawner started, is in the supervisor's memory and not in the
    guard's), and it ends with the resume."""
    import secrets

    monkeypatch.setenv("WARREN_NATIVE_THAW", "0")

    from conftest import comm
    from test_limits_live import _pause_mechanism
    from warren.server import pause

    assert Sandbox.list() == []  # the supervisor and its spawner, before the name exists
    marker = "marker-" + secrets.token_hex(8)
    other = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name=marker)
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    try:
        assert box.exec(["true"]).exit_code == 0
        sup = _supervisor()
        if not _pause_mechanism(layout).startswith("cgroup"):
            pytest.skip("paused by signals here (no freezer for this caller): no guard is needed")
        box.pause()
        try:
            deadline = time.monotonic() + 10
            while not (guards := [p for p in _children(sup) if comm(p) == pause.NAME]):
                assert time.monotonic() < deadline, "no thaw guard for the paused sandbox"
                time.sleep(0.02)
            (guard,) = guards
            assert memory_holds(sup, marker.encode())  # the control
            assert not memory_holds(guard, marker.encode())
        finally:
            box.resume()
        deadline = time.monotonic() + 10
        while guard in _children(sup):
            assert time.monotonic() < deadline, "the guard outlived the resume"
            time.sleep(0.02)
        assert box.exec(["echo", "resumed"]).stdout == b"resumed\n"
    finally:
        box.remove()
        other.remove()
