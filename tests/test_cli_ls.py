"""`warren ls` on its fast path (``cli.ls``): what it prints is the HTTP API's form of
each sandbox, and it gets there without the client library, the models or the codec
(their imports were most of its time; bench/bench_many.py times it with 1,000)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import Layout, run_cli
from warren import codec, protocol
from warren.cli import ls
from warren.client.local import info
from warren.client.sandbox import Sandbox
from warren.policy import PolicySpec

MESSAGES = [
    protocol.SandboxInfo(name="dev", id="a" * 32, state="running", workspace="/w", created=1.5, pid1=42),
    protocol.SandboxInfo(
        name="old",
        id="b" * 32,
        state="dead",
        reason="its PID 1 was killed (SIGKILL)",
        workspace="/home/u/p",
        created=1700000000.25,
        warnings=["no memory limit: this host has no memory cgroup for you", "second"],
        idle_timeout=600.0,
        last_active=1700000100.0,
    ),
    protocol.SandboxInfo(name="x", id="c" * 32, state="stopped", idle_timeout=None, last_active=0.0),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: m.state)
def test_a_row_is_the_http_apis_form_of_the_sandbox_field_by_field_and_in_order(
    message: protocol.SandboxInfo,
) -> None:
    # What `warren ls --format json` printed before it had its own path: the model
    # encoded by the HTTP codec. Compared as JSON text, so the order of keys counts.
    assert json.dumps(ls.row(message)) == json.dumps(codec.encode(info(message)))


def test_the_listing_prints_what_the_api_lists_and_shows_an_idle_timeout(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    monkeypatch.setenv("XDG_STATE_HOME", env["XDG_STATE_HOME"])
    ws = layout.workspace
    live = Sandbox.create(PolicySpec(workspace=str(ws), idle_timeout="10m"), name="live")
    gone = Sandbox.create(PolicySpec(workspace=str(ws)), name="gone")
    try:
        gone.stop()
        listed = run_cli(["ls", "--format", "json"], cwd=ws, env=env)
        assert listed.returncode == 0, listed.stderr
        expected = [codec.encode(i) for i in Sandbox.list()]
        assert json.loads(listed.stdout) == json.loads(json.dumps(expected))
        assert [list(r) for r in json.loads(listed.stdout)] == [list(r) for r in expected]
        table = run_cli(["ls"], cwd=ws, env=env)
        assert table.returncode == 0, table.stderr
        lines = {line.split()[0]: line for line in table.stdout.splitlines()[1:]}
        assert set(lines) == {"live", "gone"}
        assert lines["live"].split()[1] == "running" and "/10m" in lines["live"]
        assert lines["gone"].split()[1] == "stopped" and f"{ws}  (" in lines["gone"]
        quiet = run_cli(["ls", "-q"], cwd=ws, env=env)
        assert sorted(quiet.stdout.split()) == ["gone", "live"]
    finally:
        live.remove()
        gone.remove()


# Modules `warren ls` used to import, most of its time: none is needed to list.
HEAVY = (
    "warren.client.local",
    "warren.client.sandbox",
    "warren.models",
    "warren.codec",
    "warren.policy",
    "warren.plan",
    "dataclasses",
)


def test_the_listing_imports_none_of_the_client_library(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="one")  # the supervisor runs
    try:
        probe = (
            "import sys\n"
            "from warren.cli import console_main\n"
            "sys.argv = ['warren', 'ls']\n"
            "try:\n"
            "    console_main()\n"
            "except SystemExit as e:\n"
            "    assert not e.code, e.code\n"
            f"print('LOADED', [m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=layout.workspace
        )
        assert done.returncode == 0, done.stderr
        assert "one" in done.stdout.splitlines()[1]  # it listed the sandbox
        assert "LOADED []" in done.stderr, done.stderr
    finally:
        box.remove()


# What the commands that only name a sandbox (stats, pause, stop, rm) need not import:
# the policy (with the presets and the secret patterns) and the planner are for creating
# one; they were a third of each such command's time.
POLICY = ("warren.policy", "warren.plan", "warren.client.capture")


def test_commands_naming_a_sandbox_import_no_policy_and_stop_and_rm_no_client_library(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    box = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="named")
    try:
        # stop and rm on the protocol alone, as ls: not even the client library (cli.lifecycle)
        light = (*POLICY, *HEAVY)
        for argv, unloaded in (
            (["stats", "named"], POLICY),
            (["pause", "named"], POLICY),
            (["resume", "named"], POLICY),
            (["stop", "named"], light),
            (["rm", "-f", "named"], light),
        ):
            probe = (
                "import sys\n"
                "from warren.cli import console_main\n"
                f"sys.argv = ['warren', *{argv!r}]\n"
                "try:\n"
                "    console_main()\n"
                "except SystemExit as e:\n"
                "    assert not e.code, e.code\n"
                f"print('LOADED', [m for m in {unloaded!r} if m in sys.modules], file=sys.stderr)\n"
            )
            done = subprocess.run(
                [sys.executable, "-c", probe],
                capture_output=True,
                text=True,
                timeout=60,
                cwd=layout.workspace,
            )
            assert done.returncode == 0, (argv, done.stderr)
            assert "LOADED []" in done.stderr, (argv, done.stderr)
        assert all(s.name != "named" for s in Sandbox.list())  # the rm did remove it
    finally:
        if any(s.name == "named" for s in Sandbox.list()):
            box.remove()
