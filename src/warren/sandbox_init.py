"""PID 1 of a long-lived sandbox, and the hardened helpers it forks on request.

Process shape, all inside the sandbox's namespaces:

    PID 1 (``pid1_main``): cloned by the supervisor with PR_SET_PDEATHSIG(SIGKILL); sets
    │   up the root once, builds the Landlock ruleset once, then serves requests on a
    │   unix socket and reaps every orphan. It runs no user code and is not itself
    │   Landlocked or seccomp'd (it must keep forking); user code cannot signal it
    │   (Landlock signal scoping) nor trace it (not dumpable, and it keeps capabilities
    │   that its hardened descendants lack).
    ├─ shim, one per exec/spawn: forked, hardens itself exactly like a one-shot
    │   sandbox's command (caps, no_new_privs, Landlock, seccomp), becomes a child
    │   subreaper, resolves the cwd *now*, posix_spawns the command in a new session and
    │   reports pid and status. A timeout or a vanished client kills the command's
    │   whole tree: as subreaper the shim inherits every orphan, so no descendant can
    │   slip out of the tree it kills.
    └─ file helper, one per files-API call: forked, hardened the same way, performs one
        file operation with the sandbox's own path resolution and rights.

Joining the sandbox by forking from PID 1 (already in every namespace) instead of
``setns`` from the client costs one fork of a small process, and makes "sees exactly
the sandbox's view" true by construction.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import selectors
import shutil
import signal
import socket
import stat as _stat
import time
from typing import Any, NoReturn

from . import _sys, launch, netns, wire
from .errors import CwdNotFound, SetupError
from .output import truncation_marker
from .plan import Plan

PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
STOP_GRACE = 2.0


class SandboxInit:
    def __init__(self, plan: Plan, workspace: str, listener: socket.socket, ruleset: int | None) -> None:
        self.plan = plan
        self.workspace = workspace
        self.listener = listener
        self.ruleset = ruleset
        self.helpers: set[int] = set()
        self.stopping: float | None = None
        self.sel = selectors.DefaultSelector()
        self.wake_r, self.wake_w = socket.socketpair()

    # --- PID 1's loop -------------------------------------------------------------

    def serve(self) -> int:
        for s in (self.wake_r, self.wake_w, self.listener):
            s.setblocking(False)
        signal.set_wakeup_fd(self.wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, self._on_term)
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        self.sel.register(self.listener, selectors.EVENT_READ, "accept")
        self.sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        while True:
            timeout = None if self.stopping is None else 0.05
            for key, _ in self.sel.select(timeout):
                if key.data == "accept":
                    self._accept()
                elif key.data == "wake":
                    with contextlib.suppress(BlockingIOError):
                        while self.wake_r.recv(4096):
                            pass
                else:
                    self.sel.unregister(key.fileobj)
                    self._handle(key.fileobj)  # type: ignore[arg-type]
            self._reap()
            if self.stopping is not None and (not _children() or time.monotonic() > self.stopping):
                return 0

    def _on_term(self, _signum: int, _frame: object) -> None:
        # Stop: give every process SIGTERM and a grace period; PID 1 exiting then
        # SIGKILLs whatever is left (the kernel tears the pid namespace down).
        if self.stopping is None:
            self.stopping = time.monotonic() + STOP_GRACE
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGTERM)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(True)
            conn.settimeout(10)
            self.sel.register(conn, selectors.EVENT_READ, "conn")

    def _reap(self) -> None:
        while True:
            try:
                pid, _status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.helpers.discard(pid)

    def _handle(self, conn: socket.socket) -> None:
        try:
            msg, payload, fds = wire.recv(conn)
        except (wire.ConnectionClosed, OSError, ValueError):
            conn.close()
            return
        op = msg.get("op")
        try:
            if op in ("exec", "spawn", "file"):
                pid = os.fork()
                if pid == 0:
                    self._helper(conn, msg, payload, fds)
                self.helpers.add(pid)
            elif op == "ps":
                wire.send(conn, {"processes": self._ps()})
            elif op == "signal":
                wire.send(conn, self._signal(int(msg["pid"]), int(msg["signal"])))
            elif op == "connect":
                _connect_inside(conn, int(msg["port"]))
            else:
                wire.send(conn, {"ok": True, "pid": os.getpid()})
        except OSError:
            pass
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()

    def _ps(self) -> list[dict[str, Any]]:
        procs = []
        for pid, ppid, state in _proc_table():
            if pid == 1 or pid in self.helpers:
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
            except OSError:
                continue
            procs.append(
                {"pid": pid, "ppid": 0 if ppid in self.helpers else ppid, "state": state, "argv": argv}
            )
        return procs

    def _signal(self, pid: int, sig: int) -> dict[str, Any]:
        if pid <= 1 or pid in self.helpers:
            return {"error": "SandboxError", "message": f"no such process in the sandbox: {pid}"}
        try:
            os.kill(-pid, sig)  # commands run in their own session: signal the group
        except ProcessLookupError:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return {"ok": False, "gone": True}
        return {"ok": True}

    # --- in a forked helper ---------------------------------------------------------

    def _helper(self, conn: socket.socket, msg: dict[str, Any], payload: bytes, fds: list[int]) -> NoReturn:
        code = 0
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
                signal.signal(sig, signal.SIG_DFL)
            for s in (self.listener, self.wake_r, self.wake_w):
                os.close(s.detach())
            conn.settimeout(None)
            if msg["op"] == "file":
                launch.harden(self.plan, self.ruleset)
                _file_op(conn, msg, payload, self.workspace)
            else:
                _Shim(self, conn, msg, fds).run()
        except launch.Failure as f:
            with contextlib.suppress(OSError):
                wire.send(conn, f.record)
            code = 125
        except BaseException as e:
            with contextlib.suppress(OSError):
                wire.send(
                    conn,
                    {
                        "error": "SandboxError",
                        "message": f"sandbox helper failed: {e!r}",
                        "operation": str(msg.get("op")),
                        "hint": "this is a bug in warren; please report it with the command you ran",
                    },
                )
            code = 125
        os._exit(code)


def _connect_inside(conn: socket.socket, port: int) -> None:
    """For an exposed port: a TCP connection to the port on the sandbox's loopback,
    made here (a socket belongs to the namespace it is created in) and handed over."""
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.settimeout(2)
            sock.connect((address, port))
            sock.settimeout(None)
            wire.send(conn, {"ok": True}, fds=[sock.fileno()])
            return
        except OSError:
            continue
        finally:
            sock.close()
    wire.send(conn, {"ok": False, "refused": True})


def _proc_table() -> list[tuple[int, int, str]]:
    table = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        table.append((int(name), int(fields[1]), fields[0]))
    return table


def _children() -> bool:
    me = os.getpid()
    return any(ppid == me for _pid, ppid, _state in _proc_table())


def _descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for pid, ppid, _state in _proc_table():
        kids.setdefault(ppid, []).append(pid)
    out, todo = [], list(kids.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, []))
    return out


def _default_cwd(workspace: str) -> tuple[str, list[str]]:
    """The workspace, re-resolved for every exec (DESIGN F5). If it was removed, the
    nearest existing ancestor, said out loud in the result's warnings."""
    with contextlib.suppress(OSError):
        os.chdir(workspace)
        return workspace, []
    path = workspace
    while path != "/":
        path = os.path.dirname(path)
        with contextlib.suppress(OSError):
            os.chdir(path)
            break
    warning = (
        f"the workspace {workspace} does not exist in the sandbox any more; "
        f"ran in {path} (recreate it with mkdir -p {workspace})"
    )
    return path, [warning]


def _enter_explicit_cwd(cwd: str, workspace: str) -> str:
    path = cwd if cwd.startswith("/") else os.path.join(workspace, cwd)
    try:
        os.chdir(path)
    except OSError as e:
        raise launch.fail(
            CwdNotFound,
            f"working directory does not exist in the sandbox: {path}"
            if e.errno in (errno.ENOENT, errno.ENOTDIR)
            else f"cannot enter working directory {path}",
            "chdir",
            path,
            e.errno,
            f"create it first (run mkdir -p {path} in the sandbox), or omit cwd to use the workspace",
        ) from None
    return path


class _Shim:
    """Runs one command for a client: see the module docstring."""

    def __init__(self, init: SandboxInit, conn: socket.socket, msg: dict[str, Any], fds: list[int]) -> None:
        self.plan = init.plan
        self.ruleset = init.ruleset
        self.workspace = init.workspace
        self.conn = conn
        self.msg = msg
        self.fds = fds
        self.spawn = msg["op"] == "spawn"

    def run(self) -> None:
        msg = self.msg
        _sys.prctl(PR_SET_CHILD_SUBREAPER, 1)
        if self.spawn:
            out_log, err_log, status_fd = self.fds[:3]
            out_r, out_w = os.pipe()
            err_r, err_w = os.pipe()
            stdio = [os.open("/dev/null", os.O_RDONLY), out_w, err_w]
        else:
            given = iter(self.fds)
            stdio = [next(given) if attached else -1 for attached in msg["stdio"]]
            if stdio[0] < 0:
                stdio[0] = os.open("/dev/null", os.O_RDONLY)
            for i in (1, 2):
                if stdio[i] < 0:
                    stdio[i] = os.open("/dev/null", os.O_WRONLY)
        for target, fd in enumerate(stdio):
            os.dup2(fd, target)
        launch.harden(self.plan, self.ruleset)
        env = dict(self.plan.env)
        env.update(msg.get("env") or {})
        if msg.get("cwd"):
            cwd = _enter_explicit_cwd(str(msg["cwd"]), self.workspace)
            warnings: list[str] = []
        else:
            cwd, warnings = _default_cwd(self.workspace)
        _sys.close_range(3, 0xFFFFFFFF, _sys.CLOSE_RANGE_CLOEXEC)
        argv = [str(a) for a in msg["argv"]]
        path = launch.resolve_command(argv[0], env.get("PATH", ""))
        pid = _spawn(path, argv, env)
        for target in (0, 1, 2):
            os.close(target)  # only the command holds the client's pipes now
        if self.spawn:
            os.close(out_w)
            os.close(err_w)
        wire.send(self.conn, {"pid": pid, "cwd": cwd, "warnings": warnings})
        timeout = msg.get("timeout")
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        if self.spawn:
            self._relay(pid, deadline, out_r, err_r, out_log, err_log, status_fd)
        else:
            self._wait(pid, deadline)

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
                status = _kill_tree(pid)
                break
            if any(fd == pidfd for fd, _ in events):
                _, status = os.waitpid(pid, 0)
                break
            if any(fd == self.conn.fileno() for fd, _ in events):
                # The client went away (or cancelled): nobody will read the result.
                _kill_tree(pid)
                return
        wire.send(self.conn, {"status": status, "timed_out": timed_out})

    def _relay(
        self,
        pid: int,
        deadline: float | None,
        out_r: int,
        err_r: int,
        out_log: int,
        err_log: int,
        status_fd: int,
    ) -> None:
        limit = int(self.msg.get("output_limit") or 16 * 1024 * 1024)
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
                status = _kill_tree(pid) if status is None else status
                _kill_tree(pid)
                deadline = None
            for fd, _ev in events:
                if fd == pidfd:
                    poller.unregister(pidfd)
                    _, status = os.waitpid(pid, 0)
                    _write_status(status_fd, status, timed_out)
                    with contextlib.suppress(OSError):
                        wire.send(self.conn, {"status": status, "timed_out": timed_out})
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
            if timed_out and status is not None and not _descendants(os.getpid()):
                break
        if status is not None and timed_out:
            _write_status(status_fd, status, timed_out)


def _write_status(fd: int, status: int, timed_out: bool) -> None:
    import json

    data = json.dumps({"status": status, "timed_out": timed_out}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def _spawn(path: str, argv: list[str], env: dict[str, str]) -> int:
    try:
        return os.posix_spawn(
            path,
            argv,
            env,
            setsid=True,
            setsigdef=(*launch.FORWARDED, signal.SIGPIPE, signal.SIGXFSZ, signal.SIGCHLD),
            setsigmask=(),
        )
    except OSError as e:
        raise launch.spawn_failure(e, argv[0], path) from None


def _kill_tree(main: int) -> int:
    """SIGKILL every descendant until none is left; the main command's wait status.

    As a child subreaper this process inherits the orphans of everything it kills,
    so repeating "kill all descendants, reap" converges on an empty tree even for
    processes that fork, setsid or ignore SIGTERM."""
    status = 0x9  # killed by SIGKILL, if it was reaped before we saw it
    while True:
        for pid in _descendants(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return status
            if pid == 0:
                break
            if pid == main:
                status = st
        time.sleep(0.002)


# --- the files API, inside the sandbox -------------------------------------------------

_DENIED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def _file_error(op: str, path: str, e: OSError) -> dict[str, Any]:
    code = e.errno or errno.EIO
    if code in (errno.ENOENT, errno.ENOTDIR):
        kind, hint = (
            "SandboxFileNotFound",
            "paths are resolved inside the sandbox (relative ones from the workspace); "
            "list the parent directory to see what exists",
        )
    elif code in _DENIED_ERRNOS:
        kind, hint = (
            "SandboxPermissionDenied",
            "the sandbox's policy does not allow this: only writable roots can change, "
            "denied paths cannot be read",
        )
    else:
        kind, hint = "SandboxFileError", f"{op} failed inside the sandbox"
    return {
        "error": kind,
        "message": f"{op} {path}: {os.strerror(code)}",
        "operation": op,
        "path": path,
        "errno": code,
        "hint": hint,
    }


def _stat_dict(st: os.stat_result) -> dict[str, Any]:
    kind = (
        "dir"
        if _stat.S_ISDIR(st.st_mode)
        else "file"
        if _stat.S_ISREG(st.st_mode)
        else "symlink"
        if _stat.S_ISLNK(st.st_mode)
        else "other"
    )
    return {
        "type": kind,
        "size": st.st_size,
        "mode": _stat.S_IMODE(st.st_mode),
        "mtime": st.st_mtime,
        "uid": st.st_uid,
        "gid": st.st_gid,
    }


def _read_regular(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EISDIR if os.path.isdir(path) else errno.EINVAL, "not a regular file", path)
        parts = []
        while chunk := os.read(fd, 1 << 20):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _write_regular(path: str, data: bytes, append: bool, mode: int, parents: bool) -> None:
    if parents:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    flags |= os.O_APPEND if append else 0
    fd = os.open(path, flags, mode)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if not append:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _file_op(conn: socket.socket, msg: dict[str, Any], payload: bytes, workspace: str) -> None:
    op = str(msg["fop"])
    raw = str(msg["path"])
    path = raw if raw.startswith("/") else os.path.join(workspace, raw)
    reply: dict[str, Any] = {"ok": True}
    out = b""
    try:
        if op == "read":
            out = _read_regular(path)
        elif op == "write":
            _write_regular(
                path, payload, bool(msg.get("append")), int(msg.get("mode", 0o644)), bool(msg.get("parents"))
            )
        elif op == "list":
            entries = []
            with os.scandir(path) as it:
                for entry in it:
                    try:
                        info = _stat_dict(entry.stat(follow_symlinks=False))
                    except OSError:
                        continue
                    entries.append({"name": entry.name, **info})
            reply["entries"] = sorted(entries, key=lambda e: e["name"])
        elif op == "stat":
            reply["stat"] = _stat_dict(os.stat(path, follow_symlinks=bool(msg.get("follow", True))))
        elif op == "exists":
            reply["exists"] = os.path.exists(path)
        elif op == "mkdir":
            if msg.get("parents"):
                os.makedirs(path, mode=int(msg.get("mode", 0o755)), exist_ok=bool(msg.get("exist_ok", True)))
            else:
                try:
                    os.mkdir(path, int(msg.get("mode", 0o755)))
                except FileExistsError:
                    if not (msg.get("exist_ok") and os.path.isdir(path)):
                        raise
        elif op == "remove":
            if os.path.isdir(path) and not os.path.islink(path):
                if msg.get("recursive"):
                    shutil.rmtree(path)
                else:
                    os.rmdir(path)
            else:
                os.unlink(path)
        elif op == "rename":
            raw_dst = str(msg["dst"])
            dst = raw_dst if raw_dst.startswith("/") else os.path.join(workspace, raw_dst)
            os.rename(path, dst)
        else:
            reply = {
                "error": "SandboxFileError",
                "message": f"unknown file operation {op}",
                "operation": op,
                "hint": "upgrade the client and the supervisor together",
            }
    except OSError as e:
        reply = _file_error(op, raw, e)
    wire.send(conn, reply, out)


# --- entry from the supervisor's clone -------------------------------------------------


def pid1_main(
    plan: Plan,
    workspace: str,
    listener: socket.socket,
    ready_fd: int,
    alive_fd: int,
    net: socket.socket | None = None,
) -> int:
    """Run as the freshly cloned PID 1; returns its exit code."""
    _sys.prctl(_sys.PR_SET_PDEATHSIG, signal.SIGKILL)
    # The supervisor is outside this pid namespace (getppid() is 0): EOF on this pipe
    # means it died before PR_SET_PDEATHSIG took effect.
    if select.select([alive_fd], [], [], 0)[0]:
        return 125
    os.close(alive_fd)
    launch.enter_new_root(plan)
    if net is not None and not netns.pid1_handshake(plan, net):
        return 125
    launch.drop_bounding_set(plan)
    os.chdir("/")
    ruleset = launch.landlock_ruleset(plan.landlock) if plan.landlock is not None else None
    launch.seccomp_program(plan)
    _sys.prctl(PR_SET_DUMPABLE, 0)
    launch.report(ready_fd, {"ready": True})
    os.close(ready_fd)
    return SandboxInit(plan, workspace, listener, ruleset).serve()


__all__ = ["SandboxInit", "SetupError", "pid1_main"]
