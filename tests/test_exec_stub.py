"""A command's process waits for its command as the exec stub (``native/exec-stub.c``,
from a sealed memfd), confined already: the stub is started by ``posix_spawn`` and
confines itself (``WARREN_CONFINE``), or (``WARREN_STUB_CONFINES=0``) a copy of the
helper confines itself in Python and then execs it; without it (``WARREN_EXEC_STUB=0``,
or no C compiler at install) it waits in Python. Tested the three ways, as root and as
uid 1001:

- the same results and the same typed errors (a file without its execute bit, a file
  that is no program, a missing command, a missing working directory);
- the same confinement of the command (no_new_privs, no capabilities, its seccomp
  filters, a write outside the roots refused — judged on the host);
- the stub is there when it should be, shown as warren's by ``warren ps``, cannot be
  signalled through warren, and its program cannot be changed from inside: a command
  that tries to write it through ``/proc/PID/exe`` fails, and the next command runs.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Layout, shut_down_supervisor
from warren import PolicySpec, Sandbox
from warren._core import execstub
from warren.errors import CommandNotFound, CwdNotFound, ExecError, ProcessNotFound

STUB_ARGV = (execstub.NAME,)

pytestmark = pytest.mark.skipif(
    execstub.program() is None, reason="the exec stub was not built (no C compiler at install)"
)


@pytest.fixture(params=["stub", "stub-python-confined", "python"])
def box(
    request: pytest.FixtureRequest, layout: Layout, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[str, Sandbox]]:
    """A sandbox whose private supervisor loads the stub, or is told not to."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("WARREN_EXEC_STUB", raising=False)
    monkeypatch.delenv("WARREN_STUB_CONFINES", raising=False)
    if request.param == "python":
        monkeypatch.setenv("WARREN_EXEC_STUB", "0")
    elif request.param == "stub-python-confined":
        monkeypatch.setenv("WARREN_STUB_CONFINES", "0")
    sb = Sandbox.create(PolicySpec(workspace=str(layout.workspace)))
    try:
        yield request.param, sb
    finally:
        sb.remove()
        shut_down_supervisor()


# Run in the sandbox: the pid of the process waiting as the stub (PID 1 makes the next
# spare helper, with its command's process, a few milliseconds after a command starts;
# a ``ps`` request would take the spare itself, so the command looks on its own).
FIND_STUB = (
    "import os, time\n"
    "def find():\n"
    "    for p in os.listdir('/proc'):\n"
    "        try:\n"
    "            if p.isdigit() and open(f'/proc/{p}/cmdline', 'rb').read() == b'warren-exec-stub\\0':\n"
    "                return int(p)\n"
    "        except OSError:\n"
    "            pass\n"
    "deadline = time.monotonic() + 5\n"
    "while (pid := find()) is None and time.monotonic() < deadline:\n"
    "    time.sleep(0.02)\n"
)


def _waiting(sb: Sandbox) -> int | None:
    r = sb.exec(["python3", "-c", FIND_STUB + "print(pid)"])
    out = r.stdout.decode().strip()
    return None if out == "None" else int(out)


def _status(sb: Sandbox) -> dict[str, str]:
    out = sb.exec(["cat", "/proc/self/status"]).stdout.decode()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in out.splitlines())}


def test_results_and_confinement_are_the_same_both_ways(box: tuple[str, Sandbox], outside: Path) -> None:
    kind, sb = box
    r = sb.exec(["sh", "-c", "echo out; echo err >&2; exit 7"])
    assert (r.exit_code, r.stdout, r.stderr) == (7, b"out\n", b"err\n")
    status = _status(sb)
    assert status["NoNewPrivs"] == "1" and status["CapEff"] == "0000000000000000", status
    assert status["Seccomp"] == "2", status
    # one filter of the sandbox's PID 1 (its broker's) and the command's own
    assert status["Seccomp_filters"] == "2", status
    assert status["SigBlk"] == "0000000000000000", status
    if kind == "stub":
        # no signal ignored, as a command the host's shell starts (the other ways leave
        # glibc's SIGCANCEL ignored, as they always did)
        assert status["SigIgn"] == "0000000000000000", status
    limits = sb.exec(["cat", "/proc/self/limits"]).stdout.decode()
    assert limits == sb.exec(["cat", "/proc/self/limits"]).stdout.decode()
    fds = sb.exec(["ls", "/proc/self/fd"]).stdout.decode().split()
    assert fds == ["0", "1", "2", "3"], fds  # stdio and ls's own directory: nothing of warren's
    target = outside / "written-by-sandbox"
    w = sb.exec(["sh", "-c", f"echo owned > {target}"])
    assert w.exit_code != 0 and not target.exists(), (kind, w)
    assert sb.exec(["pwd"]).stdout.decode().strip() == sb.info.workspace


def test_exec_errors_are_typed_the_same_both_ways(box: tuple[str, Sandbox], layout: Layout) -> None:
    _kind, sb = box
    ws = layout.workspace
    plain = ws / "not-executable"
    plain.write_text("#!/bin/sh\necho no\n")
    plain.chmod(0o644)
    junk = ws / "junk-program"
    junk.write_bytes(b"\x00\x01 not a program")
    junk.chmod(0o755)
    with pytest.raises(ExecError) as e:
        sb.exec(["./not-executable"])
    assert "cannot execute ./not-executable" in e.value.message and e.value.errno == 13
    with pytest.raises(ExecError) as e:
        sb.exec(["./junk-program"])
    assert e.value.errno == 8  # ENOEXEC
    with pytest.raises(CommandNotFound):
        sb.exec(["no-such-command-here"])
    with pytest.raises(CwdNotFound):
        sb.exec(["true"], cwd=str(ws / "gone"))
    assert sb.exec(["true"]).exit_code == 0  # and the sandbox goes on


def test_the_stub_waits_and_cannot_be_signalled_through_warren(box: tuple[str, Sandbox]) -> None:
    kind, sb = box
    waiting = _waiting(sb)
    if kind == "python":
        assert waiting is None
        return
    assert waiting is not None
    # the stub of the spare made while ``_waiting`` ran, or of the one after it: both
    # are warren's, never a command to signal
    with pytest.raises(ProcessNotFound):
        sb._transport.signal(sb.name, waiting, signal.SIGKILL)  # as `warren kill` does
    assert sb.exec(["echo", "still"]).stdout == b"still\n"


@pytest.mark.parametrize("box", ["stub"], indirect=True)
def test_the_stubs_program_cannot_be_changed_from_inside(box: tuple[str, Sandbox]) -> None:
    _kind, sb = box
    attack = FIND_STUB + (
        "print('stub', pid)\n"
        "for mode in (os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_TRUNC):\n"
        "    try:\n"
        "        fd = os.open(f'/proc/{pid}/exe', mode)\n"
        "    except OSError as e:\n"
        "        print('refused', e.errno)\n"
        "        continue\n"
        "    try:\n"
        "        os.write(fd, b'#!/bin/sh\\necho pwned\\n')\n"
        "        print('WROTE')\n"
        "    except OSError as e:\n"
        "        print('write refused', e.errno)\n"
    )
    r = sb.exec(["python3", "-c", attack])
    assert b"stub " in r.stdout and b"stub None" not in r.stdout, r
    assert b"WROTE" not in r.stdout, r
    # judged by what runs next: the stub still execs the command asked for
    for _ in range(3):
        assert sb.exec(["echo", "ok"]).stdout == b"ok\n"


PEEK = (
    "import ctypes, os, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def peek(pid):\n"
    "    out = []\n"
    "    for name in ('environ', 'mem'):\n"
    "        try:\n"
    "            with open(f'/proc/{pid}/{name}', 'rb') as f:\n"
    "                out.append(f.read(1 << 16) if name == 'environ' else b'opened')\n"
    "        except OSError as e:\n"
    "            out.append(f'{name} refused {e.errno}'.encode())\n"
    "    try:\n"
    "        os.kill(pid, 0)\n"
    "        out.append(b'signal reaches')\n"
    "    except OSError as e:\n"
    "        out.append(f'signal refused {e.errno}'.encode())\n"
    "    if libc.ptrace(16, pid, 0, 0) == 0:\n"  # PTRACE_ATTACH
    "        out.append(b'ATTACHED')\n"
    "        libc.ptrace(17, pid, 0, 0)\n"  # PTRACE_DETACH
    "    else:\n"
    "        out.append(f'ptrace refused {ctypes.get_errno()}'.encode())\n"
    "    return b' | '.join(out)\n"
)


@pytest.mark.parametrize("box", ["stub"], indirect=True)
def test_a_command_reads_no_other_commands_environment_nor_the_waiting_stubs(
    box: tuple[str, Sandbox],
) -> None:
    """A secret given to one exec (``env={"TOKEN": ...}``) is out of reach of another
    command of the same sandbox: its ``/proc/PID/environ`` and ``mem``, ptrace and
    signals are refused (each command and the stub have a Landlock domain of their own),
    and so is the waiting stub that will receive the next request's environment. The
    control: the same probe on a child of the attacker (its own domain) reads the
    child's secret and reaches it."""
    _kind, sb = box
    canary = "TOKEN-" + os.urandom(8).hex()
    victim = sb.spawn(["sleep", "60"], env={"TOKEN": canary})
    try:
        attack = (
            FIND_STUB
            + PEEK
            + (
                "def sleeper():\n"
                "    for p in os.listdir('/proc'):\n"
                "        try:\n"
                "            line = open(f'/proc/{p}/cmdline', 'rb').read()\n"
                "            if p.isdigit() and line == b'sleep\\x0060\\x00':\n"
                "                return int(p)\n"
                "        except OSError:\n"
                "            pass\n"
                "while (other := sleeper()) is None and time.monotonic() < deadline:\n"
                "    time.sleep(0.02)\n"
                "print('stub', pid, peek(pid))\n"
                "print('other', other, peek(other))\n"
                "child = os.fork()\n"
                "if child == 0:\n"
                "    os.execve('/bin/sleep', ['sleep', '5'], {'TOKEN': 'child-' + sys.argv[1]})\n"
                # Peeked once it runs sleep (its exec done), not after a fixed pause:
                # under load the exec came after 0.2 s, and its environment was still ours.
                "until = time.monotonic() + 30\n"
                "ran = lambda: open(f'/proc/{child}/cmdline', 'rb').read() == b'sleep\\x005\\x00'\n"
                "while not ran() and time.monotonic() < until:\n"
                "    time.sleep(0.01)\n"
                "print('child', peek(child))\n"
                "os.kill(child, 9)\n"
            )
        )
        r = sb.exec(["python3", "-c", attack, canary])
        out = r.stdout.decode(errors="replace")
        assert r.exit_code == 0, (out, r.stderr)
        lines = {line.split(" ", 1)[0]: line for line in out.splitlines()}
        assert "None" not in lines["stub"] and "None" not in lines["other"], out
        for who in ("stub", "other"):
            for refused in ("environ refused 13", "mem refused 13", "signal refused 1", "ptrace refused 1"):
                assert refused in lines[who], (who, out)
        assert canary not in out.replace(f"child-{canary}", "")
        # The control: what the attacker's own child holds, it reads and reaches.
        assert f"TOKEN=child-{canary}" in lines["child"] and "signal reaches" in lines["child"], out
        assert "ATTACHED" in lines["child"], out
    finally:
        victim.kill()
    assert sb.exec(["echo", "ok"]).stdout == b"ok\n"  # the stub still runs what is asked


def test_a_waiting_stub_has_its_own_name(box: tuple[str, Sandbox]) -> None:
    """Its comm, which a quiesce (a rollback, a checkpoint) tells it from a command by
    when it finds one on its way out, whose exe link is gone then: spawned from a
    /proc/self/fd path its name would otherwise be a number, reported as a process the
    rollback stopped."""
    kind, sb = box
    # Read by the command that found it (the next command would be started by it), once
    # it waits: spawned a moment ago it may still be in the loader, its name the one the
    # kernel gave it (a number, or on newer kernels, 6.18 here, its memfd's: "memfd:warren-ex",
    # seen in a stress gate) until it names itself.
    show = (
        "import time\n"
        "comm = lambda: open(f'/proc/{pid}/comm').read().strip() if pid else None\n"
        "until = time.monotonic() + 5\n"
        f"while pid and comm() != {execstub.COMM!r} and time.monotonic() < until: time.sleep(0.01)\n"
        "print(comm())"
    )
    comm = sb.exec(["python3", "-c", FIND_STUB + show]).stdout.decode().strip()
    assert comm == ("None" if kind == "python" else execstub.COMM), (kind, comm)


def test_the_memfd_is_sealed_and_executable() -> None:
    fd = execstub.load()
    assert fd is not None
    mode = os.fstat(fd).st_mode
    assert stat.S_ISREG(mode) and mode & 0o111
    with pytest.raises(OSError):
        os.write(fd, b"x")
    with pytest.raises(OSError):
        os.ftruncate(fd, 0)


@pytest.mark.parametrize(
    ("first", "said"),
    # "S": a stub built before it confined itself, which says ready unconfined
    [(b"R", "speaks another version"), (b"S", "speaks another version"), (b"", "is gone")],
)
def test_a_stub_of_another_version_or_none_is_a_typed_error(first: bytes, said: str) -> None:
    """What the helper makes of the first byte of a command's process made ahead: a
    stub built from other sources (another wire format), or a process that died."""
    import socket

    from warren._core.shim import Launcher

    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        if first:
            theirs.sendall(first)
        os._exit(0)
    theirs.close()
    launcher = Launcher.__new__(Launcher)
    launcher.pid, launcher.sock = pid, ours
    try:
        with pytest.raises(ExecError) as e:
            launcher.launch("/bin/true", ["true"], {}, "/", [], -1)
        assert said in e.value.message and e.value.hint
    finally:
        os.waitpid(pid, 0)


def test_a_stub_that_could_not_confine_itself_is_the_setup_error_of_its_step() -> None:
    """The stub's report of a step of confining that failed ("F", step, errno): the
    command gets the error the Python path raises for that step, typed."""
    import socket
    import struct

    from warren._core.shim import Launcher
    from warren.errors import SetupError

    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        theirs.sendall(execstub.FAILED + struct.pack("!II", 6, 22))
        os._exit(127)
    theirs.close()
    launcher = Launcher.__new__(Launcher)
    launcher.pid, launcher.sock = pid, ours
    with pytest.raises(SetupError) as e:
        launcher.launch("/bin/true", ["true"], {}, "/", [], -1)
    assert "install seccomp filter" in e.value.message and e.value.hint


def _stub_says(confine: str, *, inherit: int | None = None) -> bytes:
    """Run the stub itself on the host with WARREN_CONFINE (its channel's descriptor
    first) and return what it says first."""
    import socket

    program = execstub.program()
    assert program is not None
    ours, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        ours.close()
        os.set_inheritable(theirs.fileno(), True)
        ruleset = -1 if inherit is None else inherit
        os.execve(program, [execstub.NAME], {"WARREN_CONFINE": f"{theirs.fileno()};{ruleset};{confine}"})
    theirs.close()
    try:
        ours.settimeout(10)
        said = ours.recv(9)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    return said


def test_the_stub_reports_the_step_of_confining_that_failed() -> None:
    import resource
    import struct

    from warren._core import _sys

    allow = _sys.SeccompProgram(((0x06, 0, 0, 0x7FFF0000),)).hex  # BPF_RET|BPF_K ALLOW
    assert _stub_says(execstub.confinement((), False, [], allow)) == execstub.READY
    # a filter that is no whole program, a field missing: refused before any step
    for spec in (execstub.confinement((), False, [], allow[:-2]), "13;0;"):
        said = _stub_says(spec)
        assert said[:1] == execstub.FAILED and struct.unpack("!II", said[1:]) == (1, 22), (spec, said)
    # more descriptors than the kernel allows any process (fs.nr_open): refused, root too
    with open("/proc/sys/fs/nr_open") as f:
        nr_open = int(f.read())
    said = _stub_says(execstub.confinement((), False, [(resource.RLIMIT_NOFILE, nr_open + 1)], allow))
    assert said[:1] == execstub.FAILED and struct.unpack("!II", said[1:])[0] == 2, said
