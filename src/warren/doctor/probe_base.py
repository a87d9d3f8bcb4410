"""What every probe shares: the result record, the failure it raises, and the small
checked file operations probes are written with.

A probe is a function that works inside a scratch directory it was given and either
returns a short detail or raises ``ProbeFailure`` naming the step that failed;
``_result`` runs one and turns either outcome into a ``ProbeResult``. The filesystem
probes (``file_probes``), the workspace probes (``workspace_probes``) and the limit
probes (``limits``) are all written with these helpers. Standard library only.
"""

from __future__ import annotations

import errno as _errno
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class ProbeResult:
    id: str
    title: str
    location: str  # a role ("workspace", "cache", "tool-cache:uv", "tmpdir", "process") or "src->dst"
    status: str  # "pass", "fail", "skip", "error" (the probe itself crashed)
    required: bool  # does a developer tool need this to work?
    operation: str | None = None  # the step that failed: "rename", "link", "open", ...
    errno: int | None = None
    message: str = ""
    kind: str | None = None  # what the failed step moved or linked: "file" or "dir"
    src: str | None = None  # role of the source location of a step between two locations
    dst: str | None = None
    detail: str = ""
    # What a probe measured beyond pass or fail, as plain JSON values (the limit probes:
    # the cgroup it tried, the mechanism pause will use). Empty for filesystem probes.
    facts: dict[str, object] = field(default_factory=dict)

    @property
    def roles(self) -> tuple[str, ...]:
        return tuple(r for r in (self.src, self.dst) if r) or (self.location,)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


class ProbeFailure(Exception):
    """A step of a probe failed: an OSError, or a semantic check that did not hold."""

    def __init__(self, operation: str, message: str, err: int | None = None, kind: str | None = None):
        super().__init__(message)
        self.operation = operation
        self.message = message
        self.errno = err
        self.kind = kind


class ProbeSkipped(Exception):
    """The probe cannot run here (a tool is not installed); not a failure."""


def _op(operation: str, fn: Callable[..., T], *args: object, kind: str | None = None, **kw: object) -> T:
    try:
        return fn(*args, **kw)
    except OSError as e:
        raise ProbeFailure(operation, describe(e), e.errno, kind) from e


def describe(e: OSError) -> str:
    name = _errno.errorcode.get(e.errno or 0, str(e.errno))
    where = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
    return f"{name}: {e.strerror or e}" + (f" ({where})" if where else "")


def _check(ok: bool, operation: str, message: str) -> None:
    if not ok:
        raise ProbeFailure(operation, message)


def _write(path: str, data: bytes = b"warren-doctor\n") -> None:
    fd = _op("create", os.open, path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _op("write", os.write, fd, data)
    finally:
        os.close(fd)


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as e:
        raise ProbeFailure("open", describe(e), e.errno) from e


def _mkdirs(*paths: str) -> None:
    for p in paths:
        _op("mkdir", os.mkdir, p)


j = os.path.join


def _result(
    probe_id: str,
    title: str,
    location: str,
    required: bool,
    fn: Callable[[], str],
    src: str | None = None,
    dst: str | None = None,
) -> ProbeResult:
    base = ProbeResult(probe_id, title, location, "pass", required, src=src, dst=dst)
    try:
        detail = fn()
    except ProbeFailure as f:
        return replace(
            base, status="fail", operation=f.operation, errno=f.errno, message=f.message, kind=f.kind
        )
    except ProbeSkipped as s:
        return replace(base, status="skip", message=str(s))
    except Exception as e:  # a probe that crashes is reported, never raised
        return replace(base, status="error", message=f"{type(e).__name__}: {e}")
    return replace(base, detail=detail)
