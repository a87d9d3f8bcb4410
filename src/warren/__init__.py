"""warren: a Linux sandbox for AI coding agents in which real developer tools work.

Library first: ``warren.run(argv, policy=...)`` runs one command in a one-shot
sandbox; ``warren.Policy`` / ``warren.policy.build`` describe what it may touch.
"""

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
from .policy import Policy, PolicySpec, build
from .run import Result, run

__all__ = [
    "CommandNotFound",
    "ConfigError",
    "CwdNotFound",
    "ExecError",
    "HostError",
    "Policy",
    "PolicyError",
    "PolicySpec",
    "Result",
    "SetupError",
    "WarrenError",
    "build",
    "run",
]
