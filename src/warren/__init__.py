"""warren: a Linux sandbox for AI coding agents in which real developer tools work.

Library first: ``warren.run(argv, policy=...)`` runs one command in a one-shot
sandbox; ``warren.Policy`` / ``warren.build`` describe what it may touch.
Names are imported on first use, so ``python -m warren`` starts fast.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_EXPORTS = {
    "CommandNotFound": "errors",
    "ConfigError": "errors",
    "CwdNotFound": "errors",
    "ExecError": "errors",
    "HostError": "errors",
    "PolicyError": "errors",
    "SetupError": "errors",
    "WarrenError": "errors",
    "SandboxError": "errors",
    "SandboxNotFound": "errors",
    "SandboxDead": "errors",
    "SandboxTimeout": "errors",
    "SandboxPaused": "errors",
    "LimitReached": "errors",
    "ProcessNotFound": "errors",
    "PortNotForwarded": "errors",
    "PortUnavailable": "errors",
    "ProcessEnded": "errors",
    "StdinError": "errors",
    "StdinNotOpen": "errors",
    "StdinClosed": "errors",
    "StdinFull": "errors",
    "ReviewError": "errors",
    "ReviewConflict": "errors",
    "CheckpointError": "errors",
    "Policy": "policy",
    "PolicySpec": "policy",
    "build": "policy",
    "Result": "models",
    "SandboxInfo": "models",
    "ProcessInfo": "models",
    "SpawnInfo": "models",
    "FileInfo": "models",
    "Review": "models",
    "NetPolicy": "models",
    "NetPending": "models",
    "Checkpoint": "models",
    "Sandbox": "client.sandbox",
    "Process": "client.sandbox",
    "AsyncSandbox": "client.aio",
    "Transport": "client.transport",
    "LocalTransport": "client.local",
    "run": "client.oneshot",
}
__all__ = [
    "AsyncSandbox",
    "Checkpoint",
    "CheckpointError",
    "CommandNotFound",
    "ConfigError",
    "CwdNotFound",
    "ExecError",
    "FileInfo",
    "HostError",
    "LimitReached",
    "LocalTransport",
    "NetPending",
    "NetPolicy",
    "Policy",
    "PolicyError",
    "PolicySpec",
    "PortNotForwarded",
    "PortUnavailable",
    "Process",
    "ProcessEnded",
    "ProcessInfo",
    "ProcessNotFound",
    "Result",
    "Review",
    "ReviewConflict",
    "ReviewError",
    "Sandbox",
    "SandboxDead",
    "SandboxError",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxPaused",
    "SandboxTimeout",
    "SetupError",
    "SpawnInfo",
    "StdinClosed",
    "StdinError",
    "StdinFull",
    "StdinNotOpen",
    "Transport",
    "WarrenError",
    "build",
    "run",
]

if TYPE_CHECKING:
    from .client.aio import AsyncSandbox
    from .client.local import LocalTransport
    from .client.oneshot import run
    from .client.sandbox import Process, Sandbox
    from .client.transport import Transport
    from .errors import (
        CheckpointError,
        CommandNotFound,
        ConfigError,
        CwdNotFound,
        ExecError,
        HostError,
        LimitReached,
        PolicyError,
        ProcessEnded,
        ProcessNotFound,
        ReviewConflict,
        ReviewError,
        SandboxDead,
        SandboxError,
        SandboxNotFound,
        SandboxPaused,
        SandboxTimeout,
        SetupError,
        StdinClosed,
        StdinError,
        StdinFull,
        StdinNotOpen,
        WarrenError,
    )
    from .models import Checkpoint, FileInfo, ProcessInfo, Result, Review, SandboxInfo
    from .policy import Policy, PolicySpec, build


def __getattr__(name: str) -> Any:
    from ._lazy import named

    return named(__name__, _EXPORTS, globals(), name)
