"""The fallback kept beside the native init (``WARREN_NATIVE_INIT=0``, or an install
without a C compiler): the sandbox's PID 1 stays the Python process that set it up and
serves it. The rest of the suite runs on the native init; this runs the paths that
differ between the two (a one-shot's end, which kills every process but PID 1 and its
own; the quiesce of a checkpoint; what `ps` and a command see of warren's processes;
pause; removal), judged from the host."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import warren
from conftest import Layout, sandbox_members
from warren import PolicySpec, Sandbox
from warren.policy import build

pytestmark = pytest.mark.usefixtures("state_home")


@pytest.fixture(autouse=True)
def _python_pid1(monkeypatch: pytest.MonkeyPatch) -> None:
    # In the environment of the test's own supervisor (``state_home``), which reads it.
    monkeypatch.setenv("WARREN_NATIVE_INIT", "0")


def test_a_one_shot_run_ends_every_process_it_left_and_confines_its_command(
    layout: Layout, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    script = (
        "(sleep 1; echo late > late.txt) & "
        f"echo x > {outside}/o 2>/dev/null && echo wrote-outside; "
        "echo made > made.txt; grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"
    )
    r = warren.run(["sh", "-c", script], build(PolicySpec(workspace=str(layout.workspace))))
    assert r.exit_code == 0, r
    assert b"NoNewPrivs:\t1" in r.stdout and b"Seccomp:\t2" in r.stdout and b"wrote-outside" not in r.stdout
    assert (layout.workspace / "made.txt").read_text() == "made\n"
    assert list(outside.iterdir()) == []
    time.sleep(2)
    assert not (layout.workspace / "late.txt").exists()  # the background child ended with the run


def test_a_long_lived_sandbox_serves_exec_spawn_files_pause_and_ps(layout: Layout) -> None:
    ws = layout.workspace
    box = Sandbox.create(PolicySpec(workspace=str(ws)))
    names = sandbox_members()
    assert "warren-init" not in names and any(n.startswith("python") for n in names), names
    assert box.exec(["echo", "ok"]).stdout == b"ok\n"
    box.files.write(str(ws / "put.txt"), b"put\n")
    assert (ws / "put.txt").read_bytes() == b"put\n"
    assert box.files.read(str(ws / "put.txt")) == b"put\n"
    proc = box.spawn(["sleep", "60"])
    deadline = time.monotonic() + 10
    while not any(list(p.argv[:1]) == ["sleep"] for p in box.processes()):
        assert time.monotonic() < deadline, box.processes()
        time.sleep(0.05)
    assert [p.pid for p in box.processes() if p.pid == 1]  # PID 1 listed, the Python one
    box.pause()
    box.resume()
    assert box.exec(["echo", "after"]).stdout == b"after\n"
    proc.kill()
    assert proc.wait(timeout=30) != 0
    # a command's signals to PID 1 change nothing
    for sig in ("TERM", "HUP", "INT", "USR1", "USR2"):
        box.exec(["sh", "-c", f"kill -{sig} 1"])
    assert box.exec(["echo", "still"]).stdout == b"still\n"
    box.remove()
    deadline = time.monotonic() + 10
    while sandbox_members():
        assert time.monotonic() < deadline, sandbox_members()
        time.sleep(0.1)


def test_a_checkpoint_and_rollback_with_a_python_pid1(layout: Layout) -> None:
    ws = layout.workspace
    (ws / "a.txt").write_text("a\n")
    box = Sandbox.create(build(PolicySpec(workspace=str(ws), review=True)))
    try:
        assert box.exec(["sh", "-c", "echo b > a.txt"]).exit_code == 0
        taken = box.checkpoint()
        assert box.exec(["sh", "-c", "echo c > a.txt; rm -f nothing"]).exit_code == 0
        assert box.exec(["cat", "a.txt"]).stdout == b"c\n"
        box.rollback(taken.id)
        assert box.exec(["cat", "a.txt"]).stdout == b"b\n"
        assert (ws / "a.txt").read_text() == "a\n"  # the host's copy untouched under review
    finally:
        box.remove()
