"""inotify and fanotify counts: a sandbox holds its share of the user's, never all.

The kernel charges each inotify instance (and watch, fanotify group and mark) at every
user namespace level up to the host's uid, against the limit of each level: PID 1 sets
the limits of the sandbox's own user namespace (``/proc/sys/user``) to a share of the
user's before it drops its capabilities. Judged from the host, as root and as uid 1001:
while a sandbox holds every instance it can get, the test process (the same user) and
another sandbox still get one. The control shows the same detector catching the
exhaustion where the level below has no limit of its own (in a user namespace the test
makes: bounded, so the user's real count is never exhausted, which would break whatever
else the user runs).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import _make_layout, module_state
from warren import PolicySpec, Sandbox
from warren.plan.limits import USER_NS_SHARES

# Opens inotify instances until refused, writes "COUNT ERRNO" to ARGV[1], then holds
# them until its stdin closes.
FLOOD = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fds = []\n"
    "while len(fds) < 100000:\n"
    "    fd = libc.inotify_init1(os.O_CLOEXEC)\n"
    "    if fd < 0:\n"
    "        break\n"
    "    fds.append(fd)\n"
    "with open(sys.argv[1] + '.tmp', 'w') as f: f.write(f'{len(fds)} {ctypes.get_errno()}')\n"
    "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\n"
    "sys.stdin.read()\n"
)

# A dev server's watcher, in small: a watch on every directory of a tree, then the
# events of a file made in the deepest.
WATCHER = (
    "import ctypes, os, struct, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "fd = libc.inotify_init1(os.O_CLOEXEC)\n"
    "assert fd >= 0, os.strerror(ctypes.get_errno())\n"
    "n = 0\n"
    "for d, _dirs, _files in os.walk(sys.argv[1]):\n"
    "    wd = libc.inotify_add_watch(fd, d.encode(), 0x100 | 0x8)\n"  # IN_CREATE | IN_CLOSE_WRITE
    "    assert wd >= 0, (d, os.strerror(ctypes.get_errno()))\n"
    "    last, n = d, n + 1\n"
    "with open(os.path.join(last, 'new.txt'), 'w') as f: f.write('x')\n"
    "data = os.read(fd, 4096)\n"
    "names = []\n"
    "while data:\n"
    "    _wd, mask, _c, size = struct.unpack_from('iIII', data)\n"
    "    names.append(data[16:16 + size].rstrip(b'\\0').decode())\n"
    "    data = data[16 + size:]\n"
    "print(n, sorted(set(names)))\n"
)

# The control, run in a user namespace of the test's own (unshare -r): its limit is
# set to ARGV[1]; a child in a user namespace below it floods with the limit ARGV[2]
# (0: none of its own); then this level asks for one instance.
CONTROL = (
    "import ctypes, json, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def limit(n):\n"
    "    with open('/proc/sys/user/max_inotify_instances', 'w') as f: f.write(str(n))\n"
    "limit(int(sys.argv[1]))\n"
    "r, w = os.pipe()\n"
    "go_r, go_w = os.pipe()\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    assert libc.unshare(0x10000000) == 0, os.strerror(ctypes.get_errno())\n"
    "    if int(sys.argv[2]):\n"
    "        limit(int(sys.argv[2]))\n"
    "    fds = []\n"
    "    while len(fds) < 10000 and libc.inotify_init1(0) >= 0:\n"
    "        fds.append(1)\n"
    "    os.write(w, str(len(fds)).encode())\n"
    "    os.read(go_r, 1)\n"
    "    os._exit(0)\n"
    "held = int(os.read(r, 100))\n"
    "fd = libc.inotify_init1(0)\n"
    "err = ctypes.get_errno()\n"
    "os.write(go_w, b'x')\n"
    "os.waitpid(pid, 0)\n"
    "print(json.dumps({'held': held, 'above_got_one': fd >= 0, 'errno': 0 if fd >= 0 else err}))\n"
)


def _user_limit(name: str) -> int:
    return int(Path(f"/proc/sys/user/{name}").read_text())


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _make_layout(tmp_path_factory.mktemp("inotify")).workspace


@pytest.fixture(scope="module")
def sandbox(workspace: Path) -> Iterator[Sandbox]:
    with Sandbox.create(PolicySpec(workspace=str(workspace))) as sb:
        yield sb


def _sh(sb: Sandbox, script: str) -> str:
    r = sb.exec(["sh", "-c", script])
    assert r.exit_code == 0, (script, r.stderr.decode())
    return r.stdout.decode()


def test_the_sandboxs_user_namespace_has_a_share_of_the_users_limits(sandbox: Sandbox) -> None:
    names = list(USER_NS_SHARES)
    inside = _sh(sandbox, "cd /proc/sys/user && cat " + " ".join(names)).split()
    assert [int(v) for v in inside] == [_user_limit(n) // USER_NS_SHARES[n] for n in names]
    # Nobody inside can raise them: no capability there, and a write is refused.
    r = sandbox.exec(["sh", "-c", "echo 100000 > /proc/sys/user/max_inotify_instances"])
    assert r.exit_code != 0
    assert _sh(sandbox, "cat /proc/sys/user/max_inotify_instances").split() == inside[:1]


def test_a_sandbox_holding_all_the_instances_it_can_leaves_the_user_and_others_theirs(
    sandbox: Sandbox, workspace: Path
) -> None:
    share = _user_limit("max_inotify_instances") // USER_NS_SHARES["max_inotify_instances"]
    held = workspace / "held"
    flood = sandbox.spawn(["python3", "-c", FLOOD, "held"], stdin=True)
    try:
        deadline = time.monotonic() + 20
        while not held.exists():
            assert time.monotonic() < deadline, "the flood never reported"
            time.sleep(0.05)
        count, err = map(int, held.read_text().split())
        # It was stopped by the sandbox's own limit (warren's helpers may hold a few of
        # the share), far below the user's.
        assert err == errno.EMFILE and share - 4 <= count <= share, (count, share)
        assert count < _user_limit("max_inotify_instances")
        # Judged from the host meanwhile: this process, of the same user, gets one...
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_CLOEXEC)
        assert fd >= 0, os.strerror(ctypes.get_errno())
        os.close(fd)
        # ... and so does another sandbox of the user.
        with Sandbox.create(PolicySpec(workspace=str(workspace))) as other:
            one = "import ctypes; print(ctypes.CDLL(None).inotify_init1(0) >= 0)"
            got = other.exec(["python3", "-c", one])
            assert got.stdout == b"True\n", got.stderr
    finally:
        flood.close_stdin()
        flood.wait()


@pytest.mark.parametrize("below", [0, 4])
def test_control_a_level_without_a_limit_of_its_own_exhausts_the_one_above(below: int) -> None:
    """The same detector one level down: with a limit of 10 above, a child namespace
    with none of its own takes all 10 and the level above gets EMFILE; with 4 of its
    own, the level above still gets one."""
    r = subprocess.run(
        ["unshare", "-r", sys.executable, "-c", CONTROL, "10", str(below)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    if below:
        assert got == {"held": below, "above_got_one": True, "errno": 0}
    else:
        assert got == {"held": 10, "above_got_one": False, "errno": errno.EMFILE}


def test_a_watcher_on_a_tree_of_directories_works_inside(sandbox: Sandbox, workspace: Path) -> None:
    for i in range(300):
        (workspace / "tree" / f"d{i % 30}" / f"e{i}").mkdir(parents=True, exist_ok=True)
    r = sandbox.exec(["python3", "-c", WATCHER, "tree"])
    assert r.exit_code == 0, r.stderr.decode()
    assert r.stdout.decode().strip() == "331 ['new.txt']"
