"""Run one command in the sandbox: the exec helper PID 1 forks for each exec or spawn.

    PID 1 ── shim (this; warren's: unconfined, no capabilities, not dumpable, a child
              │   subreaper): resolves the cwd and the program *now*, makes a pty when
              │   asked, starts the command, reports its pid, relays signals from the
              │   client, enforces the timeout by killing the command's whole tree, and
              │   reports the wait status
              └─ the command: forked ahead of time (``Launcher``), in its own session,
                  hardened in its own process right before execve (``harden.harden``),
                  so it lives in a Landlock domain of its own: it can neither signal nor
                  trace the shim, PID 1 or any other exec's helper (signal scoping needs
                  Landlock ABI >= 6).

A background process (spawn) has its output relayed into capped logs the supervisor
made (stdout, stderr, status, and its pid and argv); the shim stays until it ends and
records its status there. Its stdin is /dev/null, or, when the spawn asked for it, the
read end of a pipe whose write end the supervisor keeps.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import resource as resource_mod
import select
import signal
import socket
import struct
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NoReturn, cast

from .. import protocol, wire
from ..errors import (
    CommandNotFound,
    CwdNotFound,
    ExecError,
    ProtocolError,
    SetupError,
    WarrenError,
    from_record,
)
from ..output import truncation_marker
from ..plan.model import Plan
from . import _sys, cgroups, dirwatch, execstub, harden, procs

# How long an exec's end waits for the supervisor to bring the sandbox's repositories
# in step with the host (a sync copies at most a few index-sized files).
SYNC_WAIT = 10.0
# The command's process made ahead is the exec stub, spawned, which confines itself
# (``_spawn_stub``); WARREN_STUB_CONFINES=0 in the supervisor's environment: a copy of
# the helper confines itself in Python and then execs it (the way before, and the one
# taken where the stub cannot be spawned).
STUB_CONFINES = os.environ.get("WARREN_STUB_CONFINES", "1") != "0"
# Dispositions a command must start with; Python ignores SIGPIPE and SIGXFSZ, and
# ignored signals stay ignored across execve.
_DEFAULT_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGTERM,
    signal.SIGCHLD,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGTTOU,
    signal.SIGTTIN,
    signal.SIGTSTP,
)


def resolve_command(cmd: str, path_var: str) -> str:
    """PATH search with the sandbox's PATH, as execvp would, keeping the first error
    that is not "absent" (EACCES on a non-executable file wins over ENOENT)."""
    if "/" in cmd:
        return cmd
    first_error: str | None = None
    for directory in (path_var or "/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory or ".", cmd)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            first_error = first_error or candidate
    if first_error:
        return first_error
    raise not_found(cmd, path_var)


def not_found(cmd: str, path_var: str) -> CommandNotFound:
    """``cmd`` is in no directory of ``path_var``."""
    return CommandNotFound(
        f"command not found in the sandbox: {cmd}",
        operation="execve",
        path=cmd,
        errno=errno.ENOENT,
        hint="check the name; the sandbox searches PATH=" + path_var,
    )


def exec_failure(err: int, cmd: str, path: str) -> WarrenError:
    if err in (errno.ENOENT, errno.ENOTDIR):
        return CommandNotFound(
            f"command not found in the sandbox: {cmd}",
            operation="execve",
            path=path,
            errno=err,
            hint="check the path; inside the sandbox only what the policy shows exists",
        )
    if err == errno.E2BIG:
        return ExecError(
            f"cannot execute {cmd}: the argument list is too long",
            operation="execve",
            path=path,
            errno=err,
            hint="the arguments and environment together exceed the kernel's limit (one string: "
            "128 KiB); pass large data on stdin or in a file",
        )
    return ExecError(
        f"cannot execute {cmd}",
        operation="execve",
        path=path,
        errno=err,
        hint="is it a program with its execute bit set (chmod +x), built for this machine?",
    )


def _default_cwd(plan: Plan) -> tuple[str, list[str]]:
    """The plan's directory, re-resolved for every exec (DESIGN F5). If it was removed,
    the nearest existing ancestor, said out loud in the result's warnings."""
    with contextlib.suppress(OSError):
        os.chdir(plan.cwd)
        return plan.cwd, []
    path = plan.cwd
    while path != "/":
        path = os.path.dirname(path)
        with contextlib.suppress(OSError):
            os.chdir(path)
            break
    return path, [
        f"the working directory {plan.cwd} does not exist in the sandbox any more; "
        f"ran in {path} (recreate it with mkdir -p {plan.cwd})"
    ]


def _cwd_error(path: str, e: OSError) -> CwdNotFound:
    return CwdNotFound.from_os(
        e,
        f"working directory does not exist in the sandbox: {path}"
        if e.errno in (errno.ENOENT, errno.ENOTDIR)
        else f"cannot enter working directory {path}",
        "chdir",
        path,
        hint=f"create it first (mkdir -p {path} in the sandbox), or omit the cwd to use the workspace",
    )


def command_dir(cwd: str, workspace: str) -> str:
    """A command's directory as the request gave it: absolute as it is, relative
    beneath the workspace. The helper and the supervisor (when it hands the command to
    the exec stub itself: ``server.handoff``) both take it from here."""
    return os.path.join(workspace, cwd)


def command_env(plan: Plan, command: protocol.Command) -> dict[str, str]:
    """A command's environment: the plan's, the request's over it (helper and
    supervisor alike, as ``command_dir``)."""
    return {**plan.env, **command.env}


def _enter_cwd(cwd: str, workspace: str) -> str:
    path = command_dir(cwd, workspace)
    try:
        os.chdir(path)
    except OSError as e:
        raise _cwd_error(path, e) from None
    return path


def warm(plan: Plan) -> None:
    """Run, once and without effect, the code a request will run. A process forked
    ahead of time shares its parent's memory copy-on-write, and the first write to
    each page (Python writes reference counts on everything it touches) costs a page
    fault and a copy: taking them now keeps them off the request's path."""
    command = protocol.Command(argv=["true"], env={"A": "b"}, stdio=[False, True, True])
    request = protocol.ExecRequest(sandbox="warm", command=command)
    protocol.from_dict(protocol.Handoff(request=request).to_dict())
    protocol.from_dict(protocol.Launch(path="/x", argv=["x"], env={}, cwd="/").to_dict())
    for message in (protocol.Started(pid=2, cwd="/"), protocol.Exited(status=0), protocol.Signal(signal=1)):
        protocol.decode(wire.frame(message)[wire.PREFIX.size :])
    # A request as it comes: framed, with descriptors, over a socket, received and
    # decoded as ``pid1._await_handoff`` does, its connection made a socket object; what
    # the helper does next, up to its answer. (A call refused here, at a limit, costs
    # only those faults.)
    with contextlib.suppress(OSError):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        with ours, theirs:
            command.cwd, command.env = "warm", {"PATH": "/usr/bin:/bin", "HOME": "/root", "LANG": "C"}
            handoff = protocol.Handoff(request=request, launched=True, before={"pids:max": 0})
            handoff.extra.extend(["active", "pids:max", "pids:"])
            wire.send(ours, handoff, fds=[theirs.fileno()] * 4)
            got, _, fds = wire.recv(theirs, (protocol.Handoff,), max_payload=0, max_fds=wire.HANDOFF_MAX_FDS)
            conn = socket.socket(fileno=fds[0])
            conn.setblocking(True)
            conn.close()
            for fd in fds[1:]:
                os.close(fd)
            assert isinstance(got, protocol.Handoff)
            dict(zip(got.extra, fds[1:], strict=True))
            # The wait for it and the word to PID 1 (``pid1._await_handoff``), the command's
            # environment, and the wait for the command's end (``Shim._wait``).
            poller = select.poll()
            poller.register(theirs, select.POLLIN)
            poller.register(ours, select.POLLIN)
            poller.poll(0)
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            ours.send(b"t", socket.MSG_NOSIGNAL)
            command_dir(command.cwd, plan.workspace)
            command_env(plan, command).get("PATH", "")
            pidfd = os.pidfd_open(os.getpid())
            poller.register(pidfd, select.POLLIN)
            poller.poll(0)
            os.close(pidfd)
            # The helper's own object, and what it runs while the command does (no counter
            # given: nothing is read).
            shim = Shim(plan, cast("Launcher", None), conn, command, [], None, {"active": -1}, launched={})
            shim._ready_to_answer()
            wire.send(ours, protocol.Started(pid=2, cwd="/", warnings=[], network="none"))
            wire.send(ours, protocol.Exited(status=0, timed_out=False, limit=None))
    harden.seccomp_program(plan)
    _sys.prctl(_sys.PR_GET_DUMPABLE)  # the ctypes call path hardening takes
    _sys.close_range(0xFFFFFFFE, 0xFFFFFFFF)
    with contextlib.suppress(CommandNotFound):
        resolve_command("warren-warm-not-a-command", plan.env.get("PATH", ""))


class Launcher:
    """The command's process, made ahead of time (while the sandbox waits for work),
    so that starting a command costs no fork. Where the exec stub is loaded
    (``execstub``) it is the stub, a process of a few pages that on ``launch`` takes its
    stdio, enters the directory and execs: spawned (``_spawn_stub``: no copy of this
    process) and confining itself (``confinement``), or, where it cannot be spawned or
    with ``STUB_CONFINES`` off, forked, confined here in Python (``harden``) and exec'd.
    Else it stays Python, warren's (no seccomp filter: ``procs.is_warren``) until
    ``launch``, and confines itself then. Its first byte says which
    (``execstub.READY``, ``FAILED``: a step of confining failed, ``PYTHON``, or
    ``HARDENED``: the stub could not be exec'd, so a Python launcher waits confined)."""

    def __init__(
        self,
        plan: Plan,
        ruleset: int | None,
        warm_up: bool,
        pair: tuple[socket.socket, socket.socket] | None = None,
    ) -> None:
        """``pair``: the channel to the process, made by PID 1, which gave the
        supervisor a copy of our end (``protocol.Spare``): the supervisor may hand the
        stub a command itself (``launched``)."""
        ours, theirs = pair or socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        spawned = None
        stub = execstub.loaded() if STUB_CONFINES else None
        if stub is not None:
            spawned = _spawn_stub(stub, theirs.fileno(), ruleset, confinement(plan, ruleset))
        if spawned is not None:
            theirs.close()
            self.pid, self.sock = spawned, ours
            return
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            raise
        if pid == 0:
            ours.close()
            _await_launch(plan, ruleset, theirs, warm_up)
        theirs.close()
        self.pid, self.sock = pid, ours

    def launch(
        self, path: str, argv: list[str], env: dict[str, str], cwd: str, stdio: list[int], ctty: int
    ) -> int:
        """The command's pid once it has exec'd; its typed error if it could not."""
        try:
            kind = self.sock.recv(1)
            if kind == execstub.READY:
                return self._stub(path, argv, env, cwd, stdio, ctty)
            if kind == execstub.FAILED:
                raise self._unconfined()
            if kind and kind not in (execstub.PYTHON, execstub.HARDENED):
                raise ExecError(
                    f"cannot start {argv[0]}: warren's exec stub speaks another version",
                    operation="execve",
                    hint="install warren again (pip install -e . rebuilds native/exec-stub.c), "
                    "or start the supervisor with WARREN_EXEC_STUB=0",
                )
            if not kind:
                raise ExecError(
                    f"cannot start {argv[0]}: the process made for it ahead of time is gone",
                    operation="execve",
                    hint="was it killed from outside the sandbox? the next command gets a new one",
                )
            launch = protocol.Launch(path=path, argv=argv, env=env, cwd=cwd, ctty=ctty)
            wire.send(self.sock, launch, fds=stdio)
            try:
                msg, _, fds = wire.recv(self.sock, (protocol.Error,), max_payload=0)
            except wire.ConnectionClosed:
                return self.pid  # its end closed on execve: the command runs
        finally:
            self.sock.close()
        for fd in fds:
            os.close(fd)
        os.waitpid(self.pid, 0)
        assert isinstance(msg, protocol.Error)
        raise from_record(msg.error.to_fields())

    def _unconfined(self) -> WarrenError:
        """The stub's report of the step of confining that failed (it has exited), as
        the error the Python path's ``harden`` raises for it."""
        data = b""
        with contextlib.suppress(OSError):
            while len(data) < 8 and (chunk := self.sock.recv(8 - len(data))):
                data += chunk
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        step, err = struct.unpack("!II", data) if len(data) == 8 else (1, errno.EPROTO)
        what = execstub.CONFINE_STEPS.get(step, f"step {step}")
        return SetupError.from_os(
            OSError(err, os.strerror(err)), f"sandbox setup failed: {what}", what, hint=harden.HINT
        )

    def launched(self, argv: list[str], cwd: str, path_var: str) -> int:
        """The command the supervisor handed the stub itself (``Handoff.launched``; it
        saw the stub ready): its pid once it has exec'd, its typed error if it could
        not. ``path_var``: the PATH it was searched in."""
        try:
            kind = self.sock.recv(1)
            if kind != execstub.READY:
                # Only a stub says READY, and the supervisor saw it: this one was
                # killed since (by a process of the sandbox), as after an execve.
                return self.pid
            return self._outcome(argv, cwd, argv[0], path_var)
        finally:
            self.sock.close()

    def _stub(
        self, path: str, argv: list[str], env: dict[str, str], cwd: str, stdio: list[int], ctty: int
    ) -> int:
        if not execstub.sendable(argv, env, cwd, path):
            self.sock.close()
            os.waitpid(self.pid, 0)
            raise ExecError(
                f"cannot start {argv[0]}: a NUL in an argument, or an environment name with '='",
                operation="execve",
                hint="execve takes neither",
            )
        socket.send_fds(self.sock, [execstub.request(cwd, path, ctty, argv, env)], stdio)
        return self._outcome(argv, cwd, path, None)

    def _outcome(self, argv: list[str], cwd: str, path: str, path_var: str | None) -> int:
        """The stub's answer: none (its end closed on execve: the command runs), or the
        step that failed. ``path_var``: set when the stub searched PATH for ``path``."""
        answer = b""
        while len(answer) < 9:
            chunk = self.sock.recv(9 - len(answer))
            if not chunk:
                break
            answer += chunk
        if not answer:
            return self.pid  # its end closed on execve: the command runs
        os.waitpid(self.pid, 0)
        step, err = execstub.reply(answer)
        if step == execstub.CHDIR:
            raise _cwd_error(cwd, OSError(err, os.strerror(err), cwd))
        if step == execstub.SEARCH and path_var is not None:
            raise not_found(path, path_var)
        if step == execstub.EXECVE:
            raise exec_failure(err, argv[0], path)
        raise ExecError(
            f"cannot start {argv[0]}: {os.strerror(err)} (step {step} of warren's exec stub)",
            operation="execve",
            errno=err,
            hint="this is a bug in warren; please report it with the command you ran",
        )

    def discard(self) -> None:
        """Not needed (no request came, or not a command): it is killed and reaped. Not
        left to see its channel end: the supervisor may hold a copy of our end of it
        (``Launcher.launched``) until this helper has exited, so the end would never
        come, and this wait would never end (a spare PID 1 let go stayed, with its
        stub, for as long as the sandbox lived)."""
        self.sock.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)  # it has run nothing: it only waited
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def limit_resources(plan: Plan) -> None:
    """The planned rlimits (where no cgroup enforces a limit), soft and hard: once the
    capabilities are dropped, nothing in the command can raise them again."""
    if plan.limits is None:
        return
    if plan.limits.cgroups:
        # At the memory limit the OOM killer picks in the sandbox's cgroup: the command
        # (raising its own score needs no privilege), never PID 1 or a helper, so the
        # sandbox survives and the kill is reported.
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    for name, value in plan.limits.rlimits:
        resource = getattr(resource_mod, name)
        _soft, hard = resource_mod.getrlimit(resource)
        value = value if hard == resource_mod.RLIM_INFINITY else min(value, hard)
        resource_mod.setrlimit(resource, (value, value))


def confinement(plan: Plan, ruleset: int | None) -> str:
    """What the stub confines itself to (``execstub.confinement``): what
    ``limit_resources`` and ``harden.harden`` do here, the rlimits' values taken now
    (the stub has this process's hard limits). The descriptors (its channel, the
    Landlock ruleset) are named beside it (``_spawn_stub``)."""
    rlimits: list[tuple[int, int]] = []
    oom = False
    if plan.limits is not None:
        oom = bool(plan.limits.cgroups)
        for name, value in plan.limits.rlimits:
            resource = getattr(resource_mod, name)
            _soft, hard = resource_mod.getrlimit(resource)
            rlimits.append((resource, value if hard == resource_mod.RLIM_INFINITY else min(value, hard)))
    signals = tuple(int(sig) for sig in _DEFAULT_SIGNALS)
    return execstub.confinement(signals, oom, rlimits, harden.seccomp_program(plan).hex)


def _become_stub(stub: int, sock: int) -> None:
    """Exec the stub (confined already) with ``sock`` as its fd 3 (the only descriptor
    it keeps)."""
    if stub == execstub.SOCK:
        stub = os.dup(stub)
    if sock == execstub.SOCK:
        os.set_inheritable(sock, True)
    else:
        os.dup2(sock, execstub.SOCK)  # the copy is not close-on-exec
    _sys.close_range(execstub.SOCK + 1, 0xFFFFFFFF, _sys.CLOSE_RANGE_CLOEXEC)
    os.execve(stub, [execstub.NAME], {})


def _spawn_stub(stub: int, sock: int, ruleset: int | None, spec: str) -> int | None:
    """The stub (``stub``: its memfd, ``execstub.loaded``) started as its own process
    (``posix_spawn``: no copy of this one is made), confining itself (``confinement``);
    None where it cannot be (no /proc to name its memfd by): the caller forks as before."""
    env = {"WARREN_CONFINE": f"{sock};{-1 if ruleset is None else ruleset};{spec}"}
    given = {fd: os.get_inheritable(fd) for fd in (sock, ruleset) if fd is not None}
    for fd in given:
        os.set_inheritable(fd, True)  # the stub closes every other descriptor it got
    try:
        return os.posix_spawn(
            f"/proc/self/fd/{stub}",
            [execstub.NAME],
            env,
            setsigmask=(),
            setsigdef=_DEFAULT_SIGNALS,
        )
    except OSError:
        return None
    finally:
        for fd, was in given.items():
            os.set_inheritable(fd, was)


def _await_launch(plan: Plan, ruleset: int | None, sock: socket.socket, warm_up: bool) -> NoReturn:
    """In the process forked ahead of time: wait for the command, then become it."""
    hardened = False
    try:
        os.setsid()
        for sig in _DEFAULT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        stub = execstub.loaded()
        if stub is not None:
            with contextlib.suppress(OSError, WarrenError):  # else said at launch (see below)
                limit_resources(plan)
                harden.harden(plan, ruleset)
                hardened = True
        if stub is not None and hardened:
            with contextlib.suppress(OSError):
                _become_stub(stub, sock.fileno())
        if warm_up:
            warm(plan)
        sock.sendall(execstub.HARDENED if hardened else execstub.PYTHON)
        msg, _, fds = wire.recv(sock, (protocol.Launch,), max_payload=0)
    except BaseException:
        os._exit(0)  # not needed after all
    assert isinstance(msg, protocol.Launch)
    try:
        os.chdir(msg.cwd)
        if 0 <= msg.ctty < len(fds):
            fcntl.ioctl(fds[msg.ctty], termios.TIOCSCTTY, 0)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)  # dup2 clears close-on-exec on the copy
        if not hardened:
            limit_resources(plan)
            harden.harden(plan, ruleset)
        _sys.close_range(3, 0xFFFFFFFF, _sys.CLOSE_RANGE_CLOEXEC)
        os.execve(msg.path, msg.argv, msg.env)
    except OSError as e:
        error: WarrenError = exec_failure(e.errno or errno.EIO, msg.argv[0], msg.path)
        if e.filename == msg.cwd or (e.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.isdir(msg.cwd)):
            error = _cwd_error(msg.cwd, e)
    except WarrenError as e:
        error = e
    except BaseException as e:
        error = ExecError(f"cannot start {msg.argv[0]}: {e!r}", operation="execve")
    with contextlib.suppress(OSError):
        wire.send(sock, protocol.error_message(error))
    os._exit(127)


@dataclass(eq=False)
class Shim:
    plan: Plan
    launcher: Launcher
    conn: socket.socket
    command: protocol.Command
    fds: list[int]
    spawn_id: str | None  # set for a background process: fds are its logs
    # The sandbox's cgroup counters ("memory:oom_kill", "pids:max") and the
    # supervisor's "active" pipe (held until this shim exits: the exec's end).
    extra: dict[str, int] | None = None
    stdin: bool = False  # a background process's stdin pipe follows its logs in fds
    # Set when the supervisor handed the command to the stub itself (``Handoff.launched``):
    # the counters as it read them just before. No descriptors came in ``fds`` then.
    launched: dict[str, int] | None = None
    # A one-shot's run, in its own pid namespace: the sandbox ends with the command, and
    # PID 1 is told on this channel once nothing of it is left (``end_sandbox``).
    last: socket.socket | None = None
    before: dict[str, int] = field(default_factory=dict, init=False)
    # Asked just before an exec's answer is sent: True when its helper serves again
    # (``pid1._GoesOn``), which then keeps its core rather than yield it as it exits;
    # and, that answer sent, told so (True), to say so to PID 1 at once.
    goes_on: Callable[[bool], bool] | None = field(default=None, init=False)
    # Asked when a command failed (``pid1._ends_with_pid1``, set only for a command started
    # while the hard-link walk's window was open): whether its sandbox is ending, PID 1
    # going. A writing call the window held then failed with ENOSYS as PID 1 closed its
    # broker (the walk found a file linked from outside): that failure is not the
    # command's, and the helper says nothing of it (the client hears why from the
    # supervisor: "linked from outside ... run the command again").
    ends: Callable[[], bool] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.counters = {k: fd for k, fd in (self.extra or {}).items() if ":" in k}
        self.synced = (self.extra or {}).get("synced")  # see _in_step
        self.watches = [fd for k, fd in (self.extra or {}).items() if k.startswith("gitwatch.")]

    def _limit_hit(self, status: int) -> str | None:
        """The limit the sandbox ran into while the command ran: its counter went up
        (for memory, only when the command itself was killed: the OOM killer's)."""
        if self.plan.limits is None:
            return None
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        for name, fd in self.counters.items():
            limit, _, key = name.partition(":")
            # A key names an event count; none, a level (the pids peak, read below).
            went_up = key and cgroups.read_counter(fd, key) > self.before.get(name, 0)
            if went_up and (limit != "memory" or killed):
                level = self.counters.get(f"{limit}:")
                peak = None if level is None else cgroups.read_counter(level, "")
                return self.plan.limits.reached(limit, peak)
        return None

    def run(self) -> None:
        cmd = self.command
        if not cmd.argv or not cmd.argv[0]:
            raise ExecError("no command given", operation="exec", hint="pass a command after --")
        if self.launched is not None:
            self._follow_launched()
            return
        warnings: list[str] = []
        if cmd.cwd:
            cwd = _enter_cwd(cmd.cwd, self.plan.workspace)
        else:
            cwd, warnings = _default_cwd(self.plan)
        env = command_env(self.plan, cmd)
        if self.plan.scratch:
            # The sandbox's TMPDIR, removed by an earlier command (possible only where
            # its parent is writable too): made again, empty, so this command has one.
            with contextlib.suppress(OSError):
                os.mkdir(self.plan.scratch, 0o700)
        path = resolve_command(cmd.argv[0], env.get("PATH", ""))
        master = -1
        relay: tuple[int, int] | None = None
        if self.spawn_id is not None:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            stdin = self.fds[4] if self.stdin else os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC)
            stdio = [stdin, out_w, err_w]
            relay = (out_r, err_r)
        else:
            given = iter(self.fds)
            stdio = [next(given) if attached else -1 for attached in (cmd.stdio + [False] * 3)[:3]]
            for i in range(3):
                if stdio[i] < 0:
                    stdio[i] = os.open("/dev/null", os.O_RDWR | os.O_CLOEXEC)
        slave = -1
        if cmd.tty is not None:
            master, slave = os.openpty()
            fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", cmd.tty.rows, cmd.tty.cols, 0, 0))
            for i in cmd.tty.fds:
                if 0 <= i <= 2:
                    stdio[i] = slave
        ctty = stdio.index(slave) if slave >= 0 and slave in stdio else -1
        self.before = {
            name: cgroups.read_counter(fd, name.partition(":")[2]) for name, fd in self.counters.items()
        }
        pid = self.launcher.launch(path, cmd.argv, env, cwd, stdio, ctty)
        for fd in {*stdio, slave} - {-1}:
            os.close(fd)
        if self.spawn_id is not None:
            meta = {"pid": pid, "argv": cmd.argv, "cwd": cwd, "started": time.time()}
            os.pwrite(self.fds[3], json.dumps(meta).encode(), 0)
        self._started(pid, cwd, warnings, master)
        deadline = None if cmd.timeout is None else time.monotonic() + cmd.timeout
        if relay is not None:
            self._relay(pid, deadline, *relay)
        else:
            self._ready_to_answer()
            self._wait(pid, deadline)

    def _follow_launched(self) -> None:
        """The supervisor gave the command to the stub itself, with the command's stdio
        (``server.handoff``): here the directory it was told to enter (the same walk,
        for the warning) and its outcome, then the command, as for any exec."""
        assert self.launched is not None
        cmd = self.command
        self.before = dict(self.launched)
        warnings: list[str] = []
        if cmd.cwd:
            cwd = command_dir(cmd.cwd, self.plan.workspace)
        else:
            cwd, warnings = _default_cwd(self.plan)
        path_var = command_env(self.plan, cmd).get("PATH", "")
        pid = self.launcher.launched(cmd.argv, cwd, path_var)
        self._started(pid, cwd, warnings, -1)
        self._ready_to_answer()
        self._wait(pid, None if cmd.timeout is None else time.monotonic() + cmd.timeout)

    def _started(self, pid: int, cwd: str, warnings: list[str], master: int) -> None:
        started = protocol.Started(
            pid=pid,
            cwd=cwd,
            warnings=warnings,
            spawn_id=self.spawn_id,
            network=self.plan.net.mode,
            repository=self.plan.repository,
        )
        wire.send(self.conn, started, fds=[master] if master >= 0 else [])
        if master >= 0:
            os.close(master)

    def _ready_to_answer(self) -> None:
        """While the command runs: once, without effect, what its end runs (the limits'
        counters read, the report and the answer encoded). This helper is a fork of PID 1
        and shares its memory copy-on-write: the first write to each page (Python writes
        reference counts on whatever it touches) costs a page fault and a copy, about 40
        of them on the way from the command's end to the answer; taken now, they are
        beside the command instead of between its end and the client."""
        self._limit_hit(0)
        wire.frame(protocol.Exited(status=0, timed_out=False, limit=None))
        _report_data(protocol.Exited(status=0))
        os.sched_param(0)

    def _forward(self, pid: int) -> bool:
        """A message from the client: a signal to forward. False when it went away."""
        try:
            msg, _, fds = wire.recv(self.conn, (protocol.Signal,), max_payload=0)
        except (wire.ConnectionClosed, OSError, ProtocolError):
            return False
        for fd in fds:
            os.close(fd)
        assert isinstance(msg, protocol.Signal)
        if 1 <= msg.signal < signal.NSIG:
            try:
                os.killpg(pid, msg.signal)  # the command leads its own session and group
            except ProcessLookupError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, msg.signal)
        return True

    def _wait(self, pid: int, deadline: float | None) -> None:
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        poller.register(self.conn, select.POLLIN)
        timed_out = False
        while True:
            wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
            events = poller.poll(wait)
            if not events and deadline is not None and time.monotonic() >= deadline:
                timed_out = True
                status = procs.kill_tree(pid)
                break
            if any(fd == pidfd for fd, _ in events):
                _, status = os.waitpid(pid, 0)
                break
            if any(fd == self.conn.fileno() for fd, _ in events) and not self._forward(pid):
                # The client went away (or was killed): nobody will read the result.
                procs.kill_tree(pid)
                return
        if status != 0 and self.ends is not None and self.ends():
            os._exit(1)  # the namespace's end kills this helper meanwhile
        if self.last is not None:
            end_sandbox(self.last)
            self.last = None
        exited = protocol.Exited(status=status, timed_out=timed_out, limit=self._limit_hit(status))
        # The watches are read before the report: the report wakes the supervisor, whose
        # sync reads them too, and a queue it emptied would read here as "nothing changed"
        # (the client then heard of the end before the host's repository had the command's
        # index).
        wait = self._changed()
        self._report(exited)
        self._in_step(wait)
        goes_on = self.goes_on is not None and self.goes_on(False)
        with contextlib.suppress(OSError):
            wire.send(self.conn, exited)
        if not goes_on:
            _yield_to_client()
        elif self.goes_on is not None:
            self.goes_on(True)

    def _report(self, exited: protocol.Exited) -> None:
        """How the command ended, on the supervisor's end-of-exec channel (one write,
        far below PIPE_BUF: whole or not at all), for the sandbox's trail."""
        fd = self.synced if self.synced is not None else (self.extra or {}).get("active")
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.write(fd, _report_data(exited))

    def _changed(self) -> bool:
        """Whether the client must wait for the sync: something is queued on the trees'
        watches (nothing queued: the command changed nothing the sync carries to the
        host, which still runs, told by the end of the synced socket)."""
        return self.synced is not None and (not self.watches or dirwatch.changed(self.watches))

    def _in_step(self, wait: bool | None = None) -> None:
        """Where the sandbox has repositories, the supervisor brings them in step with the
        host once the command ended: the client hears of the end after that (``wait``:
        ``_changed`` as read before the report, else read now)."""
        if self.synced is None:
            return
        if wait is None:
            wait = self._changed()
        sock = socket.socket(fileno=self.synced)
        self.synced = None
        with contextlib.suppress(OSError), sock:
            sock.shutdown(socket.SHUT_WR)
            if wait:
                sock.settimeout(SYNC_WAIT)
                sock.recv(1)

    def _relay(self, pid: int, deadline: float | None, out_r: int, err_r: int) -> None:
        out_log, err_log, status_fd = self.fds[:3]
        limit = self.command.output_limit
        sinks = {out_r: [out_log, 0, 0], err_r: [err_log, 0, 0]}  # log fd, kept, dropped
        for fd in sinks:
            os.set_blocking(fd, False)
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)

        def take(fd: int) -> bool:
            """One read of ``fd`` into its log; False when nothing more is there now."""
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                return False
            sink = sinks[fd]
            if not chunk:
                poller.unregister(fd)
                if sink[2]:
                    os.write(sink[0], truncation_marker(sink[2]))
                del sinks[fd]
                return False
            room = max(0, limit - sink[1])
            if room:
                os.write(sink[0], chunk[:room])
                sink[1] += min(room, len(chunk))
            sink[2] += max(0, len(chunk) - room)
            return True

        status: int | None = None
        timed_out = False
        while sinks or status is None:
            wait = None if deadline is None else max(0, int((deadline - time.monotonic()) * 1000) + 1)
            events = poller.poll(wait)
            if not events and deadline is not None and time.monotonic() >= deadline:
                timed_out = True
                status = procs.kill_tree(pid) if status is None else status
                deadline = None
            for fd, _ev in events:
                if fd == pidfd:
                    poller.unregister(pidfd)
                    if status is not None:
                        continue  # reaped by the timeout's kill: told below
                    _, status = os.waitpid(pid, 0)
                    # What the process wrote is in the pipes now: it is in the logs (and a
                    # pipe it alone held has ended, with its marker) before anyone hears
                    # of the exit. A pipe a process it left behind still holds goes on.
                    for out in list(sinks):
                        while out in sinks and take(out):
                            pass
                    self._finished(status_fd, status, timed_out)
                elif fd in sinks:
                    take(fd)
            if timed_out and status is not None and not procs.descendants(os.getpid()):
                break
        if timed_out and status is not None:
            self._finished(status_fd, status, timed_out)

    def _finished(self, status_fd: int, status: int, timed_out: bool) -> None:
        """Record the status where any client finds it, and tell the one that spawned."""
        limit = self._limit_hit(status)
        data = json.dumps({"status": status, "timed_out": timed_out, "limit": limit}).encode()
        os.ftruncate(status_fd, 0)
        os.pwrite(status_fd, data, 0)
        with contextlib.suppress(OSError):
            wire.send(self.conn, protocol.Exited(status=status, timed_out=timed_out, limit=limit))


# How long the helper of a one-shot's run waits for the processes its command left to
# die once killed (seconds): one that takes longer (a process in an uninterruptible
# wait) is left to PID 1's exit, which the run's answer then waits for.
END_WAIT = 1.0


def end_sandbox(last: socket.socket, wait: float = END_WAIT) -> bool:
    """A one-shot's command ended, and the sandbox with it: kill every process of the
    sandbox but PID 1 and this helper (``kill(-1)`` in its own pid namespace), reap
    what the command left (this helper is their child subreaper: each comes to it
    as its parent dies, so none is left once none is), then tell PID 1 ("d") — before
    the command's end is said, so PID 1's word (``protocol.Emptied``) and the
    answer travel together. Not said when one outlives ``wait``: PID 1's exit ends it,
    and the run is answered after that, as ever. Whatever else the kill reached is
    warren's own (spares let go, the credentials sender) and runs none of the
    sandbox's code."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    deadline = time.monotonic() + wait
    try:
        keeper = os.getppid()
        if keeper == 1:  # PID 1 serves the sandbox itself: kill(-1) spares it (and this helper)
            with contextlib.suppress(OSError):  # none left (ESRCH), or none it may kill (EPERM)
                os.kill(-1, signal.SIGKILL)
        else:  # the keeper (``pid1._keep_as_keeper``), which kill(-1) would not spare
            procs.kill_all_but({1, os.getpid(), keeper})
        while True:
            try:
                reaped = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG)
            except ChildProcessError:
                break
            if reaped is not None:
                continue
            left = deadline - time.monotonic()
            if left <= 0 or signal.sigtimedwait({signal.SIGCHLD}, left) is None:
                return False
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    try:
        last.send(b"d", socket.MSG_NOSIGNAL)
    except OSError:
        return False
    finally:
        last.close()
    return True


def _report_data(exited: protocol.Exited) -> bytes:
    """An exec's end as its helper reports it to the supervisor, with when (read a
    moment later, maybe: ``server.box.take_reports``)."""
    said = {"status": exited.status, "timed_out": exited.timed_out, "limit": exited.limit}
    return json.dumps({**said, "mono": time.monotonic(), "wall": time.time()}).encode()


def _yield_to_client() -> None:
    """The answer is sent and this helper only exits now: that exit (a forked Python's
    memory let go, about a millisecond) runs after whatever else wants the core — the
    client just woken on this one, which would otherwise wait for it."""
    with contextlib.suppress(OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        os.sched_yield()


def stub_request(plan: Plan, cmd: protocol.Command) -> bytes | None:
    """The exec as the exec stub reads it (``execstub.request``), for the supervisor to
    give the spare helper's command process itself: the same directory, environment,
    PATH search and stdio the helper would give it (``Shim.run``). None for what
    only the helper does (a terminal) or refuses with its own error (no command, a
    string execve cannot take). The supervisor gives the stub all three stdio
    descriptors, ``/dev/null`` where the client attached none (``server.box``): the
    stub opens nothing itself, so that it can take a command while the hard-link walk's
    window is open, where its writing open of ``/dev/null`` would wait for the walk."""
    if cmd.tty is not None or not cmd.argv or not cmd.argv[0]:
        return None
    env = command_env(plan, cmd)
    if cmd.cwd:
        cwd, walk = command_dir(cmd.cwd, plan.workspace), False
    else:
        cwd, walk = plan.cwd, True  # the default, re-resolved: its nearest ancestor if removed
    scratch = plan.scratch or ""
    if not execstub.sendable(cmd.argv, env, cwd, scratch):
        return None
    return execstub.request(
        cwd, cmd.argv[0], -1, cmd.argv, env, walk=walk, scratch=scratch, search=True, nulls="000"
    )
