"""A workspace's ``warren.toml`` is the sandbox's to write, and the supervisor reads it
for the next run or create there: what a sandbox leaves at that name must cost the
supervisor nothing. A FIFO there held the supervisor's open for good (every sandbox of
the user unserved from then on); a device, or a file of gigabytes, would be read whole.
Now the file is opened without waiting, must be a regular file of at most 1 MiB, and
the run that reads it hears why it cannot (judged from the host: the next request to
the same supervisor is answered). Root and uid 1001.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import run_cli
from warren import protocol
from warren.errors import ConfigError
from warren.plan import CallerFacts
from warren.server import planning


@pytest.fixture
def alarm() -> Iterator[None]:
    """A read that waits fails the test instead of hanging it."""

    def late(_signum: int, _frame: object) -> None:
        raise AssertionError("reading the config file waited")

    before = signal.signal(signal.SIGALRM, late)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def _resolve(ws: Path) -> None:
    env = {"HOME": str(ws.parent / "home"), "PATH": "/usr/bin:/bin"}
    caller = CallerFacts(uid=os.getuid(), gid=os.getgid(), home=env["HOME"], env=env, cwd=str(ws))
    planning.resolve({}, caller, protocol.Caller(env=env, cwd=str(ws), config=True))


@pytest.mark.parametrize("kind", ["fifo", "device", "directory", "large"])
def test_a_config_file_that_is_no_small_regular_file_is_a_clear_error(
    tmp_path: Path, kind: str, alarm: None
) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "home").mkdir()
    path = ws / "warren.toml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/null")  # (one that never ends, /dev/zero, was read whole)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text("# a comment\n" * 100_000)  # 1.2 MB of valid TOML
    with pytest.raises(ConfigError) as got:
        _resolve(ws)
    assert str(path) in str(got.value)
    expected = "larger than 1 MiB" if kind == "large" else "not a regular file"
    assert expected in str(got.value)


def test_a_small_config_file_is_read_as_before(tmp_path: Path, alarm: None) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "home").mkdir()
    (ws / "private").mkdir()
    (ws / "warren.toml").write_text('deny = ["private"]\n' + "# a comment\n" * 1000)
    _resolve(ws)


def test_a_sandbox_that_leaves_a_fifo_as_warren_toml_holds_no_supervisor(
    tmp_path: Path, state_home: Path
) -> None:
    ws, other = tmp_path / "ws", tmp_path / "other"
    ws.mkdir()
    other.mkdir()
    r = run_cli(["run", "--", "sh", "-c", "mkfifo warren.toml"], cwd=ws, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (ws / "warren.toml").is_fifo(), "the sandbox made its FIFO (as it may)"
    r = run_cli(["run", "--", "true"], cwd=ws, timeout=60)
    assert r.returncode != 0 and "warren.toml: not a regular file" in r.stderr, r.stderr
    r = run_cli(["run", "--", "echo", "served"], cwd=other, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "served", "the supervisor still serves"
