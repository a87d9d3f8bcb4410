"""The typed, versioned messages between warren clients, the supervisor and a sandbox's
PID 1.

Every message is a declared class: its fields, their types and defaults are the
annotations below. On the wire a message is one JSON object carrying the protocol
version ``v``, its kind ``t`` and its fields; ``decode`` accepts exactly that and
rejects everything else (unknown kind or field, wrong type, NUL byte in a string,
another version) with a ``ProtocolError`` naming the field. Raw payloads (file
contents) and descriptors travel beside the JSON (``wire``).

This module is on the CLI's fast path: it uses no ``typing``, ``dataclasses``, ``enum``
or ``re`` at run time (each costs milliseconds of start-up; JSON goes through
``jsonc``), which is why messages are declared with the small ``Message`` base below
rather than dataclasses. mypy sees them
as dataclasses (``dataclass_transform``), so constructing one is type-checked.
"""

from __future__ import annotations

import math

from . import jsonc
from .errors import ProtocolError

TYPE_CHECKING = False  # not typing's: importing typing costs milliseconds (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, dataclass_transform
else:

    def dataclass_transform(**_kw: object) -> object:
        return lambda cls: cls


VERSION = 4  # bumped whenever a message changes: a supervisor of other code refuses cleanly
DEFAULT_OUTPUT_LIMIT = 16 * 1024 * 1024
STDIN_MAX_QUEUED = 4 * 1024 * 1024  # a process's stdin bytes the supervisor holds beyond its pipe

_MISSING = object()
_KINDS: dict[str, type[Message]] = {}


def _bad(where: str, expected: str, value: object) -> ProtocolError:
    got = type(value).__name__ if value is not None else "null"
    return ProtocolError(
        f"malformed message: {where} must be {expected}, not {got}",
        operation="decode",
        hint="the client and the supervisor must be the same warren version",
    )


def _check_str(value: object, where: str) -> object:
    if not isinstance(value, str):
        raise _bad(where, "a string", value)
    if "\x00" in value:
        raise ProtocolError(
            f"{where} contains a NUL byte",
            operation="decode",
            hint="paths, arguments and environment values cannot contain NUL (\\0)",
        )
    return value


def _check_int(value: object, where: str) -> object:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(where, "an integer", value)
    return value


def _check_float(value: object, where: str) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(where, "a number", value)
    if not math.isfinite(value):
        raise ProtocolError(f"{where} must be a finite number, not {value}", operation="decode")
    return float(value)


def _check_bool(value: object, where: str) -> object:
    if not isinstance(value, bool):
        raise _bad(where, "true or false", value)
    return value


def _check_any(value: object, where: str) -> object:
    return value


def _split_top(text: str, sep: str) -> list[str]:
    """Split a type expression at top-level ``sep`` (not inside brackets)."""
    if sep not in text:
        return [text.strip()]
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


_CHECKERS: dict[str, Callable[[object, str], object]] = {}


def _checker(expr: str, owner: str) -> Callable[[object, str], object]:
    """A validator for one annotation, written as the small subset used here. Made
    once per distinct annotation (validators hold no state): building them for every
    field of every message was most of this module's import time."""
    check = _CHECKERS.get(expr)
    if check is None:
        check = _CHECKERS[expr] = _make_checker(expr, owner)
    return check


def _make_checker(expr: str, owner: str) -> Callable[[object, str], object]:
    alts = _split_top(expr, "|")
    if len(alts) == 2 and "None" in alts:
        inner = _checker(alts[0] if alts[1] == "None" else alts[1], owner)

        def optional(value: object, where: str) -> object:
            return None if value is None else inner(value, where)

        return optional
    if expr.startswith("list[") and expr.endswith("]"):
        item = _checker(expr[5:-1], owner)

        def list_of(value: object, where: str) -> object:
            if not isinstance(value, list):
                raise _bad(where, "a list", value)
            return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

        return list_of
    if expr.startswith("dict[str,") and expr.endswith("]"):
        val = _checker(expr[9:-1].strip(), owner)

        def dict_of(value: object, where: str) -> object:
            if not isinstance(value, dict):
                raise _bad(where, "an object", value)
            return {_check_str(k, f"{where} key"): val(v, f"{where}.{k}") for k, v in value.items()}

        return dict_of
    simple = {"str": _check_str, "int": _check_int, "float": _check_float, "bool": _check_bool}
    if expr in simple:
        return simple[expr]
    if expr == "object":
        return _check_any

    def nested(value: object, where: str) -> object:
        cls = _BY_NAME.get(expr)
        if cls is None:  # pragma: no cover - a declaration error, caught by the tests
            raise TypeError(f"{owner}: unknown field type {expr}")
        if not isinstance(value, dict):
            raise _bad(where, f"a {expr} object", value)
        return cls._from_fields(value, where)

    return nested


_BY_NAME: dict[str, type[Message]] = {}


@dataclass_transform(kw_only_default=True)
class Message:
    """A declared message. Subclasses name their kind in ``TAG`` and their fields as
    annotations; defaults are class attributes (lists and dicts are copied)."""

    TAG: ClassVar[str] = ""
    _fields: ClassVar[tuple[tuple[str, Callable[[object, str], object], object], ...]] = ()

    def __init_subclass__(cls) -> None:
        fields: dict[str, tuple[str, Callable[[object, str], object], object]] = {}
        for klass in reversed(cls.__mro__):
            for name, expr in klass.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
                if name.startswith("_") or str(expr).startswith("ClassVar"):
                    continue
                fields[name] = (name, _checker(str(expr), cls.__name__), klass.__dict__.get(name, _MISSING))
        cls._fields = tuple(fields.values())
        _BY_NAME[cls.__name__] = cls
        if cls.TAG:
            if cls.TAG in _KINDS:  # pragma: no cover - a declaration error
                raise TypeError(f"two messages with the tag {cls.TAG!r}")
            _KINDS[cls.TAG] = cls

    def __init__(self, **values: Any) -> None:
        for name, _check, default in self._fields:
            if name in values:
                value = values.pop(name)
            elif default is _MISSING:
                raise TypeError(f"{type(self).__name__}: missing field {name}")
            else:
                value = default.copy() if isinstance(default, (list, dict)) else default
            setattr(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(values)}")

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name, _c, _d in self._fields)
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n, _c, _d in self._fields
        )

    __hash__ = None  # type: ignore[assignment]

    # --- codecs ---------------------------------------------------------------------

    def to_fields(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, _check, _default in self._fields:
            value = getattr(self, name)
            if isinstance(value, Message):
                value = value.to_fields()
            elif isinstance(value, list) and value and isinstance(value[0], Message):
                value = [v.to_fields() for v in value]
            out[name] = value
        return out

    def to_dict(self) -> dict[str, object]:
        return {"v": VERSION, "t": self.TAG, **self.to_fields()}

    def encode(self) -> bytes:
        return jsonc.dumps(self.to_dict()).encode()

    @classmethod
    def _from_fields(cls, data: dict[str, object], where: str) -> Any:
        values = {}
        for name, check, default in cls._fields:
            if name in data:
                values[name] = check(data[name], f"{where}.{name}" if where else name)
            elif default is _MISSING:
                field = f"{where}.{name}" if where else name
                raise ProtocolError(
                    f"malformed message: {cls.TAG or cls.__name__} lacks {field}",
                    operation="decode",
                    hint="the client and the supervisor must be the same warren version",
                )
        unknown = set(data) - {name for name, _c, _d in cls._fields} - {"v", "t"}
        if unknown:
            raise ProtocolError(
                f"malformed message: unknown field {sorted(unknown)[0]!r} in {cls.TAG or cls.__name__}",
                operation="decode",
                hint="the client and the supervisor must be the same warren version",
            )
        return cls(**values)


def decode(raw: bytes, expect: tuple[type[Message], ...] = ()) -> Message:
    """One message from its JSON bytes; ``expect`` limits which kinds are acceptable."""
    try:
        data = jsonc.loads(raw.decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"malformed message: not JSON ({e})", operation="decode") from None
    return from_dict(data, expect)


def from_dict(data: object, expect: tuple[type[Message], ...] = ()) -> Message:
    """One message from its decoded JSON object (``decode`` without the parsing)."""
    if not isinstance(data, dict):
        raise ProtocolError("malformed message: not a JSON object", operation="decode")
    version = data.get("v")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version mismatch: got {version!r}, this side speaks {VERSION}",
            operation="decode",
            hint="a warren supervisor of another version is running; it exits 5 s after its "
            "last sandbox ends (see `warren ls`), or stop it with `warren shutdown`",
        )
    cls = _KINDS.get(str(data.get("t")))
    if cls is None or (expect and cls not in expect):
        raise ProtocolError(f"unexpected message kind {data.get('t')!r}", operation="decode")
    message: Message = cls._from_fields(data, "")
    return message


# --- values shared by several messages ---------------------------------------------------


class Caller(Message):
    """Who asks, from where: the caller's working directory and environment (the
    supervisor learns uid and gid from the socket, never from the message)."""

    cwd: str
    env: dict[str, str]
    config: bool = False  # layer ~/.config/warren/config.toml and the workspace's warren.toml
    profile: str | None = None


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


class ErrorRecord(Message):
    kind: str
    message: str
    operation: str = ""
    path: str | None = None
    errno: int | None = None
    hint: str = ""


# --- client -> supervisor ------------------------------------------------------------------


class RunRequest(Message):
    """A one-shot sandbox: plan ``spec`` for ``caller``, run ``command``, tear down.
    Descriptors: the command's stdio per ``command.stdio``, then the net-event pipe
    when ``net_events``."""

    TAG = "run"
    spec: dict[str, object]
    caller: Caller
    command: Command
    net_events: bool = False


class PlanRequest(Message):
    """What a ``run`` with this spec, from this caller, would set up (``warren plan``)."""

    TAG = "plan"
    spec: dict[str, object]
    caller: Caller
    cwd: str | None = None


class CreateRequest(Message):
    TAG = "create"
    name: str
    spec: dict[str, object]
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


class SpawnRequest(Message):
    """Start ``command`` in the background; its output goes to logs the supervisor keeps.
    ``stdin``: its stdin is a pipe the supervisor holds the write end of (``StdinRequest``);
    otherwise /dev/null."""

    TAG = "spawn"
    sandbox: str
    command: Command
    stdin: bool = False


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


class ExposeRequest(Message):
    TAG = "expose"
    sandbox: str
    port: int
    host_port: int = 0


class NetLogRequest(Message):
    TAG = "netlog"
    sandbox: str


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


class PauseRequest(Message):
    """Freeze every process of a sandbox (``paused``), or thaw them."""

    TAG = "pause"
    sandbox: str
    paused: bool


class ShutdownRequest(Message):
    """Ask the supervisor to exit once it holds no sandbox; the reply lists those it
    still holds."""

    TAG = "shutdown"


class Signal(Message):
    """From a client to the command it runs (same connection): forward this signal."""

    TAG = "sig"
    signal: int


# --- replies ---------------------------------------------------------------------------------


class Error(Message):
    TAG = "error"
    error: ErrorRecord


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
    pid1: int = 0
    warnings: list[str] = []
    idle_timeout: float | None = None  # seconds without a request before it stops
    last_active: float = 0.0  # when a request last reached it (or an exec ended)


class SandboxList(Message):
    TAG = "sandboxes"
    items: list[SandboxInfo] = []


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


class FileStat(Message):
    name: str = ""
    type: str
    size: int
    mode: int
    mtime: float
    uid: int
    gid: int


class FileReply(Message):
    """``read``: the data is the payload. ``list``: entries. ``stat``: stat. ``exists``."""

    TAG = "file-ok"
    entries: list[FileStat] = []
    stat: FileStat | None = None
    exists: bool = False


class Exposed(Message):
    TAG = "exposed"
    address: str


class NetEventRecord(Message):
    time: str
    sandbox: str
    method: str
    host: str
    port: int
    allowed: bool
    reason: str
    address: str | None = None


class NetLog(Message):
    TAG = "netlog-ok"
    events: list[NetEventRecord] = []


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


# --- supervisor <-> PID 1 ----------------------------------------------------------------------


class Ready(Message):
    """PID 1 finished setting up; it serves handoffs from now on."""

    TAG = "ready"


class Refresh(Message):
    """From the supervisor: a writable root was replaced on the host and bound anew;
    rebuild the Landlock ruleset (rules bind to inodes) before the next request."""

    TAG = "refresh"


class Failed(Message):
    TAG = "failed"
    error: ErrorRecord


class NetProxy(Message):
    """``--network allow``: the proxy's listening socket, made inside, is attached."""

    TAG = "net-proxy"


class NetReady(Message):
    """``--network open``: the namespace is ready for pasta."""

    TAG = "net-ready"


class NetGo(Message):
    TAG = "net-go"
    go: bool


class NetUp(Message):
    TAG = "net-up"
    ok: bool


class Handoff(Message):
    """A client's request for PID 1: the request, then descriptors — the client's
    connection first, then the request's own. ``payload``: bytes of it still in the
    connection (a file to write). ``spawn_id``/``spawned``: what the supervisor knows of
    background processes (their logs are its)."""

    TAG = "handoff"
    request: dict[str, object]
    payload: int = 0
    spawn_id: str | None = None
    spawned: dict[str, str] = {}
    # Descriptors after the request's own, by name: "active" (held while an exec runs:
    # the supervisor sees it end), "LIMIT:KEY" (a cgroup counter file, e.g.
    # "memory:oom_kill", read before and after the command to tell a limit it hit).
    extra: list[str] = []


class Launch(Message):
    """Inside a sandbox, from an exec helper to the process it forked ahead of time:
    become this command. Descriptors: the command's stdin, stdout and stderr;
    ``ctty`` names the one that is its controlling terminal (-1: none)."""

    TAG = "launch"
    path: str
    argv: list[str]
    env: dict[str, str]
    cwd: str
    ctty: int = -1


class ConnectorRequest(Message):
    """The sandbox's network helper asks PID 1 for a connector: on this connection,
    each ``ConnectRequest`` gets back a socket connected *inside* the sandbox."""

    TAG = "connector"


class ConnectRequest(Message):
    TAG = "connect"
    port: int


class Connected(Message):
    """The connected socket is attached (none when nothing listens on the port)."""

    TAG = "connected"
    ok: bool


def error_message(error: Exception) -> Error:
    from .errors import WarrenError, to_record

    if not isinstance(error, WarrenError):
        error = WarrenError(f"internal error: {error!r}", hint="this is a bug in warren; please report it")
    record = to_record(error)
    return Error(error=ErrorRecord._from_fields(record, "error"))


def raise_error(message: Error) -> None:
    from .errors import from_record

    raise from_record(message.error.to_fields())
