"""The Transport interface: everything ``Sandbox``, ``AsyncSandbox`` and ``warren.run``
need from wherever sandboxes live (httpx-style: one API, several transports).

``LocalTransport`` (``client.local``) talks to this user's supervisor over its unix
socket; an HTTP transport for ``warren serve`` implements the same methods. Above a
transport nothing knows where state is kept: methods take and return warren's own
types (``models``), never a protocol message. A command and how it runs travel
as one ``Command``, checked before it reaches a transport.
"""

from __future__ import annotations

import abc
import builtins
import dataclasses
import time
from collections.abc import Callable, Iterator

from ..errors import WarrenError
from ..models import (
    Checkpoint,
    FileOp,
    FileResult,
    NetPolicy,
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

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy.spec import PolicySpec

OutputCallback = Callable[[bytes], None] | None


@dataclasses.dataclass(frozen=True)
class Command:
    """A command and how it runs, for ``run``, ``exec`` and ``spawn`` alike: the
    internal form of the public API's arguments, checked already (``checked``)."""

    argv: builtins.list[str]
    cwd: str | None = None
    env: dict[str, str] = dataclasses.field(default_factory=dict)  # exec, spawn (run: the policy's)
    timeout: float | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    stdin: bytes | None = None  # run, exec: all the command reads (None: /dev/null)
    stdin_pipe: bool = False  # spawn: a pipe ``write_stdin`` feeds (else /dev/null)
    on_stdout: OutputCallback = None  # run, exec: output as it comes
    on_stderr: OutputCallback = None
    on_net_event: Callable[[NetEvent], None] | None = None  # run: each decision of its proxy

    @classmethod
    def checked(
        cls,
        op: str,
        argv: object,
        cwd: object = None,
        env: object = None,
        stdin: object = None,
        timeout: object = None,
        output_limit: object = DEFAULT_OUTPUT_LIMIT,
        on_stdout: OutputCallback = None,
        on_stderr: OutputCallback = None,
        *,
        stdin_pipe: bool = False,
        on_net_event: Callable[[NetEvent], None] | None = None,
    ) -> Command:
        """What a caller passed to ``op`` (the public API's arguments, a request's
        fields), each checked in this order: a bad one is the error naming it."""
        return cls(
            argv=checks.argv(argv, op),
            cwd=checks.cwd(cwd, op),
            env=checks.env(env, op),
            stdin=checks.stdin(stdin, op),
            timeout=checks.timeout(timeout, op),
            output_limit=checks.limit(output_limit, op),
            stdin_pipe=stdin_pipe,
            on_stdout=checks.callback(on_stdout, "on_stdout", op),
            on_stderr=checks.callback(on_stderr, "on_stderr", op),
            on_net_event=checks.callback(on_net_event, "on_net_event", op),
        )


@dataclasses.dataclass(frozen=True)
class EventPage:
    """Records of a sandbox's trail (``Sandbox.events``) and the cursor after them;
    ``running``: the sandbox still runs, so more may come."""

    records: tuple[dict[str, object], ...]
    after: str
    skip: int
    running: bool


def trail_of(
    transport: Transport, name: str, *, follow: bool = False, poll: float = 0.25
) -> Iterator[dict[str, object]]:
    """Sandbox ``name``'s trail through ``transport``, page by page (``Sandbox.events``)."""
    after, skip = "", 0
    while True:
        page = transport.events(name, after, skip)
        yield from page.records
        after, skip = page.after, page.skip
        if page.records:
            continue  # a full page, or new records: ask again at once
        if not follow or not page.running:
            return
        time.sleep(poll)


class Transport(abc.ABC):
    @abc.abstractmethod
    def run(self, spec: PolicySpec, command: Command, *, config: bool, profile: str | None) -> Result:
        """A one-shot sandbox for ``command``; ``config``: merge the caller's config files
        (``profile`` of them) into ``spec``."""

    @abc.abstractmethod
    def create(self, spec: PolicySpec, name: str, *, config: bool, profile: str | None) -> SandboxInfo: ...

    @abc.abstractmethod
    def get(self, name: str) -> SandboxInfo: ...

    @abc.abstractmethod
    def list(self) -> builtins.list[SandboxInfo]: ...

    @abc.abstractmethod
    def stop(self, name: str, *, remove: bool) -> SandboxInfo: ...

    @abc.abstractmethod
    def exec(self, name: str, command: Command) -> Result: ...

    @abc.abstractmethod
    def spawn(self, name: str, command: Command) -> tuple[str, int]:
        """Start in the background; (spawn id, pid in the sandbox)."""

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

    def spawns(self, name: str) -> builtins.list[SpawnInfo]:
        """Every background process of the sandbox on record, running or ended."""
        raise _not_here(self, "the records of ended background processes", name)

    @abc.abstractmethod
    def signal(self, name: str, pid: int, sig: int) -> None: ...

    @abc.abstractmethod
    def file(self, name: str, op: FileOp, data: bytes = b"") -> FileResult:
        """One file operation inside the sandbox ``name``; ``data``: what a write writes."""

    @abc.abstractmethod
    def expose(self, name: str, port: int, host_port: int) -> str: ...

    def exposed(self, name: str) -> dict[int, str]:
        """The sandbox's ports forwarded from the host: its port -> "127.0.0.1:N"."""
        raise _not_here(self, "the list of forwarded ports", name)

    def unexpose(self, name: str, port: int) -> None:
        raise _not_here(self, "closing a forwarded port", name)

    @abc.abstractmethod
    def net_log(self, name: str) -> builtins.list[NetEvent]: ...

    def events(self, name: str, after: str = "", skip: int = 0) -> EventPage:
        """The sandbox's trail after the cursor (``after``, ``skip``: an ``EventPage``'s)."""
        raise _not_here(self, "the trail of a sandbox", name)

    def net_policy(
        self,
        name: str,
        action: str,
        *,
        rule: str = "",
        request_id: int = 0,
        always: bool = False,
        via: str = "",
    ) -> NetPolicy:
        """A running sandbox's network policy: ``show``, ``allow``/``deny`` a ``rule``,
        ``pending``, ``approve``/``reject`` request ``request_id``; ``via`` names the
        client in the network log's record."""
        raise _not_here(self, "changing a running sandbox's network policy", name)

    @abc.abstractmethod
    def stats(self, name: str) -> Stats: ...

    def review(
        self, name: str, action: str, paths: builtins.list[str], force: bool = False, patch: bool = False
    ) -> Review:
        """A review sandbox's layer: ``diff``, ``apply`` or ``discard``."""
        raise WarrenError(
            f"review mode's {action} is available through the local supervisor only (not over HTTP yet)",
            operation=action,
            path=name,
            hint=f"run `warren {action} {name}` on the machine the sandbox runs on",
        )

    def checkpoint(
        self, name: str, action: str, ident: int = 0, keep_running: bool = False
    ) -> builtins.list[Checkpoint]:
        """A review sandbox's checkpoints: ``take``, ``list`` or ``rollback``."""
        raise WarrenError(
            f"checkpoints ({action}) are available through the local supervisor only",
            operation=action,
            path=name,
            hint=f"run `warren {'checkpoints' if action == 'list' else action} {name}` on the machine the "
            "sandbox runs on",
        )

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


def _not_here(transport: Transport, what: str, name: str) -> WarrenError:
    return WarrenError(
        f"{what} is not available through {type(transport).__name__}",
        operation="cli",
        path=name,
        hint="use the local transport or HttpTransport, which have it",
    )


def _no_snapshots(transport: Transport) -> WarrenError:
    return WarrenError(
        f"snapshots are not available through {type(transport).__name__}",
        operation="snapshot",
        hint="take and use snapshots on the machine the sandboxes run on (the local supervisor)",
    )
