"""Long-lived sandboxes for Python callers: ``Sandbox.create(policy=...)``.

A ``Sandbox`` is a handle: a name and a ``Transport`` (``LocalTransport`` unless one
is given). It outlives this Python process unless used as a context manager (which
removes it on exit); reattach with ``Sandbox.get(name)``. ``AsyncSandbox``
(``client.aio``) offers the same methods with ``await``.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import signal as _signal
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .. import names, protocol, wire
from ..errors import (
    CheckpointError,
    ExecError,
    ProcessNotFound,
    SandboxDead,
    SandboxError,
    SandboxFileError,
    SandboxTimeout,
    SnapshotNotFound,
    StdinFull,
    WarrenError,
)
from ..models import (
    Checkpoint,
    FileInfo,
    FileOp,
    FileResult,
    NetPending,
    NetPolicy,
    Output,
    ProcessInfo,
    ProcessState,
    Result,
    Review,
    SandboxInfo,
    SnapshotInfo,
    SpawnInfo,
    Stats,
)
from ..net.allowlist import NetEvent
from ..output import DEFAULT_OUTPUT_LIMIT
from . import checks
from .transport import Command, Transport, trail_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy import Policy, PolicySpec

PathArg = str | os.PathLike[str]
DEFAULT_READ_LIMIT = 64 * 1024 * 1024
STDIN_CHUNK = 1 << 20  # one write request's data: a quarter of what a process's stdin queues


def _local(remote: str | None = None, token: str | None = None) -> Transport:
    """The transport a call without one uses: ``remote`` (a ``warren serve`` URL), else
    ``WARREN_URL``/``WARREN_TOKEN`` from the environment, else this machine's supervisor."""
    if remote is not None:
        from .http import HttpTransport

        return HttpTransport(remote, token if token is not None else os.environ.get("WARREN_TOKEN"))
    if os.environ.get("WARREN_URL"):
        from .http import from_env

        transport = from_env()
        assert transport is not None
        return transport
    from .local import LocalTransport

    return LocalTransport()


def feed_stdin(
    transport: Transport, name: str, process: str, data: bytes, timeout: float | None = None
) -> None:
    """Send ``data`` to a background process's stdin in order, in requests of at most
    ``STDIN_CHUNK`` bytes. While the process does not read (its pipe and warren's queue
    for it are full: ``StdinFull``), wait and retry, as a write to a pipe would block;
    ``timeout`` bounds that wait."""
    deadline = None if timeout is None else time.monotonic() + timeout
    sent, pause = 0, 0.002
    while True:
        part = data[sent : sent + STDIN_CHUNK]
        try:
            transport.write_stdin(name, process, part)
        except StdinFull as e:
            if deadline is not None and time.monotonic() >= deadline:
                raise StdinFull(
                    f"{e.message}; {sent} of {len(data)} bytes were sent within {timeout} s",
                    operation=e.operation,
                    path=e.path,
                    hint=e.hint,
                ) from None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
            continue
        sent += len(part)
        pause = 0.002
        if sent >= len(data):
            return


class Process:
    """A background process started with ``Sandbox.spawn`` (or found again with
    ``Sandbox.process(id)``)."""

    def __init__(self, sandbox: Sandbox, spawn_id: str, pid: int, argv: Sequence[str]) -> None:
        self.sandbox = sandbox
        self.id = spawn_id
        self.pid = pid
        self.argv = list(argv)
        self._status: int | None = None

    def __repr__(self) -> str:
        return f"<Process {self.id} pid {self.pid} {self.argv!r}>"

    def _state(self) -> ProcessState:
        state, _, _ = self.sandbox._transport.process(
            self.sandbox.name, self.id, checks.MAX_OFFSET, checks.MAX_OFFSET
        )
        if state.status is not None:
            self._status = state.status
        return state

    @property
    def running(self) -> bool:
        return self._status is None and self._state().running

    @property
    def returncode(self) -> int | None:
        if self._status is None:
            self._state()
        return None if self._status is None else protocol.exit_code(self._status)

    @property
    def status(self) -> int | None:
        """Its wait status once it ended, else None: ``os.WIFSIGNALED`` tells a signal
        from an exit of 128+N, which ``returncode`` cannot."""
        if self._status is None:
            self._state()
        return self._status

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (128+N for signal N); raises SandboxTimeout if ``timeout`` passes."""
        timeout = checks.wait_timeout(timeout, "wait")
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.02
        while self._status is None:
            state = self._state()
            if self._status is not None:
                break
            if not state.running:
                raise SandboxDead(
                    f"sandbox {self.sandbox.name} ended while process {self.pid} was running",
                    operation="wait",
                    hint="see `warren ls` for why",
                )
            if deadline is not None and time.monotonic() >= deadline:
                raise SandboxTimeout(
                    f"process {self.pid} still running after {timeout} s",
                    operation="wait",
                    hint="kill it with .kill() or wait longer",
                )
            time.sleep(pause)
            # A short command is seen ending at once; a long one is not asked 50 times a second.
            pause = min(pause * 1.5, 0.25)
        return protocol.exit_code(self._status)

    def kill(self, signal: int = _signal.SIGTERM) -> None:
        """Send ``signal`` to the process's group (it runs in its own session); nothing
        when it has already ended (as ``subprocess.Popen.send_signal``)."""
        sig = checks.signal(signal, "signal")
        try:
            self.sandbox._transport.signal(self.sandbox.name, self.pid, sig)
        except ProcessNotFound:
            if self.returncode is None:
                raise

    def output(self) -> Output:
        """Everything captured so far (capped per stream, with a visible marker)."""
        _, out, err = self.sandbox._transport.process(self.sandbox.name, self.id)
        return Output(out, err)

    def write(self, data: bytes | str, timeout: float | None = None) -> None:
        """Send ``data`` (str as UTF-8) to the process's stdin; it must have been
        started with ``spawn(..., stdin=True)`` (else ``StdinNotOpen``). Returns once
        warren holds all of it for the process, in order. While the process does not
        read and what waits for it is at the bound (a few MiB), this waits, as a write
        to a pipe would; ``timeout`` bounds that wait (``StdinFull``). ``StdinClosed``
        after ``close_stdin``, ``ProcessEnded`` once the process has ended."""
        raw = checks.stdin(data, "stdin")
        if raw is None:
            raise ExecError(
                "stdin must be bytes or str, not None", operation="stdin", hint="pass bytes or str"
            )
        feed_stdin(self.sandbox._transport, self.sandbox.name, self.id, raw, checks.timeout(timeout, "stdin"))

    def close_stdin(self) -> None:
        """Close the process's stdin: it reads end of file after what was written.
        Closing again, or after the process ended, does nothing."""
        self.sandbox._transport.write_stdin(self.sandbox.name, self.id, b"", eof=True)


class Sandbox:
    """A named, long-lived sandbox: ``with Sandbox.create(policy) as sb: sb.exec([...])``."""

    def __init__(
        self, info: SandboxInfo, transport: Transport | None = None, output_limit: int = DEFAULT_OUTPUT_LIMIT
    ) -> None:
        if not isinstance(info, SandboxInfo):
            raise SandboxError(
                f"Sandbox() takes the SandboxInfo of a sandbox, not {type(info).__name__}",
                operation="sandbox",
                hint="create one with Sandbox.create(PolicySpec(workspace=...)), "
                "or attach to a running one with Sandbox.get(name)",
            )
        self._info = info
        self._transport = transport or _local()
        self.output_limit = checks.limit(output_limit, "sandbox")
        self.files = Files(self)

    @property
    def name(self) -> str:
        return self._info.name

    @property
    def id(self) -> str:
        return self._info.id

    @property
    def workspace(self) -> str:
        return self._info.workspace

    @property
    def info(self) -> SandboxInfo:
        return self._info

    @property
    def pid1(self) -> int:
        """PID 1 of the sandbox, as a pid on the host (0 when not known)."""
        return self._info.pid1

    def __repr__(self) -> str:
        return f"<Sandbox {self.name} {self._info.state}>"

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    # --- lifecycle ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        policy: PolicySpec | Policy | None = None,
        name: str | None = None,
        *,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        transport: Transport | None = None,
        remote: str | None = None,
        token: str | None = None,
    ) -> Sandbox:
        """Create a sandbox; the supervisor resolves and plans ``policy`` for you.
        ``remote="http://host:7420"`` (or ``WARREN_URL``) creates it behind a ``warren serve``."""
        transport = transport or _local(remote, token)
        name = f"sb-{os.urandom(5).hex()}" if name is None else names.check_name(name)
        info = transport.create(checks.spec_of(policy), name, config=False, profile=None)
        return cls(info, transport, output_limit)

    @classmethod
    def get(
        cls,
        name: str,
        *,
        transport: Transport | None = None,
        remote: str | None = None,
        token: str | None = None,
    ) -> Sandbox:
        """Reattach to a running sandbox; SandboxNotFound or SandboxDead otherwise."""
        transport = transport or _local(remote, token)
        info = transport.get(names.check_name(name))
        if not info.alive:
            raise SandboxDead(
                f"sandbox {name} is {info.state}" + (f": {info.reason}" if info.reason else ""),
                operation="get",
                path=name,
                hint=f"remove it with `warren rm {name}` and create it again",
            )
        return cls(info, transport)

    @classmethod
    def list(
        cls, *, transport: Transport | None = None, remote: str | None = None, token: str | None = None
    ) -> builtins.list[SandboxInfo]:
        """Every registered sandbox of this user, dead ones with the reason."""
        return (transport or _local(remote, token)).list()

    @property
    def alive(self) -> bool:
        try:
            info = self._transport.get(self.name)
        except WarrenError:
            return False
        if info.id != self.id:
            return False
        self._info = info
        return info.alive

    def stop(self) -> None:
        """SIGTERM every process, then SIGKILL after a grace period; the record stays."""
        self._info = self._transport.stop(self.name, remove=False)

    def remove(self) -> None:
        """Stop if running and forget the sandbox (its logs too). The workspace stays."""
        self._transport.stop(self.name, remove=True)

    # --- commands -----------------------------------------------------------------------

    def exec(
        self,
        cmd: Sequence[str],
        cwd: PathArg | None = None,
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
        limit = self.output_limit if output_limit is None else output_limit
        command = Command.checked("exec", cmd, cwd, env, stdin, timeout, limit, on_stdout, on_stderr)
        return self._transport.exec(self.name, command)

    def spawn(
        self,
        cmd: Sequence[str],
        cwd: PathArg | None = None,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        output_limit: int | None = None,
        stdin: bool = False,
    ) -> Process:
        """Start ``cmd`` in the background; it keeps running after this call and
        after this Python process. Its output goes to capped logs (``output()``).
        Its stdin is /dev/null, or with ``stdin=True`` a pipe fed by ``Process.write``
        and closed by ``Process.close_stdin`` (from any client, ``Sandbox.process(id)``)."""
        if not isinstance(stdin, bool):
            raise ExecError(
                f"stdin must be True or False, not {stdin!r}",
                operation="spawn",
                hint="spawn(..., stdin=True) gives the process a pipe; send data with Process.write",
            )
        limit = self.output_limit if output_limit is None else output_limit
        command = Command.checked("spawn", cmd, cwd, env, None, timeout, limit, stdin_pipe=stdin)
        spawn_id, pid = self._transport.spawn(self.name, command)
        return Process(self, spawn_id, pid, command.argv)

    def process(self, spawn_id: str) -> Process:
        """Reattach to a background process started by ``spawn`` (any client)."""
        checks.ident(
            spawn_id, "spawn_id", "process", ProcessNotFound, "pass the id spawn() gave (Process.spawn_id)"
        )
        state, _, _ = self._transport.process(self.name, spawn_id, 1 << 62, 1 << 62)
        return Process(self, spawn_id, state.pid, state.argv)

    def processes(self) -> builtins.list[ProcessInfo]:
        """The processes running in the sandbox now (not warren's own)."""
        return self._transport.processes(self.name)

    def spawns(self) -> builtins.list[SpawnInfo]:
        """Every background process ``spawn`` started in the sandbox, oldest first, with
        its exit status once it ended (what ``warren ps -a`` shows)."""
        return self._transport.spawns(self.name)

    # --- network ----------------------------------------------------------------------

    def expose(self, port: int, host_port: int = 0) -> str:
        """Forward ``127.0.0.1:host_port`` on the host (a free port when 0) to ``port``
        on the sandbox's loopback; returns the host address ("127.0.0.1:NNNN"). Works
        in every network mode; closed with the sandbox."""
        port, host_port = (
            checks.port(port, "port", "expose"),
            checks.port(host_port, "host_port", "expose", 0),
        )
        return self._transport.expose(self.name, port, host_port)

    def exposed(self) -> dict[int, str]:
        """The ports forwarded from the host: the sandbox's port -> "127.0.0.1:N"."""
        return self._transport.exposed(self.name)

    def unexpose(self, port: int) -> None:
        """Stop forwarding to ``port``: its host port takes no new connection (those
        already open run on until either end closes them)."""
        self._transport.unexpose(self.name, checks.port(port, "port", "unexpose"))

    def stats(self) -> Stats:
        """Memory, processes + threads and CPU time of the whole sandbox now, against its
        limits."""
        return self._transport.stats(self.name)

    def pause(self) -> None:
        """Freeze every process of the sandbox: it uses no CPU and keeps its processes and
        memory. Until ``resume``, exec, spawn and file operations raise SandboxPaused."""
        self._info = self._transport.pause(self.name, True)

    def resume(self) -> None:
        """Let a paused sandbox run again, exactly where it stopped."""
        self._info = self._transport.pause(self.name, False)

    # --- snapshots (sandboxes on an image) ------------------------------------------------

    def snapshot(self) -> SnapshotInfo:
        """Snapshot this sandbox's own filesystem state (its layer: everything it changed
        in the image, and /workspace when that lives there). Between commands the layer
        is frozen where it is, in milliseconds whatever its size, and copied to warren's
        state directory in the background (``saved`` is False until then; a sandbox made
        from it meanwhile gets the layer from memory). With a process running in the
        sandbox the layer is copied while it is paused. Processes and memory are not part
        of it; a host workspace is not."""
        return self._transport.snapshot(self.name)

    def fork(self, name: str | None = None, policy: PolicySpec | None = None) -> Sandbox:
        """A new sandbox from a snapshot of this one taken now: the same image and files
        (and the same host workspace, if any). ``policy`` sets the rest (network,
        limits); its ``from_snapshot`` is filled in."""
        from ..policy import PolicySpec

        snap = self.snapshot()
        spec = dataclasses.replace(policy or PolicySpec(), from_snapshot=snap.id)
        if spec.workspace is None:
            spec = dataclasses.replace(spec, workspace=snap.host_workspace or "none")
        return Sandbox.create(spec, name, transport=self._transport, output_limit=self.output_limit)

    @classmethod
    def snapshots(
        cls, *, transport: Transport | None = None, remote: str | None = None, token: str | None = None
    ) -> builtins.list[SnapshotInfo]:
        """This user's snapshots, oldest first."""
        return (transport or _local(remote, token)).snapshots()

    @classmethod
    def remove_snapshot(
        cls,
        snap_id: str,
        *,
        transport: Transport | None = None,
        remote: str | None = None,
        token: str | None = None,
    ) -> SnapshotInfo:
        """Remove a snapshot no sandbox or other snapshot stands on."""
        checks.ident(
            snap_id, "snapshot id", "remove snapshot", SnapshotNotFound, "list them: Sandbox.snapshots()"
        )
        return (transport or _local(remote, token)).remove_snapshot(snap_id)

    def diff(self, patch: bool = False) -> Review:
        """A review sandbox's changes to its workspace (``create(..., review=True)``),
        with a git-style patch when ``patch``; the host's files are untouched."""
        return self._transport.review(self.name, "diff", [], patch=patch)

    def apply(self, *paths: str, force: bool = False) -> Review:
        """Write a stopped review sandbox's changes (those at or beneath ``paths``,
        relative to the workspace; all without) to the host workspace. A file changed on
        the host since the sandbox started refuses the apply (``ReviewConflict``) unless
        ``force``."""
        return self._transport.review(self.name, "apply", list(paths), force=force)

    def discard(self) -> None:
        """Drop a stopped review sandbox's changes."""
        self._transport.review(self.name, "discard", [])

    def events(self, *, follow: bool = False, poll: float = 0.25) -> Iterator[dict[str, object]]:
        """This sandbox's trail, oldest first: every command asked of it (who asked, its
        argv, cwd and environment's names, how it ended), file operation, signal and
        network decision, one dict per record (``docs/events.md`` lists the kinds).
        With ``follow``, new records as they come, until the sandbox ends."""
        return trail_of(self._transport, self.name, follow=follow, poll=checks.poll(poll, "events"))

    def net_policy(self) -> NetPolicy:
        """This running sandbox's network policy: the allowlist it started with, the
        rules allowed and denied since, and (``network="ask"``) the requests waiting."""
        return self._net("show")

    def net_allow(self, rule: str) -> NetPolicy:
        """Allow ``rule`` (``HOST[:PORT]``, as ``allow_host`` at create writes it, checked
        the same way) from the next connection on; connections already open stay."""
        return self._net("allow", rule=checks.rule(rule, "net allow"))

    def net_deny(self, rule: str) -> NetPolicy:
        """Refuse ``rule`` from the next connection on, whatever allows it (an added
        rule of the same text is dropped); connections already open stay."""
        return self._net("deny", rule=checks.rule(rule, "net deny"))

    def net_pending(self) -> builtins.list[NetPending]:
        """The connections of ``network="ask"`` waiting for an answer, oldest first."""
        return builtins.list(self._net("pending").pending)

    def net_approve(self, request_id: int, always: bool = False) -> NetPolicy:
        """Let the connections waiting on request ``request_id`` through; with
        ``always`` its host and port are allowed for the sandbox's life."""
        return self._net("approve", request_id=_request_id(request_id, "net approve"), always=bool(always))

    def net_reject(self, request_id: int) -> NetPolicy:
        """Refuse the connections waiting on request ``request_id`` (the proxy's 403)."""
        return self._net("reject", request_id=_request_id(request_id, "net reject"))

    def _net(self, action: str, **given: Any) -> NetPolicy:
        return self._transport.net_policy(self.name, action, via="library", **given)

    def checkpoint(self) -> Checkpoint:
        """Freeze a review sandbox's workspace as it is now (one is also taken before
        each command), or a sandbox on an image's root; refused (``CheckpointError``)
        while a process runs in it, and on a sandbox with neither (it writes the host's
        workspace itself)."""
        return self._transport.checkpoint(self.name, "take")[0]

    def checkpoints(self) -> builtins.list[Checkpoint]:
        """A review sandbox's (or a sandbox on an image's) checkpoints, oldest first."""
        return self._transport.checkpoint(self.name, "list")

    def rollback(self, checkpoint: int | None = None, keep_running: bool = False) -> Checkpoint:
        """Return the workspace (on an image: the root) to checkpoint ``checkpoint``
        (the last one without): what was written since is gone, and later checkpoints
        with it. Processes still
        running are stopped first (named in ``Checkpoint.stopped``), or with
        ``keep_running`` the rollback is refused (``CheckpointError``)."""
        if checkpoint is not None:
            checks.number(
                checkpoint,
                "checkpoint",
                "rollback",
                CheckpointError,
                "pass a checkpoint's id (Sandbox.checkpoints()), or None for the last",
            )
        return self._transport.checkpoint(self.name, "rollback", checkpoint or 0, keep_running)[0]

    def net_log(self) -> builtins.list[NetEvent]:
        """Every decision of this sandbox's network proxy (``--network allow``), oldest
        first; kept after the sandbox stops, removed with it."""
        return self._transport.net_log(self.name)


class Files:
    """File operations as the sandbox sees them: every path is resolved by the
    kernel inside the sandbox (its root, mounts, symlinks, Landlock), by a hardened
    helper process there. Relative paths start at the workspace."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def _op(self, op: str, path: PathArg, data: bytes = b"", **extra: Any) -> FileResult:
        return self._sb._transport.file(
            self._sb.name, FileOp(op=op, path=checks.path(path, op), **extra), data
        )

    def read(self, path: PathArg, *, max_bytes: int = DEFAULT_READ_LIMIT) -> bytes:
        """The file's bytes; FileTooLarge when it is bigger than ``max_bytes`` (at most
        256 MiB: what one message may carry)."""
        if checks.limit(max_bytes, "read", "max_bytes") > wire.MAX_PAYLOAD:
            raise SandboxFileError(
                f"max_bytes {max_bytes} is above what one read carries ({wire.MAX_PAYLOAD} bytes)",
                operation="read",
                path=str(path),
                hint="read a part with a command (sb.exec(['head', '-c', N, path])), or use the workspace",
            )
        return self._op("read", path, max_bytes=max_bytes).data

    def read_text(
        self, path: PathArg, encoding: str = "utf-8", *, max_bytes: int = DEFAULT_READ_LIMIT
    ) -> str:
        return self.read(path, max_bytes=max_bytes).decode(encoding)

    def write(
        self,
        path: PathArg,
        data: bytes | str,
        *,
        mode: int = 0o644,
        append: bool = False,
        parents: bool = False,
    ) -> None:
        if isinstance(data, str):
            raw = data.encode()
        elif isinstance(data, (bytes, bytearray, memoryview)):
            raw = bytes(data)
        else:
            raise SandboxFileError(
                f"data must be bytes or str, not {type(data).__name__}",
                operation="write",
                hint="pass bytes or str",
            )
        self._op(
            "write", path, raw, mode=checks.mode(mode, "write"), append=bool(append), parents=bool(parents)
        )

    def list(self, path: PathArg = ".") -> builtins.list[FileInfo]:
        return builtins.list(self._op("list", path).entries)

    def stat(self, path: PathArg, follow_symlinks: bool = True) -> FileInfo:
        stat = self._op("stat", path, follow=bool(follow_symlinks)).stat
        assert stat is not None
        return stat

    def exists(self, path: PathArg) -> bool:
        return self._op("exists", path).exists

    def mkdir(
        self, path: PathArg, *, parents: bool = False, exist_ok: bool = False, mode: int = 0o755
    ) -> None:
        self._op(
            "mkdir", path, parents=bool(parents), exist_ok=bool(exist_ok), mode=checks.mode(mode, "mkdir")
        )

    def remove(self, path: PathArg, *, recursive: bool = False) -> None:
        self._op("remove", path, recursive=bool(recursive))

    def rename(self, src: PathArg, dst: PathArg) -> None:
        self._op("rename", src, dst=checks.path(dst, "rename"))


def _request_id(value: object, op: str) -> int:
    return checks.number(
        value, "request_id", op, SandboxError, "pass the id of a waiting request (Sandbox.net_pending())"
    )
