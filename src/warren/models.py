"""warren's own result types, returned by the public API whatever the transport.

Plain frozen dataclasses; built from protocol messages by the client, never from
the supervisor's registry rows.
"""

from __future__ import annotations

import os
import signal as _signal
from dataclasses import dataclass, field

from .net.allowlist import NetEvent


@dataclass(frozen=True)
class Result:
    """What a command did: exit status (128+N when killed by signal N), its output
    (capped, with a visible marker), and what warren noticed."""

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration: float
    signal: int | None = None
    timed_out: bool = False
    limit: str | None = None  # a limit of the sandbox it ran into: "memory limit 512M reached"
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    warnings: tuple[str, ...] = ()
    cwd: str | None = None
    net_log: tuple[NetEvent, ...] = ()  # --network allow (one-shot runs): every proxy decision

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def signal_name(self) -> str | None:
        return _signal.Signals(self.signal).name if self.signal else None

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


@dataclass(frozen=True)
class NetPending:
    """A connection of ``--network ask`` waiting for an answer (``Sandbox.net_approve``)."""

    id: int
    method: str  # CONNECT, or the plain HTTP request's method
    host: str
    port: int
    age: float  # seconds it has waited
    waiting: int  # connections to the same target waiting on this answer
    process: str = ""  # the asking process, when the proxy can tell


@dataclass(frozen=True)
class NetPolicy:
    """A running sandbox's network policy: the allowlist it started with, the rules
    allowed and denied since, and under ``--network ask`` the requests waiting."""

    mode: str  # "allow" or "ask"
    allowed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    ask_timeout: float = 0.0  # seconds a connection waits for an answer (mode "ask")
    pending: tuple[NetPending, ...] = ()
    changed: bool = False  # the request changed the policy


@dataclass(frozen=True)
class SandboxInfo:
    """A registered sandbox: alive, stopped or dead (and then why)."""

    name: str
    id: str
    state: str  # "running", "paused", "stopping", "stopped", "dead"
    reason: str
    workspace: str
    created: float
    warnings: tuple[str, ...] = ()
    pid1: int = 0  # its PID 1 as this host sees it (0 when unknown or remote)
    idle_timeout: float | None = None  # seconds without a request before it stops by itself
    last_active: float = 0.0  # when it was last used (a request, or the end of an exec)

    @property
    def alive(self) -> bool:
        """Its processes exist (running, or paused with everything kept)."""
        return self.state in ("running", "paused")


@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a sandbox on an image (``warren snapshot``): its own layer, no
    processes. ``workspace``: "included", or "not included: host directory PATH"."""

    id: str
    sandbox: str
    image: str
    created: float = 0.0
    size: int = 0  # bytes of file data
    workspace: str = ""
    seconds: float = 0.0  # how long taking it paused the sandbox
    host_workspace: str = ""  # the host directory the sandbox had at /workspace, if any
    # Its layer is all in warren's state directory. False for a moment after a snapshot
    # taken without a copy (its frozen layer is copied there in the background; a
    # sandbox made from it meanwhile gets the layer from memory).
    saved: bool = True


@dataclass(frozen=True)
class Stats:
    """A sandbox's use now against its limits (``None``: no limit). ``source`` says
    where the numbers come from (the cgroup files the limits are enforced on, or the
    sandbox's processes in /proc)."""

    memory: int  # bytes
    pids: int  # processes + threads, warren's own few included
    cpu_time: float  # seconds
    source: str
    memory_limit: int | None = None
    pids_limit: int | None = None
    cpus_limit: float | None = None


@dataclass(frozen=True)
class Change:
    """One change a review sandbox's layer makes to the workspace (``path`` relative to
    it): ``kind`` added, modified, removed, mode or renamed (from ``renamed_from``);
    ``type`` file, dir, symlink or other; ``held``: why ``apply`` never writes it."""

    path: str
    kind: str
    type: str
    old_mode: int | None = None
    new_mode: int | None = None
    renamed_from: str | None = None
    held: str = ""


@dataclass(frozen=True)
class Review:
    """A review sandbox's changes (``Sandbox.diff``), its git-style ``patch`` when asked,
    and the paths ``Sandbox.apply`` wrote."""

    changes: tuple[Change, ...] = ()
    patch: str = ""
    applied: tuple[str, ...] = ()


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint of a review sandbox's workspace (``Sandbox.checkpoint``): its id,
    when it was taken (seconds since the epoch), the bytes its frozen changes hold, and
    the commands that followed it ("; " between). ``stopped``: after a rollback, the
    processes stopped first (pid and name)."""

    id: int
    time: float
    bytes: int
    command: str = ""
    stopped: str = ""


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


@dataclass(frozen=True)
class ProcessState:
    """A background process as its sandbox's supervisor knows it: ``status`` is its
    wait status once it ended (``protocol.exit_code`` turns it into an exit code);
    ``running`` is false also when its sandbox ended under it."""

    pid: int
    argv: tuple[str, ...]
    running: bool
    status: int | None = None
    timed_out: bool = False
    limit: str | None = None  # a limit of the sandbox it ran into


@dataclass(frozen=True)
class SpawnInfo:
    """A background process on its sandbox's record (``Sandbox.spawns``), running or
    ended: ``status`` is its wait status once it ended, ``exit_code`` the shell's form."""

    spawn_id: str
    pid: int
    argv: tuple[str, ...]
    started: float = 0.0
    running: bool = False
    status: int | None = None
    timed_out: bool = False
    limit: str | None = None

    @property
    def exit_code(self) -> int | None:
        if self.status is None:
            return None
        return (
            128 + os.WTERMSIG(self.status)
            if os.WIFSIGNALED(self.status)
            else os.waitstatus_to_exitcode(self.status)
        )


@dataclass(frozen=True)
class FileOp:
    """One file operation inside a sandbox, as every transport takes it: ``op`` is
    read, write, list, stat, exists, mkdir, remove or rename (to ``dst``); the other
    fields matter to the operations they name."""

    op: str
    path: str
    dst: str | None = None
    mode: int | None = None
    parents: bool = False
    exist_ok: bool = False
    recursive: bool = False
    append: bool = False
    follow: bool = True
    max_bytes: int = 64 * 1024 * 1024
    # Extended attributes whose names begin with ``xattrs`` (a ``user.`` prefix): a stat
    # or a listing reads them; a write leaves the file with exactly ``set_xattrs`` of them.
    xattrs: str | None = None
    set_xattrs: dict[str, str] | None = None


@dataclass(frozen=True)
class FileResult:
    """What a file operation returned: a read's ``data``, a listing's ``entries``, a
    stat's ``stat``, whether a path ``exists``; the rest keep their defaults. ``xattrs``:
    the attributes ``FileOp.xattrs`` asked for, by entry name (a stat's under "")."""

    data: bytes = b""
    entries: tuple[FileInfo, ...] = ()
    stat: FileInfo | None = None
    exists: bool = False
    xattrs: dict[str, dict[str, str]] = field(default_factory=dict)
