"""What every framework backend shares: turning "warren's policy keys" into a spec.

A backend takes the keys of ``warren.toml`` (a mapping such as
``{"preset": ["python"], "network": "allow"}``) or a ``PolicySpec``; with neither it
means warren's default policy for the current directory. The directory is fixed when
the backend is built, so a sandbox created later (or by another thread) does not
depend on where the process happens to be then. Also here: the shell line that runs
an agent's command with stderr folded into stdout in the order it was written, as the
frameworks' own local backends return it, and the one that gives it a terminal.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from ..errors import ConfigError
from ..policy import PolicySpec
from ..policy.spec import from_mapping

PolicyKeys = Mapping[str, object] | PolicySpec | None


def spec_from(policy: PolicyKeys, where: str) -> PolicySpec:
    """A spec from ``policy`` (warren.toml keys or a PolicySpec); ``where`` names the
    integration in errors. The workspace defaults to the current directory."""
    if policy is None:
        spec = PolicySpec()
    elif isinstance(policy, PolicySpec):
        spec = PolicySpec().merged(policy)
    elif isinstance(policy, Mapping):
        spec = from_mapping(policy, where)
    else:
        raise ConfigError(
            f"{where}: policy must be a mapping of warren.toml keys or a PolicySpec, "
            f"not {type(policy).__name__}",
            operation="config",
            hint='pass e.g. {"workspace": ".", "preset": ["python"]}',
        )
    spec.workspace = os.path.abspath(spec.workspace or os.getcwd())
    return spec


def keys_of(spec: PolicySpec) -> dict[str, object]:
    """The warren.toml form of ``spec``: what a backend stores to recreate its sandbox."""
    return spec.to_mapping()


def merged_stdout(argv: list[str]) -> list[str]:
    """``argv`` with its stderr sent to stdout by the sandbox's own shell, so both
    arrive interleaved as written (two captured pipes would lose that order)."""
    return ["/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh", *argv]


def in_terminal(argv: list[str]) -> list[str]:
    """``argv`` in a terminal of its own: util-linux ``script`` in the sandbox gives it a
    PTY (24x80) and relays it over the process's pipes, so the caller's terminal is
    never the command's; what it prints arrives on stdout, as a terminal shows it."""
    inner = f"stty rows 24 cols 80 2>/dev/null; exec {shlex.join(argv)}"
    return ["script", "--quiet", "--flush", "--return", "--command", inner, "/dev/null"]


def workspace_named(policy: PolicyKeys) -> bool:
    """Whether ``policy`` names a workspace (else the current directory is meant)."""
    if isinstance(policy, PolicySpec):
        return policy.workspace is not None
    return isinstance(policy, Mapping) and policy.get("workspace") is not None
