"""Checks of what a caller passes to the public API, before anything is sent: a bad
argument is a typed error naming it, never a traceback from deep inside.

The one place where values are bounded: the SDK, the HTTP service and the MCP server
all call these (the service turns their errors into 400s), so a number is refused the
same way whichever door it came in by. The bounds are also the OpenAPI schema's.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TypeVar

from ..errors import (
    CwdNotFound,
    ExecError,
    PolicyError,
    ProcessNotFound,
    SandboxError,
    SandboxFileError,
    WarrenError,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy import PolicySpec

MAX_TIMEOUT = 7 * 24 * 3600.0  # seconds: a week (well inside every clock's range)
MAX_OUTPUT_LIMIT = 1 << 40  # bytes per stream
MAX_OFFSET = 1 << 62  # byte offsets into a process's output
PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT
MAX_ARG_STRLEN = 32 * 4096  # the kernel's limit on one argument or environment string (E2BIG)


def argv(cmd: object, op: str) -> list[str]:
    if isinstance(cmd, (str, bytes)) or not isinstance(cmd, Sequence) or not cmd:
        if isinstance(cmd, (str, bytes)):
            got = "one string"
        else:
            got = type(cmd).__name__ if not isinstance(cmd, Sequence) else "an empty list"
        raise ExecError(
            f"argv must be a non-empty list of strings, not {got}",
            operation=op,
            hint='use ["sh", "-c", "..."] to run a shell command line',
        )
    out = []
    for i, a in enumerate(cmd):
        if isinstance(a, os.PathLike):
            a = os.fspath(a)
        if not isinstance(a, str):
            raise ExecError(
                f"argv[{i}] must be a string, not {type(a).__name__}",
                operation=op,
                hint="decode bytes first (os.fsdecode) and pass str",
            )
        if "\x00" in a:
            raise ExecError(
                f"argv[{i}] contains a NUL byte", operation=op, hint="arguments cannot contain NUL"
            )
        if len(a) >= MAX_ARG_STRLEN // 4 and len(a.encode()) >= MAX_ARG_STRLEN:
            raise ExecError(
                f"argv[{i}] is {len(a.encode())} bytes: the argument is too long (E2BIG)",
                operation=op,
                errno=7,
                hint=f"one argument may have at most {MAX_ARG_STRLEN - 1} bytes; pass large data on "
                "stdin or in a file",
            )
        out.append(a)
    if not out[0]:
        raise ExecError("argv[0] is empty", operation=op, hint="name the program to run")
    return out


def stdin(data: object, op: str) -> bytes | None:
    if data is None:
        return None
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise ExecError(
        f"stdin must be bytes or str, not {type(data).__name__}", operation=op, hint="pass bytes or str"
    )


def seconds(value: object, what: str, op: str, most: float, error: type[WarrenError], hint: str) -> float:
    """A number of seconds above 0 and at most ``most``; else ``error`` naming ``what``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value <= most
    ):
        raise error(
            f"{what} must be a number of seconds above 0 and at most {most:.0f}, not {value!r}",
            operation=op,
            hint=hint,
        )
    return float(value)


def timeout(value: object, op: str) -> float | None:
    if value is None:
        return None
    hint = "pass e.g. timeout=30, or None (null) for no limit; 0 is not 'no limit'"
    return seconds(value, "timeout", op, MAX_TIMEOUT, ExecError, hint)


C = TypeVar("C")


def callback(value: C, what: str, op: str) -> C:
    """A function called with output (or a network event) as it comes, or None."""
    if value is not None and not callable(value):
        raise ExecError(
            f"{what} must be a function (or None), not {type(value).__name__}",
            operation=op,
            hint=f"pass e.g. {what}=lambda data: print(data)",
        )
    return value


def wait_timeout(value: object, op: str) -> float | None:
    """How long ``Process.wait`` waits: None (as long as it takes) or seconds, as
    ``subprocess``'s ``wait`` takes them (0 or less: look once)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ExecError(
            f"timeout must be a number of seconds or None, not {value!r}",
            operation=op,
            hint="pass e.g. timeout=30, or None to wait as long as it takes",
        )
    return min(float(value), MAX_TIMEOUT)


def cwd(value: object, op: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise ExecError(
            f"cwd must be a non-empty path string, not {value!r}", operation=op, hint="pass a str path"
        )
    return value


def env(value: object, op: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ExecError("env must map str to str", operation=op, hint='pass e.g. env={"NAME": "value"}')
    for k, v in value.items():
        if not k or "=" in k or "\x00" in k or "\x00" in v:
            raise ExecError(
                f"invalid environment entry {k!r}", operation=op, hint="no '=' in names, no NUL anywhere"
            )
    return dict(value)


def limit(value: object, op: str, what: str = "output_limit") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OUTPUT_LIMIT:
        raise ExecError(
            f"{what} must be a byte count from 0 to {MAX_OUTPUT_LIMIT}, not {value!r}",
            operation=op,
            hint="pass e.g. 1 << 20",
        )
    return value


def offset(value: object, what: str, op: str) -> int:
    """A byte offset into a process's output."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OFFSET:
        raise ExecError(
            f"{what} must be a byte offset from 0 to {MAX_OFFSET}, not {value!r}",
            operation=op,
            hint="pass 0, or the next_offset of the previous answer",
        )
    return value


def pid(value: object, op: str) -> int:
    """A pid of a sandbox's own process (as the sandbox sees it): never 0 (the group),
    1 (its PID 1) or negative (every process)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 2 <= value <= PID_MAX:
        raise ProcessNotFound(
            f"no such process in the sandbox: {value!r}",
            operation=op,
            hint=f"a pid of one of the sandbox's processes (2 to {PID_MAX}); list them with "
            "`warren ps NAME` / Sandbox.processes()",
        )
    return value


def ident(value: object, what: str, op: str, error: type[SandboxError], hint: str) -> str:
    """An id warren gave (a background process's, a snapshot's): a non-empty string."""
    if not isinstance(value, str) or not value or "\x00" in value:
        raise error(f"{what} must be a non-empty string, not {value!r}", operation=op, hint=hint)
    return value


def number(value: object, what: str, op: str, error: type[SandboxError], hint: str) -> int:
    """A number warren gave (a checkpoint's, a waiting request's): a whole number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_OFFSET:
        raise error(f"{what} must be a whole number from 0, not {value!r}", operation=op, hint=hint)
    return value


MAX_POLL = 3600.0  # seconds between two looks at a trail being followed


def poll(value: object, op: str) -> float:
    """Seconds between two looks (``events(follow=True)``): above 0, at most an hour."""
    return seconds(value, "poll", op, MAX_POLL, SandboxError, "pass e.g. poll=0.25")


def rule(value: object, op: str) -> str:
    """A network rule as written (``HOST[:PORT]``); the supervisor parses it."""
    if not isinstance(value, str) or not value.strip() or "\x00" in value:
        raise SandboxError(
            f"rule must be a non-empty string such as 'pypi.org' or '*.github.com:443', not {value!r}",
            operation=op,
            hint="write a rule as allow_hosts takes it: HOST[:PORT]",
        )
    return value


def port(value: object, what: str, op: str, low: int = 1) -> int:
    """A TCP port number (``low`` 0: 0 picks a free one)."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= 65535:
        raise SandboxError(
            f"{what} must be a TCP port number, got {value!r}",
            operation=op,
            hint="ports are 1-65535 (host_port 0 picks a free one)",
        )
    return value


def signal(value: object, op: str) -> int:
    """A signal number, or a name ("SIGTERM", "TERM")."""
    import signal as _signal

    if isinstance(value, str):
        try:
            return int(_signal.Signals[value if value.startswith("SIG") else f"SIG{value}"])
        except KeyError:
            pass
    elif not isinstance(value, bool) and isinstance(value, int) and 1 <= value < _signal.NSIG:
        return value
    raise SandboxError(
        f"signal must be a name or a number 1-{_signal.NSIG - 1}, not {value!r}",
        operation=op,
        hint="e.g. SIGTERM, SIGKILL, 15",
    )


def path(value: object, op: str) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value or "\x00" in value:
        raise SandboxFileError(
            f"path must be a non-empty string without NUL, not {value!r}",
            operation=op,
            hint="pass a str path",
        )
    try:
        encoded = value.encode()
    except UnicodeEncodeError:
        raise SandboxFileError(
            f"path {value!r} is not valid UTF-8",
            operation=op,
            hint="file paths cross to the sandbox as UTF-8 text; rename the file",
        ) from None
    if len(encoded) >= 4096:
        raise SandboxFileError(
            "path too long", operation=op, path=value[:100], errno=36, hint="at most 4095 bytes"
        )
    return value


def mode(value: object, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise SandboxFileError(
            f"mode must be an int such as 0o644, not {value!r}",
            operation=op,
            hint='write permissions in octal: mode=0o755 (the string "755" would be ambiguous)',
        )
    if not 0 <= value <= 0o1777:
        raise SandboxFileError(
            f"mode {value:#o} is not allowed",
            operation=op,
            hint="permission bits and the sticky bit only (no setuid/setgid): 0 to 0o1777",
        )
    return value


def spec_of(policy: object) -> PolicySpec:
    from ..policy import Policy, PolicySpec  # only creating a sandbox needs the policy

    if policy is None:
        return PolicySpec()
    if isinstance(policy, Policy):
        if policy.spec.workspace is None:
            # Made by hand, not by ``build``: the supervisor resolves a sandbox's policy
            # from the spec, and this one's is empty, so its fields would be dropped
            # (a sandbox on the caller's directory, not on the workspace it names).
            raise PolicyError(
                f"a Policy made by hand cannot start a sandbox (workspace {policy.workspace}): "
                "the supervisor resolves the policy from the spec it was built from, and this one has none",
                operation="policy",
                path=str(policy.workspace),
                hint=f'pass PolicySpec(workspace="{policy.workspace}", ...), or a Policy from '
                "warren.build(PolicySpec(...))",
            )
        return policy.spec
    if isinstance(policy, PolicySpec):
        return policy
    raise PolicyError(
        f"policy must be a PolicySpec (or a Policy from warren.build), not {type(policy).__name__}",
        operation="policy",
        hint='pass e.g. PolicySpec(workspace="/path", presets=["python"])',
    )


def caller_cwd(workspace: str | None) -> str:
    """The caller's working directory, which a sandbox's workspace and relative paths
    default to. Removed under the caller's shell (``rm -rf`` of the directory it is in),
    an absolute ``workspace`` asked for stands in for it; without one, ``CwdNotFound``
    names the directory that was there."""
    try:
        return os.getcwd()
    except FileNotFoundError:
        pass
    if workspace and os.path.isabs(workspace):
        return workspace
    try:
        gone = os.readlink("/proc/self/cwd").removesuffix(" (deleted)")
    except OSError:
        gone = "(unknown)"
    raise CwdNotFound(
        f"your current directory was removed: {gone}",
        operation="getcwd",
        path=gone,
        hint="cd into a directory that exists (the workspace is the current directory unless "
        "--workspace names one), or pass --workspace /ABSOLUTE/DIR",
    )
