"""warren's own control plane as attack surface: every attack is attempted for real and
judged from the host (a marker not created, a secret not printed, the supervisor and
other sandboxes still serving)."""

from __future__ import annotations

import json
import os
import pty
import random
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import warren
from conftest import WARREN, Layout, run_cli
from warren import protocol
from warren.client.sandbox import Sandbox
from warren.errors import ExecError, FileTooLarge, SandboxFileError
from warren.policy import PolicySpec
from warren.server import statedir

pytestmark = pytest.mark.usefixtures("state_home")


def _supervisor() -> tuple[str, int]:
    found = statedir.read_address(statedir.location(os.environ))
    assert found is not None
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# Runs in a sandbox with the supervisor's real (secret) address in argv[1]: if it could
# connect, it asks for a one-shot sandbox that writes argv[2] on the host.
EXPLOIT = r"""
import json, os, socket, struct, sys
token, marker = sys.argv[1], sys.argv[2]
out = {}
for name in ("\0warren-" + token,):
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(name)
    except OSError as e:
        out["connect"] = e.__class__.__name__
        continue
    out["connect"] = "CONNECTED"
    req = {"v": 2, "t": "run", "spec": {"workspace": os.path.dirname(marker)},
           "caller": {"cwd": "/", "env": {"PATH": "/usr/bin:/bin"}},
           "command": {"argv": ["touch", marker]}}
    data = json.dumps(req).encode()
    s.sendall(struct.pack("!II", len(data), 0) + data)
    out["reply"] = s.recv(4096).decode(errors="replace")
with open("/proc/net/unix") as f:
    out["visible_sockets"] = [l.split()[-1] for l in f if "warren" in l]
try:
    os.listdir(os.environ["STATE"])
    out["state_dir"] = "VISIBLE"
except OSError as e:
    out["state_dir"] = e.__class__.__name__
print(json.dumps(out))
"""


@pytest.mark.parametrize("path", ["run", "exec"])
@pytest.mark.parametrize("network", ["none", "allow"])
def test_no_sandbox_can_reach_the_supervisor(
    layout: Layout, state_home: Path, path: str, network: str
) -> None:
    victim = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="victim")
    token, pid = _supervisor()
    marker = layout.root / "PWNED"
    (layout.root / "exploit.py").write_text(EXPLOIT)
    argv = ["python3", str(layout.root / "exploit.py"), token, str(marker)]
    spec = PolicySpec(
        workspace=str(layout.workspace),
        read=[str(layout.root / "exploit.py")],
        env={"STATE": str(state_home / "warren")},
        network=network,
    )
    if path == "run":
        r = warren.run(argv, spec)
    else:
        with Sandbox.create(spec) as attacker:
            r = attacker.exec(argv)
    assert r.exit_code == 0, r.stderr
    seen = json.loads(r.stdout)
    assert seen["connect"] == "ConnectionRefusedError", seen
    assert seen["visible_sockets"] == [] and seen["state_dir"] in ("FileNotFoundError", "PermissionError")
    assert not marker.exists()
    assert _alive(pid) and _supervisor()[1] == pid
    assert victim.exec(["echo", "still here"]).stdout == b"still here\n"


def test_a_process_in_another_user_namespace_is_refused(tmp_path: Path) -> None:
    Sandbox.list()  # start the supervisor
    token, pid = _supervisor()
    probe = (
        "import socket, struct, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect('\\0warren-' + sys.argv[1])\n"
        'd = b\'{"v":2,"t":"list"}\'\n'
        "s.settimeout(5)\n"
        "try:\n    s.sendall(struct.pack('!II', len(d), 0) + d)\n    print(repr(s.recv(4096)))\n"
        "except (ConnectionResetError, BrokenPipeError):\n    print(repr(b''))\n"
    )
    r = subprocess.run(
        ["unshare", "--user", "--map-root-user", sys.executable, "-c", probe, token],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "b''"  # closed without a word
    log = (Path(statedir.location(os.environ)) / statedir.LOG_FILE).read_text()
    assert "refused a connection: the peer is in another user namespace" in log
    assert _alive(pid)


@pytest.mark.skipif(
    os.geteuid() != 0,
    reason="an unprivileged user makes a pid namespace only inside a user namespace of its own, "
    "where the supervisor's namespaces cannot be read at all (the degraded mode's case, test_degraded)",
)
def test_a_client_in_another_pid_namespace_is_told_to_use_a_state_directory_of_its_own() -> None:
    """A client in another pid namespace (a container sharing this home and the host's
    network) finds no process at the supervisor's pid and the lock held: it tries
    again a moment (a supervisor killed holds its lock that long), then fails with a
    hint, rather than running inline (which would skip what a next supervisor adopts
    first, were the holder dead). The supervisor serves on, unharmed."""
    Sandbox.list()  # start the supervisor
    _token, pid = _supervisor()
    r = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *WARREN, "run", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert "holds its lock" in r.stderr and "XDG_STATE_HOME" in r.stderr, r.stderr
    assert _alive(pid) and _supervisor()[1] == pid
    assert Sandbox.list() == []


def test_a_policy_that_would_make_the_state_dir_writable_is_refused(layout: Layout, tmp_path: Path) -> None:
    state = layout.workspace / "state"
    for via in (["run"], ["create"]):
        r = run_cli(
            [*via, "-w", str(layout.workspace), *(["--", "true"] if via == ["run"] else ["x"])],
            cwd=layout.workspace,
            env={"XDG_STATE_HOME": str(state)},
        )
        assert r.returncode == 125, r.stderr
        assert f"contains warren's state directory {state}/warren" in r.stderr and "hint:" in r.stderr


SNOOP = r"""
import ctypes, json, os, signal, sys
canary = sys.argv[1]
found, opened = [], {}
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == os.getpid():
        continue
    for name in ("environ", "cmdline", "mem"):
        try:
            with open(f"/proc/{pid}/{name}", "rb") as f:
                data = f.read(1 << 20) if name != "mem" else b""
            opened[f"{pid}/{name}"] = "opened"
            if canary.encode() in data:
                found.append(f"{pid}/{name}")
        except OSError as e:
            opened[f"{pid}/{name}"] = e.__class__.__name__
libc = ctypes.CDLL(None, use_errno=True)
attach = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH PID 1
tries = {"ptrace_pid1": "ALLOWED" if attach == 0 else os.strerror(ctypes.get_errno())}
for target, sig in ((1, signal.SIGSTOP), (os.getppid(), signal.SIGKILL)):
    try:
        os.kill(target, sig)
        tries[f"kill_{target}"] = "ALLOWED"
    except OSError as e:
        tries[f"kill_{target}"] = e.__class__.__name__
print(json.dumps({"found": found, "pid1": {k: v for k, v in opened.items() if k.startswith("1/")}, **tries}))
"""


@pytest.mark.parametrize("path", ["run", "exec"])
def test_pid1_and_helpers_hold_nothing_of_the_caller_and_cannot_be_touched(
    layout: Layout, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    canary = f"canary-{random.getrandbits(64):x}"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", canary)  # the caller's environment
    in_memory = f"held only in memory: {canary}"  # noqa: F841 - a secret of this process
    (layout.root / "snoop.py").write_text(SNOOP)
    spec = PolicySpec(workspace=str(layout.workspace), read=[str(layout.root / "snoop.py")])
    argv = ["python3", str(layout.root / "snoop.py"), canary]
    if path == "run":
        r = warren.run(argv, spec, timeout=30)
    else:
        with Sandbox.create(spec) as sb:
            r = sb.exec(argv, timeout=30)
            # PID 1 is a fork of the supervisor (a fresh interpreter), not of this process.
            ppid = int(Path(f"/proc/{sb.pid1}/stat").read_text().rsplit(")", 1)[1].split()[1])
            assert ppid == _supervisor()[1] and ppid != os.getpid()
    assert r.exit_code == 0 and not r.timed_out, r.stderr
    seen = json.loads(r.stdout)
    assert seen["found"] == [] and canary.encode() not in r.stdout + r.stderr
    assert seen["pid1"]["1/environ"] != "opened" and seen["pid1"]["1/mem"] != "opened"
    assert seen["ptrace_pid1"] != "ALLOWED"
    assert seen["kill_1"] == "PermissionError"
    assert set(seen) >= {"found", "pid1"} and all(
        v == "PermissionError" for k, v in seen.items() if k.startswith("kill_")
    ), seen


@pytest.mark.parametrize("path", ["run", "exec"])
def test_a_command_cannot_kill_its_helper_to_escape_the_timeout(layout: Layout, path: str) -> None:
    argv = ["sh", "-c", "kill -KILL $PPID; echo kill-status=$?; exec sleep 60"]
    start = time.monotonic()
    if path == "run":
        r = warren.run(argv, PolicySpec(workspace=str(layout.workspace)), timeout=2)
    else:
        with Sandbox.create(PolicySpec(workspace=str(layout.workspace))) as sb:
            r = sb.exec(argv, timeout=2)
            assert sb.exec(["true"]).exit_code == 0
    assert time.monotonic() - start < 10
    assert r.timed_out and r.signal == signal.SIGKILL
    assert b"kill-status=1" in r.stdout  # the helper is outside the command's reach


def _pty_session(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, int]:
    pid, fd = pty.fork()
    if pid == 0:
        os.chdir(cwd)
        os.environ.update(env)
        os.execv(argv[0], argv)
    return pid, fd


def _read_until(fd: int, token: bytes, seconds: float) -> bytes:
    out = b""
    deadline = time.monotonic() + seconds
    while token not in out and time.monotonic() < deadline:
        if select.select([fd], [], [], 0.5)[0]:
            try:
                out += os.read(fd, 4096)
            except OSError:
                break
    return out


def test_exec_on_a_terminal_gets_its_own_pty_and_leftovers_cannot_read_the_user(layout: Layout) -> None:
    ws = layout.workspace
    assert run_cli(["create", "-w", str(ws), "termbox"], cwd=ws).returncode == 0
    script = "tty > tty.txt; (sleep 1; cat > leftover.txt 2>/dev/null) & echo started; exit 0"
    pid, fd = _pty_session([*WARREN, "exec", "termbox", "sh", "-c", script], ws, {})
    try:
        assert b"started" in _read_until(fd, b"started", 20)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The user types into their shell after `warren exec` returned.
        os.write(fd, b"typed-after-exec: my password\n")
        time.sleep(2)
    finally:
        os.close(fd)
    inner = (ws / "tty.txt").read_text().strip()
    assert inner.startswith("/dev/pts/")  # a terminal made inside the sandbox
    leftover = ws / "leftover.txt"
    assert not leftover.exists() or b"typed-after-exec" not in leftover.read_bytes()


def _raw(payload: bytes, fds: list[int] | None = None, wait: float = 5.0) -> bytes:
    """Send raw bytes to the supervisor; what it answers before closing."""
    token, _pid = _supervisor()
    s = socket.socket(socket.AF_UNIX)
    s.connect("\0warren-" + token)
    if fds:
        s.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(f"{len(fds)}i", *fds))])
    else:
        s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    s.settimeout(wait)
    data = b""
    try:
        while chunk := s.recv(65536):
            data += chunk
    except TimeoutError:
        data += b"<no answer>"
    s.close()
    return data


def _frame(obj: object, payload_len: int = 0) -> bytes:
    data = json.dumps(obj).encode()
    return struct.pack("!II", len(data), payload_len) + data


def _error_kind(reply: bytes) -> str | None:
    if len(reply) < 8:
        return None
    n, _ = struct.unpack("!II", reply[:8])
    msg = json.loads(reply[8 : 8 + n])
    return str(msg["error"]["kind"]) if msg.get("t") == "error" else None


def test_malformed_messages_are_typed_errors_that_harm_nothing(layout: Layout) -> None:
    sb = Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="bystander")
    _token, pid = _supervisor()
    cases = {
        "huge length": struct.pack("!II", 0xFFFFFFF0, 0) + b"{}x",
        "huge payload": _frame({"v": protocol.VERSION, "t": "list"}, payload_len=0xFFFFFFFF),
        "not json": struct.pack("!II", 5, 0) + b"{nope",
        "json array": _frame([1, 2, 3]),
        "other version": _frame({"v": 999, "t": "list"}),
        "unknown kind": _frame({"v": protocol.VERSION, "t": "format-disk"}),
        "wrong types": _frame({"v": protocol.VERSION, "t": "stop", "name": 42}),
        "unknown field": _frame({"v": protocol.VERSION, "t": "list", "evil": True}),
        "NUL in argv": _frame(
            {"v": protocol.VERSION, "t": "exec", "sandbox": "bystander", "command": {"argv": ["tr\u0000ue"]}}
        ),
        "declared stdio missing": _frame(
            {
                "v": protocol.VERSION,
                "t": "exec",
                "sandbox": "bystander",
                "command": {"argv": ["true"], "stdio": [True, True, True]},
            }
        ),
    }
    for what, payload in cases.items():
        reply = _raw(payload)
        assert _error_kind(reply) == "ProtocolError", (what, reply[:300])
    # Nine descriptors: more than a frame may carry.
    fds = [os.open(os.devnull, os.O_RDONLY) for _ in range(9)]
    try:
        assert _error_kind(_raw(_frame({"v": protocol.VERSION, "t": "list"}), fds)) == "ProtocolError"
    finally:
        for fd in fds:
            os.close(fd)
    # Truncated: half a header, then the client hangs up.
    assert _raw(struct.pack("!II", 100, 0) + b'{"v":') == b""
    rng = random.Random(9)
    for _ in range(200):
        junk = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 64)))
        _raw(struct.pack("!II", len(junk), 0) + junk, wait=2)
    assert _alive(pid) and _supervisor()[1] == pid
    assert sb.exec(["echo", "unharmed"]).stdout == b"unharmed\n"
    sb.remove()


def test_a_slow_client_stalls_nobody(layout: Layout) -> None:
    Sandbox.list()
    token, _pid = _supervisor()
    slow = socket.socket(socket.AF_UNIX)
    slow.connect("\0warren-" + token)
    slow.sendall(b"\0\0")  # two bytes of a header, then nothing
    start = time.monotonic()
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace))) as sb:
        assert sb.exec(["true"]).exit_code == 0
    assert time.monotonic() - start < 3
    slow.close()


def test_after_a_supervisor_crash_the_same_name_can_be_created_at_once(layout: Layout) -> None:
    spec = PolicySpec(workspace=str(layout.workspace))
    Sandbox.create(spec, name="phoenix")
    _token, pid = _supervisor()
    os.kill(pid, signal.SIGKILL)
    while _alive(pid):
        time.sleep(0.01)
    again = Sandbox.create(spec, name="phoenix")  # no `warren ls` in between
    assert again.exec(["echo", "back"]).stdout == b"back\n"
    again.remove()


def test_warren_run_works_from_any_thread(layout: Layout) -> None:
    results: list[warren.Result] = []
    t = threading.Thread(
        target=lambda: results.append(warren.run(["echo", "hi"], PolicySpec(workspace=str(layout.workspace))))
    )
    t.start()
    t.join(60)
    assert results and results[0].stdout == b"hi\n"


def _host_pids_with(token: str) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if token.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    out.append(int(name))
            except OSError:
                pass
    return out


@pytest.mark.parametrize("path", ["run", "exec"])
def test_sigkill_of_the_cli_kills_the_command_tree(layout: Layout, path: str) -> None:
    ws = layout.workspace
    token = f"{os.getpid()}{random.getrandbits(30)}"  # sleep 1000.TOKEN: a valid interval
    script = f"sleep 1000.{token} & setsid sleep 1001.{token} & exec sleep 1002.{token}"
    if path == "run":
        argv = [*WARREN, "run", "--", "sh", "-c", script]
    else:
        assert run_cli(["create", "-w", str(ws), "killme"], cwd=ws).returncode == 0
        argv = [*WARREN, "exec", "killme", "sh", "-c", script]
    cli = subprocess.Popen(argv, cwd=ws, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    sleeps = [p for p in _host_pids_with(token) if p != cli.pid]
    while len(sleeps) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
        sleeps = [p for p in _host_pids_with(token) if p != cli.pid]
    assert len(sleeps) == 3
    cli.kill()
    cli.wait()
    deadline = time.monotonic() + 10
    while _host_pids_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _host_pids_with(token) == []


def test_bad_arguments_are_typed_errors(layout: Layout) -> None:
    spec = PolicySpec(workspace=str(layout.workspace))
    for bad in (["tr\0ue"], [b"true"], "true", [], [""]):
        with pytest.raises(ExecError):
            warren.run(bad, spec)  # type: ignore[arg-type]
    for timeout in (float("inf"), float("nan"), -1, 0, "5"):
        with pytest.raises(ExecError):
            warren.run(["true"], spec, timeout=timeout)  # type: ignore[arg-type]
    assert warren.run(["cat"], spec, stdin="text in").stdout == b"text in"
    with pytest.raises(ExecError):
        warren.run(["true"], spec, stdin=42)  # type: ignore[arg-type]
    with Sandbox.create(spec) as sb:
        with pytest.raises(SandboxFileError) as info:
            sb.files.write("x", "y", mode="755")  # type: ignore[arg-type]
        assert "0o755" in info.value.hint
        with pytest.raises(SandboxFileError):
            sb.files.write("x", "y", mode=0o4755)  # no setuid bits through the files API
        big = layout.workspace / "sparse"
        with open(big, "wb") as f:
            f.truncate(512 << 20)
        start = time.monotonic()
        with pytest.raises(FileTooLarge):
            sb.files.read("sparse")
        assert time.monotonic() - start < 5
        with pytest.raises(SandboxFileError):
            sb.files.read("sparse", max_bytes=600 << 20)
        with pytest.raises(SandboxFileError):
            sb.files.read("a\0b")
    for flags, message in (
        (["--write", ""], "empty path"),
        (["--write", "/" + "a" * 5000], "path too long"),
        (["--deny", "/x/" + "b" * 300], "path too long"),
    ):
        r = run_cli(["run", *flags, "--", "true"], cwd=layout.workspace)
        assert r.returncode == 125 and message in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_ids_names_and_rules_of_the_wrong_type_are_typed_errors_naming_the_argument(layout: Layout) -> None:
    """What a caller passes by id or by name (a checkpoint, a background process, a
    snapshot, a waiting request, a network rule, a sandbox's name) was judged only by
    the protocol's decoder: a ``ProtocolError`` "malformed message" naming a field the
    caller never wrote (``id``). Each is now refused before anything is sent, with the
    error of its kind naming the argument; a trail followed with a poll of 0 or less
    was a busy loop (async) or a traceback (sync); a callback that is not a function, or
    a wait's timeout that is not a number, was a TypeError from deep inside."""
    import asyncio

    from warren import AsyncSandbox
    from warren.errors import (
        CheckpointError,
        PolicyError,
        ProcessNotFound,
        ProtocolError,
        SandboxError,
        SnapshotNotFound,
    )

    spec = PolicySpec(workspace=str(layout.workspace))
    with Sandbox.create(spec) as sb:
        # Typed as Any: these are what a caller without a type checker passes.
        three: Any = 3
        text: Any = "x"
        cases = [
            (lambda: sb.rollback(text), CheckpointError, "checkpoint must be a whole number"),
            (lambda: sb.rollback(-1), CheckpointError, "checkpoint must be a whole number"),
            (lambda: sb.process(three), ProcessNotFound, "spawn_id must be a non-empty string"),
            (lambda: sb.net_allow(three), SandboxError, "rule must be a non-empty string"),
            (lambda: sb.net_deny(""), SandboxError, "rule must be a non-empty string"),
            (lambda: sb.net_approve(text), SandboxError, "request_id must be a whole number"),
            (lambda: sb.net_reject(True), SandboxError, "request_id must be a whole number"),
            (lambda: Sandbox.remove_snapshot(three), SnapshotNotFound, "snapshot id must be"),
            (lambda: Sandbox.create(spec, name=three), PolicyError, "invalid sandbox name 3"),
            (lambda: Sandbox.get(None), PolicyError, "invalid sandbox name None"),  # type: ignore[arg-type]
            (lambda: sb.files.read("x", max_bytes=-1), ExecError, "max_bytes must be a byte count"),
            (lambda: sb.exec([]), ExecError, "not an empty list"),
            (lambda: list(sb.events(follow=True, poll=0)), SandboxError, "poll must be a number of seconds"),
            (lambda: list(sb.events(poll=float("nan"))), SandboxError, "poll must be a number of seconds"),
            (lambda: sb.exec(["true"], on_stdout=three), ExecError, "on_stdout must be a function"),
            (lambda: warren.run(["true"], spec, on_stderr=text), ExecError, "on_stderr must be a function"),
            (lambda: sb.spawn(["true"]).wait(timeout=text), ExecError, "must be a number of seconds or None"),
        ]
        for call, error, said in cases:
            with pytest.raises(error) as e:
                call()
            assert not isinstance(e.value, ProtocolError) and said in str(e.value), str(e.value)
            assert e.value.hint, said

        async def follow_with_no_pause() -> None:
            asb = await AsyncSandbox.get(sb.name)
            async for _ in asb.events(follow=True, poll=-1):
                pass

        with pytest.raises(SandboxError, match="poll must be"):
            asyncio.run(follow_with_no_pause())
        assert sb.exec(["echo", "still here"]).stdout == b"still here\n"


def test_the_protocol_round_trips_every_message_kind() -> None:
    protocol.base._load_channels()
    for kind, cls in protocol.base._KINDS.items():
        assert kind == cls.TAG
    msg = protocol.RunRequest(
        spec=protocol.Spec(write=["/x"], env={"A": "b"}, memory="512M", pids=64),
        caller=protocol.Caller(cwd="/", env={"K": "é"}),
        command=protocol.Command(argv=["a", "b"], tty=protocol.Tty(rows=3, fds=[0, 1])),
    )
    assert protocol.decode(msg.encode()) == msg


def test_a_sandbox_whose_pid1_dies_is_said_in_the_supervisors_log(tmp_path: Path) -> None:
    """PID 1 killed from outside (or dead of a bug): its clients hear the sandbox is
    gone, the supervisor's log says which ended and how, and the name can be removed."""
    (ws := tmp_path / "ws").mkdir()
    sb = Sandbox.create(PolicySpec(workspace=str(ws)), name="dies")
    try:
        assert sb.pid1 > 0
        os.kill(sb.pid1, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(s.name == "dies" and s.state == "running" for s in Sandbox.list()):
            assert time.monotonic() < deadline, "the supervisor never saw PID 1 end"
            time.sleep(0.05)
        log = (Path(statedir.location(os.environ)) / statedir.LOG_FILE).read_text()
        assert f"sandbox dies: the sandbox's PID 1 ({sb.pid1}) was killed by signal SIGKILL" in log, log
    finally:
        sb.remove()
    assert all(s.name != "dies" for s in Sandbox.list())


def test_pid1_failing_names_where() -> None:
    from warren._core import pid1

    def inner() -> None:
        raise KeyError("x")

    try:
        inner()
    except KeyError as e:
        said = pid1._crashed(e)
    assert said.message.startswith("PID 1 failed: KeyError('x') at test_control_plane.py:")
    assert " inner" in said.message and "bug in warren" in (said.hint or "")
