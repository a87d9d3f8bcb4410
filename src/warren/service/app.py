"""The HTTP API v1 as a Starlette application over a ``Transport``.

Every route checks its input (unknown keys, types, sizes: ``body``, ``fields``) and
calls the same transport methods the SDK calls, in a worker thread (``core``): the
service adds no sandbox logic of its own, so a sandbox behaves the same from Python,
HTTP and MCP. The handlers are grouped by resource (``sandboxes``, ``processes``,
``files``, ``network``) and listed in ``routes``; errors are ``WarrenError``s turned
into ``status.error_body`` with ``status.status_of``.

Auth and the request log are one small ASGI wrapper (``guard.Guard``) around
everything, so nothing runs for a request without the token.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp

from ..client.transport import Transport
from .core import Service
from .guard import Guard
from .routes import routes
from .status import HttpError, error_body

__all__ = ["Service", "make_app", "routes"]


def make_app(
    transport: Transport,
    token: str | None,
    *,
    log: Callable[[str], None] | None = None,
    extra: list[BaseRoute] | None = None,
    lifespan: Any = None,
    hosts: frozenset[str] | None = None,
) -> ASGIApp:
    service = Service(transport)
    app = Starlette(routes=[*routes(service), *(extra or [])], lifespan=lifespan)

    async def not_found(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        error = HttpError(
            status, f"no route {request.method} {request.url.path}", hint="see GET /v1/openapi.json"
        )
        headers = getattr(exc, "headers", None) if status == 405 else None
        return JSONResponse(error_body(error), status_code=status, headers=headers)

    app.add_exception_handler(404, not_found)
    app.add_exception_handler(405, not_found)
    return Guard(app, token, log, hosts)
