"""Long-lived sandboxes: exec, spawn, processes, files, timeouts, concurrency, death.

Every test runs against a real supervisor in a state directory private to this
module (XDG_STATE_HOME), so nothing touches the caller's own sandboxes.
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import warren
from conftest import Layout, module_state
from warren.client.sandbox import Sandbox
from warren.errors import (
    CommandNotFound,
    CwdNotFound,
    PortNotForwarded,
    PortUnavailable,
    SandboxDead,
    SandboxError,
    SandboxExists,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxPermissionDenied,
)
from warren.policy import PolicySpec, build
from warren.server import statedir
from warren.server.registry import process_start_time


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _policy(layout: Layout, **extra: object) -> warren.Policy:
    return build(PolicySpec(workspace=str(layout.workspace), write=[str(layout.cache)], **extra))  # type: ignore[arg-type]


@pytest.fixture
def sb(layout: Layout) -> Iterator[Sandbox]:
    with Sandbox.create(_policy(layout)) as sandbox:
        yield sandbox


def _host_pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _ns_of(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _host_pids_in_ns(kind: str, inode: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/{kind}") == inode:
                    found.append(int(name))
            except OSError:
                continue
    return found


def test_exec_returns_output_status_and_runs_in_the_workspace(sb: Sandbox, layout: Layout) -> None:
    r = sb.exec(["sh", "-c", "pwd; echo err >&2; touch made; exit 3"])
    assert (r.exit_code, r.stdout, r.stderr) == (3, f"{layout.workspace}\n".encode(), b"err\n")
    assert r.cwd == str(layout.workspace)
    assert (layout.workspace / "made").exists()
    assert sb.exec(["cat"], stdin=b"x" * 200000).stdout == b"x" * 200000


def test_exec_sees_per_call_env_and_cwd(sb: Sandbox, layout: Layout) -> None:
    (layout.workspace / "sub").mkdir()
    r = sb.exec(["sh", "-c", "pwd; echo $GREETING"], cwd="sub", env={"GREETING": "hi"})
    assert r.stdout == f"{layout.workspace / 'sub'}\nhi\n".encode()


def test_exec_reports_signals_as_128_plus_n_with_the_name(sb: Sandbox) -> None:
    r = sb.exec(["sh", "-c", "kill -TERM $$"])
    assert (r.exit_code, r.signal, r.signal_name) == (143, 15, "SIGTERM")


def test_exec_runs_fully_hardened_and_confined(sb: Sandbox, layout: Layout) -> None:
    status = sb.exec(["cat", "/proc/self/status"]).stdout.decode()
    for field in ("CapPrm", "CapEff", "CapBnd", "CapAmb"):
        assert f"{field}:\t0000000000000000" in status
    assert "NoNewPrivs:\t1" in status and "Seccomp:\t2" in status
    r = sb.exec(["sh", "-c", f"touch {layout.root}/escape; touch /usr/escape"])
    assert r.exit_code != 0
    assert not (layout.root / "escape").exists()


def test_missing_command_is_a_typed_error(sb: Sandbox) -> None:
    with pytest.raises(CommandNotFound) as info:
        sb.exec(["no-such-tool-here"])
    assert info.value.path == "no-such-tool-here"


def _greets(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            return conn.recv(2) == b"hi"
    except OSError:
        return False


def test_spawns_and_forwarded_ports_are_listed_and_a_forward_closed(sb: Sandbox) -> None:
    """What ``warren ps -a`` and ``warren port`` show, through the API (and over HTTP in
    test_remote_sdk): ended background processes with their status, forwards, and a
    closed forward judged by a connection from the host."""
    ended = sb.spawn(["sh", "-c", "exit 5"])
    assert ended.wait(timeout=30) == 5
    listen = (
        "import socket\ns = socket.socket(); s.bind(('127.0.0.1', 8766)); s.listen(8)\n"
        "while True:\n    c, _ = s.accept(); c.sendall(b'hi'); c.close()\n"
    )
    server = sb.spawn(["python3", "-c", listen])
    records = {s.spawn_id: s for s in sb.spawns()}
    assert records[ended.id].exit_code == 5 and not records[ended.id].running
    assert records[server.id].running and records[server.id].exit_code is None
    address = sb.expose(8766)
    deadline = time.monotonic() + 10
    while not _greets(address) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server inside may still be starting
    assert _greets(address)  # the control: forwarded, the host reaches it
    assert sb.exposed() == {8766: address}
    sb.unexpose(8766)
    assert not _greets(address) and sb.exposed() == {}
    with pytest.raises(PortNotForwarded, match="not forwarded"):
        sb.unexpose(8766)
    with socket.socket() as taken:  # a host port in use is the request's, not warren's failure
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        with pytest.raises(PortUnavailable, match="cannot listen"):
            sb.expose(8766, host_port=taken.getsockname()[1])
    server.kill()


def test_spawned_http_server_answers_a_later_exec(sb: Sandbox, layout: Layout) -> None:
    (layout.workspace / "index.html").write_text("hello from the sandbox\n")
    server = sb.spawn(["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"])
    assert server.pid > 1 and server.running
    client = (
        "import time, urllib.request\n"
        "for _ in range(100):\n"
        "    try:\n"
        "        print(urllib.request.urlopen('http://127.0.0.1:8765/index.html').read().decode(), end='')\n"
        "        break\n"
        "    except OSError:\n"
        "        time.sleep(0.05)\n"
    )
    r = sb.exec(["python3", "-c", client], timeout=30)
    assert r.stdout == b"hello from the sandbox\n"
    listed = {p.pid: p for p in sb.processes()}
    assert server.pid in listed and listed[server.pid].spawn_id == server.id
    assert "http.server" in listed[server.pid].argv
    # The sandbox has its own network namespace: the host cannot reach the server.
    with pytest.raises(OSError):
        urllib.request.urlopen("http://127.0.0.1:8765/", timeout=1)
    server.kill(signal.SIGTERM)
    assert server.wait(timeout=10) == 128 + signal.SIGTERM
    assert b"GET /index.html" in server.output().stderr
    assert not server.running


def test_exec_never_breaks_after_the_workspace_is_emptied_removed_or_symlinked(layout: Layout) -> None:
    # The parent is writable too, so the policy allows removing the workspace itself.
    policy = build(PolicySpec(workspace=str(layout.workspace), write=[str(layout.root)]))
    ws = layout.workspace
    other = layout.root / "other"
    with Sandbox.create(policy) as sb:
        (ws / "a").mkdir()
        (ws / "a" / "f").write_text("x")
        assert sb.exec(["sh", "-c", "rm -rf ./* ./.??* 2>/dev/null; ls -A"]).exit_code == 0
        r = sb.exec(["pwd"])
        assert (r.exit_code, r.stdout) == (0, f"{ws}\n".encode())

        assert sb.exec(["rm", "-rf", str(ws)]).exit_code == 0
        assert not ws.exists()
        r = sb.exec(["sh", "-c", "echo still here"])
        assert (r.exit_code, r.stdout) == (0, b"still here\n")
        assert r.cwd == str(layout.root) and "does not exist" in r.warnings[0]

        assert sb.exec(["sh", "-c", f"mkdir {other} && ln -s {other} {ws}"]).exit_code == 0
        assert ws.is_symlink()
        r = sb.exec(["sh", "-c", "touch via-link; pwd -P"])
        assert (r.exit_code, r.stdout, r.warnings) == (0, f"{other}\n".encode(), ())
        assert (other / "via-link").exists()

        missing = ws / "deep" / "er"
        with pytest.raises(CwdNotFound) as info:
            sb.exec(["true"], cwd=missing)
        assert info.value.path == str(missing)
        assert f"mkdir -p {missing}" in info.value.hint
        assert sb.exec(["mkdir", "-p", str(missing)]).exit_code == 0
        assert sb.exec(["pwd", "-P"], cwd=missing).stdout == f"{other}/deep/er\n".encode()
        assert sb.exec(["echo", "normal"]).stdout == b"normal\n"


def test_files_api_round_trip_in_bytes_and_text(sb: Sandbox, layout: Layout) -> None:
    sb.files.write("notes/a.txt", "héllo\n", parents=True)
    sb.files.write("notes/a.txt", b"more\n", append=True)
    assert sb.files.read_text("notes/a.txt") == "héllo\nmore\n"
    assert (layout.workspace / "notes" / "a.txt").read_text() == "héllo\nmore\n"
    assert [e.name for e in sb.files.list("notes")] == ["a.txt"]
    assert sb.files.stat("notes/a.txt").type == "file"
    sb.files.mkdir("notes/d")
    sb.files.rename("notes/a.txt", "notes/d/b.txt")
    assert sb.files.exists("notes/d/b.txt") and not sb.files.exists("notes/a.txt")
    sb.files.remove("notes", recursive=True)
    assert not (layout.workspace / "notes").exists()
    with pytest.raises(SandboxFileNotFound) as info:
        sb.files.read("nope.txt")
    assert info.value.path == "nope.txt" and info.value.hint


def test_files_api_cannot_escape_the_policy(layout: Layout) -> None:
    secret = layout.root / "secret"
    secret.mkdir()
    (secret / "key").write_text("TOP SECRET\n")
    policy = _policy(layout, deny=[str(secret)])
    ws = layout.workspace
    with Sandbox.create(policy) as sb:
        # ../ traversal to a file outside the writable roots
        with pytest.raises(SandboxPermissionDenied):
            sb.files.write("../outside.txt", b"pwned")
        with pytest.raises(SandboxPermissionDenied):
            sb.files.write("../../../../../../../../etc/warren-pwned", b"pwned")
        # absolute symlink out of the workspace
        (ws / "abs").symlink_to(layout.outside)
        with pytest.raises(SandboxPermissionDenied):
            sb.files.write("abs", b"pwned")
        (ws / "up").symlink_to(layout.root)
        with pytest.raises(SandboxPermissionDenied):
            sb.files.remove("up/outside.txt")
        (ws / "etc").symlink_to("/etc")
        with pytest.raises(SandboxPermissionDenied):
            sb.files.write("etc/warren-pwned", b"pwned")
        # symlink to a denied path: hidden inside, so nothing to read
        (ws / "peek").symlink_to(secret / "key")
        with pytest.raises((SandboxFileNotFound, SandboxPermissionDenied)):
            sb.files.read("peek")
        with pytest.raises((SandboxFileNotFound, SandboxPermissionDenied)):
            sb.files.list(str(secret))
        # a symlink swapped between a harmless file and the secret, for 2 s
        (ws / "plain").write_text("plain\n")
        stop = threading.Event()

        def swap() -> None:
            link, tmp = ws / "race", ws / "race.tmp"
            while not stop.is_set():
                for target in (ws / "plain", secret / "key", layout.outside):
                    with __import__("contextlib").suppress(FileNotFoundError):
                        tmp.unlink()
                    tmp.symlink_to(target)
                    os.replace(tmp, link)

        swapper = threading.Thread(target=swap)
        swapper.start()
        reads = writes = 0
        try:
            deadline = time.monotonic() + 2
            while time.monotonic() < deadline:
                try:
                    data = sb.files.read("race")
                    assert b"SECRET" not in data
                    reads += 1
                except (SandboxFileNotFound, SandboxPermissionDenied):
                    pass
                try:
                    sb.files.write("race", b"overwritten\n")
                    writes += 1
                except (SandboxFileNotFound, SandboxPermissionDenied):
                    pass
        finally:
            stop.set()
            swapper.join()
        assert reads > 0 and writes > 0  # the race really ran both ways
    assert layout.outside.read_text() == "keep me\n"
    assert (secret / "key").read_text() == "TOP SECRET\n"
    assert not Path("/etc/warren-pwned").exists()


def test_timeout_kills_a_forked_child_that_ignores_sigterm(sb: Sandbox) -> None:
    script = "sh -c 'trap \"\" TERM; exec sleep 303' & sh -c 'setsid sleep 304 &' ; wait"
    start = time.monotonic()
    r = sb.exec(["sh", "-c", script], timeout=1)
    assert r.timed_out and r.signal == signal.SIGKILL and r.exit_code == 137
    assert time.monotonic() - start < 8
    left = [p.argv for p in sb.processes()]
    assert not [a for a in left if a[:1] == ["sleep"]], left
    assert sb.exec(["echo", "alive"]).stdout == b"alive\n"


def test_output_is_capped_with_a_visible_marker(layout: Layout) -> None:
    with Sandbox.create(_policy(layout), output_limit=1000) as sb:
        r = sb.exec(["python3", "-c", "import sys; sys.stdout.write('x' * 300000)"])
        assert r.stdout_truncated and r.stdout.startswith(b"x" * 1000)
        assert b"output truncated, 299000 more bytes dropped" in r.stdout
        p = sb.spawn(["python3", "-c", "import sys; sys.stderr.write('y' * 5000)"])
        assert p.wait(timeout=20) == 0
        # The exit status can be reported before the last of the output is read.
        deadline = time.monotonic() + 10
        err = p.output().stderr
        while b"more bytes dropped" not in err and time.monotonic() < deadline:
            time.sleep(0.1)
            err = p.output().stderr
        assert err.startswith(b"y" * 1000) and b"4000 more bytes dropped" in err


def test_fifty_concurrent_execs_in_one_sandbox(sb: Sandbox) -> None:
    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda i: sb.exec(["sh", "-c", f"echo {i}; exit {i % 7}"]), range(50)))
    assert [(r.stdout, r.exit_code) for r in results] == [(f"{i}\n".encode(), i % 7) for i in range(50)]


def test_twenty_sandboxes_at_once(tmp_path: Path) -> None:
    def one(i: int) -> tuple[bytes, bytes]:
        ws = tmp_path / f"w{i}"
        ws.mkdir()
        with Sandbox.create(build(PolicySpec(workspace=str(ws))), name=f"many-{i}") as sb:
            sb.files.write("id", f"{i}\n")
            return sb.exec(["sh", "-c", "cat id; hostname"]).stdout, (ws / "id").read_bytes()

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    host = socket.gethostname()  # the host's name, as tools that name files after it expect
    assert results == [(f"{i}\n{host}\n".encode(), f"{i}\n".encode()) for i in range(20)]


def test_reattach_by_name_and_errors_for_missing_or_stopped(layout: Layout) -> None:
    sb = Sandbox.create(_policy(layout), name="reattach")
    try:
        with pytest.raises(SandboxExists):
            Sandbox.create(_policy(layout), name="reattach")
        p = sb.spawn(["sleep", "60"])
        again = Sandbox.get("reattach")
        assert again.exec(["echo", "ok"]).stdout == b"ok\n"
        assert p.pid in [q.pid for q in again.processes()]
        assert again.process(p.id).running
        assert "reattach" in [e.name for e in Sandbox.list() if e.state == "running"]
        sb.stop()
        with pytest.raises(SandboxDead) as info:
            again.exec(["true"])
        assert "stopped" in str(info.value)
        assert [e.state for e in Sandbox.list() if e.name == "reattach"] == ["stopped"]
    finally:
        sb.remove()
    with pytest.raises(SandboxNotFound):
        Sandbox.get("reattach")


def test_a_sandbox_made_from_a_path_is_a_typed_error_with_the_way_to_make_one(layout: Layout) -> None:
    """``Sandbox("/path")`` (a newcomer's first guess) failed later, in ``__exit__``,
    with an AttributeError traceback; it says at once how a sandbox is made."""
    with pytest.raises(SandboxError) as info:
        Sandbox(str(layout.workspace))  # type: ignore[arg-type]
    assert "Sandbox() takes the SandboxInfo of a sandbox, not str" in str(info.value)
    assert "Sandbox.create(PolicySpec(workspace=" in str(info.value)


def test_supervisor_sigkill_leaves_no_process_or_mount_and_is_recorded(
    layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "own-state"))
    sb = Sandbox.create(_policy(layout), name="doomed")
    try:
        _kill_supervisor_and_check(sb, layout)
    finally:
        sb.remove()


def _kill_supervisor_and_check(sb: Sandbox, layout: Layout) -> None:
    token = f"305.{os.getpid()}"  # unique: tells this test's sleeper from any other
    sb.spawn(["sh", "-c", f"trap '' TERM; sleep {token}"])
    sb.files.write("kept.txt", "data\n")
    # PID 1 is not dumpable (its /proc/N/ns is closed to an unprivileged owner): take
    # the namespaces from the sandboxed sleep, found on the host by its command line.
    # spawn returns once sh runs; sh forks the sleep a moment later (under load, after
    # the write above has come back): wait for it.
    deadline = time.monotonic() + 10
    while not (found := [p for p in _host_pids() if _cmdline(p) == f"sleep\x00{token}\x00".encode()]):
        assert time.monotonic() < deadline, "the sandboxed sleep never showed on the host"
        time.sleep(0.02)
    [sleeper] = found
    pid_ns = os.readlink(f"/proc/{sleeper}/ns/pid")
    mnt_ns = os.readlink(f"/proc/{sleeper}/ns/mnt")
    # Held open so that their numbers are not given to new namespaces (other tests',
    # other sessions') once the sandbox's are gone: the checks below then see only it.
    held = [os.open(f"/proc/{sleeper}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC) for kind in ("pid", "mnt")]
    try:
        _check_gone(sb, layout, token, pid_ns, mnt_ns)
    finally:
        for fd in held:
            os.close(fd)


def _check_gone(sb: Sandbox, layout: Layout, token: str, pid_ns: str, mnt_ns: str) -> None:
    pid1_start = process_start_time(sb.pid1)
    assert pid1_start is not None
    assert len(_host_pids_in_ns("pid", pid_ns)) >= 2
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    os.kill(found[1], signal.SIGKILL)
    # Everything goes, but not at once: PID 1 and the supervisor's helpers joined to the
    # sandbox's mount namespace die of their parent's death, each when next scheduled.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (
        _host_pids_in_ns("pid", pid_ns)
        or _host_pids_in_ns("mnt", mnt_ns)
        or process_start_time(sb.pid1) == pid1_start
    ):
        time.sleep(0.05)
    assert _host_pids_in_ns("pid", pid_ns) == []
    assert process_start_time(sb.pid1) != pid1_start  # PID 1 itself is gone
    assert [p for p in _host_pids() if _cmdline(p) == f"sleep\x00{token}\x00".encode()] == []
    left = {p: (_cmdline(p)[:200], _ns_of(p, "pid")) for p in _host_pids_in_ns("mnt", mnt_ns)}
    assert left == {}  # no process is left in the mount namespace
    [dead] = [e for e in Sandbox.list() if e.name == "doomed"]
    assert dead.state == "dead" and "supervisor" in dead.reason and "killed" in dead.reason
    with pytest.raises(SandboxDead):
        sb.exec(["true"])
    assert (layout.workspace / "kept.txt").read_text() == "data\n"
