"""Long-lived sandboxes for Python callers: ``Sandbox.create(policy=...)``.

Owns the client side of a long-lived sandbox: starting the per-user supervisor when
none runs, asking it to create and stop sandboxes, and talking to each sandbox's
PID 1 for exec, spawn, processes and files. ``AsyncSandbox`` (``warren.aio``) runs
this same core in worker threads. Nothing here makes a namespace or mount call.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import os
import pickle
import select
import signal as _signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from . import hostinfo, registry, wire
from . import plan as _plan
from .errors import (
    ExecError,
    SandboxDead,
    SandboxError,
    SandboxNotFound,
    SandboxTimeout,
    WarrenError,
    from_dict,
)
from .netpolicy import NetEvent
from .output import DEFAULT_OUTPUT_LIMIT, Capture, Result, feed
from .policy import Policy, PolicySpec, Root, build

_CLIENT_GRACE = 10.0  # beyond a timeout, how long to wait for the sandbox to say so


# --- the supervisor -------------------------------------------------------------------


def _start_supervisor(root: Path) -> None:
    r, w = os.pipe()
    log = os.open(root / "supervisor.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        # The intermediate process forks the supervisor and exits at once, so the
        # supervisor is nobody's child here and never a zombie of this process.
        code = (
            "import os,sys\n"
            "if os.fork(): os._exit(0)\n"
            "os.setsid()\n"
            "from warren.supervisor import main\n"
            "sys.exit(main(sys.argv[1:]))\n"
        )
        subprocess.run(
            [sys.executable, "-c", code, str(root), str(w)],
            pass_fds=(w,),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            cwd="/",
            check=True,
        )
    finally:
        os.close(w)
        os.close(log)
    try:
        ready, _, _ = select.select([r], [], [], 30)
        if ready:
            os.read(r, 64)
    finally:
        os.close(r)


def _supervisor_request(root: Path, msg: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
    path = str(root / "supervisor.sock")
    last: BaseException | None = None
    for _attempt in range(5):
        try:
            sock = wire.connect(path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            last = e
            _start_supervisor(root)
            continue
        try:
            sock.settimeout(None)
            wire.send(sock, msg, payload)
            reply, _, _ = wire.recv(sock)
            return reply
        except (wire.ConnectionClosed, ConnectionResetError, BrokenPipeError) as e:
            last = e  # the supervisor was exiting as we connected: start the next one
            time.sleep(0.05)
        finally:
            sock.close()
    raise SandboxError(
        "cannot reach the warren supervisor",
        operation=str(msg.get("op")),
        path=path,
        errno=getattr(last, "errno", None),
        hint=f"see {root / 'supervisor.log'}; check that {root} is writable",
    )


def _raise_if_error(reply: dict[str, Any]) -> dict[str, Any]:
    if "error" in reply:
        raise from_dict(reply)
    return reply


# --- results and processes ------------------------------------------------------------


@dataclass(frozen=True)
class ProcessInfo:
    """A process running in the sandbox (pids are the sandbox's own)."""

    pid: int
    ppid: int
    state: str
    argv: tuple[str, ...]
    spawn_id: str | None = None


@dataclass(frozen=True)
class Output:
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@dataclass(frozen=True)
class FileInfo:
    name: str
    type: str  # "file", "dir", "symlink" or "other"
    size: int
    mode: int
    mtime: float
    uid: int
    gid: int


def _exit_code(status: int) -> tuple[int, int | None]:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return 128 + sig, sig
    return os.waitstatus_to_exitcode(status), None


def _check_argv(cmd: Sequence[str]) -> list[str]:
    if isinstance(cmd, (str, bytes)) or not cmd:
        raise ExecError(
            "argv must be a non-empty list of strings, not one string",
            operation="exec",
            hint='use ["sh", "-c", "..."] to run a shell command line',
        )
    return [os.fspath(a) for a in cmd]


class Process:
    """A background process started with ``Sandbox.spawn``."""

    def __init__(
        self, sandbox: Sandbox, spawn_id: str, pid: int, argv: list[str], conn: socket.socket | None
    ):
        self.sandbox = sandbox
        self.id = spawn_id
        self.pid = pid
        self.argv = argv
        self._conn = conn
        self._status: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<Process {self.pid} {self.argv!r} {'running' if self.running else 'exited'}>"

    def _files(self) -> tuple[Path, Path, Path]:
        base = self.sandbox._procdir / self.id
        return base.with_suffix(".out"), base.with_suffix(".err"), base.with_suffix(".status")

    def _poll(self) -> dict[str, Any] | None:
        if self._status is None:
            with contextlib.suppress(OSError, ValueError):
                data = self._files()[2].read_bytes()
                if data:
                    self._status = json.loads(data)
        return self._status

    @property
    def running(self) -> bool:
        if self._poll() is not None:
            return False
        return self.sandbox.alive

    @property
    def returncode(self) -> int | None:
        st = self._poll()
        return None if st is None else _exit_code(int(st["status"]))[0]

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (128+N for signal N); raises SandboxTimeout if ``timeout`` passes."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise SandboxTimeout(
                    f"process {self.pid} still running after {timeout} s",
                    operation="wait",
                    hint="kill it with .kill() or wait longer",
                )
            if self._conn is not None:
                ready, _, _ = select.select([self._conn], [], [], 0.5 if left is None else min(left, 0.5))
                if ready:
                    try:
                        wire.recv(self._conn)
                    except (wire.ConnectionClosed, OSError):
                        self._conn.close()
                        self._conn = None
            else:
                time.sleep(0.02 if left is None else min(left, 0.02))
            if self._poll() is None and not self.sandbox.alive:
                raise SandboxDead(
                    f"sandbox {self.sandbox.name} ended while process {self.pid} was running",
                    operation="wait",
                    hint="see `warren ls` for why",
                )
        code = self.returncode
        assert code is not None
        return code

    def kill(self, signal: int = _signal.SIGTERM) -> None:
        """Send ``signal`` to the process's group (it runs in its own session)."""
        self.sandbox._pid1_request({"op": "signal", "pid": self.pid, "signal": int(signal)})

    def output(self) -> Output:
        """Everything captured so far (capped per stream, with a visible marker)."""
        out, err, _ = self._files()
        return Output(_read_or_empty(out), _read_or_empty(err))


def _read_or_empty(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


# --- the sandbox ------------------------------------------------------------------------


class Sandbox:
    """A named, long-lived sandbox: ``with Sandbox.create(policy) as sb: sb.exec([...])``.

    It outlives this Python process unless used as a context manager (which removes
    it on exit); reattach with ``Sandbox.get(name)``.
    """

    def __init__(self, entry: registry.Entry, root: Path, output_limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        self._entry = entry
        self._root = root
        self.output_limit = output_limit
        self.files = Files(self)

    @property
    def name(self) -> str:
        return self._entry.name

    @property
    def id(self) -> str:
        return self._entry.id

    @property
    def workspace(self) -> str:
        return self._entry.workspace

    @property
    def pid1(self) -> int:
        """PID 1 of the sandbox, as a pid on the host."""
        return self._entry.pid1

    @property
    def _procdir(self) -> Path:
        return self._root / "sandboxes" / self.name

    def __repr__(self) -> str:
        return f"<Sandbox {self.name} {self._entry.state}>"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # --- lifecycle ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        policy: Policy | None = None,
        name: str | None = None,
        *,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> Sandbox:
        policy = policy or build(PolicySpec())
        root = registry.ensure_state_dir(registry.state_dir())
        name = registry.check_name(name) if name else f"sb-{uuid.uuid4().hex[:10]}"
        # The state directory holds the sockets of every sandbox and the supervisor:
        # hidden inside, like the host's other sockets.
        policy = replace(policy, denied=(*policy.denied, Root(root, "warren state directory")))
        paths = [r.path for r in (*policy.writable, *policy.readable, *policy.denied)]
        facts = hostinfo.gather_for(paths)
        plan = replace(_plan.make_plan(policy, facts, cwd=str(policy.workspace)), new_session=True)
        reply = _raise_if_error(
            _supervisor_request(
                root, {"op": "create", "name": name, "workspace": str(policy.workspace)}, pickle.dumps(plan)
            )
        )
        (root / "sandboxes" / name).mkdir(mode=0o700, parents=True, exist_ok=True)
        entry = registry.Registry(root).get(name)
        if entry is None or entry.id != reply.get("id"):
            raise SandboxError(
                f"sandbox {name} was created but is not in the registry",
                operation="create",
                hint="another process removed it at the same moment; create it again",
            )
        return cls(entry, root, output_limit)

    @classmethod
    def get(cls, name: str) -> Sandbox:
        root = registry.state_dir()
        reg = registry.Registry(root)
        try:
            entry = reg.get(name)
            if entry is None:
                raise SandboxNotFound(
                    f"no sandbox named {name}",
                    operation="get",
                    path=name,
                    hint="see `warren ls`; create one with `warren create NAME`",
                )
            entry = reg.refresh(entry)
        finally:
            reg.close()
        if entry.state != registry.RUNNING:
            raise SandboxDead(
                f"sandbox {name} is {entry.state}: {entry.reason}",
                operation="get",
                path=name,
                hint=f"remove it with `warren rm {name}` and create it again",
            )
        return cls(entry, root)

    @classmethod
    def list(cls) -> list[registry.Entry]:
        """Every registered sandbox of this user, dead ones with the reason."""
        reg = registry.Registry(registry.state_dir())
        try:
            return list(reg.entries())
        finally:
            reg.close()

    @property
    def alive(self) -> bool:
        reg = registry.Registry(self._root)
        try:
            entry = reg.get(self.name)
            if entry is None or entry.id != self.id:
                return False
            self._entry = reg.refresh(entry)
            return self._entry.state == registry.RUNNING
        finally:
            reg.close()

    def stop(self) -> None:
        """SIGTERM every process, then SIGKILL after a grace period; the record stays."""
        self._stop(remove=False)

    def remove(self) -> None:
        """Stop if running and forget the sandbox (its logs too). The workspace stays."""
        self._stop(remove=True)
        import shutil

        shutil.rmtree(self._procdir, ignore_errors=True)

    def _stop(self, remove: bool) -> None:
        reg = registry.Registry(self._root)
        try:
            entry = reg.get(self.name)
            if entry is None or entry.id != self.id:
                return
            entry = reg.refresh(entry)
            if entry.state == registry.RUNNING:
                _raise_if_error(
                    _supervisor_request(self._root, {"op": "stop", "name": self.name, "remove": remove})
                )
            elif remove:
                reg.remove(self.name)
        finally:
            reg.close()

    # --- talking to PID 1 -----------------------------------------------------------

    def _connect(self) -> socket.socket:
        try:
            return wire.connect(self._entry.socket)
        except (FileNotFoundError, ConnectionRefusedError):
            raise self._dead_error() from None

    def _dead_error(self) -> WarrenError:
        if self.alive:
            return SandboxError(
                f"sandbox {self.name} did not answer",
                operation="connect",
                path=self._entry.socket,
                hint="its PID 1 may be overloaded; try again, or `warren stop` it",
            )
        return SandboxDead(
            f"sandbox {self.name} is {self._entry.state}: {self._entry.reason}",
            operation="exec",
            path=self.name,
            hint=f"remove it with `warren rm {self.name}` and create it again",
        )

    def _pid1_request(self, msg: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        sock = self._connect()
        try:
            wire.send(sock, msg, payload)
            reply, data, _ = wire.recv(sock)
        except (wire.ConnectionClosed, ConnectionResetError, BrokenPipeError):
            raise self._dead_error() from None
        finally:
            sock.close()
        return _raise_if_error(reply), data

    # --- exec and spawn ---------------------------------------------------------------

    def exec(
        self,
        cmd: Sequence[str],
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        stdin: bytes | str | None = None,
        timeout: float | None = None,
        on_stdout: Callable[[bytes], None] | None = None,
        on_stderr: Callable[[bytes], None] | None = None,
        output_limit: int | None = None,
    ) -> Result:
        """Run ``cmd`` in the sandbox and capture its output.

        The cwd defaults to the workspace, re-resolved on every call; an explicit
        ``cwd`` that does not exist raises ``CwdNotFound``. A timeout kills the
        command's whole process tree and returns ``timed_out=True``.
        """
        argv = _check_argv(cmd)
        start = time.monotonic()
        data = stdin.encode() if isinstance(stdin, str) else stdin
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        fds = [out_w, err_w]
        in_w = -1
        if data is not None:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            fds.insert(0, in_r)
        try:
            sock = self._connect()
            msg = {
                "op": "exec",
                "argv": argv,
                "cwd": os.fspath(cwd) if cwd is not None else None,
                "env": env or {},
                "timeout": timeout,
                "stdio": [data is not None, True, True],
            }
            try:
                wire.send(sock, msg, fds=fds)
            except (BrokenPipeError, ConnectionResetError):
                sock.close()
                raise self._dead_error() from None
        except BaseException:
            for fd in (out_r, err_r, in_w):
                if fd >= 0:
                    os.close(fd)
            raise
        finally:
            for fd in fds:
                os.close(fd)
        limit = self.output_limit if output_limit is None else output_limit
        captures = {out_r: Capture(limit, on_stdout), err_r: Capture(limit, on_stderr)}
        try:
            return self._collect(sock, captures, in_w, data, timeout, start)
        finally:
            sock.close()
            for fd in (out_r, err_r):
                os.close(fd)

    def _collect(
        self,
        sock: socket.socket,
        captures: dict[int, Capture],
        in_w: int,
        data: bytes | None,
        timeout: float | None,
        start: float,
    ) -> Result:
        pending = memoryview(data or b"")
        if in_w >= 0:
            if not pending:
                os.close(in_w)
                in_w = -1
            else:
                os.set_blocking(in_w, False)
        readers: list[int | socket.socket] = [sock, *captures]
        deadline = None if timeout is None else start + timeout + _CLIENT_GRACE
        started: dict[str, Any] = {}
        final: dict[str, Any] | None = None
        try:
            while final is None:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                writers = [in_w] if in_w >= 0 else []
                ready_r, ready_w, _ = select.select(readers, writers, [], wait)
                if not ready_r and not ready_w:
                    # The sandbox did not enforce the timeout: give up on it. Closing
                    # the connection makes the shim kill the command's tree.
                    final = {"status": _signal.SIGKILL, "timed_out": True}
                    break
                for fd in ready_w:
                    pending = feed(fd, pending)
                    if not pending:
                        os.close(in_w)
                        in_w = -1
                for r in ready_r:
                    if r is sock:
                        try:
                            msg, _, _ = wire.recv(sock)
                        except (wire.ConnectionClosed, ConnectionResetError):
                            raise self._dead_error() from None
                        _raise_if_error(msg)
                        if "status" in msg:
                            final = msg
                        else:
                            started = msg
                    else:
                        assert isinstance(r, int)
                        chunk = os.read(r, 65536)
                        if chunk:
                            captures[r].feed(chunk)
                        else:
                            readers.remove(r)
        finally:
            if in_w >= 0:
                os.close(in_w)
        # The command has exited: what it wrote is in the pipes. Read to EOF, but do
        # not wait for background processes that inherited the pipes.
        for fd in [r for r in readers if isinstance(r, int)]:
            os.set_blocking(fd, False)
            with contextlib.suppress(BlockingIOError):
                while chunk := os.read(fd, 65536):
                    captures[fd].feed(chunk)
        exit_code, sig = _exit_code(int(final["status"]))
        out, err = captures.values()
        return Result(
            exit_code=exit_code,
            stdout=out.value(),
            stderr=err.value(),
            duration=time.monotonic() - start,
            signal=sig,
            timed_out=bool(final.get("timed_out")),
            stdout_truncated=bool(out.dropped),
            stderr_truncated=bool(err.dropped),
            cwd=started.get("cwd"),
            warnings=tuple(started.get("warnings") or ()),
        )

    def exec_attached(
        self,
        cmd: Sequence[str],
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        stdio: tuple[int, int, int] = (0, 1, 2),
        timeout: float | None = None,
    ) -> tuple[int, builtins.list[str]]:
        """Run with the given descriptors as stdio (the CLI passes its own): returns
        (exit status, warnings). Output is not captured."""
        argv = _check_argv(cmd)
        sock = self._connect()
        try:
            wire.send(
                sock,
                {
                    "op": "exec",
                    "argv": argv,
                    "cwd": cwd,
                    "env": env or {},
                    "timeout": timeout,
                    "stdio": [True, True, True],
                },
                fds=list(stdio),
            )
            warnings: builtins.list[str] = []
            while True:
                try:
                    msg, _, _ = wire.recv(sock)
                except (wire.ConnectionClosed, ConnectionResetError):
                    raise self._dead_error() from None
                _raise_if_error(msg)
                if "status" in msg:
                    return _exit_code(int(msg["status"]))[0], warnings
                warnings = list(msg.get("warnings") or ())
        finally:
            sock.close()

    def spawn(
        self,
        cmd: Sequence[str],
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
    ) -> Process:
        """Start ``cmd`` in the background; it keeps running after this call and
        after this Python process. Its output goes to capped logs (``output()``)."""
        argv = _check_argv(cmd)
        spawn_id = uuid.uuid4().hex[:12]
        base = self._procdir / spawn_id
        self._procdir.mkdir(mode=0o700, parents=True, exist_ok=True)
        flags = os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        fds = [os.open(base.with_suffix(s), flags, 0o600) for s in (".out", ".err", ".status")]
        try:
            sock = self._connect()
            msg = {
                "op": "spawn",
                "argv": argv,
                "cwd": os.fspath(cwd) if cwd is not None else None,
                "env": env or {},
                "timeout": timeout,
                "output_limit": self.output_limit if output_limit is None else output_limit,
            }
            try:
                wire.send(sock, msg, fds=fds)
                reply, _, _ = wire.recv(sock)
            except (wire.ConnectionClosed, ConnectionResetError, BrokenPipeError):
                sock.close()
                raise self._dead_error() from None
        finally:
            for fd in fds:
                os.close(fd)
        if "error" in reply:
            sock.close()
            raise from_dict(reply)
        pid = int(reply["pid"])
        base.with_suffix(".json").write_text(json.dumps({"pid": pid, "argv": argv, "started": time.time()}))
        return Process(self, spawn_id, pid, argv, sock)

    def processes(self) -> builtins.list[ProcessInfo]:
        """The processes running in the sandbox now (not its PID 1 or warren's helpers)."""
        reply, _ = self._pid1_request({"op": "ps"})
        spawned: dict[int, str] = {}
        for meta in self._procdir.glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                if not meta.with_suffix(".status").stat().st_size:
                    spawned[int(json.loads(meta.read_text())["pid"])] = meta.stem
        return [
            ProcessInfo(p["pid"], p["ppid"], p["state"], tuple(p["argv"]), spawned.get(p["pid"]))
            for p in reply["processes"]
        ]

    def process(self, spawn_id: str) -> Process:
        """Reattach to a background process started by ``spawn`` (any client)."""
        meta = json.loads((self._procdir / f"{spawn_id}.json").read_text())
        return Process(self, spawn_id, int(meta["pid"]), list(meta["argv"]), None)

    # --- network ----------------------------------------------------------------------

    def expose(self, port: int, host_port: int = 0) -> str:
        """Forward ``127.0.0.1:host_port`` on the host (a free port when 0) to ``port``
        on the sandbox's loopback, for dev servers and previews; returns the host
        address ("127.0.0.1:NNNN"). Works in every network mode; closed with the
        sandbox. Exposing a port again returns the same address."""
        for value, what in ((port, "port"), (host_port, "host_port")):
            if not isinstance(value, int) or not (0 if what == "host_port" else 1) <= value <= 65535:
                raise SandboxError(
                    f"{what} must be a TCP port number, got {value!r}",
                    operation="expose",
                    hint="ports are 1-65535 (host_port 0 picks a free one)",
                )
        if not self.alive:
            raise self._dead_error()
        reply = _raise_if_error(
            _supervisor_request(
                self._root, {"op": "expose", "name": self.name, "port": port, "host_port": host_port}
            )
        )
        return str(reply["address"])

    def net_log(self) -> builtins.list[NetEvent]:
        """Every decision of this sandbox's network proxy (``--network allow``), oldest
        first; kept after the sandbox stops, removed with it."""
        from .netd import read_log

        return read_log(self._procdir / "net.jsonl")


class Files:
    """File operations as the sandbox sees them: every path is resolved by the
    kernel inside the sandbox (its root, mounts, symlinks, Landlock), by a hardened
    helper process there. Relative paths start at the workspace."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _op(
        self, fop: str, path: str | os.PathLike[str], payload: bytes = b"", **extra: Any
    ) -> tuple[dict[str, Any], bytes]:
        return self._sb._pid1_request({"op": "file", "fop": fop, "path": os.fspath(path), **extra}, payload)

    def read(self, path: str | os.PathLike[str]) -> bytes:
        return self._op("read", path)[1]

    def read_text(self, path: str | os.PathLike[str], encoding: str = "utf-8") -> str:
        return self.read(path).decode(encoding)

    def write(
        self,
        path: str | os.PathLike[str],
        data: bytes | str,
        *,
        mode: int = 0o644,
        append: bool = False,
        parents: bool = False,
    ) -> None:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._op("write", path, raw, mode=mode, append=append, parents=parents)

    def list(self, path: str | os.PathLike[str] = ".") -> list[FileInfo]:
        reply, _ = self._op("list", path)
        return [FileInfo(**e) for e in reply["entries"]]

    def stat(self, path: str | os.PathLike[str], follow_symlinks: bool = True) -> FileInfo:
        reply, _ = self._op("stat", path, follow=follow_symlinks)
        return FileInfo(name=os.path.basename(os.fspath(path)), **reply["stat"])

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return bool(self._op("exists", path)[0]["exists"])

    def mkdir(
        self,
        path: str | os.PathLike[str],
        *,
        parents: bool = False,
        exist_ok: bool = False,
        mode: int = 0o755,
    ) -> None:
        self._op("mkdir", path, parents=parents, exist_ok=exist_ok, mode=mode)

    def remove(self, path: str | os.PathLike[str], *, recursive: bool = False) -> None:
        self._op("remove", path, recursive=recursive)

    def rename(self, src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        self._op("rename", src, dst=os.fspath(dst))
