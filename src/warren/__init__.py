"""warren: a Linux sandbox for AI coding agents in which real developer tools work.

Library first: ``warren.run(argv, policy=...)`` runs one command in a one-shot
sandbox; ``warren.Policy`` / ``warren.build`` describe what it may touch.
Names are imported on first use, so ``python -m warren`` starts fast.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "CommandNotFound": "errors",
    "ConfigError": "errors",
    "CwdNotFound": "errors",
    "ExecError": "errors",
    "HostError": "errors",
    "PolicyError": "errors",
    "SetupError": "errors",
    "WarrenError": "errors",
    "Policy": "policy",
    "PolicySpec": "policy",
    "build": "policy",
    "Result": "output",
    "Sandbox": "sandbox",
    "AsyncSandbox": "aio",
    "run": "oneshot",
}
__all__ = [
    "AsyncSandbox",
    "CommandNotFound",
    "ConfigError",
    "CwdNotFound",
    "ExecError",
    "HostError",
    "Policy",
    "PolicyError",
    "PolicySpec",
    "Result",
    "Sandbox",
    "SetupError",
    "WarrenError",
    "build",
    "run",
]

if TYPE_CHECKING:
    from .aio import AsyncSandbox
    from .errors import (
        CommandNotFound,
        ConfigError,
        CwdNotFound,
        ExecError,
        HostError,
        PolicyError,
        SetupError,
        WarrenError,
    )
    from .oneshot import run
    from .output import Result
    from .policy import Policy, PolicySpec, build
    from .sandbox import Sandbox


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'warren' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
