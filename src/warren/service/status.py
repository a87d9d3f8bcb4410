"""How the service answers a failure: the HTTP status of each ``WarrenError`` and the
error body (``{"error": {"type", "message", "path", "errno", "hint", "operation"}}``,
``type`` the subclass, so the client raises the same type; ``warren.codec.error_of``
reads it back). ``HttpError`` is a refusal before warren sees the request (auth,
size, route). Standard library only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ..errors import (
    ConfigError,
    CwdNotFound,
    ExecError,
    FileTooLarge,
    LimitReached,
    PolicyError,
    PortNotForwarded,
    PortUnavailable,
    ProcessEnded,
    ProcessNotFound,
    ProtocolError,
    ReviewError,
    SandboxDead,
    SandboxExists,
    SandboxFileError,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxPaused,
    SandboxPermissionDenied,
    SandboxTimeout,
    SnapshotError,
    SnapshotNotFound,
    StdinError,
    StdinFull,
    WarrenError,
    to_record,
)

# most specific first: the first class the error is an instance of decides
_STATUS: tuple[tuple[type[WarrenError], int], ...] = (
    (SandboxNotFound, 404),
    (SnapshotNotFound, 404),
    (SnapshotError, 409),
    (ReviewError, 409),
    (SandboxFileNotFound, 404),
    (ProcessNotFound, 404),
    (PortNotForwarded, 404),
    (PortUnavailable, 409),
    (SandboxExists, 409),
    (SandboxDead, 409),
    (SandboxPaused, 409),
    (LimitReached, 429),
    (ProcessEnded, 409),
    (StdinFull, 413),
    (StdinError, 409),
    (SandboxPermissionDenied, 403),
    (FileTooLarge, 413),
    (SandboxTimeout, 504),
    (ConfigError, 400),
    (PolicyError, 400),
    (ProtocolError, 400),
    (CwdNotFound, 422),
    (ExecError, 422),
    (SandboxFileError, 400),
)


class HttpError(WarrenError):
    """A request the service refuses before warren sees it (auth, size, route)."""

    def __init__(self, status: int, message: str, *, hint: str = "", path: str | None = None) -> None:
        super().__init__(message, operation="http", hint=hint, path=path)
        self.status = status


def status_of(error: WarrenError) -> int:
    """``HttpError.status``, or a bad argument caught by the checks (``bad_request``), or
    the status of the error's class; anything else is warren's failure (500)."""
    status = getattr(error, "http_status", None)
    if isinstance(error, HttpError):
        return error.status
    if isinstance(status, int):
        return status
    for cls, status in _STATUS:
        if isinstance(error, cls):
            return status
    return 500


@contextlib.contextmanager
def bad_request() -> Iterator[None]:
    """Errors raised in this block are the request's fault: HTTP 400, same type."""
    try:
        yield
    except WarrenError as e:
        e.http_status = 400  # type: ignore[attr-defined]
        raise


def error_body(error: WarrenError) -> dict[str, Any]:
    record = to_record(error)
    kind = record.pop("kind")
    return {"error": {"type": "WarrenError" if isinstance(error, HttpError) else kind, **record}}


def internal_error(error: BaseException) -> WarrenError:
    """What the caller is told of a failure that is not a ``WarrenError`` (a bug)."""
    return WarrenError(
        f"internal error: {type(error).__name__}: {error}",
        operation="http",
        hint="this is a bug in warren; the service log has the traceback",
    )
