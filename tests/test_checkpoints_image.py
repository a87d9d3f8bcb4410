"""Checkpoints of a sandbox's root on an image (``server.rootpoints``), and what a
sandbox with neither an image nor a review workspace says when asked for one.

The root's layer is in the sandbox's memory, so the state is read through the sandbox
(as the snapshot tests do), beside the host's own view of a bound workspace: what a
command writes there is the host's and no checkpoint covers it. As root and uid 1001.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import module_state, run_cli
from test_envroot import image  # noqa: F401 (the small image: a fixture)
from warren import PolicySpec, Sandbox
from warren.errors import CheckpointError, PolicyError

STATE = "cat /root/a 2>&1; ls /root 2>&1; ls /usr/bin/env 2>&1; cat /etc/marker 2>&1"


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


# Every process's command line inside; one that ends between the glob and its read is
# passed over (a helper or spare ending then made `cat` fail in a gate).
_CMDLINES = 'for f in /proc/[0-9]*/cmdline; do cat "$f" 2>/dev/null; done; true'


def _sh(sb: Sandbox, script: str) -> str:
    r = sb.exec(["sh", "-c", script])
    return r.stdout.decode() + r.stderr.decode()


def test_a_root_on_an_image_rolls_back_to_each_checkpoint(image: Path, tmp_path: Path) -> None:  # noqa: F811
    ws = tmp_path / "ws"
    ws.mkdir()
    with Sandbox.create(PolicySpec(image=str(image), workspace=str(ws))) as sb:
        _sh(sb, "echo one > /root/a")
        at_one = _sh(sb, STATE)
        first = sb.checkpoint()
        assert first.bytes > 0
        _sh(sb, "echo two > /root/a && echo b > /root/b && echo changed > /etc/marker")
        at_two = _sh(sb, STATE)
        second = sb.checkpoint()
        # rm -rf of a directory and of an image's file, a file in the bound workspace
        _sh(sb, "rm -rf /root /usr/bin/env; echo host > /workspace/w.txt")
        assert "No such file" in _sh(sb, "ls /root")
        listed = sb.checkpoints()
        assert [c.id for c in listed] == [first.id, second.id]
        assert listed[1].command.startswith("sh -c 'rm -rf /root")  # the command that followed it
        back = sb.rollback()  # the last one: undoes the rm
        assert back.id == second.id
        assert _sh(sb, STATE) == at_two
        # the workspace is the host's, live: no checkpoint covers it
        assert (ws / "w.txt").read_text() == "host\n"
        sb.rollback(first.id)
        assert _sh(sb, STATE) == at_one
        assert [c.id for c in sb.checkpoints()] == [first.id]
        with pytest.raises(CheckpointError, match=f"has no checkpoint {second.id}"):
            sb.rollback(second.id)
        # and it goes on: another checkpoint, a change, back
        third = sb.checkpoint()
        assert third.id > second.id
        _sh(sb, "echo three > /root/a")
        sb.rollback()
        assert _sh(sb, STATE) == at_one
        assert _sh(sb, "echo ok > /root/c && cat /root/c") == "ok\n"


def test_a_running_process_refuses_a_checkpoint_and_a_rollback_stops_it(
    image: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / "fifo")  # the image has no sleep: a read of a FIFO nobody writes waits
    with Sandbox.create(PolicySpec(image=str(image), workspace=str(ws))) as sb:
        _sh(sb, "echo one > /root/a")
        point = sb.checkpoint()
        _sh(sb, "echo two > /root/a")
        sb.spawn(["sh", "-c", "read x < /workspace/fifo"])
        deadline = time.monotonic() + 10
        while "/workspace/fifo" not in _sh(sb, _CMDLINES):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with pytest.raises(CheckpointError, match="while processes run in it"):
            sb.checkpoint()
        with pytest.raises(CheckpointError, match=r"while processes run in it: \d+ \(sh\)"):
            sb.rollback(keep_running=True)
        assert _sh(sb, "cat /root/a") == "two\n"  # refused: nothing changed
        back = sb.rollback(point.id)
        assert "(sh)" in back.stopped
        assert _sh(sb, "cat /root/a") == "one\n"
        assert "/workspace/fifo" not in _sh(sb, _CMDLINES)


def test_a_snapshot_between_checkpoints_stays_what_it_was(image: Path) -> None:  # noqa: F811
    with Sandbox.create(PolicySpec(image=str(image), workspace="none")) as sb:
        _sh(sb, "echo one > /root/a")
        point = sb.checkpoint()
        _sh(sb, "echo snap > /root/a")
        snap = sb.snapshot()
        _sh(sb, "echo later > /root/a")
        sb.rollback(point.id)
        assert _sh(sb, "cat /root/a") == "one\n"
        with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
            assert _sh(b, "cat /root/a") == "snap\n"
    deadline = time.monotonic() + 30
    while True:
        try:
            Sandbox.remove_snapshot(snap.id)
            break
        except Exception:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_a_sandbox_writing_the_host_workspace_says_why_it_has_no_checkpoint(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with Sandbox.create(PolicySpec(workspace=str(ws))) as sb:
        for call in (sb.checkpoint, sb.checkpoints, sb.rollback):
            with pytest.raises(CheckpointError, match="writes your workspace itself") as got:
                call()
            assert "--review" in str(got.value.hint) and "--image" in str(got.value.hint)
    assert os.listdir(ws) == []


def test_review_mode_on_an_image_is_refused_with_a_typed_error_and_a_hint(
    image: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    with pytest.raises(PolicyError, match="review mode does not work with a sandbox on an image") as got:
        Sandbox.create(PolicySpec(image=str(image), workspace=str(ws), review=True), name="img-review")
    assert "warren checkpoint" in str(got.value.hint) and "without --image" in str(got.value.hint)
    cli = run_cli(["create", "img-review", "--review", "--image", str(image), "--workspace", str(ws)], cwd=ws)
    assert cli.returncode != 0 and "review mode does not work" in cli.stderr and "hint:" in cli.stderr
    assert "Traceback" not in cli.stderr
    assert os.listdir(ws) == []
    # the control: the same sandbox without --review is made
    with Sandbox.create(PolicySpec(image=str(image), workspace=str(ws)), name="img-review") as sb:
        assert sb.exec(["sh", "-c", "echo made > /workspace/made"]).exit_code == 0
    assert (ws / "made").read_text() == "made\n"
