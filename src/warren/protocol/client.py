"""The messages between a client (the CLI, the SDK's local transport) and the
supervisor: the requests, the values they carry (who calls, what to run) and the
replies — and the conversions of the values in them that every client needs (a
wait status to an exit code, the bound on one write to a process's stdin).

A request the supervisor hands to a sandbox's PID 1 (exec, spawn, file operations)
is answered by PID 1's helper on the same connection, with these same replies.
"""

from __future__ import annotations

import os

from ..errors import StdinFull
from .base import Message

DEFAULT_OUTPUT_LIMIT = 16 * 1024 * 1024
STDIN_MAX_QUEUED = 4 * 1024 * 1024  # a process's stdin bytes the supervisor holds beyond its pipe


# --- values shared by several messages ---------------------------------------------------


class Caller(Message):
    """Who asks, from where: the caller's working directory and environment (the
    supervisor learns uid and gid from the socket, never from the message)."""

    cwd: str
    env: dict[str, str]
    config: bool = False  # layer ~/.config/warren/config.toml and the workspace's warren.toml
    profile: str | None = None


class Spec(Message):
    """A policy as the caller wrote it, in warren.toml's keys (``PolicySpec.to_mapping``,
    the CLI's flags); the supervisor resolves it for the caller. Unset keys are None or
    empty; ``to_mapping`` gives back only what is set, as ``policy.spec.from_mapping``
    reads it (where a bad value is refused with the key's name)."""

    workspace: str | None = None
    workspace_at: str | None = None
    workspace_link: bool | None = None
    write: list[str] = []
    read: list[str] = []
    deny: list[str] = []
    env_pass: list[str] = []
    preset: list[str] = []
    allow_host: list[str] = []
    env: dict[str, str] = {}
    resolve: dict[str, str] = {}
    network: str | None = None
    default_deny: bool | None = None
    workspace_writable: bool | None = None
    allow_nested: bool | None = None
    allow_broad_workspace: bool | None = None
    memory: str | int | float | None = None  # as written: "512M", 64, 0.5, "none"
    pids: str | int | float | None = None
    cpus: str | int | float | None = None
    tmp_size: str | int | float | None = None
    idle_timeout: str | int | float | None = None
    image: str | None = None
    disk: str | int | None = None
    from_snapshot: str | None = None
    secrets: list[str] = []  # NAME=ENVVAR@HOST: names and sources, never a value
    allow_http: list[str] = []
    require_namespaces: bool | None = None
    review: bool | None = None
    ask_timeout: str | int | float | None = None  # network "ask": seconds, or "2m"

    @classmethod
    def of(cls, mapping: dict[str, object]) -> Spec:
        """From warren.toml's keys; a key or type this message does not declare is a
        ``ProtocolError`` naming it."""
        spec: Spec = cls._from_fields(mapping, "spec")
        return spec

    def to_mapping(self) -> dict[str, object]:
        return {k: v for k, v in self.to_fields().items() if v is not None and v != [] and v != {}}


class Tty(Message):
    """A pseudo-terminal made inside the sandbox for the command; its master end goes
    back to the client. ``fds`` lists which of 0, 1, 2 it replaces."""

    rows: int = 24
    cols: int = 80
    fds: list[int] = []


class Command(Message):
    """What to run. ``stdio`` says which of 0, 1, 2 arrive as descriptors (in that
    order, after any others the request declares); the rest are /dev/null."""

    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] = {}
    timeout: float | None = None
    stdio: list[bool] = [False, False, False]
    tty: Tty | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT


# --- client -> supervisor ------------------------------------------------------------------


class RunRequest(Message):
    """A one-shot sandbox: plan ``spec`` for ``caller``, run ``command``, tear down.
    Descriptors: the command's stdio per ``command.stdio``, then the net-event pipe
    when ``net_events``."""

    TAG = "run"
    spec: Spec
    caller: Caller
    command: Command
    net_events: bool = False
    # --network ask: the client asks its user (a terminal) and answers with a
    # NetPolicyRequest on this connection while the command runs
    net_ask: bool = False


class PlanRequest(Message):
    """What a ``run`` with this spec, from this caller, would set up (``warren plan``)."""

    TAG = "plan"
    spec: Spec
    caller: Caller
    cwd: str | None = None


class CreateRequest(Message):
    TAG = "create"
    name: str
    spec: Spec
    caller: Caller


class GetRequest(Message):
    TAG = "get"
    name: str


class ListRequest(Message):
    TAG = "list"


class StopRequest(Message):
    TAG = "stop"
    name: str
    remove: bool = False


class ExecRequest(Message):
    """Run ``command`` in a live sandbox; stdio descriptors as ``command.stdio``."""

    TAG = "exec"
    sandbox: str
    command: Command
    origin: str = ""  # who asked, for the trail: "cli", "http token ID", "mcp", "e2b", "library"


class SpawnRequest(Message):
    """Start ``command`` in the background; its output goes to logs the supervisor keeps.
    ``stdin``: its stdin is a pipe the supervisor holds the write end of (``StdinRequest``);
    otherwise /dev/null."""

    TAG = "spawn"
    sandbox: str
    command: Command
    stdin: bool = False
    origin: str = ""


class StdinRequest(Message):
    """Data for a background process's stdin (the payload, at most ``STDIN_MAX_QUEUED``
    bytes), then with ``eof`` the end of it. ``process``: its spawn id, or its pid in the
    sandbox as decimal text."""

    TAG = "stdin"
    sandbox: str
    process: str
    eof: bool = False


class PsRequest(Message):
    TAG = "ps"
    sandbox: str


class SignalRequest(Message):
    TAG = "signal"
    sandbox: str
    pid: int
    signal: int
    origin: str = ""


class FileRequest(Message):
    """One file operation inside the sandbox; ``write`` carries the data as payload."""

    TAG = "file"
    sandbox: str
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
    xattrs: str | None = None  # a name prefix (``user.``...): read, or replaced on a write
    set_xattrs: dict[str, str] | None = None
    origin: str = ""


class ExposeRequest(Message):
    TAG = "expose"
    sandbox: str
    port: int
    host_port: int = 0


class ExposeListRequest(Message):
    """The host ports forwarded into a sandbox (``warren port NAME``)."""

    TAG = "exposes"
    sandbox: str


class UnexposeRequest(Message):
    """Stop forwarding the host port that reaches ``port`` inside the sandbox."""

    TAG = "unexpose"
    sandbox: str
    port: int


class NetLogRequest(Message):
    TAG = "netlog"
    sandbox: str


class EventsRequest(Message):
    """A sandbox's trail (``server.trail``) after a cursor: a record's time, and how
    many records of that time were had already."""

    TAG = "events"
    sandbox: str
    after: str = ""
    skip: int = 0


class NetPolicyRequest(Message):
    """A running sandbox's network policy (``warren net``): ``show`` it, ``allow`` or
    ``deny`` a rule (``rule``: HOST[:PORT] as ``--allow-host`` writes it), list the
    ``pending`` requests of ``--network ask``, ``approve`` (``always``: for the
    sandbox's life) or ``reject`` one (``id``). ``via`` names the client (cli, library,
    http); the supervisor adds who it is (``by``) before the network helper logs it."""

    TAG = "netpolicy"
    sandbox: str
    action: str
    rule: str = ""
    id: int = 0
    always: bool = False
    via: str = ""
    by: str = ""


class NetPendingRecord(Message):
    id: int
    method: str
    host: str
    port: int
    age: float  # seconds since it was asked
    waiting: int  # connections waiting on the answer
    process: str = ""  # the asking process, when the proxy can tell


class NetPolicy(Message):
    """A running sandbox's network policy, after the change asked for (if any)."""

    TAG = "netpolicy-ok"
    mode: str  # allow | ask
    allowed: list[str] = []  # the rules it started with
    added: list[str] = []  # rules allowed since
    denied: list[str] = []  # rules denied since
    ask_timeout: float = 0.0
    pending: list[NetPendingRecord] = []
    changed: bool = False


class ReviewRequest(Message):
    """A review sandbox's layer: ``diff`` (``patch``: with a git-style patch),
    ``apply`` (``paths`` relative to the workspace, all without; ``force``: over host
    files changed meanwhile) or ``discard``."""

    TAG = "review"
    sandbox: str
    action: str
    paths: list[str] = []
    force: bool = False
    patch: bool = False


class CheckpointRequest(Message):
    """A review sandbox's checkpoints: ``take`` one, ``list`` them, or ``rollback`` to
    ``id`` (0: the last one); ``keep_running``: refuse the rollback while processes run
    instead of stopping them."""

    TAG = "checkpoint"
    sandbox: str
    action: str
    id: int = 0
    keep_running: bool = False


class StatsRequest(Message):
    TAG = "stats"
    sandbox: str


class ProcessRequest(Message):
    """The state of a background process, and its output from the given offsets."""

    TAG = "process"
    sandbox: str
    spawn_id: str
    stdout_offset: int = 0
    stderr_offset: int = 0
    max_bytes: int = 16 * 1024 * 1024


class SpawnListRequest(Message):
    """Every background process of a sandbox (``spawn``), running or ended, with its
    exit status once it ended: what ``warren ps -a`` shows beside the live processes."""

    TAG = "spawns"
    sandbox: str


class PauseRequest(Message):
    """Freeze every process of a sandbox (``paused``), or thaw them."""

    TAG = "pause"
    sandbox: str
    paused: bool


class SnapshotRequest(Message):
    """Snapshot a sandbox on an image: its own layer, frozen where it is between
    commands (copied to the state directory in the background), else copied while the
    sandbox is paused."""

    TAG = "snapshot"
    sandbox: str


class SnapshotListRequest(Message):
    TAG = "snapshot-ls"


class SnapshotRemoveRequest(Message):
    TAG = "snapshot-rm"
    id: str


class ShutdownRequest(Message):
    """Ask the supervisor to exit once it holds no sandbox; the reply lists those it
    still holds."""

    TAG = "shutdown"


class Signal(Message):
    """From a client to the command it runs (same connection): forward this signal."""

    TAG = "sig"
    signal: int


# --- replies ---------------------------------------------------------------------------------


class Ok(Message):
    TAG = "ok"


class SandboxInfo(Message):
    TAG = "sandbox"
    name: str
    id: str
    state: str
    reason: str = ""
    workspace: str = ""
    created: float = 0.0
    # In models.SandboxInfo's order: `warren ls` prints these fields as the HTTP API's rows (cli.ls).
    warnings: list[str] = []
    pid1: int = 0
    idle_timeout: float | None = None  # seconds without a request before it stops
    last_active: float = 0.0  # when a request last reached it (or an exec ended)


class SandboxList(Message):
    TAG = "sandboxes"
    items: list[SandboxInfo] = []


class SnapshotInfo(Message):
    """A snapshot (``server.snapshots``): of which sandbox, on which image, what it holds."""

    TAG = "snapshot-info"
    id: str
    sandbox: str
    image: str
    created: float = 0.0
    size: int = 0  # bytes of file data in it
    workspace: str = ""  # "included", or "not included: host directory PATH"
    seconds: float = 0.0  # how long the sandbox was paused for it
    host_workspace: str = ""
    saved: bool = True  # its layer is all in the state directory (False: being copied there)


class SnapshotList(Message):
    TAG = "snapshots"
    items: list[SnapshotInfo] = []


class PlanReply(Message):
    TAG = "plan-ok"
    text: str
    plan: dict[str, object]


class Started(Message):
    """The command runs (``pid`` as the sandbox sees it). With a tty, the pty's master
    is attached."""

    TAG = "started"
    pid: int
    cwd: str
    warnings: list[str] = []
    spawn_id: str | None = None
    network: str = ""  # the sandbox's network mode (for hints)
    repository: str | None = None  # a git repository above the workspace, read-only (for hints)
    # --network ask asked on the client's terminal: the name ``warren net`` reaches the
    # run by, said before any of the command's output is read (``cli.asking``)
    ask_name: str | None = None


class Exited(Message):
    TAG = "exited"
    status: int
    timed_out: bool = False
    warnings: list[str] = []
    limit: str | None = None  # the sandbox's limit it ran into ("memory limit 512M reached")


class ProcInfo(Message):
    pid: int
    ppid: int
    state: str
    argv: list[str]
    spawn_id: str | None = None


class ProcessList(Message):
    TAG = "procs"
    items: list[ProcInfo] = []


class SpawnRecord(Message):
    spawn_id: str
    pid: int
    argv: list[str]
    started: float = 0.0
    running: bool = False
    status: int | None = None  # its wait status once it ended
    timed_out: bool = False
    limit: str | None = None


class SpawnList(Message):
    TAG = "spawns-ok"
    items: list[SpawnRecord] = []


class FileStat(Message):
    name: str = ""
    type: str
    size: int
    mode: int
    mtime: float
    uid: int
    gid: int


class FileXattrs(Message):
    name: str  # the entry's name in a listing; "" for a stat's path
    attrs: dict[str, str] = {}


class FileReply(Message):
    """``read``: the data is the payload. ``list``: entries. ``stat``: stat. ``exists``.
    ``xattrs``: the attributes the request's prefix names, for the entries that have some."""

    TAG = "file-ok"
    entries: list[FileStat] = []
    stat: FileStat | None = None
    exists: bool = False
    xattrs: list[FileXattrs] = []


class Exposed(Message):
    TAG = "exposed"
    address: str


class ExposedPort(Message):
    port: int  # inside the sandbox
    address: str  # 127.0.0.1:N on the host


class ExposedList(Message):
    TAG = "exposes-ok"
    items: list[ExposedPort] = []


class NetEventRecord(Message):
    time: str
    sandbox: str
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str | None = None
    kind: str = "request"
    by: str = ""
    request: int = 0


class NetLog(Message):
    TAG = "netlog-ok"
    events: list[NetEventRecord] = []


class Events(Message):
    """Trail records, each a JSON object as text (their kinds and fields are the
    trail's: ``server.trail``), and the cursor after them; ``running``: more may come."""

    TAG = "events-ok"
    records: list[str] = []
    after: str = ""
    skip: int = 0
    running: bool = False


class ReviewChange(Message):
    path: str
    kind: str  # added | modified | removed | mode | renamed
    type: str  # file | dir | symlink | other
    old_mode: int | None = None
    new_mode: int | None = None
    renamed_from: str | None = None
    held: str = ""  # why apply never writes it


class ReviewResult(Message):
    TAG = "review-ok"
    changes: list[ReviewChange] = []
    patch: str = ""
    applied: list[str] = []


class CheckpointInfo(Message):
    id: int
    time: float
    bytes: int  # what its frozen upper directory holds
    command: str = ""  # the commands that followed it ("; " between)


class CheckpointResult(Message):
    TAG = "checkpoint-ok"
    items: list[CheckpointInfo] = []  # the one taken or rolled back to; or all, oldest first
    stopped: str = ""  # rollback: the processes stopped first (pid and name)


class Stats(Message):
    """A sandbox's use now against its limits (``None``: no limit)."""

    TAG = "stats-ok"
    memory: int  # bytes
    pids: int  # processes + threads, warren's own few included
    cpu_time: float  # seconds, of the processes alive now and the children they reaped
    source: str  # where the numbers come from: cgroup files or the sandbox's /proc entries
    memory_limit: int | None = None
    pids_limit: int | None = None
    cpus_limit: float | None = None


class StdinState(Message):
    """A write to a process's stdin was taken: ``queued`` bytes wait in the supervisor for
    the process to read (beyond what its pipe holds); ``closed`` once eof was asked."""

    TAG = "stdin-ok"
    queued: int = 0
    closed: bool = False


class ProcessState(Message):
    """Payload: the stdout chunk followed by the stderr chunk (lengths given)."""

    TAG = "process-ok"
    pid: int
    argv: list[str]
    running: bool
    status: int | None = None
    timed_out: bool = False
    limit: str | None = None  # a limit of the sandbox it ran into
    stdout_len: int = 0
    stderr_len: int = 0


def exit_code(status: int) -> int:
    """The exit code a shell shows for a wait status (``Exited.status``,
    ``ProcessState.status``): the command's own, or 128+N when signal N killed it."""
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)


def check_stdin_size(size: int, ident: str) -> None:
    """One write to a background process's stdin may carry at most what its stdin may
    queue (``STDIN_MAX_QUEUED``): checked by the client before sending, and again by
    the supervisor before reading it."""
    if size > STDIN_MAX_QUEUED:
        raise StdinFull(
            f"a write of {size} bytes is more than the {STDIN_MAX_QUEUED} bytes a process's stdin may queue",
            operation="stdin",
            path=ident,
            hint="write it in parts of at most that size (Process.write does)",
        )
