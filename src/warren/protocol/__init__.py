"""warren's protocol: typed, versioned messages between clients, the supervisor and a
sandbox's PID 1, one module per channel.

``base`` is the message engine (the ``Message`` class, the version, decoding, errors);
``client`` the client <-> supervisor requests and replies; ``pid1`` the supervisor <->
PID 1 channel; ``handoff`` the work carried into a sandbox (handoffs, the exec
helper's launch, the network helper's connector). Every message is re-exported here,
so ``protocol.ExecRequest`` names it wherever it is declared (``pid1`` and ``handoff``
are loaded when first named: a client never needs them). Framing (length, payload,
descriptors) is ``warren.wire``.

On the CLI's fast path: every module here is standard library only.
"""

from __future__ import annotations

from .base import (
    VERSION,
    Error,
    ErrorRecord,
    Message,
    decode,
    error_message,
    from_dict,
    raise_error,
)
from .client import (
    DEFAULT_OUTPUT_LIMIT,
    STDIN_MAX_QUEUED,
    Caller,
    Command,
    CreateRequest,
    ExecRequest,
    Exited,
    Exposed,
    ExposedList,
    ExposedPort,
    ExposeListRequest,
    ExposeRequest,
    FileReply,
    FileRequest,
    FileStat,
    FileXattrs,
    GetRequest,
    ListRequest,
    NetEventRecord,
    NetLog,
    NetLogRequest,
    Ok,
    PauseRequest,
    PlanReply,
    PlanRequest,
    ProcessList,
    ProcessRequest,
    ProcessState,
    ProcInfo,
    PsRequest,
    ReviewChange,
    ReviewRequest,
    ReviewResult,
    RunRequest,
    SandboxInfo,
    SandboxList,
    ShutdownRequest,
    Signal,
    SignalRequest,
    SnapshotInfo,
    SnapshotList,
    SnapshotListRequest,
    SnapshotRemoveRequest,
    SnapshotRequest,
    SpawnList,
    SpawnListRequest,
    SpawnRecord,
    SpawnRequest,
    Spec,
    Started,
    Stats,
    StatsRequest,
    StdinRequest,
    StdinState,
    StopRequest,
    Tty,
    UnexposeRequest,
    check_stdin_size,
    exit_code,
)

TYPE_CHECKING = False  # not typing's: importing typing costs milliseconds (mypy knows the name)
if TYPE_CHECKING:
    from .handoff import (
        Connected,
        ConnectorRequest,
        ConnectRequest,
        Handoff,
        Launch,
    )
    from .pid1 import (
        Failed,
        Layers,
        NetGo,
        NetProxy,
        NetReady,
        NetUp,
        Quiesce,
        Quiet,
        Ready,
        Refresh,
        Spare,
    )

# The channels a client never speaks load when first named (the CLI's start-up stays
# with base and client); ``base.from_dict`` loads them before refusing an unknown kind.
_LAZY = {
    "ConnectRequest": "handoff",
    "Connected": "handoff",
    "ConnectorRequest": "handoff",
    "Failed": "pid1",
    "Handoff": "handoff",
    "Launch": "handoff",
    "Layers": "pid1",
    "NetGo": "pid1",
    "NetProxy": "pid1",
    "NetReady": "pid1",
    "NetUp": "pid1",
    "Quiesce": "pid1",
    "Quiet": "pid1",
    "Ready": "pid1",
    "Refresh": "pid1",
    "Spare": "pid1",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'warren.protocol' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "DEFAULT_OUTPUT_LIMIT",
    "STDIN_MAX_QUEUED",
    "VERSION",
    "Caller",
    "Command",
    "ConnectRequest",
    "Connected",
    "ConnectorRequest",
    "CreateRequest",
    "Error",
    "ErrorRecord",
    "ExecRequest",
    "Exited",
    "ExposeListRequest",
    "ExposeRequest",
    "Exposed",
    "ExposedList",
    "ExposedPort",
    "Failed",
    "FileReply",
    "FileRequest",
    "FileStat",
    "FileXattrs",
    "GetRequest",
    "Handoff",
    "Launch",
    "Layers",
    "ListRequest",
    "Message",
    "NetEventRecord",
    "NetGo",
    "NetLog",
    "NetLogRequest",
    "NetProxy",
    "NetReady",
    "NetUp",
    "Ok",
    "PauseRequest",
    "PlanReply",
    "PlanRequest",
    "ProcInfo",
    "ProcessList",
    "ProcessRequest",
    "ProcessState",
    "PsRequest",
    "Quiesce",
    "Quiet",
    "Ready",
    "Refresh",
    "ReviewChange",
    "ReviewRequest",
    "ReviewResult",
    "RunRequest",
    "SandboxInfo",
    "SandboxList",
    "ShutdownRequest",
    "Signal",
    "SignalRequest",
    "SnapshotInfo",
    "SnapshotList",
    "SnapshotListRequest",
    "SnapshotRemoveRequest",
    "SnapshotRequest",
    "Spare",
    "SpawnList",
    "SpawnListRequest",
    "SpawnRecord",
    "SpawnRequest",
    "Spec",
    "Started",
    "Stats",
    "StatsRequest",
    "StdinRequest",
    "StdinState",
    "StopRequest",
    "Tty",
    "UnexposeRequest",
    "check_stdin_size",
    "decode",
    "error_message",
    "exit_code",
    "from_dict",
    "raise_error",
]
