"""The degraded mode, where a sandbox can get no user namespace (docs/degraded.md).

"No user namespaces" is simulated for real: the whole warren — the CLI and the
supervisor it starts, with a state and runtime directory of this module's own — runs
under ``bwrap --unshare-user --disable-userns``, where clone(CLONE_NEWUSER) fails with
ENOSPC as in a container that forbids them (``test_the_simulation_forbids_user_namespaces``
checks that it does). Each attack is judged on the host, beside a control that does the
same thing without warren and succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from conftest import need_tool
from test_syscall_filter import ABOVE, ACL_ATTACK, DONE, OTHERS, REFUSED, _limits
from warren.errors import HostError, PolicyError
from warren.plan import CallerFacts, make_plan
from warren.plan.degraded import NOT_HELD
from warren.policy import build
from warren.policy.spec import PolicySpec
from warren.server import hostfacts

BWRAP = shutil.which("bwrap")


@pytest.fixture(autouse=True)
def _bwrap() -> None:
    need_tool("bwrap", "it makes the container without user namespaces these tests run in")


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This module's own state and runtime directories (so its own supervisor, which
    starts inside the simulation too), and a workspace."""
    base = tmp_path_factory.mktemp("degraded")
    for sub in ("state", "long-lived", "stuck", "run", "ws"):
        (base / sub).mkdir(mode=0o700)
    yield base


def nouserns(
    base: Path, argv: list[str], *, state: str = "state", timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``warren ARGV`` (or, with argv[0] == "--", a plain command) with no user
    namespaces to be had, from the workspace. Each call is a user namespace of its
    own, whose supervisor the next one cannot reach: it runs one of its own, which
    leaves soon after (WARREN_SUPERVISOR_IDLE)."""
    env = {
        **os.environ,
        "WARREN_SUPERVISOR_IDLE": "1",
        "XDG_STATE_HOME": str(base / state),
        "XDG_RUNTIME_DIR": str(base / "run"),
    }
    cmd = argv[1:] if argv and argv[0] == "--" else [sys.executable, "-m", "warren", *argv]
    assert BWRAP is not None
    return subprocess.run(
        [BWRAP, "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--", *cmd],
        cwd=base / "ws",
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


PROBE = "from warren._core import kernel; print(*kernel.userns_probe())"


def test_the_simulation_forbids_user_namespaces(box: Path) -> None:
    r = nouserns(box, ["--", sys.executable, "-c", PROBE])
    assert r.stdout.split() == ["unavailable", "28"], r.stderr  # ENOSPC
    here = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True)
    assert here.stdout.split() == ["usable", "0"], here.stderr


def test_a_command_runs_and_writes_its_workspace_without_user_namespaces(box: Path) -> None:
    r = nouserns(
        box,
        [
            "run",
            "--",
            "sh",
            "-c",
            'echo made > made.txt && echo tmp > "$TMPDIR/t" && cat made.txt "$TMPDIR/t"',
        ],
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["made", "tmp"]
    assert (box / "ws" / "made.txt").read_text() == "made\n"


def test_writes_outside_the_workspace_fail_without_user_namespaces(box: Path, outside: Path) -> None:
    attack = f"echo pwned > {outside}; touch {outside}.planted; chmod 777 {outside}"
    r = nouserns(box, ["run", "--", "sh", "-c", attack])
    assert r.returncode != 0
    assert outside.read_text() == "keep me\n"
    assert not Path(f"{outside}.planted").exists()
    assert oct(outside.stat().st_mode & 0o777) != oct(0o777)
    # Control: the same commands, without warren, do what they say.
    control = nouserns(box, ["--", "sh", "-c", f"echo pwned > {outside}.control"])
    assert control.returncode == 0 and Path(f"{outside}.control").read_text() == "pwned\n"
    Path(f"{outside}.control").unlink()


def test_setxattrat_cannot_give_a_file_of_yours_an_acl_without_user_namespaces(
    box: Path, outside: Path, tmp_path: Path
) -> None:
    """The degraded mode shares the host's mounts: an ACL written with the new call on
    any file the user owns would rewrite its mode (a denied key made 0644)."""
    os.chmod(outside, 0o600)
    r = nouserns(box, ["run", "--", sys.executable, "-c", ACL_ATTACK, str(outside)])
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res == {"setxattrat_access": "ENOSYS", "removexattrat": "ENOSYS", "setxattr_access": "EPERM"}, res
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
    with pytest.raises(OSError) as gone:
        os.getxattr(outside, "system.posix_acl_access")
    assert gone.value.errno == errno.ENODATA
    # Control: the same calls in the same container, without warren.
    control = tmp_path / "control"
    control.write_text("")
    os.chmod(control, 0o600)
    os.setxattr(control, "user.warren", b"x")
    c = nouserns(box, ["--", sys.executable, "-c", ACL_ATTACK, str(control)])
    assert json.loads(c.stdout.strip().splitlines()[-1]) == dict.fromkeys(res, "ok"), c.stderr
    assert stat.S_IMODE(control.stat().st_mode) == 0o777


def test_calls_above_the_reviewed_ones_get_enosys_without_user_namespaces(box: Path) -> None:
    r = nouserns(box, ["run", "--", sys.executable, "-c", ABOVE])
    assert r.stdout.split("\n")[:4] == ["468 EINVAL", "469 ENOSYS", "470 ENOSYS", "1000 ENOSYS"], r.stderr
    control = nouserns(box, ["--", sys.executable, "-c", ABOVE])
    assert control.stdout.split("\n")[:2] == ["468 EINVAL", "469 EINVAL"], control.stderr


# argv[1]: a process of the caller's outside; then every ancestor of the command up
# to the container or the host's init (its helper, PID 1, the supervisor, which
# detached itself), each attacked.
ANCESTORS = """
import os, sys
def parent(pid):
    return next(int(l.split()[1]) for l in open(f"/proc/{pid}/status") if l.startswith("PPid:"))
pid = parent(os.getpid())
while pid > 1 and not open(f"/proc/{pid}/cmdline", "rb").read().startswith(b"bwrap"):
    sys.argv.append(str(pid))
    pid = parent(pid)
"""


def test_a_command_cannot_lower_the_limits_or_priority_of_your_processes_without_user_namespaces(
    box: Path,
) -> None:
    """No pid namespace here: every process of the user is a pid away, the supervisor
    among them (``prlimit --nofile=3`` on it would take its sandboxes down)."""
    host = subprocess.Popen(["sleep", "60"])
    try:
        before = _limits(host.pid)
        r = nouserns(box, ["run", "--", sys.executable, "-c", ANCESTORS + OTHERS, str(host.pid)])
        assert r.returncode == 0, r.stderr
        res = json.loads(r.stdout)
        assert len(res) >= 4 and set(map(tuple, res.values())) == {tuple(REFUSED)}, res
        assert _limits(host.pid) == before and os.getpriority(os.PRIO_PROCESS, host.pid) == 0
        # The supervisor lived through it: the next run is answered.
        assert nouserns(box, ["run", "--", "true"]).returncode == 0
        # Control: the same calls in the same container without warren.
        c = nouserns(box, ["--", sys.executable, "-c", OTHERS, str(host.pid)])
        assert json.loads(c.stdout) == {str(host.pid): DONE}, c.stderr
        assert _limits(host.pid).split()[3:5] == ["12", "12"]
    finally:
        host.kill()
        host.wait()


def test_a_planted_credential_stays_unreadable_without_user_namespaces(
    box: Path, planted_secret: Path
) -> None:
    r = nouserns(box, ["run", "--", "cat", str(planted_secret)])
    assert "PLANTED-SECRET" not in r.stdout + r.stderr
    assert r.returncode != 0 and "Permission denied" in r.stderr
    control = nouserns(box, ["--", "cat", str(planted_secret)])
    assert "PLANTED-SECRET" in control.stdout


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """A TCP listener on the host's loopback; what reached it is recorded."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    seen: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    seen.append(conn.recv(100))
                except OSError:
                    seen.append(b"")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], seen
    stop.set()
    thread.join()
    server.close()


def test_a_host_loopback_listener_is_unreachable_under_network_none_without_user_namespaces(
    box: Path, listener: tuple[int, list[bytes]]
) -> None:
    port, seen = listener
    send = (
        "import socket, sys\n"
        "for family, kind in ((socket.AF_INET, socket.SOCK_STREAM), (socket.AF_INET6, socket.SOCK_STREAM),"
        " (socket.AF_INET, socket.SOCK_DGRAM)):\n"
        "    try:\n"
        "        s = socket.socket(family, kind)\n"
        f"        s.connect(('127.0.0.1' if family == socket.AF_INET else '::ffff:127.0.0.1', {port}))\n"
        "        s.sendall(b'LEAK')\n"
        "        print('CONNECTED')\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
    )
    r = nouserns(box, ["run", "--", sys.executable, "-c", send])
    assert r.returncode == 0, r.stderr
    assert "CONNECTED" not in r.stdout and r.stdout.count("refused 13") == 3, r.stdout
    assert seen == []
    # Network open there refuses the host's loopback too (its services: warren serve's
    # API, databases), however written (::ffff:127.0.0.1, 0.0.0.0), and says so.
    opened = nouserns(box, ["run", "--network", "open", "--", sys.executable, "-c", send])
    assert "CONNECTED" not in opened.stdout and opened.stdout.count("refused 13") == 3, opened.stdout
    assert "the host's loopback is refused" in opened.stderr
    unspecified = send.replace("'127.0.0.1' if", "'0.0.0.0' if")
    opened = nouserns(box, ["run", "--network", "open", "--", sys.executable, "-c", unspecified])
    assert "CONNECTED" not in opened.stdout, opened.stdout
    assert seen == []
    # Control: the same program outside warren (in the same simulation) reaches it.
    plain = nouserns(box, ["--", sys.executable, "-c", send])
    assert "CONNECTED" in plain.stdout, plain.stdout + plain.stderr
    assert b"LEAK" in seen


def test_network_allow_reaches_only_its_proxy_without_user_namespaces(
    box: Path, listener: tuple[int, list[bytes]]
) -> None:
    port, seen = listener
    probe = (
        "import os, socket, urllib.request\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port})).sendall(b'LEAK'); print('DIRECT')\n"
        "except OSError as e:\n"
        "    print('direct refused', e.errno)\n"
        "try:\n"
        f"    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'LEAK', ('127.0.0.1', {port}))\n"
        "    print('UDP')\n"
        "except OSError as e:\n"
        "    print('udp refused', e.errno)\n"
        "try:\n"
        "    urllib.request.urlopen('http://not-allowed.test/', timeout=10)\n"
        "except urllib.error.HTTPError as e:\n"
        "    print('proxy said', e.code, os.environ['HTTP_PROXY'])\n"
    )
    r = nouserns(box, ["run", "--network", "allow", "--", sys.executable, "-c", probe])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[:2] == ["direct refused 13", "udp refused 13"], r.stdout
    # The proxy answered, on the port the plan chose (not 3128), and refused the host.
    assert lines[2].startswith("proxy said 403 http://127.0.0.1:") and not lines[2].endswith(":3128")
    assert "not-allowed.test:80 is not on the allowlist" in r.stderr
    assert seen == []


LISTEN = r"""
import os, socket, sys
s = socket.socket()
try:
    s.listen(8)
    print("LISTENING", s.getsockname()[1], flush=True)
except OSError as e:
    print("refused", e.errno, s.getsockname()[1], flush=True)
s.settimeout(10)
try:
    s.accept()[0].sendall(b"hi")
    print("ACCEPTED", flush=True)
except OSError as e:
    print("no connection", e.errno, flush=True)
# fidelity: a unix socket server still listens, and answers
name = f"unix-{os.getpid()}.sock"
u = socket.socket(socket.AF_UNIX)
u.bind(name)
u.listen(1)
c = socket.socket(socket.AF_UNIX)
c.connect(name)
u.accept()[0].sendall(b"unix ok")
print(c.recv(10).decode())
os.unlink(name)
"""


UDP = r"""
import socket
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    print("BOUND", s.getsockname()[1], flush=True)
    s.settimeout(10)
    print("GOT", s.recv(10).decode(), flush=True)
except OSError as e:
    print("refused", e.errno, 0, flush=True)
"""


def _listen_judged_from_the_host(box: Path, argv: list[str], script: str = "") -> tuple[str, bool]:
    """Run LISTEN (or ``script``: UDP) under warren ARGV or plain, connect (send) from
    the host to the port it got, if any: its output, and whether it got there."""
    script = script or LISTEN
    env = {
        **os.environ,
        "WARREN_SUPERVISOR_IDLE": "1",
        "XDG_STATE_HOME": str(box / "state"),
        "XDG_RUNTIME_DIR": str(box / "run"),
    }
    cmd = (
        [sys.executable, "-c", script]
        if not argv
        else [sys.executable, "-m", "warren", *argv, "--", sys.executable, "-c", script]
    )
    assert BWRAP is not None
    proc = subprocess.Popen(
        [BWRAP, "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--", *cmd],
        cwd=box / "ws",
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        bufsize=0,
    )
    assert proc.stdout is not None
    # the first line a byte at a time: a buffered readline could take later lines with
    # it, which communicate() (reading the descriptor) would then never see
    head = b""
    while not head.endswith(b"\n") and (byte := proc.stdout.read(1)):
        head += byte
    first = head.decode()
    port = int(first.split()[-1]) if first.split() else 0
    reached = False
    if port and script == UDP:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            u.sendto(b"hi", ("127.0.0.1", port))
    elif port:
        # the listener's every address: the host's loopback stands for any of them here
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=5) as c:
            reached = c.recv(2) == b"hi"
    raw_out, raw_err = proc.communicate(timeout=60)
    out, err = raw_out.decode(errors="replace"), raw_err.decode(errors="replace")
    if script == UDP:
        reached = "GOT hi" in out
    return first + out + err, reached


@pytest.mark.parametrize("network", ["allow", "none"])
def test_no_listener_is_reachable_from_outside_under_allow_or_none_without_user_namespaces(
    box: Path, network: str
) -> None:
    """listen() on a socket never bound would bind it to every address of the host
    (autobind): refused under allow (EACCES, left unbound), and no IP socket at all
    under none. Judged by connecting from the host; a unix socket server still works."""
    out, reached = _listen_judged_from_the_host(box, ["run", "--network", network])
    assert not reached and "LISTENING" not in out and "ACCEPTED" not in out, out
    assert ("refused 13 0" in out) if network == "allow" else ("Permission denied" in out), out
    if network == "allow":
        assert "unix ok" in out, out
    # control: the same program outside warren listens on every address and is reached
    out, reached = _listen_judged_from_the_host(box, [])
    assert reached and "ACCEPTED" in out and "unix ok" in out, out


def test_no_udp_socket_can_be_bound_for_the_outside_under_allow_without_user_namespaces(box: Path) -> None:
    """A UDP socket bound to every address would receive from the network past the
    proxy: no IP socket but a stream one under allow (EACCES). Judged by a datagram
    sent from the host; control: outside warren it arrives."""
    out, reached = _listen_judged_from_the_host(box, ["run", "--network", "allow"], UDP)
    assert not reached and "refused 13 0" in out and "BOUND" not in out, out
    out, reached = _listen_judged_from_the_host(box, [], UDP)
    assert reached, out


# Drives a long-lived sandbox through the library, inside the simulation: argv[1] is
# a process of the caller's outside the sandbox.
LONG_LIVED = """
import os, signal, sys, time
from warren import Sandbox
from warren.errors import ProcessNotFound
from warren.policy.spec import PolicySpec
host, t = int(sys.argv[1]), sys.argv[2]  # t: this test's mark on its sleeps
# A failure here must not leave a live sandbox (and its supervisor) to the next run.
box = Sandbox.create(PolicySpec(), name="deg")
try:
    proc = box.spawn(["sh", "-c", f"sleep 300.{t} & exec sleep 301.{t}"])
    deadline = time.monotonic() + 10
    first = ["sleep", f"300.{t}"]
    while not any(list(p.argv[:2]) == first for p in box.processes()) and time.monotonic() < deadline:
        time.sleep(0.02)
    pids = {p.pid for p in box.processes()}
    listed = [p.argv[0] for p in box.processes()]
    print("listed", sorted(a for a in listed if a == "sleep"), len(listed))
    print("host listed", host in pids)
    try:
        box._transport.signal(box.name, host, 9)
        print("host signalled")
    except ProcessNotFound:
        print("host refused")
    box.stop()
finally:
    box.remove()
# What the supervisor sends instead of SIGKILL there (nothing dies with PID 1): PID 1
# kills every process of the sandbox itself, then exits.
other = Sandbox.create(PolicySpec(), name="deg2")
try:
    other.spawn(["sh", "-c", f"setsid sleep 305.{t} & exec sleep 306.{t}"])
    while not any(p.argv[0] == "sleep" for p in other.processes()):
        time.sleep(0.02)
    os.kill(other.pid1, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while other.alive and time.monotonic() < deadline:
        time.sleep(0.02)
    print("kill-now ended", not other.alive)
finally:
    other.remove()
"""


def test_a_host_abstract_unix_socket_is_unreachable_without_user_namespaces(box: Path) -> None:
    name = f"warren-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind("\0" + name)
    server.listen(4)
    server.settimeout(0.2)
    connect = (
        "import socket\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        "try:\n"
        f"    s.connect('\\0{name}'); print('CONNECTED')\n"
        "except OSError as e:\n"
        "    print('refused', e.errno)\n"
    )
    try:
        r = nouserns(box, ["run", "--", sys.executable, "-c", connect])
        assert r.stdout.strip() == "refused 13", r.stdout + r.stderr
        with pytest.raises(TimeoutError):
            server.accept()
        control = nouserns(box, ["--", sys.executable, "-c", connect])
        assert control.stdout.strip() == "CONNECTED"
    finally:
        server.close()


def _mark() -> str:
    """A mark for this test's sleeps: other tests of this user (and, as root, of the other
    half of scripts/test) sleep as long at the same time."""
    return f"{os.getpid()}{time.monotonic_ns() % 100000}"


def test_a_long_lived_sandbox_lists_signals_and_stops_only_its_own_processes(box: Path) -> None:
    host = subprocess.Popen(["sleep", "60"])  # a process of the caller's, outside the sandbox
    try:
        # Its sleeps are marked (other tests of this user sleep 300 at the same time).
        token = _mark()
        r = nouserns(box, ["--", sys.executable, "-c", LONG_LIVED, str(host.pid), token], state="long-lived")
        assert r.returncode == 0, r.stderr
        # The two commands, and at most warren's helpers for them (shims, spares), as
        # in the full mode; nothing of the host's.
        listed = r.stdout.split("\n")[0]
        assert listed.startswith("listed ['sleep', 'sleep'] ") and int(listed.split()[-1]) <= 6, r.stdout
        assert "host listed False" in r.stdout and "host refused" in r.stdout
        assert host.poll() is None
        assert _sleepers(f"^sleep 30[01][.]{token}$") == "", "a process of the stopped sandbox outlived it"
        assert "kill-now ended True" in r.stdout
        outlived = _sleepers(f"^sleep 30[56][.]{token}$")
        assert outlived == "", "a process outlived the sandbox's SIGUSR1 (pid1.KILL_NOW)"
    finally:
        host.kill()
        host.wait()


# A PID 1 that acts on no signal (stopped from the host: only SIGKILL reaches it). The
# supervisor's SIGTERM, then after its grace what the degraded mode sends instead of
# SIGKILL (pid1.KILL_NOW), then SIGKILL half a second later.
STUCK = """
import os, signal, threading, time
from warren import Sandbox
from warren.policy.spec import PolicySpec
box = Sandbox.create(PolicySpec(), name="stuck")
pid1 = box.pid1
os.kill(pid1, signal.SIGSTOP)
removed = threading.Event()
threading.Thread(target=lambda: (box.remove(), removed.set()), daemon=True).start()
t0 = time.monotonic()
states = []
while not removed.wait(0.1) and time.monotonic() - t0 < 12:
    state = " ".join(i.state for i in Sandbox.list() if i.name == "stuck") or "gone"
    if not states or states[-1] != state:
        states.append(state)
print("removed", removed.is_set(), round(time.monotonic() - t0, 1))
print("states", states)
try:
    os.kill(pid1, 0)
    print("pid1 left")
    os.kill(pid1, signal.SIGKILL)
except ProcessLookupError:
    print("pid1 gone")
"""


def test_a_pid1_deaf_to_signals_is_killed_and_reads_stopping_until_then_without_user_namespaces(
    box: Path,
) -> None:
    """The degraded mode's stop of a PID 1 that cannot act on SIGTERM or SIGUSR1: after
    the grace, SIGUSR1, then SIGKILL; the sandbox reads "stopping" all along. (The
    supervisor forgot it was stopping once it had sent the first of those, so the SIGKILL
    never came: the remove waited for ever and ``warren ls`` said "running".)"""
    r = nouserns(box, ["--", sys.executable, "-c", STUCK], state="stuck", timeout=90)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    removed = lines[0].split()
    assert removed[:2] == ["removed", "True"] and float(removed[2]) < 10, r.stdout
    # (its record may go a moment before the remove's answer)
    assert lines[1] in ("states ['stopping']", "states ['stopping', 'gone']"), r.stdout
    assert lines[2] == "pid1 gone", r.stdout


def _wait_for(what: Callable[[], bool], timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _sleepers(pattern: str) -> str:
    return subprocess.run(
        ["pgrep", "-U", str(os.getuid()), "-f", pattern], capture_output=True, text=True
    ).stdout


def test_a_killed_client_takes_its_command_tree_with_it_without_user_namespaces(box: Path) -> None:
    env = {**os.environ, "XDG_STATE_HOME": str(box / "state"), "XDG_RUNTIME_DIR": str(box / "run")}
    assert BWRAP is not None
    # Its sleeps are marked, and only this user's are looked for and killed: the other
    # half of scripts/test (root, which may kill any) runs this test at the same time.
    t = _mark()
    mine = rf"^sleep 30[23]\.{t}$"
    command = f"setsid sleep 302.{t} & sleep 303.{t}"
    warren = [sys.executable, "-m", "warren", "run", "--", "sh", "-c", command]
    client = subprocess.Popen(
        [BWRAP, "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--", *warren],
        cwd=box / "ws",
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert _wait_for(lambda: _sleepers(mine).count("\n") == 2)
        # bwrap's child is the warren client: SIGKILL it, as an agent framework might.
        inner = subprocess.run(
            ["pgrep", "-P", str(client.pid)], capture_output=True, text=True
        ).stdout.split()
        os.kill(int(inner[0]), signal.SIGKILL)
        assert _wait_for(lambda: _sleepers(mine) == ""), "the command tree outlived its client"
    finally:
        client.kill()
        client.wait()
        subprocess.run(["pkill", "-U", str(os.getuid()), "-f", mine])


def test_plan_names_each_protection_the_degraded_mode_cannot_hold(box: Path) -> None:
    r = nouserns(box, ["plan"])
    assert r.returncode == 0, r.stderr
    assert "mode: DEGRADED" in r.stdout and "unavailable here (clone: ENOSPC)" in r.stdout
    for protection, _instead in NOT_HELD:
        assert protection in r.stdout
    assert "TCP: bind and connect handled, no port granted" in r.stdout


def test_require_namespaces_refuses_the_degraded_mode(box: Path) -> None:
    r = nouserns(box, ["run", "--require-namespaces", "--", "sh", "-c", "echo ran > ran.txt"])
    assert r.returncode == 125 and "the policy requires them" in r.stderr, r.stderr
    assert not (box / "ws" / "ran.txt").exists()


def _plan_for(tmp_path: Path, namespaces: tuple[str, int], landlock_abi: int, **spec: object):  # type: ignore[no-untyped-def]
    caller = CallerFacts(uid=os.getuid(), gid=os.getgid(), home=str(Path.home()), env={}, cwd=str(tmp_path))
    policy = build(PolicySpec(workspace=str(tmp_path), **spec), cwd=tmp_path, env={}, home=Path.home())  # type: ignore[arg-type]
    host = hostfacts.gather([str(tmp_path)], workspace=str(tmp_path))
    host = type(host)(**{**host.__dict__, "namespaces": namespaces, "landlock_abi": landlock_abi})
    return make_plan(policy, host, caller, scratch_id="ab" * 12)


def test_powerless_namespaces_plan_the_degraded_mode_and_no_landlock_refuses_it(tmp_path: Path) -> None:
    plan = _plan_for(tmp_path, ("powerless", 13), 7)
    assert not plan.namespaces and plan.mounts == () and "powerless" in plan.warnings[0]
    assert plan.env["TMPDIR"] == plan.scratch and plan.scratch is not None
    with pytest.raises(HostError, match="Landlock is unavailable"):
        _plan_for(tmp_path, ("powerless", 13), 0)
    assert _plan_for(tmp_path, ("usable", 0), 7).namespaces


def test_secrets_are_refused_rather_than_dropped_without_namespaces(tmp_path: Path) -> None:
    """The proxy's CA reaches the sandbox through a mount the degraded mode cannot make:
    a secret there is a clear error, never a sandbox where it silently does not work."""
    spec = {"network": "allow", "allow_hosts": ["api.example.org"], "secrets": ["TOKEN=HOME@api.example.org"]}
    with pytest.raises(PolicyError, match="need the full mode"):
        _plan_for(tmp_path, ("unavailable", 28), 7, **spec)
    assert _plan_for(tmp_path, ("usable", 0), 7, **spec).net.secrets


def test_doctor_names_each_degraded_protection_without_user_namespaces(box: Path) -> None:
    r = nouserns(box, ["doctor", "--json"], timeout=120)
    section = json.loads(r.stdout)["namespaces"]
    assert section["state"] == "unavailable" and section["errno_name"] == "ENOSPC"
    assert section["mode"] == "degraded"
    assert [row["protection"] for row in section["not_held"]] == [p for p, _ in NOT_HELD]
    assert section["fix"] == []  # a container's settings decide: no root command here helps


def test_doctor_explains_apparmors_restriction_with_the_exact_fix(tmp_path: Path) -> None:
    from warren.doctor import userns

    sysctl = tmp_path / "apparmor_restrict_unprivileged_userns"  # stands in for /proc/sys/kernel/...
    sysctl.write_text("1\n")
    section = userns.check(str(sysctl), lambda: ("powerless", errno.EACCES), landlock_abi=7)
    assert section["mode"] == "degraded" and "apparmor_restrict_unprivileged_userns = 1" in str(
        section["cause"]
    )
    profile = Path(__file__).parent.parent / "packaging" / "apparmor" / "warren"
    v = sys.version_info
    assert section["fix"] == [
        f"install -D -m 0755 {os.path.realpath(sys.executable)} /usr/lib/warren/python{v.major}.{v.minor}",
        f"install -m 0644 {profile.resolve()} /etc/apparmor.d/warren",
        "apparmor_parser -r /etc/apparmor.d/warren",
    ]
    printed = "\n".join(userns.render(section, fix=True))
    assert all(command in printed for command in section["fix"])
    # Control: the same namespaces without the sysctl set are not AppArmor's doing.
    sysctl.write_text("0\n")
    other = userns.check(str(sysctl), lambda: ("powerless", errno.EACCES), landlock_abi=7)
    assert other["fix"] == [] and "AppArmor restricts" not in str(other["cause"])
    assert userns.check(str(sysctl), lambda: ("powerless", errno.EACCES), landlock_abi=0)["mode"] == "refused"


PARSER = shutil.which("apparmor_parser") or (
    os.path.exists("/usr/sbin/apparmor_parser") and "/usr/sbin/apparmor_parser"
)


def test_the_shipped_apparmor_profile_parses(tmp_path: Path) -> None:
    """Debian 12's parser (AppArmor 3.0) predates the `userns` rule (4.0, Ubuntu >= 23.10):
    there the profile is parsed without its abi line and that one rule, which must be
    present as written; a 4.x parser reads it whole."""
    if not PARSER:
        need_tool("apparmor_parser", "it parses the shipped profile")
    assert isinstance(PARSER, str)
    profile = Path(__file__).parent.parent / "packaging" / "apparmor" / "warren"
    text = profile.read_text()
    assert "\n  userns,\n" in text and "abi <abi/4.0>," in text
    version = subprocess.run([PARSER, "--version"], capture_output=True, text=True).stdout
    if "version 3." in version:
        lines = [ln for ln in text.splitlines() if ln.strip() not in ("userns,", "abi <abi/4.0>,")]
        profile = tmp_path / "warren"
        profile.write_text("\n".join(lines) + "\n")
    r = subprocess.run([PARSER, "-Q", "-K", str(profile)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    broken = tmp_path / "broken"
    broken.write_text(
        profile.read_text().replace("flags=(unconfined) {", "flags=(unconfined) {\n  not a rule,")
    )
    assert subprocess.run([PARSER, "-Q", "-K", str(broken)], capture_output=True).returncode != 0
