"""PID 1's broker never lets the kernel re-read what it judged, and never blocks.

The attacks are real programs inside a sandbox (a C program compiled here, a Python
script), judged from the host: a listener outside the writable roots never accepts a
connection and never receives a byte; PID 1 keeps answering while a sandbox process
waits in a blocking connect. Each has a control showing the test could see success.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import SENDMMSG, WARREN, Layout, run_cli
from warren._core import credsend
from warren._core.broker import pool

# One thread puts an AF_INET socket, then a unix one, onto fd F in a loop, while the
# main thread calls connect/sendto/sendmsg on F with a unix address. A broker that saw
# the INET socket and let the kernel go on (CONTINUE) lets the kernel look F up again
# and find the unix socket. A call made on the unix socket is judged as always (EACCES).
RACE_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define F 100
#define MIN_ATTEMPTS 3000
static volatile int stop;
static int unix_type;

static void *swapper(void *arg) {
    (void)arg;
    while (!stop) {  /* F is an AF_INET socket, then a unix one, then again ... */
        int i = socket(AF_INET, (unix_type == SOCK_STREAM ? SOCK_STREAM : SOCK_DGRAM) | SOCK_NONBLOCK, 0);
        if (i >= 0) { dup2(i, F); close(i); }
        int u = socket(AF_UNIX, unix_type | SOCK_NONBLOCK, 0);
        if (u >= 0) { dup2(u, F); close(u); }
    }
    return NULL;
}

static int op(const char *mode, int fd, struct sockaddr_un *sun, socklen_t len) {
    if (!strcmp(mode, "connect")) return connect(fd, (struct sockaddr *)sun, len);
    if (!strcmp(mode, "sendto")) return (int)sendto(fd, "x", 1, 0, (struct sockaddr *)sun, len);
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    struct msghdr msg = {.msg_name = sun, .msg_namelen = len, .msg_iov = &iov, .msg_iovlen = 1};
    return (int)sendmsg(fd, &msg, 0);
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 5) return 2;
    const char *mode = argv[1], *how = argv[2], *path = argv[3];
    double until = now() + atof(argv[4]);
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    strncpy(sun.sun_path, path, sizeof sun.sun_path - 1);
    socklen_t len = offsetof(struct sockaddr_un, sun_path) + strlen(path) + 1;
    unix_type = strcmp(mode, "connect") ? SOCK_DGRAM : SOCK_STREAM;
    if (!strcmp(how, "direct")) {
        int s = socket(AF_UNIX, unix_type, 0);
        int r = op(mode, s, &sun, len);
        printf("%s direct %s\n", mode, r < 0 ? strerror(errno) : "ok");
        return 0;
    }
    pthread_t t;
    pthread_create(&t, NULL, swapper, NULL);
    /* At least the given seconds and MIN_ATTEMPTS calls (a loaded machine is slower),
       at most 30 s. */
    long attempts = 0, wins = 0, first = -1;
    double start = now();
    while ((now() < until || attempts < MIN_ATTEMPTS) && now() < start + 30) {
        if (op(mode, F, &sun, len) >= 0 && wins++ == 0) first = attempts;
        attempts++;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("%s race attempts=%ld first_win_at=%ld wins=%ld\n", mode, attempts, first, wins);
    return 0;
}
"""


@pytest.fixture(params=["run", "exec"])
def via(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each claim holds for a one-shot `warren run` and for `warren exec`."""
    monkeypatch.setattr(Layout, "via", request.param)
    return str(request.param)


@pytest.fixture
def outside() -> Iterator[Path]:
    """A directory the sandbox sees (read-only) but may not reach sockets in."""
    where = Path(tempfile.mkdtemp(prefix="warren-race-", dir="/var/tmp"))
    os.chmod(where, 0o755)
    yield where
    shutil.rmtree(where, ignore_errors=True)


def _race_binary(layout: Layout) -> Path:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.fail("gcc is needed to build the race program")
    src = layout.root / "race.c"
    src.write_text(RACE_C)
    exe = layout.workspace / "race"
    subprocess.run([cc, "-O2", "-pthread", "-o", str(exe), str(src)], check=True)
    return exe


def _listeners(where: Path) -> tuple[socket.socket, socket.socket, socket.socket]:
    """A stream listener ``s`` and datagram sockets ``d`` (for sendto) and ``m`` (for
    sendmsg: a queue of its own, so one call's datagrams cannot fill the other's)."""
    stream = socket.socket(socket.AF_UNIX)
    stream.bind(str(where / "s"))
    stream.listen(128)
    stream.setblocking(False)
    dgrams = []
    for name in ("d", "m"):
        dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        dgram.bind(str(where / name))
        dgram.setblocking(False)
        dgrams.append(dgram)
    for name in ("s", "d", "m"):
        os.chmod(where / name, 0o777)
    return stream, dgrams[0], dgrams[1]


def _reached(stream: socket.socket, *dgrams: socket.socket) -> tuple[int, ...]:
    """Connections accepted by the host's listener, datagrams received by each socket."""
    counts = [0] * (1 + len(dgrams))
    while True:
        try:
            stream.accept()[0].close()
            counts[0] += 1
        except BlockingIOError:
            break
    for i, dgram in enumerate(dgrams, 1):
        while True:
            try:
                dgram.recv(64)
                counts[i] += 1
            except BlockingIOError:
                break
    return tuple(counts)


def test_a_swapped_fd_never_reaches_a_host_unix_socket(layout: Layout, outside: Path, via: str) -> None:
    """connect, sendto and sendmsg, each raced for seconds against a dup2 of a unix
    socket onto the fd the broker judged: the host's listeners outside the roots hear
    nothing, while the same program reaches listeners in the workspace."""
    exe = _race_binary(layout)
    outside_socks = _listeners(outside)
    own_socks = _listeners(layout.workspace)
    try:
        s, d, m = (str(outside / x) for x in "sdm")
        ws, wd, wm = (str(layout.workspace / x) for x in "sdm")
        script = "; ".join(
            [
                f"{exe} connect race {s} 3",
                f"{exe} sendto race {d} 3",
                f"{exe} sendmsg race {m} 3",
                f"{exe} connect direct {s} 0",
                f"{exe} sendto direct {d} 0",
                f"{exe} sendmsg direct {m} 0",
                f"{exe} connect direct {ws} 0",
                f"{exe} sendto direct {wd} 0",
                f"{exe} sendmsg direct {wm} 0",
            ]
        )
        r = layout.run(["sh", "-c", script], timeout=120)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        for mode in ("connect", "sendto", "sendmsg"):
            line = next(x for x in out.splitlines() if x.startswith(f"{mode} race"))
            assert int(line.split("attempts=")[1].split()[0]) >= 3000, out  # it really raced
            assert line.endswith("wins=0"), out
            assert f"{mode} direct Permission denied" in out, out
        assert _reached(*outside_socks) == (0, 0, 0), out  # judged on the host
        # The control: the same program, the same calls, listeners it may reach.
        assert out.count("direct ok") == 3, out
        assert _reached(*own_socks) == (1, 1, 1), out
    finally:
        for sock in (*outside_socks, *own_socks):
            sock.close()


# --- the broker never blocks -------------------------------------------------------------

FULL = r"""
import socket
l = socket.socket(socket.AF_UNIX); l.bind(PATH); l.listen(0)
held = []
while True:  # fill the backlog
    c = socket.socket(socket.AF_UNIX); c.setblocking(False)
    try:
        c.connect(PATH)
    except BlockingIOError:
        break
    held.append(c)
"""


def _full_listener(path: Path) -> tuple[socket.socket, list[socket.socket]]:
    """A unix listener whose backlog is full: a blocking connect to it waits."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(0)
    listener.setblocking(False)
    return listener, _fill(path)


def _fill(path: Path) -> list[socket.socket]:
    held: list[socket.socket] = []
    while True:
        c = socket.socket(socket.AF_UNIX)
        c.setblocking(False)
        try:
            c.connect(str(path))
        except BlockingIOError:
            c.close()
            return held
        held.append(c)


def _accept_for(listener: socket.socket, seconds: float) -> int:
    accepted = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            listener.accept()[0].close()
            accepted += 1
        except BlockingIOError:
            time.sleep(0.05)
    return accepted


NONBLOCKING = r"""
import errno, json, socket
out = {}
l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1)
c = socket.socket(); c.setblocking(False)
try:
    c.connect(l.getsockname()); out['tcp'] = 'connected'
except OSError as e:
    out['tcp'] = errno.errorcode[e.errno]
u = socket.socket(socket.AF_UNIX); u.setblocking(False)
try:
    u.connect(FULL); out['unix_full'] = 'connected'
except OSError as e:
    out['unix_full'] = errno.errorcode[e.errno]
print(json.dumps(out))
"""


def test_a_blocking_connect_to_a_full_backlog_does_not_wedge_the_sandbox(layout: Layout) -> None:
    """A command waits in connect() on a listener that does not accept: other execs
    answer at once, `exec --timeout 2` ends it with 124 in time and leaves no connect
    behind, `warren stop` answers; a non-blocking connect says what it says on the
    host."""
    full = layout.workspace / "full.sock"
    listener, held = _full_listener(full)
    name = f"wedge-{uuid.uuid4().hex[:8]}"
    block = f"import socket; socket.socket(socket.AF_UNIX).connect({str(full)!r})"
    r = run_cli(["create", name], cwd=layout.workspace)
    assert r.returncode == 0, r.stderr
    waiting = subprocess.Popen(
        [*WARREN, "exec", name, "python3", "-c", block],
        cwd=layout.workspace,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        time.sleep(1.0)
        assert waiting.poll() is None  # it really waits
        t = time.monotonic()
        r = run_cli(["exec", name, "true"], cwd=layout.workspace, timeout=30)
        assert r.returncode == 0 and time.monotonic() - t < 5, (r.returncode, r.stderr)
        t = time.monotonic()
        r = run_cli(
            ["exec", "--timeout", "2", name, "python3", "-c", block], cwd=layout.workspace, timeout=30
        )
        took = time.monotonic() - t
        assert r.returncode == 124 and took < 6, (r.returncode, took, r.stderr)
        code = NONBLOCKING.replace("FULL", repr(str(full)))
        inside = run_cli(["exec", name, "python3", "-c", code], cwd=layout.workspace, timeout=30)
        host = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert inside.returncode == 0, inside.stderr
        assert (
            json.loads(inside.stdout)
            == json.loads(host.stdout)
            == {"tcp": "EINPROGRESS", "unix_full": "EAGAIN"}
        )
        # The command killed by its timeout left no connect behind (no worker still
        # waiting on its copy): once the host accepts, only the one still waiting
        # gets in, and its exec ends well. The broker frees a worker whose caller died
        # at its next check (``pool.TICK``, 0.1 s): under the gate's load that came
        # after the accept once, so the host waits ten checks first (a worker never
        # freed still connects then).
        time.sleep(10 * pool.TICK)
        assert _accept_for(listener, 2.0) == len(held) + 1
        assert waiting.wait(timeout=10) == 0
        held += _fill(full)
        waiting = subprocess.Popen(
            [*WARREN, "exec", name, "python3", "-c", block],
            cwd=layout.workspace,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        time.sleep(1.0)
        assert waiting.poll() is None  # it waits again
        t = time.monotonic()
        r = run_cli(["stop", name], cwd=layout.workspace, timeout=30)
        assert r.returncode == 0 and time.monotonic() - t < 8, r.stderr
        waiting.wait(timeout=10)
        assert waiting.returncode != 0
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        run_cli(["rm", "-f", name], cwd=layout.workspace)
        listener.close()
        for c in held:
            c.close()


def test_rm_f_answers_while_a_command_waits_in_connect(layout: Layout) -> None:
    full = layout.workspace / "full.sock"
    listener, held = _full_listener(full)
    name = f"wedge-rm-{uuid.uuid4().hex[:8]}"
    block = f"import socket; socket.socket(socket.AF_UNIX).connect({str(full)!r})"
    assert run_cli(["create", name], cwd=layout.workspace).returncode == 0
    waiting = subprocess.Popen(
        [*WARREN, "exec", name, "python3", "-c", block],
        cwd=layout.workspace,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        time.sleep(1.0)
        assert waiting.poll() is None  # it really waits
        t = time.monotonic()
        r = run_cli(["rm", "-f", name], cwd=layout.workspace, timeout=30)
        assert r.returncode == 0 and time.monotonic() - t < 8, r.stderr
        waiting.wait(timeout=10)
        assert name not in run_cli(["ls"], cwd=layout.workspace).stdout
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait()
        run_cli(["rm", "-f", name], cwd=layout.workspace)
        listener.close()
        for c in held:
            c.close()


# Blocking connects beyond the workers' bound are refused at once (ENOBUFS), never
# queued; callers killed while waiting free their workers (no thread kept).
BOUND = (
    FULL
    + r"""
import errno, os, signal, time
def wave(n):
    kids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            try:
                socket.socket(socket.AF_UNIX).connect(PATH)
                os._exit(0)
            except OSError as e:
                os._exit(3 if e.errno == errno.ENOBUFS else 4)
        kids.append(pid)
    time.sleep(1.5)
    refused = other = 0
    for pid in kids:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            refused += code == 3
            other += code != 3
    for pid in kids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in kids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    return refused, other
first = wave(40)
time.sleep(0.5)
second = wave(40)
time.sleep(0.5)
ok = socket.socket(socket.AF_UNIX); ok.bind(PATH + '.ok'); ok.listen()
socket.socket(socket.AF_UNIX).connect(PATH + '.ok')  # and calls go on as before
print(first, second)
"""
)


def test_blocking_connects_beyond_the_bound_are_refused_and_killed_callers_free_their_workers(
    layout: Layout, via: str
) -> None:
    path = str(layout.workspace / "bound.sock")
    r = layout.run(["python3", "-c", BOUND.replace("PATH", repr(path))], timeout=60)
    assert r.returncode == 0, r.stderr
    first, second = r.stdout.split(")")[0:2]
    first_refused, first_other = (int(x) for x in first.strip(" (").split(","))
    second_refused, second_other = (int(x) for x in second.strip(" (").split(","))
    assert first_other == 0 and second_other == 0, r.stdout  # the rest really waited
    # Some of 40 are over the bound, and the second wave finds exactly as many workers:
    # none was kept by a caller killed in the first.
    assert 0 < first_refused < 40 and second_refused == first_refused, r.stdout


# --- what the broker now does itself still behaves as on the host ------------------------

FIDELITY = (
    SENDMMSG
    + r"""
import ctypes, errno, json, os, signal, socket, struct, threading, time
out = {}
def err(fn):
    try:
        r = fn()
        return 'ok' if r is None else r
    except OSError as e:
        return errno.errorcode[e.errno]
# fds passed over a unix stream socket (multiprocessing's forkserver does this)
a, b = socket.socketpair()
r, w = os.pipe()
a.sendmsg([b'f'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('i', r))])
msg, anc, _, _ = b.recvmsg(1, socket.CMSG_SPACE(4))
got = struct.unpack('i', anc[0][2][:4])[0]
os.write(w, b'through the passed fd')
out['scm_rights'] = [msg.decode(), os.read(got, 64).decode(), got != r]
# credentials: the kernel checks them against the sender
c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
d.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
creds = struct.pack('iII', os.getpid(), os.getuid(), os.getgid())
out['scm_credentials'] = err(lambda: c.sendmsg([b'c'], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)]))
_, anc, _, _ = d.recvmsg(1, 64)
out['scm_credentials_uid'] = struct.unpack('iII', anc[0][2])[1] == os.getuid()
no_fd = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack('i', 999))]
out['scm_rights_bad_fd'] = err(lambda: a.sendmsg([b'f'], no_fd))
# sendmmsg on a connected UDP socket (glibc's resolver sends its queries so)
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); rx.bind(('127.0.0.1', 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); tx.connect(rx.getsockname())
n, lens = sendmmsg(tx.fileno(), [b'one', b'three'])
out['sendmmsg'] = [n, *lens, rx.recv(16).decode(), rx.recv(16).decode()]
# a datagram socket disconnected with AF_UNSPEC, then an unconnected send
unspec = struct.pack('H14x', 0)
out['unspec_connect'] = libc.connect(tx.fileno(), unspec, 16) and errno.errorcode[ctypes.get_errno()]
out['send_after_unspec'] = err(lambda: tx.send(b'x'))
# a write to a stream whose peer is gone: EPIPE, and SIGPIPE unless MSG_NOSIGNAL
e, f = socket.socketpair(); f.close()
out['epipe_nosignal'] = err(lambda: e.sendmsg([b'x'], [], socket.MSG_NOSIGNAL))
pid = os.fork()
if pid == 0:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        e.sendmsg([b'x'])
    except OSError:
        os._exit(3)
    os._exit(0)
out['epipe_signal'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
pid = os.fork()
if pid == 0:
    got = []
    signal.signal(signal.SIGPIPE, lambda *_: got.append(1))
    try:
        e.sendmsg([b'x'])
        code = 0
    except OSError as x:
        code = 10 if x.errno == errno.EPIPE else 20
    time.sleep(0.2)
    os._exit(code + len(got))
out['epipe_handler'] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
out['epipe_ignored'] = err(lambda: e.sendmsg([b'x']))
# a large sendmsg on TCP, written in full by a loop over short writes
l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen()
s = socket.socket(); s.connect(l.getsockname()); p, _ = l.accept()
total = []
def drain():
    n = 0
    while (chunk := p.recv(1 << 20)):
        n += len(chunk)
    total.append(n)
t = threading.Thread(target=drain); t.start()
data = memoryview(b'z' * (12 << 20))
while data:
    data = data[s.sendmsg([data]):]
s.close(); t.join()
out['tcp_sendmsg_all'] = total[0]
print(json.dumps(out))
"""
)


def test_socket_calls_the_broker_makes_behave_as_on_the_host(layout: Layout, via: str) -> None:
    """fd passing, credentials, sendmmsg with its lengths written back, AF_UNSPEC,
    EPIPE with and without SIGPIPE, a large TCP sendmsg: the same as on the host."""
    r = layout.run(["python3", "-c", FIDELITY], timeout=60)
    host = subprocess.run([sys.executable, "-c", FIDELITY], capture_output=True, text=True, check=True)
    assert r.returncode == 0, r.stderr
    inside, outside = json.loads(r.stdout), json.loads(host.stdout)
    assert inside == outside, (inside, outside)
    assert inside["scm_rights"] == ["f", "through the passed fd", True]
    assert inside["sendmmsg"] == [2, 3, 5, "one", "three"]
    assert inside["epipe_signal"] == -13 and inside["epipe_nosignal"] == "EPIPE"
    assert inside["epipe_handler"] == 11 and inside["epipe_ignored"] == "EPIPE"  # EPIPE, handler ran
    assert inside["tcp_sendmsg_all"] == 12 << 20


FORGE = r"""
import errno, json, os, socket, struct, sys, time
c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
d.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
d.setblocking(False)
other = os.fork()
if other == 0:
    time.sleep(30)
    os._exit(0)
out = {}
for who, pid in (("other", other), ("parent", os.getppid()), ("own", os.getpid())):
    creds = struct.pack('iII', pid, os.getuid(), os.getgid())
    try:
        c.sendmsg([who.encode()], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)])
        out[who] = 'sent'
    except OSError as e:
        out[who] = errno.errorcode[e.errno]
seen = []
while True:
    try:
        msg, anc, _, _ = d.recvmsg(16, 64)
    except BlockingIOError:
        break
    seen.append([msg.decode(), struct.unpack('iII', anc[0][2])[0]])
out['seen'] = seen
out['pids'] = [other, os.getppid()]
out['me'] = os.getpid()
os.kill(other, 9)
print(json.dumps(out))
"""


def test_a_command_cannot_name_another_process_in_its_credentials(layout: Layout, via: str) -> None:
    """The attack: a command sends SCM_CREDENTIALS naming another process (a child of its
    own, its parent) to a receiver that checks them. The kernel refuses it to an
    unprivileged sender, and the broker, which makes the send, must say the same: the
    receiver never sees a pid the command named but is not. The control: the same
    script on the host, where root may name another process (it holds CAP_SYS_ADMIN)."""
    r = layout.run(["python3", "-c", FORGE], timeout=60)
    assert r.returncode == 0, r.stderr
    inside = json.loads(r.stdout)
    host = json.loads(
        subprocess.run([sys.executable, "-c", FORGE], capture_output=True, text=True, check=True).stdout
    )
    # root holds CAP_SYS_ADMIN on the host, so there the forgery works (a command of a root
    # caller holds no capability inside); the kernel refuses it to uid 1001 everywhere
    forged = "sent" if os.getuid() == 0 else "EPERM"
    assert host["other"] == host["parent"] == forged and host["own"] == "sent"
    assert inside["other"] == inside["parent"] == "EPERM", inside
    assert inside["own"] == "sent"
    assert [msg for msg, _pid in inside["seen"]] == ["own"]
    # the one it may name, itself, is what the receiver is told (the credentials sender)
    assert inside["seen"] == [["own", inside["me"]]] or credsend.program() is None, inside
    assert not set(inside["pids"]) & {pid for _msg, pid in inside["seen"]}, inside
