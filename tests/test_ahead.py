"""One-shot sandboxes booted ahead (``server.ahead``): a run that takes one gets a
sandbox no command could tell from a fresh one, and a change on the host or in the
config between the boot and the run is never served by the stale one.

Each scenario runs the same request twice (from its second run on, the supervisor boots
the next sandbox for it), waits until the booted sandbox's TMPDIR is there, changes
something, and runs again: that run's TMPDIR is the booted one's when it took it
(asserted where the scenario expects it). The suite runs as root and as uid 1001.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import WARREN, host_files, loopback_http, run_cli, server_of
from warren import PolicySpec, Sandbox
from warren._core import procs
from warren.server import ahead


class Place:
    """A workspace ``ws`` beside the caller's cache (XDG_CACHE_HOME), on /var/tmp's
    filesystem, so the sandbox's TMPDIR is a host directory: cache/warren/tmp/ID."""

    def __init__(self, base: Path) -> None:
        self.base, self.ws, self.cache = base, base / "ws", base / "cache"
        self.ws.mkdir(parents=True)
        self.cache.mkdir()
        self.env = {"XDG_CACHE_HOME": str(self.cache)}

    def run(self, script: str, *flags: str) -> tuple[int, str, str]:
        r = run_cli(
            ["run", *flags, "--", "sh", "-c", script],
            cwd=self.ws,
            env=self.env,
            timeout=120,
        )
        return r.returncode, r.stdout, r.stderr

    def tmpdirs(self) -> set[str]:
        where = self.cache / "warren" / "tmp"
        return {str(where / n) for n in os.listdir(where)} if where.is_dir() else set()

    def booted(self) -> str:
        """The TMPDIR of the sandbox booted for the next run, once it is there."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = self.tmpdirs()
            if len(found) == 1:
                return found.pop()
            time.sleep(0.02)
        raise AssertionError(f"no sandbox was booted ahead: {self.tmpdirs()}")


@pytest.fixture
def place(state_home: Path) -> Iterator[Place]:
    base = Path("/var/tmp") / f"warren-ahead-{os.getpid()}-{time.monotonic_ns()}"
    with host_files(exclusive=False):  # no host key made in /etc/ssh meanwhile (test_trust_boundary)
        yield Place(base)
    # A sandbox booted for the next run goes after 60 s unused, with its supervisor.
    shutil.rmtree(base, ignore_errors=True)


def _twice(place: Place, script: str = "true", *flags: str) -> None:
    for _ in range(2):
        code, _out, err = place.run(script, *flags)
        assert code == 0, err


def test_a_run_that_takes_a_booted_sandbox_finds_nothing_an_earlier_run_left(place: Place) -> None:
    leave = (
        'echo x > /tmp/left; echo x > "$TMPDIR/left"; echo x > /dev/shm/left; '
        "setsid sleep 300 </dev/null >/dev/null 2>&1 &"
    )
    _twice(place, leave)
    booted = place.booted()
    code, out, err = place.run('echo "$TMPDIR"; ls -A /tmp "$TMPDIR" /dev/shm; ps -e -o args=')
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == booted, "the run took the sandbox booted for it"
    assert "left" not in out, "/tmp, TMPDIR and /dev/shm are new"
    assert not [line for line in lines if line.startswith("sleep")], "no process of an earlier run is there"
    assert not os.path.lexists(booted), "its TMPDIR is removed after the run, as a fresh one's"


def test_runs_in_two_sibling_workspaces_in_turn_each_take_the_sandbox_booted_for_it(
    state_home: Path,
) -> None:
    """Two workspaces side by side whose sandboxes' TMPDIRs are made beside them (no
    cache of the caller's on their filesystem): each launch makes one in their common
    parent, a new entry there, which made the sandbox booted ahead for the other
    workspace stale: runs in turn launched afresh every time (an agent working in two
    repositories; a bench's interleaved runs: 45 ms against 10)."""
    base = Path("/var/tmp") / f"warren-ahead-sib-{os.getpid()}-{time.monotonic_ns()}"
    spaces = {name: base / name for name in ("a", "b")}
    env = {"XDG_CACHE_HOME": "/tmp/warren-ahead-nocache"}  # under /tmp: never the TMPDIR's place

    def run(name: str) -> str:
        r = run_cli(["run", "--", "sh", "-c", 'echo "$TMPDIR"'], cwd=spaces[name], env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def scratch() -> set[str]:
        return {str(base / n) for n in os.listdir(base) if n.startswith(".warren-tmp-")}

    def booted(others: set[str]) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            new = scratch() - others
            if len(new) == 1:
                return new.pop()
            time.sleep(0.02)
        raise AssertionError(f"no sandbox was booted ahead: {scratch()}")

    with host_files(exclusive=False):
        try:
            for path in spaces.values():
                path.mkdir(parents=True)
            assert run("a").startswith(str(base / ".warren-tmp-")), "the TMPDIR is beside the workspace"
            run("a")
            for_a = booted(set())
            run("b")
            run("b")
            for_b = booted({for_a})
            for _ in range(2):
                assert run("a") == for_a, "a's run took the sandbox booted for it"
                for_a = booted({for_b})
                assert run("b") == for_b, "b's run took the sandbox booted for it"
                for_b = booted({for_a})
        finally:
            shutil.rmtree(base, ignore_errors=True)


def test_an_edited_warren_toml_takes_effect_at_the_next_run(place: Place) -> None:
    secret = place.base / "secret.txt"
    secret.write_text("s3cret\n")
    _twice(place, f"cat {secret}")
    stale = place.booted()
    (place.ws / "warren.toml").write_text(f'deny = ["{secret}"]\n')
    code, out, _err = place.run(f'echo "$TMPDIR"; cat {secret}')
    assert code != 0 and "s3cret" not in out, "the new deny holds at once"
    assert out.splitlines()[0] != stale, "the sandbox booted before the edit was not used"
    code, out, _err = place.run(f"cat {secret}")
    assert code != 0 and "s3cret" not in out


def test_a_user_config_edited_in_place_takes_effect_at_the_next_run(place: Place) -> None:
    """The booted sandbox's policy is kept while nothing it was resolved from changed
    (``policymemo``); an edit in place of the user's config changes no name the kernel
    would tell of: its bytes are what say so."""
    for name in ("secret.txt", "public.txt"):
        (place.base / name).write_text(f"{name}-s3cret\n")
    config = place.base / "config" / "warren" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'deny = ["{place.base / "public.txt"}"]\n')
    place.env["XDG_CONFIG_HOME"] = str(place.base / "config")
    _twice(place, f"cat {place.base}/secret.txt")
    stale = place.booted()
    with open(config, "r+") as f:  # the same file, the same size
        text = f.read()
        f.seek(0)
        f.write(text.replace("public.txt", "secret.txt"))
    code, out, _err = place.run(f'echo "$TMPDIR"; cat {place.base}/public.txt {place.base}/secret.txt')
    assert "public.txt-s3cret" in out and "secret.txt-s3cret" not in out, (code, out)
    assert out.splitlines()[0] != stale, "the sandbox booted before the edit was not used"


def test_a_denied_directory_replaced_on_the_host_stays_hidden(place: Place) -> None:
    secret = place.base / "secret"
    secret.mkdir()
    (place.ws / "warren.toml").write_text(f'deny = ["{secret}"]\n')
    _twice(place, f"ls -A {secret} || true")
    place.booted()
    shutil.rmtree(secret)
    secret.mkdir()
    (secret / "key").write_text("s3cret\n")
    code, out, err = place.run(f"ls -A {secret}; cat {secret}/key")
    assert "s3cret" not in out and "key" not in out, (code, out, err)


def test_a_denied_directory_reached_through_a_retargeted_link_stays_hidden(place: Place) -> None:
    """The deny names a path through a link; the link is pointed at another directory
    after the boot: the run hides the one it names now, and the one it named before is
    readable, as in a fresh sandbox."""
    for d in ("a", "b"):
        (place.base / d / "secret").mkdir(parents=True)
        (place.base / d / "secret" / "key").write_text(f"{d}-s3cret\n")
    (place.base / "via").symlink_to(place.base / "a")
    (place.ws / "warren.toml").write_text(f'deny = ["{place.base / "via" / "secret"}"]\n')
    _twice(place, "true")
    place.booted()
    (place.base / "via.new").symlink_to(place.base / "b")
    os.rename(place.base / "via.new", place.base / "via")
    code, out, err = place.run(f"cat {place.base}/a/secret/key; cat {place.base}/via/secret/key")
    assert "b-s3cret" not in out and "a-s3cret" in out, (code, out, err)


def test_a_replaced_workspace_is_the_one_the_next_run_sees(place: Place) -> None:
    _twice(place, "true")
    place.booted()
    os.rename(place.ws, place.base / "ws.old")
    place.ws.mkdir()
    (place.ws / "f").write_text("new\n")
    code, out, err = place.run("cat f; echo w > g")
    assert (code, out) == (0, "new\n"), err
    assert (place.ws / "g").read_text() == "w\n"
    assert not (place.base / "ws.old" / "g").exists()


def test_a_booted_sandbox_whose_workspace_is_made_again_is_stopped_before_any_run(
    place: Place, state_home: Path
) -> None:
    """A harness that copies its project anew into the same directory before each run:
    the sandbox booted for the old directory is stopped once the supervisor hears the
    directory went (its TMPDIR is removed, no run needed), and the next run, fresh, sees
    the new copy."""
    _twice(place, "true")
    booted = place.booted()
    # Ready, most likely: a change before PID 1 is ready is found by the check made then
    # ("stopped once ready"), which the log may say instead on a slow machine.
    time.sleep(1)
    shutil.rmtree(place.ws)
    place.ws.mkdir()
    (place.ws / "f").write_text("new\n")
    deadline = time.monotonic() + 10
    while os.path.lexists(booted) and time.monotonic() < deadline:
        time.sleep(0.05)
    log = (state_home / "warren" / "supervisor.log").read_text()
    told = (f"stopped unused: {place.ws} was removed or moved away", f"stopped once ready: {place.ws} is")
    assert any(t in log for t in told), log[-2000:]
    assert not os.path.lexists(booted), "its TMPDIR is removed with it"
    code, out, err = place.run('cat f; echo "$TMPDIR"; echo w > g')
    assert code == 0, err
    assert out.splitlines()[0] == "new"
    assert out.splitlines()[1] != booted
    assert (place.ws / "g").read_text() == "w\n"


def test_a_network_allow_run_takes_a_booted_sandbox_and_its_client_hears_the_proxy(place: Place) -> None:
    """A ``--network allow`` run is booted ahead like a plain one: the run that takes it
    reaches an allowed server (a loopback one of this test's, by name) through the proxy, and the
    proxy's refusal of a host not on the allowlist reaches the run's own client, as for a
    fresh sandbox: the booted proxy's helper was given the run's event pipe first."""
    with loopback_http() as (port, asked):
        # A name the proxy resolves to the server (loopback: its address is listed too).
        flags = (
            "--network=allow",
            f"--allow-host=allowed.test:{port}",
            f"--allow-host=127.0.0.2:{port}",
            "--resolve=allowed.test=127.0.0.2",
        )
        script = (
            f'echo "$TMPDIR"; curl -sS --max-time 10 http://allowed.test:{port}/run; '
            "curl -sS --max-time 10 -o /dev/null http://denied.test:9/ || true"
        )
        _twice(place, "true", *flags)
        booted = place.booted()
        code, out, err = place.run(script, *flags)
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == booted, "the run took the sandbox booted for it"
        assert lines[1:2] == ["ok"] and asked[-1:] == ["/run"], err
        refused = [line for line in err.splitlines() if line.startswith("warren: network: refused")]
        assert refused == [
            "warren: network: refused GET denied.test:9: denied.test:9 is not on the allowlist"
            " (add --allow-host denied.test:9)"
        ], err
        # The next one is booted for too, and served the same way.
        booted = place.booted()
        code, out, err = place.run(script, *flags)
        assert code == 0 and out.splitlines()[0] == booted, err
        assert "warren: network: refused GET denied.test:9" in err


def test_a_run_with_other_flags_is_not_given_the_booted_sandbox(place: Place) -> None:
    _twice(place, "true")
    booted = place.booted()
    script = 'echo "$TMPDIR"; touch /etc/x 2>/dev/null && echo wrote; true'
    code, out, err = place.run(script, "--read", "/etc")
    assert code == 0, err
    assert booted not in out and "wrote" not in out


def test_a_create_that_takes_a_booted_sandbox_gets_a_fresh_one_under_its_name(place: Place) -> None:
    env = {"XDG_CACHE_HOME": str(place.cache)}
    made = []
    for i in range(3):
        name = f"ahead{os.getpid()}-{i}"
        if i == 2:
            booted = place.booted()
        assert run_cli(["create", name], cwd=place.ws, env=env).returncode == 0
        made.append(name)
        r = run_cli(
            ["exec", name, "sh", "-c", 'echo "$TMPDIR"; ls -A /tmp; echo x > /tmp/left; pwd'],
            cwd=place.ws,
            env=env,
        )
        assert r.returncode == 0, r.stderr
        tmpdir, *rest = r.stdout.splitlines()
        assert rest == [str(place.ws)], "nothing left in /tmp by the sandboxes before; cwd the workspace"
        if i == 2:
            assert tmpdir == booted, "the third create took the sandbox booted for it"
            listed = run_cli(["ls"], cwd=place.ws, env=env).stdout.splitlines()[1:]
            assert [line.split()[0] for line in listed] == [name], "the booted one is listed as it"
        assert run_cli(["rm", "-f", name], cwd=place.ws, env=env).returncode == 0
    assert not os.path.lexists(booted), "its TMPDIR goes with it"


def _processes() -> dict[int, list[int]]:
    """Children of each process, from the host's /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    return children


def _supervisor(state_home: Path) -> int:
    """This test's supervisor's pid (from its address file)."""
    with open(state_home / "warren" / "supervisor.addr") as f:
        return int(f.read().split()[1])


def _spares(state_home: Path) -> dict[int, list[int]]:
    """Each sandbox's PID 1 (a child of this test's supervisor) and its children that
    wait as spares (a helper with one child: its command's process made ahead)."""
    supervisor = _supervisor(state_home)
    children = _processes()
    return {
        pid1: [h for h in children.get(server_of(pid1), []) if len(children.get(h, [])) == 1]
        for pid1 in children.get(supervisor, [])
        if children.get(pid1)
    }


def _one_spare(state_home: Path, seen: dict[int, list[int]]) -> bool:
    """One sandbox with one spare, its command's process there: one look at the host,
    kept in ``seen`` (a booted sandbox found stale may be replaced by another between
    two looks, its spare then another's)."""
    seen.clear()
    seen.update({p: s for p, s in _spares(state_home).items() if s})
    spares = [s for s in seen.values()]
    return [len(s) for s in spares] == [1] and len(_processes().get(spares[0][0], [])) == 1


def _wait(what: str, condition: Callable[[], bool], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_run_s_booted_sandbox_keeps_its_spare_past_the_spare_idle_time(
    place: Place, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a sandbox booted for the next run is for is serving that run at once: its
    spare stays until then (the supervisor stops it whole after ``ahead.IDLE`` unused),
    where a long-lived sandbox's spare goes after ``WARREN_SPARE_IDLE`` (the control)."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    _twice(place)
    seen: dict[int, list[int]] = {}
    _wait("the booted sandbox's spare", lambda: _one_spare(state_home, seen))
    ((pid1, spares),) = seen.items()
    time.sleep(2.0)  # four times the spare idle time: nothing is to happen
    assert _spares(state_home).get(pid1) == spares
    # Control: a long-lived sandbox's spare goes after the same idle time.
    box = Sandbox.create(PolicySpec(workspace=str(place.ws)))
    try:
        assert box.exec(["true"]).exit_code == 0
        _wait("a spare of the long-lived sandbox", lambda: bool(_spares(state_home).get(box.pid1)))
        _wait("its spare gone after WARREN_SPARE_IDLE", lambda: not _spares(state_home).get(box.pid1))
    finally:
        box.remove()


def test_a_creates_booted_sandbox_keeps_its_spare_until_it_is_created_then_lets_it_go_when_idle(
    place: Place, state_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandbox booted for the next create keeps its spare however long it waits, so
    that the create's first exec finds one; once it is the create's sandbox
    (``protocol.Adopted``) its spare goes after ``WARREN_SPARE_IDLE`` without a request,
    as any long-lived sandbox's, and the next exec forks another."""
    monkeypatch.setenv("WARREN_SPARE_IDLE", "0.5")
    env = {"XDG_CACHE_HOME": str(place.cache)}
    names = [f"keep{os.getpid()}-{i}" for i in range(3)]
    try:
        for name in names[:2]:  # the second create of the same words boots the next one
            assert run_cli(["create", name], cwd=place.ws, env=env).returncode == 0
            assert run_cli(["rm", "-f", name], cwd=place.ws, env=env).returncode == 0
        booted = place.booted()
        seen: dict[int, list[int]] = {}
        _wait("the booted sandbox's spare", lambda: _one_spare(state_home, seen))
        ((pid1, spares),) = seen.items()
        time.sleep(2.0)  # four times the spare idle time
        assert _spares(state_home).get(pid1) == spares, "the booted sandbox kept its spare"
        assert run_cli(["create", names[2]], cwd=place.ws, env=env).returncode == 0
        (info,) = [i for i in Sandbox.list() if i.name == names[2]]
        assert info.pid1 == pid1, "the create took the sandbox booted for it"
        _wait("its spare let go once idle as a created sandbox", lambda: not _spares(state_home).get(pid1))
        r = run_cli(["exec", names[2], "sh", "-c", 'echo "$TMPDIR"'], cwd=place.ws, env=env)
        assert (r.returncode, r.stdout) == (0, booted + "\n"), r.stderr
    finally:
        for name in names:
            run_cli(["rm", "-f", name], cwd=place.ws, env=env)


def test_a_run_takes_its_booted_sandbox_s_spare_and_the_sandbox_ends_with_it(
    place: Place, state_home: Path
) -> None:
    """A sandbox booted for the next run gives its spare to the supervisor, which hands
    it the run (and, the exec stub loaded, the command to its waiting process) without
    PID 1. Judged from the host: the command runs as the process that waited, its
    stdin, output and exit status are the client's, and the sandbox ends with it (PID 1
    hears the spare took the run, and ends once that helper is gone).

    Under a parallel suite the host may change between the boot and the run (another
    test's mount, or a file under this user's home made again): the booted sandbox is
    then rightly not used, the supervisor's log says why, and the whole is tried once
    more (a gate failed here once under load; its log went with its temporary directory)."""
    script = 'read line; echo "got $line"; exit 7'
    argv = ["sh", "-c", script]
    for attempt in (1, 2):
        _twice(place)
        seen: dict[int, list[int]] = {}
        _wait("the booted sandbox's spare", lambda seen=seen: _one_spare(state_home, seen))
        ((pid1, [helper]),) = seen.items()
        (waiting,) = _processes()[helper]
        proc = subprocess.Popen(
            [*WARREN, "run", "--", "sh", "-c", script],
            cwd=place.ws,
            env={**os.environ, "XDG_CACHE_HOME": str(place.cache)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            try:
                _wait("the command in the process that waited", lambda w=waiting: procs.cmdline(w) == argv)
            except AssertionError:
                log = (state_home / "warren" / "supervisor.log").read_text().splitlines()
                why = [line for line in log if "booted ahead was" in line]
                if attempt == 1 and why:  # not used, or stopped unused: the log says why
                    continue
                raise AssertionError(
                    f"the booted sandbox's waiting process never got the run: {why}"
                ) from None
            out, err = proc.communicate("hi\n", timeout=60)
        finally:
            proc.kill()
            proc.wait()
        break
    assert proc.returncode == 7, err
    assert out == "got hi\n"
    _wait("the used sandbox's PID 1 gone", lambda: not os.path.exists(f"/proc/{pid1}"))


def test_a_run_too_long_for_the_spare_goes_through_pid1_and_ends(place: Place, state_home: Path) -> None:
    """A run the supervisor cannot hand to the spare (an argument over ``DIRECT_MAX``)
    goes through PID 1, which serves it with a helper of its own and lets the unused
    spare go: the run ends (PID 1 would otherwise wait for that spare forever)."""
    from warren.server import box as box_mod

    _twice(place)
    booted = place.booted()
    _wait("the booted sandbox's spare", lambda: any(_spares(state_home).values()))
    long = "x" * (box_mod.DIRECT_MAX + 1000)
    r = run_cli(
        ["run", "--", "sh", "-c", 'echo "$TMPDIR ${#1}"', "sh", long],
        cwd=place.ws,
        env={"XDG_CACHE_HOME": str(place.cache)},
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [booted, str(len(long))], "the booted sandbox ran it, whole"


def test_a_file_made_beside_a_denied_one_after_the_boot_is_read_by_the_booted_sandbox(
    place: Place, state_home: Path
) -> None:
    """The denied directory's neighbours get a read rule each, listed when PID 1 built
    its rules; a file made there once the booted sandbox is ready has none. The run
    still takes the booted sandbox (its rules are built again first) and reads it, as
    a fresh sandbox would; the control, a file there before the boot, reads alike."""
    d = place.base / "d"
    (d / "secret").mkdir(parents=True)
    (d / "before").write_text("old\n")
    (place.ws / "warren.toml").write_text(f'deny = ["{d / "secret"}"]\n')
    _twice(place, "true")
    booted = place.booted()
    _wait("the booted sandbox ready, its spare forked", lambda: any(_spares(state_home).values()))
    (d / "after").write_text("new\n")
    code, out, err = place.run(f'echo "$TMPDIR"; cat {d}/before {d}/after; ls {d}/secret | wc -l')
    assert code == 0, err
    assert out.splitlines() == [booted, "old", "new", "0"], "the booted sandbox, its rules built again"


# --- the pool's bookkeeping ------------------------------------------------------------------


def test_a_request_is_booted_ahead_for_only_from_its_second_run_within_the_idle_time() -> None:
    pool = ahead.Pool()
    assert not pool.again(("a",), 0.0)
    assert pool.again(("a",), 1.0)
    assert not pool.again(("b",), 2.0)
    assert not pool.again(("a",), 2.0 + ahead.IDLE + 1)


def test_the_pool_remembers_a_bounded_number_of_requests() -> None:
    pool = ahead.Pool()
    for i in range(ahead.SEEN + 10):
        pool.again((i,), float(i))
    assert len(pool.seen) == ahead.SEEN
    assert not pool.again((0,), float(ahead.SEEN + 10)), "the oldest were forgotten"


def test_booted_only_in_cgroups_the_supervisor_is_in_itself() -> None:
    caller = "4:memory:/job\n1:pids:/job\n0::/user/job\n"
    assert ahead.lingers_anyway(caller, caller)
    assert ahead.lingers_anyway(caller, "4:memory:/job\n1:pids:/job/sub\n0::/user/job/warren-1-supervisor\n")
    assert not ahead.lingers_anyway(caller, "4:memory:/\n1:pids:/job\n0::/user/job\n"), "a job of its own"
    assert not ahead.lingers_anyway(caller, "4:memory:/jobs\n1:pids:/job\n0::/user/job\n")
    assert not ahead.lingers_anyway(caller, "1:pids:/job\n0::/user/job\n")
    assert not ahead.lingers_anyway(None, caller)


@pytest.mark.parametrize("via", ["run", "create"])
def test_a_link_the_host_made_after_the_boot_never_takes_a_write_outside(
    place: Place, monkeypatch: pytest.MonkeyPatch, via: str
) -> None:
    """A large workspace is walked for hard links beside its launch, so a sandbox booted
    ahead was walked at its boot. The host then links a file of its own into the
    workspace (as a host `uv sync` links its cache into `.venv`) before the next run or
    create, which takes the booted sandbox: walked again before anything of it starts,
    its write goes to a copy of its own; judged on the host."""
    monkeypatch.setenv("WARREN_NATIVE_WALK", "1")  # every tree is large: walked beside the launch
    env = {"XDG_CACHE_HOME": str(place.cache)}
    outside = place.base / "cache-entry.py"
    outside.write_text("original\n")
    script = 'echo "$TMPDIR"; echo planted >> linked.py'
    if via == "run":
        _twice(place)
        booted = place.booted()
        time.sleep(1.0)  # its walk of these few files has ended: the link comes after it
        os.link(outside, place.ws / "linked.py")
        code, out, err = place.run(script)
        assert code == 0, err
    else:
        for i in range(2):
            name = f"walked{os.getpid()}-{i}"
            assert run_cli(["create", name], cwd=place.ws, env=env).returncode == 0
            assert run_cli(["rm", "-f", name], cwd=place.ws, env=env).returncode == 0
        booted = place.booted()
        time.sleep(1.0)  # its walk of these few files has ended: the link comes after it
        os.link(outside, place.ws / "linked.py")
        name = f"walked{os.getpid()}-2"
        assert run_cli(["create", name], cwd=place.ws, env=env).returncode == 0
        try:
            r = run_cli(["exec", name, "sh", "-c", script], cwd=place.ws, env=env)
            assert r.returncode == 0, r.stderr
            out = r.stdout
        finally:
            run_cli(["rm", "-f", name], cwd=place.ws, env=env)
    assert out.splitlines()[0] == booted, "it took the sandbox booted before the link"
    assert outside.read_text() == "original\n" and outside.stat().st_nlink == 1
    assert (place.ws / "linked.py").read_text() == "original\nplanted\n"


def _wakeups(pid: int) -> int:
    """How many times ``pid``'s main thread has slept and woken (voluntary switches)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches in /proc/{pid}/status")


def test_a_boot_waits_for_a_running_exec_s_end_without_the_supervisor_polling(
    place: Place, state_home: Path
) -> None:
    """Nothing is booted ahead while an exec runs (a boot holds the supervisor's loop and
    a core). The supervisor waits for the exec's end, and boots then: it used to wake
    every 5 ms to look again, 200 times a second for as long as any exec ran (a build's,
    a server's), about 25 ms of CPU a second on this machine."""
    other = place.base / "other"
    other.mkdir()
    box = Sandbox.create(PolicySpec(workspace=str(other)))
    try:
        ended: list[int] = []
        running = threading.Thread(target=lambda: ended.append(box.exec(["sleep", "6"]).exit_code))
        running.start()
        _wait("the exec running", lambda: any(list(p.argv[:1]) == ["sleep"] for p in box.processes()))
        _twice(place)  # its next sandbox is due once nothing runs
        supervisor = _supervisor(state_home)
        before = _wakeups(supervisor)
        time.sleep(1.5)
        woke = _wakeups(supervisor) - before
        assert running.is_alive(), "the exec ended before the supervisor was watched (the premise)"
        assert place.tmpdirs() == set(), "a sandbox was booted ahead while an exec ran"
        assert woke < 60, f"the supervisor woke {woke} times in 1.5 s with nothing to do"
        running.join()
        assert ended == [0]
        place.booted()  # booted after the exec's end, with no request meanwhile
    finally:
        box.remove()


def test_a_request_too_slow_to_plan_is_not_booted_ahead_and_the_log_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run whose planning and launch took more of the supervisor's CPU than
    ``ahead.SLOW`` gets no sandbox booted for its next one; the supervisor's log says
    so (a run that expected one can tell why it launched afresh)."""
    from warren import protocol
    from warren._core import treewalk
    from warren.plan import CallerFacts
    from warren.server.booting import Booter
    from warren.server.clients import Notes

    booter = Booter(None, None, None, Notes(), None, inline=False)  # type: ignore[arg-type]
    caller = CallerFacts.here(cwd="/")
    request = ahead.Request({}, caller, protocol.Caller(cwd="/", env={}), None, None)
    assert booter._again(request, treewalk.cpu()) is None  # its first run: none booted yet
    assert booter._again(request, treewalk.cpu() - 2 * ahead.SLOW) is None
    err = capsys.readouterr().err
    assert "the next run of a request is not booted ahead" in err and "of the supervisor's CPU" in err, err
