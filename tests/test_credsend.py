"""A command's unix sends name the command as their sender, as on the host
(``_core.credsend``): the broker makes every send, and the credentials sender, which
alone keeps CAP_SYS_ADMIN, names the command in them. Judged against the same script
on the host; the sender itself attacked from inside and killed from the host."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import SENDMMSG, module_state
from warren import PolicySpec, Sandbox
from warren._core import credsend

pytestmark = pytest.mark.skipif(
    credsend.program() is None, reason="warren-credsend was not built (no C compiler at install)"
)

CREDS = (
    SENDMMSG
    + r"""
import json, os, socket, struct, sys, threading
out = {}
def seen(sock, room=64):
    msg, anc, _, _ = sock.recvmsg(16, room)
    kinds = {t: data for _lvl, t, data in anc}
    pid = struct.unpack('iII', kinds[socket.SCM_CREDENTIALS])[0] if socket.SCM_CREDENTIALS in kinds else None
    return msg, pid, kinds
a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
b.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
a.sendmsg([b'hi'])
out['stream'] = seen(b)[1] == os.getpid()
# (send() is sendto with no address, which the kernel makes itself: sendmsg is brokered)
t = threading.Thread(target=lambda: a.sendmsg([b'th']))
t.start(); t.join()
out['thread'] = seen(b)[1] == os.getpid()  # a thread's send names its process
own = struct.pack('iII', os.getpid(), os.getuid(), os.getgid())
a.sendmsg([b'ex'], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, own)])
out['explicit'] = seen(b)[1] == os.getpid()
c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
d.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
r, w = os.pipe()
c.sendmsg([b'fd'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('i', w))])
msg, pid, kinds = seen(d)
os.write(struct.unpack('i', kinds[socket.SCM_RIGHTS])[0], b'ok')
out['dgram_with_fd'] = [pid == os.getpid(), os.read(r, 2).decode()]
# an abstract listener: the peer's credentials on each message
srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
srv.bind(b'\0warren-credsend-test-%d' % os.getpid()); srv.listen()
cli = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
cli.connect(srv.getsockname())
conn, _ = srv.accept()
conn.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
cli.sendmsg([b'seq'])
out['seqpacket'] = seen(conn)[1] == os.getpid()
# a large blocking stream write, read on the other side meanwhile: all of it arrives
big = os.urandom(3 << 20)
got = bytearray()
def drain():
    while len(got) < len(big):
        got.extend(b.recv(1 << 16))
t = threading.Thread(target=drain); t.start()
view = memoryview(big)
while view:
    view = view[a.sendmsg([view[:1 << 20]]):]
t.join()
out['big_stream'] = bytes(got) == big
# sendmmsg: two datagrams in one call, each naming the process
sent, _lens = sendmmsg(c.fileno(), [b'one', b'two'])
out['sendmmsg'] = [sent] + [[m.decode(), pid == os.getpid()] for m, pid, _ in (seen(d), seen(d))]
out['pid'] = os.getpid()
print(json.dumps(out))
"""
)
WANT = {
    "stream": True,
    "thread": True,
    "explicit": True,
    "dgram_with_fd": [True, "ok"],
    "seqpacket": True,
    "big_stream": True,
    "sendmmsg": [2, ["one", True], ["two", True]],
}


@pytest.fixture(scope="module", autouse=True)
def _module_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def sb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    workspace = tmp_path_factory.mktemp("credsend")
    with Sandbox.create(PolicySpec(workspace=str(workspace))) as box:
        yield box


def _inside(sb: Sandbox) -> dict[str, object]:
    r = sb.exec(["python3", "-c", CREDS], timeout=60)
    assert r.exit_code == 0, r.stderr.decode()[-2000:]
    out: dict[str, object] = json.loads(r.stdout)
    return out


def _sender(pid1: int) -> int:
    """The host's pid of the sandbox's credentials sender (PID 1's child running it)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        except OSError:
            continue
        if status.get("Name", "").strip() == "warren-credsend" and int(status["PPid"]) == pid1:
            return int(entry)
    raise AssertionError(f"no credentials sender under PID 1 ({pid1})")


def test_a_receiver_is_told_the_command_as_on_the_host(sb: Sandbox) -> None:
    host = json.loads(subprocess.run([sys.executable, "-c", CREDS], capture_output=True, check=True).stdout)
    inside = _inside(sb)
    assert {k: host[k] for k in WANT} == WANT  # the control: what the host's kernel says
    assert {k: inside[k] for k in WANT} == WANT, inside
    assert inside["pid"] != 1


def test_the_sender_keeps_one_capability_and_cannot_be_reached_from_inside(sb: Sandbox) -> None:
    """The sender holds CAP_SYS_ADMIN: a command must not signal, trace or read it. Read
    on the host: its capabilities, no_new_privs, its filter; then, from inside, a kill,
    a ptrace attach and reads of its memory and environment; the host then finds it
    alive, the same process, still naming commands."""
    pid = _sender(sb.pid1)
    with open(f"/proc/{pid}/status") as f:
        status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
    admin = f"{1 << 21:016x}"
    assert [status[k].strip() for k in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb")] == [
        admin,
        admin,
        admin,
        "0" * 16,
        "0" * 16,
    ]
    assert status["NoNewPrivs"].strip() == "1" and status["Seccomp"].strip() == "2"
    # a stop's SIGTERM ends it at once: nothing blocked (PID 1 forks with signals
    # blocked), SIGTERM not ignored
    ignored = int(status["SigIgn"], 16)
    assert int(status["SigBlk"], 16) == 0 and not ignored & 1 << (signal.SIGTERM - 1), status
    inner = int(status["NSpid"].split()[-1])
    attack = f"""
import ctypes, errno, json, os, signal
out = {{}}
try:
    os.kill({inner}, signal.SIGKILL); out['kill'] = 'sent'
except OSError as e:
    out['kill'] = errno.errorcode[e.errno]
libc = ctypes.CDLL(None, use_errno=True)
out['ptrace'] = libc.ptrace(16, {inner}, 0, 0) == 0 or errno.errorcode[ctypes.get_errno()]
for name in ('mem', 'environ'):
    try:
        with open('/proc/{inner}/' + name, 'rb') as f:
            f.read(16)
        out[name] = 'read'
    except OSError as e:
        out[name] = errno.errorcode[e.errno]
print(json.dumps(out))
"""
    r = sb.exec(["python3", "-c", attack], timeout=30)
    assert r.exit_code == 0, r.stderr.decode()
    out = json.loads(r.stdout)
    assert out == {"kill": "EPERM", "ptrace": "EPERM", "mem": "EACCES", "environ": "EACCES"}, out
    assert _sender(sb.pid1) == pid
    inside = _inside(sb)
    assert inside["stream"] is True


def test_a_sender_killed_from_the_host_leaves_sends_working(tmp_path: Path) -> None:
    """The sender gone (killed from the host), sends still arrive: PID 1 makes them, and
    a receiver is told PID 1 (as without the program)."""
    with Sandbox.create(PolicySpec(workspace=str(tmp_path))) as box:
        pid = _sender(box.pid1)
        os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while os.path.exists(f"/proc/{pid}/status") and time.monotonic() < deadline:
            time.sleep(0.02)
        inside = _inside(box)
        assert inside["dgram_with_fd"] == [False, "ok"] and inside["big_stream"] is True, inside
        assert inside["stream"] is False and inside["seqpacket"] is False


def test_without_the_program_a_receiver_is_told_pid1(tmp_path: Path, state_home: Path) -> None:
    """WARREN_CREDSEND=0 (what an install without a C compiler gives): no sender, and the
    broker's sends name PID 1; everything else about them is the same."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n"
            "from warren import PolicySpec, Sandbox\n"
            f"with Sandbox.create(PolicySpec(workspace={str(workspace)!r})) as sb:\n"
            "    r = sb.exec(['python3', '-c', sys.argv[1]], timeout=60)\n"
            "    print(r.stdout.decode())\n",
            CREDS,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "WARREN_CREDSEND": "0"},  # its own supervisor (state_home) reads it
    )
    assert r.returncode == 0, r.stderr[-2000:]
    inside = json.loads(r.stdout)
    assert inside["stream"] is False and inside["dgram_with_fd"] == [False, "ok"], inside
    assert inside["big_stream"] is True
