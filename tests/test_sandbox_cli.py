"""`warren create/exec/ps/ls/cp/stop/rm`, and AsyncSandbox, end to end."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from conftest import Layout, run_cli
from warren.client.aio import AsyncSandbox
from warren.policy import PolicySpec, build


def test_cli_lifecycle_outlives_the_creating_process(layout: Layout, tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ws = layout.workspace

    def cli(*args: str, stdin: str | None = None) -> tuple[int, str, str]:
        p = run_cli(list(args), cwd=ws, env=env, stdin=stdin)
        return p.returncode, p.stdout, p.stderr

    assert cli("create", "dev", "-w", str(ws)) == (0, "dev\n", "")
    try:
        assert cli("exec", "dev", "--", "sh", "-c", "pwd; echo $X; exit 4", "--env", "X=1")[0] == 4
        code, out, _ = cli("exec", "--env", "X=1", "dev", "--", "sh", "-c", "pwd; echo $X")
        assert (code, out) == (0, f"{ws}\n1\n")
        assert cli("exec", "dev", "--", "cat", stdin="piped\n")[1] == "piped\n"

        code, _, err = cli("exec", "--cwd", str(ws / "nope"), "dev", "--", "true")
        assert code == 125
        assert err.splitlines()[0].startswith(
            f"warren: working directory does not exist in the sandbox: {ws / 'nope'}"
        )
        assert "Traceback" not in err and "hint:" in err

        (tmp_path / "in.txt").write_text("from host\n")
        assert cli("cp", str(tmp_path / "in.txt"), "dev:copied.txt")[0] == 0
        assert (ws / "copied.txt").read_text() == "from host\n"
        assert cli("cp", "dev:copied.txt", str(tmp_path / "out.txt"))[0] == 0
        assert (tmp_path / "out.txt").read_text() == "from host\n"

        assert cli("exec", "dev", "--", "sh", "-c", "sleep 77 > /dev/null 2>&1 &")[0] == 0
        code, out, _ = cli("ps", "dev")
        assert code == 0 and "sleep 77" in out

        code, out, _ = cli("ls")
        assert "dev" in out and "running" in out
        assert cli("stop", "dev")[0] == 0
        code, out, _ = cli("ls")
        assert "stopped" in out
        code, _, err = cli("exec", "dev", "--", "true")
        assert code == 125 and "sandbox dev is stopped" in err
    finally:
        cli("rm", "dev")
    assert "dev" not in cli("ls")[1]
    code, _, err = cli("exec", "dev", "--", "true")
    assert code == 125 and "no sandbox named dev" in err and "warren ls" in err


def test_async_sandbox_runs_execs_concurrently(layout: Layout, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))

    async def main() -> list[bytes]:
        policy = build(PolicySpec(workspace=str(layout.workspace)))
        async with await AsyncSandbox.create(policy) as sb:
            await sb.files.write("x.txt", "async\n")
            results = await asyncio.gather(
                *(sb.exec(["sh", "-c", f"echo {i}; cat x.txt"]) for i in range(10))
            )
            return [r.stdout for r in results]

    assert asyncio.run(main()) == [f"{i}\nasync\n".encode() for i in range(10)]


def test_a_run_right_after_shutdown_is_served(layout: Layout, tmp_path: Path) -> None:
    """Two runs leave a sandbox booted ahead; `warren shutdown` stops it and the
    supervisor exits once it is gone. A `warren run` at that moment reached the exiting
    supervisor and heard "the connection to the sandbox was lost" (two of three times
    in a repository, where the booted sandbox's end takes longer): the supervisor takes
    its address away before it exits, then takes a connection already made."""
    import subprocess

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ws = layout.workspace
    subprocess.run(["git", "init", "-q", str(ws)], check=True)
    for _ in range(3):
        for _ in range(2):
            assert run_cli(["run", "--", "true"], cwd=ws, env=env).returncode == 0
        assert run_cli(["shutdown"], cwd=ws, env=env).returncode == 0
        r = run_cli(["run", "--", "echo", "served"], cwd=ws, env=env)
        assert (r.returncode, r.stdout) == (0, "served\n"), r.stderr
    run_cli(["shutdown"], cwd=ws, env=env)


def test_shutdown_returns_once_the_supervisor_has_exited(layout: Layout, tmp_path: Path) -> None:
    """With no sandbox of its own left, `warren shutdown` returns once the supervisor is
    gone, the sandboxes it booted ahead ended and their cgroups removed: a caller that
    then removes the cgroup it ran warren in, or the state directory, found it still
    going (the test suite's safety net killed it then, leaving those cgroups behind).
    Judged by a pidfd of the supervisor taken before, at once after the command, in
    rounds whose runs leave a sandbox booting ahead (0 s) or booted (1 s)."""
    import select
    import time

    from warren import statedir

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    ws = layout.workspace
    for pause in (0, 1, 0, 1, 0):
        for _ in range(2):
            assert run_cli(["run", "--", "true"], cwd=ws, env=env).returncode == 0
        time.sleep(pause)
        found = statedir.read_address(statedir.location(env))
        assert found is not None
        pidfd = os.pidfd_open(found[1])
        try:
            r = run_cli(["shutdown"], cwd=ws, env=env)
            assert (r.returncode, r.stderr) == (0, "")
            gone = select.select([pidfd], [], [], 0)[0]
            assert gone, f"pause {pause}: the supervisor (pid {found[1]}) still runs after `warren shutdown`"
        finally:
            os.close(pidfd)
        assert statedir.read_address(statedir.location(env)) is None


def test_shutdown_says_when_the_supervisor_does_not_go_in_time(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A supervisor still serving another client's connection goes only once it is done:
    `warren shutdown` waits its time, then says so and where to look, and returns."""
    from warren.cli import lifecycle
    from warren.client import connect

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(lifecycle, "EXIT_WAIT", 0.3)
    assert run_cli(["run", "--", "true"], cwd=layout.workspace, env={}).returncode == 0
    held = connect.supervisor()  # connected, its request not sent yet
    try:
        assert lifecycle.shutdown([]) == 0
        err = capsys.readouterr().err
        assert "is still running 0.3 s after agreeing to exit" in err, err
        assert "hint: see " in err and "supervisor.log" in err
    finally:
        held.close()


def test_shutdown_says_which_sandboxes_keep_the_supervisor_and_starts_none(
    layout: Layout, tmp_path: Path
) -> None:
    import time

    from warren.server import statedir

    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    root = str(tmp_path / "state" / "warren")
    none = run_cli(["shutdown"], cwd=layout.workspace, env=env)
    assert none.returncode == 0 and "no supervisor is running" in none.stderr
    assert statedir.read_address(root) is None  # asking did not start one
    assert (
        run_cli(["create", "keep", "-w", str(layout.workspace)], cwd=layout.workspace, env=env).returncode
        == 0
    )
    held = run_cli(["shutdown"], cwd=layout.workspace, env=env)
    assert held.returncode == 0 and "keep" in held.stderr and "hint:" in held.stderr
    assert statedir.read_address(root) is not None  # the sandbox still runs
    assert run_cli(["exec", "keep", "true"], cwd=layout.workspace, env=env).returncode == 0
    assert run_cli(["rm", "-f", "keep"], cwd=layout.workspace, env=env).returncode == 0
    deadline = time.monotonic() + 10
    while statedir.read_address(root) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert statedir.read_address(root) is None  # gone once its last sandbox went


def test_a_request_an_exiting_supervisor_never_accepted_goes_to_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A supervisor that exits with a connection still waiting to be accepted (its idle
    time out, `warren shutdown`, killed) resets it unread. The request goes once more,
    to the next supervisor, rather than failing with "closed the connection" (a `kill
    -9` of the supervisor followed at once by `Sandbox.list()` failed so 30 times of 30).
    Here the exiting supervisor is a listener of the test's own that closes as soon as
    the request waits on it."""
    import secrets
    import select
    import threading

    from warren import wire
    from warren.client.sandbox import Sandbox
    from warren.server import statedir as server_statedir
    from warren.statedir import location, prepare, read_address

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    root = prepare(location(os.environ))
    token = secrets.token_hex(16)
    listener = wire.listen_abstract(wire.abstract_name(token))
    server_statedir.write_address(root, token)  # as a supervisor publishes it (pid: this process)
    waited = threading.Event()

    def exit_unaccepted() -> None:
        select.select([listener], [], [], 30)  # readable: a connection waits to be accepted
        waited.set()
        listener.close()

    closer = threading.Thread(target=exit_unaccepted)
    closer.start()
    try:
        assert Sandbox.list() == []
    finally:
        closer.join()
        run_cli(["shutdown"], cwd=tmp_path, env={"XDG_STATE_HOME": str(tmp_path / "state")})
    assert waited.is_set()  # the first connection did reach the listener that went away
    found = read_address(root)
    assert found is None or found[0] != token


def test_a_request_or_run_right_after_the_supervisor_is_killed_is_served(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`kill -9` of the supervisor, then at once a request, a library run, a `warren
    run`: each reached the killed one's socket while it was going and failed ("closed
    the connection", "the connection to the sandbox was lost"); each is served."""
    import signal

    import warren
    from warren.client.sandbox import Sandbox
    from warren.statedir import location, read_address

    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    root = location(os.environ)
    policy = build(PolicySpec(workspace=str(layout.workspace)))

    def kill() -> None:
        assert Sandbox.list() == []  # starts one when none runs
        found = read_address(root)
        assert found is not None
        os.kill(found[1], signal.SIGKILL)

    try:
        for _ in range(4):
            kill()
            assert Sandbox.list() == []
            kill()
            r = warren.run(["sh", "-c", "cat; echo ran"], policy=policy, stdin=b"fed\n")
            assert (r.exit_code, r.stdout) == (0, b"fed\nran\n"), r.stderr
            kill()
            p = run_cli(
                ["run", "--", "echo", "served"], cwd=layout.workspace, env={"XDG_STATE_HOME": str(state)}
            )
            assert (p.returncode, p.stdout) == (0, "served\n"), p.stderr
    finally:
        run_cli(["shutdown"], cwd=tmp_path, env={"XDG_STATE_HOME": str(state)})
