"""Run one command in the sandbox: the exec helper PID 1 forks for each exec or spawn.

    PID 1 ── shim (this; warren's: unconfined, no capabilities, not dumpable, a child
              │   subreaper): resolves the cwd and the program *now*, makes a pty when
              │   asked, forks the command, reports its pid, relays signals from the
              │   client, enforces the timeout by killing the command's whole tree, and
              │   reports the wait status
              └─ the command: its own session, hardened in its own process right before
                  execve (``harden.harden``), so it lives in a Landlock domain of its
                  own: it can neither signal nor trace the shim, PID 1 or any other
                  exec's helper (signal scoping needs Landlock ABI >= 6).

A background process (spawn) has its output relayed into capped logs the supervisor
made (stdout, stderr, status, and its pid and argv); the shim stays until it ends and
records its status there.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import select
import signal
import socket
import struct
import termios
import time

from .. import protocol, wire
from ..errors import (
    CommandNotFound,
    CwdNotFound,
    ExecError,
    ProtocolError,
    WarrenError,
    from_record,
    to_record,
)
from ..output import truncation_marker
from ..plan.model import Plan
from . import _sys, harden, procs

PR_SET_CHILD_SUBREAPER = 36
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
    raise CommandNotFound(
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


def _enter_cwd(cwd: str, workspace: str) -> str:
    path = cwd if cwd.startswith("/") else os.path.join(workspace, cwd)
    try:
        os.chdir(path)
    except OSError as e:
        raise CwdNotFound(
            f"working directory does not exist in the sandbox: {path}"
            if e.errno in (errno.ENOENT, errno.ENOTDIR)
            else f"cannot enter working directory {path}",
            operation="chdir",
            path=path,
            errno=e.errno,
            hint=f"create it first (mkdir -p {path} in the sandbox), or omit the cwd to use the workspace",
        ) from None
    return path


class Shim:
    def __init__(
        self,
        plan: Plan,
        ruleset: int | None,
        conn: socket.socket,
        command: protocol.Command,
        fds: list[int],
        spawn_id: str | None,
    ) -> None:
        self.plan = plan
        self.ruleset = ruleset
        self.conn = conn
        self.command = command
        self.fds = fds
        self.spawn_id = spawn_id  # set for a background process: fds are its logs

    def run(self) -> None:
        _sys.prctl(PR_SET_CHILD_SUBREAPER, 1)
        cmd = self.command
        if not cmd.argv or not cmd.argv[0]:
            raise ExecError("no command given", operation="exec", hint="pass a command after --")
        warnings: list[str] = []
        if cmd.cwd:
            cwd = _enter_cwd(cmd.cwd, self.plan.workspace)
        else:
            cwd, warnings = _default_cwd(self.plan)
        env = {**self.plan.env, **cmd.env}
        path = resolve_command(cmd.argv[0], env.get("PATH", ""))
        master = -1
        relay: tuple[int, int] | None = None
        if self.spawn_id is not None:
            out_r, out_w = os.pipe2(os.O_CLOEXEC)
            err_r, err_w = os.pipe2(os.O_CLOEXEC)
            stdio = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC), out_w, err_w]
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
        pid = self._fork_command(path, cmd.argv, env, stdio, slave)
        for fd in {*stdio, slave} - {-1}:
            os.close(fd)
        if self.spawn_id is not None:
            meta = {"pid": pid, "argv": cmd.argv, "cwd": cwd, "started": time.time()}
            os.pwrite(self.fds[3], json.dumps(meta).encode(), 0)
        started = protocol.Started(
            pid=pid, cwd=cwd, warnings=warnings, spawn_id=self.spawn_id, network=self.plan.net.mode
        )
        wire.send(self.conn, started, fds=[master] if master >= 0 else [])
        if master >= 0:
            os.close(master)
        deadline = None if cmd.timeout is None else time.monotonic() + cmd.timeout
        if relay is not None:
            self._relay(pid, deadline, *relay)
        else:
            self._wait(pid, deadline)

    def _fork_command(
        self, path: str, argv: list[str], env: dict[str, str], stdio: list[int], tty: int
    ) -> int:
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                if tty >= 0:
                    fcntl.ioctl(tty, termios.TIOCSCTTY, 0)
                for target, fd in enumerate(stdio):
                    os.dup2(fd, target)  # dup2 clears close-on-exec on the copy
                for sig in _DEFAULT_SIGNALS:
                    signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_SETMASK, ())
                harden.harden(self.plan, self.ruleset)
                _sys.close_range(3, 0xFFFFFFFF, _sys.CLOSE_RANGE_CLOEXEC)
                os.execve(path, argv, env)
            except OSError as e:
                record = to_record(exec_failure(e.errno or errno.EIO, argv[0], path))
            except WarrenError as e:
                record = to_record(e)
            except BaseException as e:
                record = to_record(ExecError(f"cannot start {argv[0]}: {e!r}", operation="execve"))
            with contextlib.suppress(OSError):
                os.write(err_w, json.dumps(record).encode())
            os._exit(127)
        os.close(err_w)
        report = b""
        while chunk := os.read(err_r, 65536):
            report += chunk
        os.close(err_r)
        if report:
            os.waitpid(pid, 0)
            raise from_record(json.loads(report))
        return pid

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
        with contextlib.suppress(OSError):
            wire.send(self.conn, protocol.Exited(status=status, timed_out=timed_out))

    def _relay(self, pid: int, deadline: float | None, out_r: int, err_r: int) -> None:
        out_log, err_log, status_fd = self.fds[:3]
        limit = self.command.output_limit
        sinks = {out_r: [out_log, 0, 0], err_r: [err_log, 0, 0]}  # log fd, kept, dropped
        pidfd = os.pidfd_open(pid)
        poller = select.poll()
        for fd in (out_r, err_r, pidfd):
            poller.register(fd, select.POLLIN)
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
                    _, status = os.waitpid(pid, 0)
                    self._finished(status_fd, status, timed_out)
                    continue
                chunk = os.read(fd, 65536)
                sink = sinks[fd]
                if not chunk:
                    poller.unregister(fd)
                    if sink[2]:
                        os.write(sink[0], truncation_marker(sink[2]))
                    del sinks[fd]
                    continue
                room = max(0, limit - sink[1])
                if room:
                    os.write(sink[0], chunk[:room])
                    sink[1] += min(room, len(chunk))
                sink[2] += max(0, len(chunk) - room)
            if timed_out and status is not None and not procs.descendants(os.getpid()):
                break
        if timed_out and status is not None:
            self._finished(status_fd, status, timed_out)

    def _finished(self, status_fd: int, status: int, timed_out: bool) -> None:
        """Record the status where any client finds it, and tell the one that spawned."""
        data = json.dumps({"status": status, "timed_out": timed_out}).encode()
        os.ftruncate(status_fd, 0)
        os.pwrite(status_fd, data, 0)
        with contextlib.suppress(OSError):
            wire.send(self.conn, protocol.Exited(status=status, timed_out=timed_out))
