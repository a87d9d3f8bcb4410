"""The JSON forms of warren's values on the HTTP API, both ways: the service encodes,
the HTTP transport decodes, with the same functions. Standard library only.

Output bytes travel as UTF-8 text when they are valid UTF-8, else base64 with
``"<stream>_encoding": "base64"``; error bodies are
``{"error": {"type", "message", "path", "errno", "hint", "operation"}}`` where
``type`` is the ``WarrenError`` subclass, so the client raises the same type.
"""

from __future__ import annotations

import base64
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
    ProcessEnded,
    ProcessNotFound,
    ProtocolError,
    SandboxDead,
    SandboxExists,
    SandboxFileError,
    SandboxFileNotFound,
    SandboxNotFound,
    SandboxPaused,
    SandboxPermissionDenied,
    SandboxTimeout,
    StdinError,
    StdinFull,
    WarrenError,
    from_record,
    to_record,
)
from ..models import ProcessInfo, Result, SandboxInfo
from ..net.allowlist import NetEvent

# most specific first: the first class the error is an instance of decides
_STATUS: tuple[tuple[type[WarrenError], int], ...] = (
    (SandboxNotFound, 404),
    (SandboxFileNotFound, 404),
    (ProcessNotFound, 404),
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


def error_of(body: object, status: int) -> WarrenError:
    """The exception an error body stands for (the same class as on the server)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        record = dict(body["error"])
        record["kind"] = record.pop("type", "WarrenError")
        return from_record(record)
    return WarrenError(
        f"the service answered HTTP {status} without a warren error body",
        operation="http",
        hint="is the URL a `warren serve`? check WARREN_URL",
    )


def put_bytes(out: dict[str, Any], key: str, data: bytes) -> None:
    try:
        out[key] = data.decode()
        out[f"{key}_encoding"] = "utf-8"
    except UnicodeDecodeError:
        out[key] = base64.b64encode(data).decode()
        out[f"{key}_encoding"] = "base64"


def get_bytes(data: dict[str, Any], key: str) -> bytes:
    value = data.get(key) or ""
    if data.get(f"{key}_encoding") == "base64":
        return base64.b64decode(value)
    return str(value).encode()


def result(r: Result) -> dict[str, Any]:
    out: dict[str, Any] = {
        "exit_code": r.exit_code,
        "duration": r.duration,
        "truncated": r.stdout_truncated or r.stderr_truncated,
        "stdout_truncated": r.stdout_truncated,
        "stderr_truncated": r.stderr_truncated,
        "timed_out": r.timed_out,
        "limit": r.limit,
        "signal": r.signal,
        "warnings": list(r.warnings),
        "cwd": r.cwd,
        "net_log": [net_event(e) for e in r.net_log],
    }
    put_bytes(out, "stdout", r.stdout)
    put_bytes(out, "stderr", r.stderr)
    return out


def result_of(data: dict[str, Any]) -> Result:
    return Result(
        exit_code=int(data["exit_code"]),
        stdout=get_bytes(data, "stdout"),
        stderr=get_bytes(data, "stderr"),
        duration=float(data["duration"]),
        signal=data.get("signal"),
        timed_out=bool(data.get("timed_out")),
        limit=data.get("limit"),
        stdout_truncated=bool(data.get("stdout_truncated")),
        stderr_truncated=bool(data.get("stderr_truncated")),
        warnings=tuple(data.get("warnings") or ()),
        cwd=data.get("cwd"),
        net_log=tuple(NetEvent(**e) for e in data.get("net_log") or ()),
    )


def sandbox(info: SandboxInfo) -> dict[str, Any]:
    return {
        "name": info.name,
        "id": info.id,
        "state": info.state,
        "reason": info.reason,
        "workspace": info.workspace,
        "created": info.created,
        "warnings": list(info.warnings),
        "idle_timeout": info.idle_timeout,
        "last_active": info.last_active,
    }


def sandbox_of(data: dict[str, Any]) -> SandboxInfo:
    return SandboxInfo(
        name=data["name"],
        id=data["id"],
        state=data["state"],
        reason=data.get("reason", ""),
        workspace=data.get("workspace", ""),
        created=float(data.get("created", 0.0)),
        warnings=tuple(data.get("warnings") or ()),
        idle_timeout=data.get("idle_timeout"),
        last_active=float(data.get("last_active") or 0.0),
    )


def process(p: ProcessInfo) -> dict[str, Any]:
    return {"pid": p.pid, "ppid": p.ppid, "state": p.state, "argv": list(p.argv), "id": p.spawn_id}


def process_of(data: dict[str, Any]) -> ProcessInfo:
    return ProcessInfo(data["pid"], data["ppid"], data["state"], tuple(data["argv"]), data.get("id"))


def net_event(e: NetEvent) -> dict[str, Any]:
    return e.to_dict()
