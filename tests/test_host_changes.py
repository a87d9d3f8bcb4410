"""A long-lived sandbox keeps seeing the host as it is now.

Read access beside a denied path is granted entry by entry (a Landlock rule binds to the
inode it finds), so a file the host replaces by rename after the sandbox started is a new
inode: before ``server.hostwatch`` it stayed unreadable inside for the sandbox's life
(``git`` failing on a rewritten ``~/.gitconfig``, ``whoami`` on a rewritten
``/etc/passwd``). A scripted series of host changes, each followed by a command judged
against the host at that moment; denied paths stay denied through all of it, created
later or replaced. The control: a process started before a change keeps the rules it
started with, and cannot read the replaced file (the kernel's behaviour the watch works
around, seen by the same detector).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from warren import PolicySpec, Sandbox


@pytest.fixture
def host_dir(state_home: Path, request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory in the caller's home (the host's /tmp is not the sandbox's), removed
    afterwards."""
    base = Path.home() / f".warren-test-{os.getpid()}-{request.node.name[-30:]}"
    base.mkdir()
    yield base
    shutil.rmtree(base, ignore_errors=True)


def replace(path: Path, text: str) -> None:
    """As editors, git config and apt do: a new file renamed over the old one."""
    new = path.with_name(path.name + ".new")
    new.write_text(text)
    os.replace(new, path)


def read(sb: Sandbox, path: Path) -> tuple[int, str]:
    got = sb.exec(["cat", str(path)])
    return got.exit_code, got.stdout.decode()


def test_files_replaced_and_made_on_the_host_are_read_as_they_are_now(host_dir: Path) -> None:
    ws = host_dir / "W"
    etc = host_dir / "etc"
    bin_ = host_dir / "bin"
    for d in (ws, etc, bin_):
        d.mkdir()
    (etc / "passwd").write_text("passwd 1\n")
    (etc / "shadow").write_text("shadow 1\n")
    (host_dir / "gitconfig").write_text("[user]\n\tname = one\n")
    (bin_ / "tool").write_text("tool 1\n")
    (host_dir / "later").mkdir()
    (host_dir / "later.txt").write_text("x\n")
    denied = [etc / "shadow", host_dir / "later", host_dir / "later.txt"]
    spec = PolicySpec(workspace=str(ws), deny=[str(p) for p in denied])
    with Sandbox.create(spec) as sb:
        assert read(sb, etc / "passwd") == (0, "passwd 1\n")
        assert read(sb, etc / "shadow")[0] != 0
        # Started before the changes: its rules are those of the launch.
        wait_then_read = f"until [ -e go ]; do sleep 0.05; done; cat {etc}/passwd >seen 2>&1; echo $? >status"
        before = sb.spawn(["sh", "-c", wait_then_read])

        replace(etc / "passwd", "passwd 2\n")
        assert read(sb, etc / "passwd") == (0, "passwd 2\n")
        (ws / "go").touch()
        before.wait(timeout=30)
        assert (ws / "status").read_text().strip() != "0", "the control read the replaced file"
        assert "Permission denied" in (ws / "seen").read_text()

        # Rewritten twice in a row (git config --global does so for each key).
        replace(host_dir / "gitconfig", "[user]\n\tname = two\n")
        replace(host_dir / "gitconfig", "[user]\n\tname = three\n")
        assert read(sb, host_dir / "gitconfig") == (0, "[user]\n\tname = three\n")
        # A new file beside a denied one (a resolver writing resolv.conf afresh).
        (etc / "resolv.conf").write_text("nameserver 127.0.0.53\n")
        assert read(sb, etc / "resolv.conf") == (0, "nameserver 127.0.0.53\n")
        # A package upgraded where nothing is denied: its directory was granted whole.
        replace(bin_ / "tool", "tool 2\n")
        assert read(sb, bin_ / "tool") == (0, "tool 2\n")

        # Denied paths stay denied: removed and made again after the launch (no mask
        # covers the new ones), or replaced.
        shutil.rmtree(host_dir / "later")
        (host_dir / "later.txt").unlink()
        assert read(sb, etc / "passwd") == (0, "passwd 2\n")  # the sandbox saw them gone
        (host_dir / "later").mkdir()
        (host_dir / "later" / "credentials").write_text("key\n")
        (host_dir / "later.txt").write_text("key\n")
        replace(etc / "shadow", "shadow 2\n")
        for path in (host_dir / "later" / "credentials", host_dir / "later.txt", etc / "shadow"):
            code, out = read(sb, path)
            assert code != 0 and "key" not in out and "shadow" not in out, path

        # The directory itself replaced (rm -rf, then made again).
        shutil.rmtree(etc)
        etc.mkdir()
        (etc / "passwd").write_text("passwd 3\n")
        (etc / "shadow").write_text("shadow 3\n")
        assert read(sb, etc / "passwd") == (0, "passwd 3\n")
        code, out = read(sb, etc / "shadow")
        assert code != 0 and "shadow" not in out

        # The file API sees what commands see.
        replace(etc / "passwd", "passwd 4\n")
        assert sb.files.read(str(etc / "passwd")) == b"passwd 4\n"


def test_git_reads_a_global_config_rewritten_on_the_host(host_dir: Path) -> None:
    """The reported case: ``git config --global`` on the host while the sandbox lives,
    then git inside. A home of the test's own (``HOME`` inside and out), with its
    ``.ssh`` denied as the default policy denies the caller's."""
    home, ws = host_dir / "home", host_dir / "W"
    ws.mkdir()
    (home / ".ssh").mkdir(parents=True)
    env = {**os.environ, "HOME": str(home)}
    subprocess.run(["git", "config", "--global", "user.name", "before"], check=True, env=env)
    spec = PolicySpec(workspace=str(ws), deny=[str(home / ".ssh")], env={"HOME": str(home)})
    with Sandbox.create(spec) as sb:
        got = sb.exec(["git", "config", "--global", "user.name"])
        assert (got.exit_code, got.stdout.decode().strip()) == (0, "before"), got.stderr
        subprocess.run(["git", "config", "--global", "user.name", "after"], check=True, env=env)
        got = sb.exec(["git", "config", "--global", "user.name"])
        assert (got.exit_code, got.stdout.decode().strip()) == (0, "after"), got.stderr
        got = sb.exec(["git", "status"], cwd=str(ws))  # reads the config, finds no repository
        assert "unable to access" not in got.stderr.decode()


# The same in the degraded mode (no user namespace: the rules are all there is), driven
# through the library inside the simulation (``test_degraded.nouserns``); argv[1] is the
# directory of the test's files.
DEGRADED = """
import os, sys
from pathlib import Path
from warren import PolicySpec, Sandbox
base = Path(sys.argv[1])
def replace(path, text):
    new = path.with_name(path.name + ".new"); new.write_text(text); os.replace(new, path)
box = Sandbox.create(PolicySpec(workspace=str(base / "W"), deny=[str(base / "secret")]), name="hostchanges")
try:
    replace(base / "conf", "conf 2")
    print("conf", box.exec(["cat", str(base / "conf")]).stdout.decode())
    replace(base / "secret", "secret 2")
    got = box.exec(["cat", str(base / "secret")])
    print("secret", got.exit_code, "secret" in got.stdout.decode())
finally:
    box.remove()
"""


def test_files_replaced_on_the_host_are_read_as_they_are_now_without_user_namespaces(host_dir: Path) -> None:
    from conftest import need_tool
    from test_degraded import nouserns

    need_tool("bwrap", "it makes the container without user namespaces")
    for sub in ("state", "run", "ws", "W"):
        (host_dir / sub).mkdir(mode=0o700)
    (host_dir / "conf").write_text("conf 1")
    (host_dir / "secret").write_text("secret 1")
    r = nouserns(host_dir, ["--", sys.executable, "-c", DEGRADED, str(host_dir)])
    assert r.returncode == 0, r.stderr
    assert "conf conf 2" in r.stdout and "secret 1 False" in r.stdout, r.stdout + r.stderr


def test_the_directories_listed_entry_by_entry_are_those_above_each_denied_path() -> None:
    from warren.plan.landlock import covered_dirs, plan

    ll = plan(5, ["/home/u/W"], ("/tmp",), (), denied=("/home/u/.ssh", "/etc/shadow", "/home/u/.config/gh"))
    assert covered_dirs(ll) == ("/", "/etc", "/home", "/home/u", "/home/u/.config")
    assert covered_dirs(plan(5, ["/home/u/W"], ("/tmp",), ())) == ()


def _inotify_instances() -> int:
    fds = os.listdir("/proc/self/fd")
    return sum(
        1
        for fd in fds
        if os.path.exists(f"/proc/self/fd/{fd}") and "inotify" in os.readlink(f"/proc/self/fd/{fd}")
    )


def test_sandboxes_share_one_inotify_instance_and_each_sees_every_change(tmp_path: Path) -> None:
    """Instances are the user's (128 by default): the supervisor's sandboxes share one, and
    a directory removed and made again is watched again under its name."""
    from warren.server import hostwatch

    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a_dir.mkdir()
    b_dir.mkdir()
    before = _inotify_instances()
    one = hostwatch.HostWatch((str(a_dir), str(b_dir)))
    two = hostwatch.HostWatch((str(a_dir),))
    assert one.watched and two.watched
    assert _inotify_instances() - before <= 1
    assert not one.changed() and not two.changed()
    (a_dir / "new").write_text("x")
    assert one.changed() and two.changed()
    assert not one.changed() and not two.changed()
    (b_dir / "new").write_text("x")
    assert one.changed() and not two.changed()
    shutil.rmtree(a_dir)
    assert one.changed() and two.changed()
    a_dir.mkdir()
    assert one.changed()  # made again: its entries were never listed
    (a_dir / "again").write_text("x")
    assert two.changed() and one.changed()
    (a_dir / "modified-in-place").write_text("x")  # a new entry too
    one.close()
    assert two.changed()
    two.close()
