"""The Transport interface: everything ``Sandbox``, ``AsyncSandbox`` and ``warren.run``
need from wherever sandboxes live (httpx-style: one API, several transports).

``LocalTransport`` (``client.local``) talks to this user's supervisor over its unix
socket; an HTTP transport for ``warren serve`` implements the same methods. Above a
transport nothing knows where state is kept: methods take and return warren's own
types (``models``), never a protocol message.
"""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable

from ..errors import WarrenError
from ..models import FileOp, FileResult, ProcessInfo, ProcessState, Result, SandboxInfo, SnapshotInfo, Stats
from ..net.allowlist import NetEvent
from ..policy.spec import PolicySpec

OutputCallback = Callable[[bytes], None] | None


class Transport(abc.ABC):
    @abc.abstractmethod
    def run(
        self,
        argv: builtins.list[str],
        spec: PolicySpec,
        *,
        config: bool,
        profile: str | None,
        cwd: str | None,
        stdin: bytes | None,
        timeout: float | None,
        output_limit: int,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
        on_net_event: Callable[[NetEvent], None] | None,
    ) -> Result: ...

    @abc.abstractmethod
    def create(self, spec: PolicySpec, name: str, *, config: bool, profile: str | None) -> SandboxInfo: ...

    @abc.abstractmethod
    def get(self, name: str) -> SandboxInfo: ...

    @abc.abstractmethod
    def list(self) -> builtins.list[SandboxInfo]: ...

    @abc.abstractmethod
    def stop(self, name: str, *, remove: bool) -> SandboxInfo: ...

    @abc.abstractmethod
    def exec(
        self,
        name: str,
        argv: builtins.list[str],
        *,
        cwd: str | None,
        env: dict[str, str],
        stdin: bytes | None,
        timeout: float | None,
        output_limit: int,
        on_stdout: OutputCallback,
        on_stderr: OutputCallback,
    ) -> Result: ...

    @abc.abstractmethod
    def spawn(
        self,
        name: str,
        argv: builtins.list[str],
        *,
        cwd: str | None,
        env: dict[str, str],
        timeout: float | None,
        output_limit: int,
        stdin: bool = False,
    ) -> tuple[str, int]:
        """Start in the background; (spawn id, pid in the sandbox). ``stdin``: a pipe
        ``write_stdin`` feeds, else /dev/null."""

    @abc.abstractmethod
    def write_stdin(self, name: str, process: str, data: bytes, *, eof: bool = False) -> int:
        """Queue ``data`` (at most ``protocol.STDIN_MAX_QUEUED`` bytes) for the stdin of
        a background process (its spawn id, or its pid as text), then close it with
        ``eof``; returns the bytes still waiting for the process to read."""

    @abc.abstractmethod
    def process(
        self, name: str, spawn_id: str, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> tuple[ProcessState, bytes, bytes]:
        """A background process's state and its output from the given offsets."""

    @abc.abstractmethod
    def processes(self, name: str) -> builtins.list[ProcessInfo]: ...

    @abc.abstractmethod
    def signal(self, name: str, pid: int, sig: int) -> None: ...

    @abc.abstractmethod
    def file(self, name: str, op: FileOp, data: bytes = b"") -> FileResult:
        """One file operation inside the sandbox ``name``; ``data``: what a write writes."""

    @abc.abstractmethod
    def expose(self, name: str, port: int, host_port: int) -> str: ...

    @abc.abstractmethod
    def net_log(self, name: str) -> builtins.list[NetEvent]: ...

    @abc.abstractmethod
    def stats(self, name: str) -> Stats: ...

    @abc.abstractmethod
    def pause(self, name: str, paused: bool) -> SandboxInfo:
        """Freeze every process of the sandbox (``paused``), or thaw them."""

    # Snapshots of sandboxes on an image (``server.snapshots``); a transport without
    # them says so.
    def snapshot(self, name: str) -> SnapshotInfo:
        raise _no_snapshots(self)

    def snapshots(self) -> builtins.list[SnapshotInfo]:
        raise _no_snapshots(self)

    def remove_snapshot(self, snap_id: str) -> SnapshotInfo:
        raise _no_snapshots(self)


def _no_snapshots(transport: Transport) -> WarrenError:
    return WarrenError(
        f"snapshots are not available through {type(transport).__name__}",
        operation="snapshot",
        hint="take and use snapshots on the machine the sandboxes run on (the local supervisor)",
    )
