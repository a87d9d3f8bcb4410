"""Sandboxes count against their caller's cgroups, wherever the supervisor runs.

The supervisor serves many clients; each sandbox goes beneath the cgroups of the client
that asked (read from the kernel for the connected peer), not the supervisor's. Judged
from the host: where the sandbox's group is, how many tasks the caller's group ever held
(pids.peak), what the outcome names. Root: a v1 pids group with pids.max 60 made by the
test. uid 1001: this host's cgroup2 has no pids controller, so only the placement can be
shown there (beneath the client's child group of its delegated group), not a cap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import WARREN, run_cli
from warren._core import cgroups
from warren.errors import SandboxError
from warren.plan.limits import OVERHEAD_TASKS, V2, CgroupFacts, CgroupPlan, Hierarchy, Placement, place
from warren.plan.limits import plan as plan_limits
from warren.plan.limits import render as render_limits
from warren.policy.limits import Limits

CG = "/sys/fs/cgroup"
ROOT_PIDS = os.getuid() == 0 and os.access(f"{CG}/pids/cgroup.procs", os.W_OK)
CAP = 60
FLOOD = 150

# Forks FLOOD sleepers (a refused fork is counted, not fatal), prints how many it got.
FORKER = (
    "import os, time\n"
    "n = 0\n"
    f"for i in range({FLOOD}):\n"
    "    try:\n"
    "        if os.fork() == 0:\n"
    "            time.sleep(2)\n"
    "            os._exit(0)\n"
    "        n += 1\n"
    "    except OSError:\n"
    "        pass\n"
    "print('forked', n)\n"
)


def _own(key: str) -> str:
    """This process's group: a v1 controller's, or cgroup2's ("")."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _id, ctrls, path = line.split(":", 2)
        if (key == "" and ctrls == "") or (key and key in ctrls.split(",")):
            mount = f"{CG}/unified" if key == "" else f"{CG}/{key}"
            return os.path.normpath(mount + path)
    raise AssertionError(key)


def _delegated_v2() -> str | None:
    """This uid's own cgroup2 group (scripts/test delegates one to uid 1001), if any."""
    v2 = _own("")
    if v2 != f"{CG}/unified" and os.access(v2, os.W_OK) and os.access(f"{v2}/cgroup.procs", os.W_OK):
        return v2
    return None


def _remove(group: str) -> None:
    """``group`` and what is beneath it removed, killing what is left inside; a sandbox's
    group beneath may be going at the same time (the supervisor removes it as the
    sandbox's PID 1 exits, a moment after its run returned)."""
    deadline = time.monotonic() + 10
    while os.path.isdir(group):
        with contextlib.suppress(FileNotFoundError):
            for sub in os.listdir(group):
                if os.path.isdir(os.path.join(group, sub)):
                    _remove(os.path.join(group, sub))
        try:
            os.rmdir(group)
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            try:
                pids = Path(group, "cgroup.procs").read_text().split()
            except OSError as e:
                # Gone, or going: the supervisor's rmdir of it has begun (ENODEV).
                if e.errno not in (errno.ENOENT, errno.ENODEV):
                    raise
                pids = []
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            time.sleep(0.05)


@pytest.fixture
def groups() -> Iterator[tuple[str, str]]:
    """(capped, uncapped): two groups beneath this test's own, the first with pids.max 60
    (root, v1 pids), or two children of the delegated cgroup2 group (uid 1001)."""
    if ROOT_PIDS:
        base = _own("pids")
    else:
        delegated = _delegated_v2()
        if delegated is None:
            pytest.skip("uid 1001 with no delegated cgroup2 group and no v1 access: no caller group to make")
        base = delegated
    made = [os.path.join(base, f"warren-caller-{os.getpid()}-{kind}") for kind in ("capped", "free")]
    for g in made:
        os.mkdir(g)
    if ROOT_PIDS:
        Path(made[0], "pids.max").write_text(str(CAP))
    try:
        yield made[0], made[1]
    finally:
        for g in made:
            _remove(g)


def _enter(group: str) -> list[str]:
    """argv prefix: the process moves itself into ``group``, then execs the rest."""
    return ["sh", "-c", f'echo $$ > {group}/cgroup.procs && exec "$@"', "client"]


def _in_group(group: str, args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """A client moved into ``group`` before it starts warren (the supervisor is
    already running elsewhere), with the group watched from the host meanwhile."""
    return subprocess.run(
        [*_enter(group), *WARREN, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


class Watch:
    """From the host: the sandbox groups that appear beneath ``group`` while it runs."""

    def __init__(self, group: str, uid: int | None = None) -> None:
        self.group = group
        self.prefix = f"warren-{os.getuid() if uid is None else uid}-"
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.seen |= {d for d in os.listdir(self.group) if d.startswith(self.prefix)}
            self._stop.wait(0.01)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _supervisor_group(state: Path) -> str:
    from warren.server import statedir

    found = statedir.read_address(statedir.location({**os.environ, "XDG_STATE_HOME": str(state)}))
    assert found is not None
    key = "pids" if ROOT_PIDS else ""
    for line in Path(f"/proc/{found[1]}/cgroup").read_text().splitlines():
        _id, ctrls, path = line.split(":", 2)
        if (key == "" and ctrls == "") or (key and key in ctrls.split(",")):
            return os.path.normpath((f"{CG}/pids" if key else f"{CG}/unified") + path)
    raise AssertionError(key)


@pytest.mark.parametrize("via", ["run", "exec"])
def test_a_sandbox_counts_against_its_callers_cgroup_not_the_supervisors(
    state_home: Path, tmp_path: Path, groups: tuple[str, str], via: str
) -> None:
    capped, free = groups
    ws = tmp_path / "ws"
    ws.mkdir()
    # The supervisor starts first, from this test process, outside both groups.
    assert run_cli(["run", "--", "true"], cwd=ws).returncode == 0
    sup_before = _supervisor_group(state_home)
    assert not any(sup_before.startswith(g) for g in groups)
    results = {}
    for group in (capped, free):
        if via == "run":
            args = ["run", "--pids", "200", "--", "python3", "-c", FORKER]
        else:
            name = f"cg{os.getpid()}{os.path.basename(group)[-4:]}"
            made = _in_group(group, ["create", "--pids", "200", name], ws)
            assert made.returncode == 0, made.stderr
            args = ["exec", name, "python3", "-c", FORKER]
        with Watch(group) as watch:
            r = _in_group(group, args, ws)
        if via == "exec":
            run_cli(["rm", "-f", name], cwd=ws)
        assert r.returncode == 0, r.stderr
        results[group] = (int(r.stdout.split()[-1]), r.stderr, watch.seen)
    # The supervisor never moved: only the sandboxes went beneath their callers.
    assert _supervisor_group(state_home) == sup_before
    for group in (capped, free):
        assert results[group][2], f"no sandbox group appeared beneath the caller's {group}"
    forked, err, _seen = results[capped]
    free_forked, free_err, _ = results[free]
    if ROOT_PIDS:
        # The caller's cap held (judged by the kernel's own peak of the caller's group)
        # and the outcome names it; the control, with no cap, forked them all.
        assert int(Path(capped, "pids.peak").read_text()) <= CAP
        assert forked < CAP, forked
        assert f"pids limit {CAP} of the caller's cgroup {capped} reached" in err, err
        assert free_forked == FLOOD, free_err
        assert int(Path(free, "pids.peak").read_text()) > CAP
        assert "caller's cgroup" not in free_err
    else:
        # No pids controller in this host's cgroup2: both floods complete; the placement
        # above is what can be shown for uid 1001.
        assert forked == FLOOD and free_forked == FLOOD


@dataclass
class OtherUser:
    """uid 1001 driven by this root test: its own home, state (so its own supervisor)
    and workspace; ``argv`` runs warren as it."""

    argv: list[str]
    ws: Path

    def run(self, *args: str, group: str | None = None) -> subprocess.CompletedProcess[str]:
        before = _enter(group) if group else []
        return subprocess.run([*before, *self.argv, *args], cwd=self.ws, capture_output=True, text=True)


@pytest.fixture
def other_user() -> Iterator[OtherUser]:
    if not ROOT_PIDS:
        pytest.skip("needs root: it puts a uid 1001 client into groups that uid cannot enter itself")
    try:
        user = pwd.getpwuid(1001)
    except KeyError:
        pytest.skip("no user with uid 1001")
    top = Path(tempfile.mkdtemp(prefix="warren-caller-"))
    top.chmod(0o755)
    home = top / "u"
    ws = home / "ws"
    ws.mkdir(parents=True)
    os.chown(home, 1001, user.pw_gid)
    os.chown(ws, 1001, user.pw_gid)
    env = [
        "env",
        "-i",
        f"PATH={os.path.dirname(sys.executable)}:/usr/bin:/bin",
        f"HOME={home}",
        f"XDG_STATE_HOME={home}/state",
        "LANG=C.UTF-8",
        "PYTHONDONTWRITEBYTECODE=1",
    ]
    u = OtherUser(["runuser", "-u", user.pw_name, "--", *env, *WARREN], ws)
    try:
        yield u
    finally:
        u.run("shutdown")
        shutil.rmtree(top, ignore_errors=True)


def test_a_caller_the_supervisor_cannot_reach_is_refused_not_escaped(other_user: OtherUser) -> None:
    """Root puts a uid 1001 client into a root-owned v1 pids group with pids.max 60,
    while that user's supervisor runs outside it: uid 1001 cannot make or join a group
    there, so the run is refused (naming the group and its limit) instead of escaping to
    the supervisor's group. The control: the same client in the supervisor's group runs."""
    capped = os.path.join(_own("pids"), f"warren-caller-{os.getpid()}-root")
    os.mkdir(capped)
    Path(capped, "pids.max").write_text(str(CAP))
    try:
        first = other_user.run("run", "--", "sh", "-c", "touch first")
        assert first.returncode == 0, first.stderr  # the control: its supervisor runs it
        assert (other_user.ws / "first").exists()
        r = other_user.run("run", "--", "sh", "-c", "touch ran", group=capped)
        assert r.returncode == 125, r.stderr
        assert f"pids.max {CAP} of {capped}" in r.stderr and "hint:" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not (other_user.ws / "ran").exists()
        plan = other_user.run("plan", group=capped)
        assert "refused: the supervisor runs in" in plan.stdout, plan.stdout
    finally:
        _remove(capped)


def test_an_undelegated_callers_sandbox_uses_the_supervisors_delegated_group_when_nothing_is_escaped(
    other_user: OtherUser,
) -> None:
    """The systemd case: uid 1001's supervisor runs in a cgroup2 group delegated to it
    (its own scope), the client in one that is not (a login session's scope) with no
    limit set: the sandbox's cgroup2 group goes beneath the supervisor's (pause by
    cgroup.freeze), and the plan says whose it is. The control: in a delegated group of
    its own, beneath the client's."""
    base = _own("")
    delegated = os.path.join(base, f"warren-caller-{os.getpid()}-scope")
    session = os.path.join(base, f"warren-caller-{os.getpid()}-session")
    for g in (delegated, session):
        os.mkdir(g)
    for f in ("", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"):
        os.chown(os.path.join(delegated, f), 1001, -1)
    try:
        assert (
            other_user.run("run", "--", "true", group=delegated).returncode == 0
        )  # its supervisor starts there
        plan = other_user.run("plan", group=session).stdout
        assert "cgroup2 cgroup.freeze" in plan and f"beneath {delegated}: the supervisor's" in plan, plan
        with Watch(delegated, uid=1001) as watch:
            r = other_user.run("run", "--", "true", group=session)
        assert r.returncode == 0, r.stderr
        assert any(d.startswith("warren-1001-") and not d.endswith("supervisor") for d in watch.seen), (
            watch.seen
        )
        own = other_user.run("plan", group=delegated).stdout
        assert f"beneath {delegated}: yours" in own, own
    finally:
        _remove(session)
        _remove(delegated)


def test_the_clients_cgroups_are_read_through_its_pidfd() -> None:
    """A pid whose process is gone (the pidfd says so) is refused with a typed error,
    even while that pid number names a live process: a recycled pid cannot answer."""
    child = subprocess.Popen(["sleep", "30"])
    pidfd = os.pidfd_open(child.pid)
    try:
        assert cgroups.peer_cgroups(child.pid, pidfd) == Path(f"/proc/{child.pid}/cgroup").read_text()
        child.kill()
        child.wait()
        with pytest.raises(SandboxError) as e:
            # This process's own pid is alive: only the pidfd tells it is not the client.
            cgroups.peer_cgroups(os.getpid(), pidfd)
        assert e.value.operation == "cgroup" and e.value.hint
    finally:
        os.close(pidfd)


# --- pure planning ------------------------------------------------------------------------


def _placement(supervisor: str, caller: str, joinable: bool, escaped: tuple[str, ...] = ()) -> Placement:
    return Placement(("pids",), caller, supervisor, joinable, escaped)


def test_placement_goes_beneath_the_caller_joins_it_or_refuses() -> None:
    pids_group = (CgroupPlan("pids", "/sys/fs/cgroup/pids/ci", ()),)
    facts = CgroupFacts(
        1001,
        placements=(
            _placement("/sys/fs/cgroup/pids", "/sys/fs/cgroup/pids/ci", False, ("pids.max 60 of ci",)),
        ),
    )
    # Its own group beneath the caller's: nothing else to do.
    assert place(facts, pids_group) == ((), ())
    # No group of its own: joined when it may be, refused when it would escape a limit.
    joinable = CgroupFacts(0, placements=(_placement("/a", "/a/ci", True, ("pids.max 60 of /a/ci",)),))
    assert place(joinable, ()) == (("/a/ci",), ())
    joins, refused = place(facts, ())
    assert joins == () and "would escape pids.max 60 of ci" in refused[0]
    # Nothing set on the caller's side (or the supervisor inside the caller's group):
    # staying where the supervisor is escapes nothing.
    assert place(CgroupFacts(1001, placements=(_placement("/a", "/a/ci", False),)), ()) == ((), ())
    assert place(CgroupFacts(1001, placements=(_placement("/a/ci/s", "/a/ci", False, ("x",)),)), ()) == (
        (),
        (),
    )


def test_a_limit_met_in_the_callers_group_is_named_as_the_callers() -> None:
    facts = CgroupFacts(
        0,
        (Hierarchy("pids", "/sys/fs/cgroup/pids/ci", True),),
        pids_caps=(("/sys/fs/cgroup/pids/ci", 60), ("/sys/fs/cgroup/pids", 5000)),
    )
    lp = plan_limits(Limits(pids=200), facts, 8 << 30, 2)
    assert any(c.file == "pids.peak" and c.key == "" for c in lp.counters)
    own = 200 + OVERHEAD_TASKS
    assert lp.reached("pids", peak=55) == (
        "pids limit 60 of the caller's cgroup /sys/fs/cgroup/pids/ci reached, not the sandbox's own (200)"
    )
    assert lp.reached("pids", peak=own) == "pids limit 200 reached"
    assert lp.reached("pids") == "pids limit 200 reached"
    assert any("caller cap" in line for line in render_limits(lp))
    # A cgroup2 caller's group: the same, read from the one group.
    v2 = CgroupFacts(
        1001, v2_path="/u/ci", v2_controllers=("pids",), v2_writable=True, pids_caps=(("/u/ci", 60),)
    )
    lp2 = plan_limits(Limits(pids=200), v2, 8 << 30, 2)
    assert any(c.controller == V2 and c.file == "pids.peak" for c in lp2.counters)
