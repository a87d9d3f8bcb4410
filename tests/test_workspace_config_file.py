"""A workspace's ``warren.toml`` is the sandbox's to write, and the supervisor reads it
for the next run or create there: what a sandbox leaves at that name must cost the
supervisor nothing. A FIFO there held the supervisor's open for good (every sandbox of
the user unserved from then on); a device, or a file of gigabytes, would be read whole.
Now the file is opened without waiting, must be a regular file of at most 1 MiB, and
the run that reads it hears why it cannot (judged from the host: the next request to
the same supervisor is answered). A link left there is never followed: through one to a
host file the supervisor read and applied that file (a narrowing policy, or a parse
error, each telling the sandbox something of a file it could not read). The user's own
config, which no sandbox writes, is still read through a link. Root and uid 1001.
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
    env["XDG_CONFIG_HOME"] = str(ws.parent / "home" / ".config")
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
        # The user's config (a workspace's file is never followed, below): a link to
        # /dev/null there, or to /dev/zero, which was read whole.
        path = tmp_path / "home" / ".config" / "warren" / "config.toml"
        path.parent.mkdir(parents=True)
        path.symlink_to("/dev/null")
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


@pytest.mark.parametrize("target", ["a TOML file", "a FIFO", "nothing"])
def test_a_workspace_config_file_that_is_a_link_is_never_followed(
    tmp_path: Path, target: str, alarm: None
) -> None:
    """Each target would say otherwise if the link were followed: the TOML file would
    be applied (no error), the FIFO refused as "not a regular file", a dangling link
    read as no file at all."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "home").mkdir()
    outside = tmp_path / "outside.toml"
    if target == "a TOML file":
        outside.write_text('env = { FROM_OUTSIDE = "1" }\n')
    elif target == "a FIFO":
        os.mkfifo(outside)
    (ws / "warren.toml").symlink_to(outside)
    with pytest.raises(ConfigError) as got:
        _resolve(ws)
    assert f"{ws / 'warren.toml'}: a symbolic link" in str(got.value)
    assert "never followed" in str(got.value)
    assert "cp --remove-destination" in got.value.hint


def test_the_users_own_config_is_still_read_through_a_link(tmp_path: Path, alarm: None) -> None:
    """No sandbox writes the user's config (its directory is hidden from every
    sandbox): a dotfiles link there is followed as before."""
    ws = tmp_path / "ws"
    ws.mkdir()
    config = tmp_path / "home" / ".config" / "warren" / "config.toml"
    config.parent.mkdir(parents=True)
    real = tmp_path / "dotfiles" / "warren.toml"
    real.parent.mkdir()
    real.write_text("not = [valid\n")
    config.symlink_to(real)
    with pytest.raises(ConfigError, match="not valid TOML"):
        _resolve(ws)  # read through the link: its content is what failed
    (tmp_path / "home" / ".aws").mkdir()
    real.write_text('deny = ["~/.aws"]\n')
    _resolve(ws)


def test_a_link_a_sandbox_leaves_as_warren_toml_is_not_read_by_the_next_run(
    tmp_path: Path, state_home: Path
) -> None:
    """Judged from the host: the file the link names would set a variable in the next
    run's command (a workspace file may set env values); it is not applied, the run
    says why, and the supervisor serves on."""
    ws, other = tmp_path / "ws", tmp_path / "other"
    ws.mkdir()
    other.mkdir()
    host_file = tmp_path / "host.toml"
    host_file.write_text('env = { FROM_HOST = "read-by-warren" }\n')
    r = run_cli(["run", "--", "ln", "-s", str(host_file), "warren.toml"], cwd=ws, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (ws / "warren.toml").is_symlink(), "the sandbox made its link (as it may)"
    r = run_cli(["run", "--", "sh", "-c", "echo ${FROM_HOST:-unset}"], cwd=ws, timeout=60)
    assert "read-by-warren" not in r.stdout
    assert r.returncode != 0 and "warren.toml: a symbolic link" in r.stderr, r.stderr
    r = run_cli(["run", "--", "echo", "served"], cwd=other, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "served", "the supervisor still serves"
