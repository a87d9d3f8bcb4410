"""What envd's services share: the sandbox a request names, warren's file operations on
it, and how any failure becomes a Connect error.

``envd`` (the REST routes and the ASGI apps), ``envd_process`` (``process.Process``)
and ``envd_filesystem`` (``filesystem.Filesystem``) each build on ``EnvdService``.
"""

from __future__ import annotations

import contextvars
import functools
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from protobuf import Oneof as _Oneof

from ..errors import SandboxFileError, SandboxNotFound, WarrenError
from ..models import FileOp, FileResult, SandboxInfo
from .core import Core, E2BError, message_of, status_of
from .records import Record

# The generated messages type each oneof case with its literal field name; one untyped
# constructor spares a cast per case (the message checks the field name when built).
Oneof: Callable[[str, object], Any] = _Oneof
POLL = 0.05
KEEPALIVE = 30.0

CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.FAILED_PRECONDITION,
    413: Code.RESOURCE_EXHAUSTED,
    422: Code.INVALID_ARGUMENT,
    429: Code.RESOURCE_EXHAUSTED,
    501: Code.UNIMPLEMENTED,
    504: Code.DEADLINE_EXCEEDED,
}


def connect_error(error: BaseException) -> ConnectError:
    if isinstance(error, ConnectError):
        return error
    if isinstance(error, SandboxFileError) and error.errno == 17:  # EEXIST
        return ConnectError(Code.ALREADY_EXISTS, message_of(error))
    if not isinstance(error, (E2BError, WarrenError)):
        traceback.print_exc(file=sys.stderr)
    return ConnectError(CODES.get(status_of(error), Code.INTERNAL), message_of(error))


class Cut:
    """Set when a stream must end as E2B's would when its sandbox goes away: the
    connection dropped, no end message (``front.Access`` does the dropping)."""

    def __init__(self) -> None:
        self.cut = False


CUT: contextvars.ContextVar[Cut | None] = contextvars.ContextVar("e2b_cut", default=None)


def sandbox_gone(sandbox_id: str) -> ConnectError:
    """The error for a stream whose sandbox was killed or reached its end under it: the
    connection is cut, so the SDK probes ``/health`` (502) and says the sandbox ended,
    as it does on E2B; a client that still gets an answer reads this one."""
    cut = CUT.get()
    if cut is not None:
        cut.cut = True
    return ConnectError(Code.UNAVAILABLE, f"the sandbox {sandbox_id!r} was not found: killed or past its end")


P = ParamSpec("P")
T = TypeVar("T")


def rpc(method: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """A unary Connect method whose every failure reaches the caller as a Connect error
    (``connect_error``). Streaming methods convert their own: they yield in between."""

    @functools.wraps(method)
    async def call(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except Exception as e:
            raise connect_error(e) from None

    return call


class EnvdService:
    """One of envd's services: the sandbox a request is for, and file operations on it."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def sandbox(self, headers: Any) -> tuple[SandboxInfo, Record]:
        sandbox_id = headers.get("e2b-sandbox-id") or ""
        try:
            info = await self.core.call(self.core.transport.get, sandbox_id)
        except SandboxNotFound:
            raise E2BError(404, f"sandbox {sandbox_id!r} not found") from None
        if info.state == "paused" and await self.core.call(self.core.wake, sandbox_id):
            info = await self.core.call(self.core.transport.get, sandbox_id)
        if info.state != "running":
            raise ConnectError(Code.UNAVAILABLE, f"sandbox {sandbox_id!r} is {info.state}, not running")
        return info, self.core.record_of(info)

    async def file(
        self, sandbox_id: str, op: str, path: str, data: bytes = b"", **extra: Any
    ) -> tuple[FileResult, bytes]:
        result = await self.core.call(
            self.core.transport.file, sandbox_id, FileOp(op=op, path=path, **extra), data
        )
        return result, result.data
