"""`warren.run` from Python: results, errors, timeouts and output caps."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

import warren
from conftest import Layout
from warren.policy import PolicySpec, build


def _policy(layout: Layout) -> warren.Policy:
    return build(PolicySpec(workspace=str(layout.workspace), write=[str(layout.cache)]))


def test_run_returns_result_with_output_and_duration(layout: Layout) -> None:
    r = warren.run(["sh", "-c", "echo out; echo err >&2; exit 3"], policy=_policy(layout))
    assert (r.exit_code, r.stdout, r.stderr) == (3, b"out\n", b"err\n")
    assert 0 < r.duration < 10
    assert not r.timed_out and r.signal is None


def test_run_feeds_stdin_and_uses_cwd(layout: Layout) -> None:
    sub = layout.workspace / "sub"
    sub.mkdir()
    r = warren.run(["sh", "-c", "pwd; cat"], policy=_policy(layout), stdin=b"data" * 50000, cwd=sub)
    lines = r.stdout.split(b"\n", 1)
    assert lines[0] == str(sub).encode()
    assert lines[1] == b"data" * 50000


def test_missing_command_raises_typed_error(layout: Layout) -> None:
    with pytest.raises(warren.CommandNotFound) as info:
        warren.run(["definitely-not-here"], policy=_policy(layout))
    assert info.value.path == "definitely-not-here"
    assert info.value.hint


def test_missing_cwd_raises_cwd_not_found_naming_it(layout: Layout) -> None:
    missing = layout.workspace / "gone"
    with pytest.raises(warren.CwdNotFound) as info:
        warren.run(["true"], policy=_policy(layout), cwd=missing)
    assert info.value.path == str(missing)
    assert "mkdir -p" in info.value.hint


def test_argv_as_a_string_is_rejected(layout: Layout) -> None:
    with pytest.raises(warren.ExecError):
        warren.run("echo hi", policy=_policy(layout))  # type: ignore[arg-type]


def test_timeout_kills_the_whole_tree_including_sigterm_ignorers(layout: Layout) -> None:
    pidfile = layout.workspace / "child.pid"
    naptime = f"{300 + os.getpid() % 1000}.{time.monotonic_ns() % 1000}"  # unique on this host
    script = f"sh -c 'trap \"\" TERM; echo $$ > {pidfile}; exec sleep {naptime}' & wait"
    start = time.monotonic()
    r = warren.run(["sh", "-c", script], policy=_policy(layout), timeout=1.5)
    assert r.timed_out
    assert r.signal is not None
    assert time.monotonic() - start < 10
    # The grandchild's pid is in the sandbox's pid namespace; check no host process
    # runs this test's own `sleep` any more.
    time.sleep(0.2)
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == f"sleep\x00{naptime}\x00"]
    assert leftovers == []


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_text()
    except OSError:
        return ""


def test_output_is_capped_with_a_visible_marker(layout: Layout) -> None:
    r = warren.run(
        ["python3", "-c", "import sys; sys.stdout.write('x' * 300000)"],
        policy=_policy(layout),
        output_limit=1000,
    )
    assert r.stdout_truncated
    assert r.stdout.startswith(b"x" * 1000)
    assert b"output truncated, 299000 more bytes dropped" in r.stdout


def test_background_processes_do_not_outlive_a_one_shot_run(layout: Layout) -> None:
    naptime = f"{300 + os.getpid() % 1000}.{time.monotonic_ns() % 1000}"  # unique on this host
    r = warren.run(["sh", "-c", f"sleep {naptime} & echo started"], policy=_policy(layout))
    assert r.stdout == b"started\n"
    leftovers = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p) == f"sleep\x00{naptime}\x00"]
    assert leftovers == []


def test_policy_default_is_the_current_directory(layout: Layout, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(layout.workspace)
    r = warren.run(["sh", "-c", "pwd; touch here"])
    assert r.stdout.strip() == str(layout.workspace).encode()
    assert (layout.workspace / "here").exists()
