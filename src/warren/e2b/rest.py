"""What the control plane's and envd's REST routes share: the ``{"code", "message"}``
answer E2B's SDK reads, a handler wrapped so that any error becomes one, and a request
body read within a limit (refused as it grows past it, never buffered whole first).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import WarrenError
from .core import E2BError, message_of, status_of

Handler = Callable[[Request], Awaitable[Response]]


def error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"code": status, "message": message}, status_code=status)


def handled(handler: Handler) -> Handler:
    """``handler``, answering E2B's error form for a refusal, and 500 (its traceback to
    stderr) for anything else."""

    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except (E2BError, WarrenError) as e:
            return error(status_of(e), message_of(e))
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return error(500, message_of(e))

    return route


async def body(request: Request, limit: int, over: str) -> bytes:
    """The request's body; ``E2BError(413, over)`` as soon as it passes ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise E2BError(413, over)
        chunks.append(chunk)
    return b"".join(chunks)
