"""Checks of what a caller passes to the public API, before anything is sent: a bad
argument is a typed error naming it, never a traceback from deep inside."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence

from ..errors import ExecError, PolicyError, SandboxFileError
from ..policy import Policy, PolicySpec


def argv(cmd: object, op: str) -> list[str]:
    if isinstance(cmd, (str, bytes)) or not isinstance(cmd, Sequence) or not cmd:
        raise ExecError(
            "argv must be a non-empty list of strings, not one string",
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


def timeout(value: object, op: str) -> float | None:
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ExecError(
            f"timeout must be a positive number of seconds, not {value!r}",
            operation=op,
            hint="pass e.g. timeout=30, or None for no limit",
        )
    return float(value)


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


def limit(value: object, op: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ExecError(
            f"output_limit must be a byte count, not {value!r}", operation=op, hint="pass e.g. 1 << 20"
        )
    return value


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
    if policy is None:
        return PolicySpec()
    if isinstance(policy, Policy):
        return policy.spec
    if isinstance(policy, PolicySpec):
        return policy
    raise PolicyError(
        f"policy must be a PolicySpec (or a Policy from warren.build), not {type(policy).__name__}",
        operation="policy",
        hint='pass e.g. PolicySpec(workspace="/path", presets=["python"])',
    )
