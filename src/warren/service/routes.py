"""The route table of API v1 — (path, method, handler) — and how a handler is
called: bound to the ``Service``, its ``WarrenError`` turned into the error body and
status (``status``), anything else into a 500 with the traceback in the log.
``openapi`` describes exactly these routes."""

from __future__ import annotations

import functools
import sys
import traceback
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import WarrenError
from . import events, files, network, processes, review, sandboxes
from .core import Service
from .status import error_body, internal_error, status_of

Handler = Callable[[Request], Awaitable[Response]]
ServiceHandler = Callable[[Service, Request], Awaitable[Response]]

SANDBOX = "/v1/sandboxes/{name}"
ROUTES: tuple[tuple[str, str, ServiceHandler], ...] = (
    ("/v1/health", "GET", sandboxes.health),
    ("/v1/openapi.json", "GET", sandboxes.openapi),
    ("/v1/run", "POST", sandboxes.run),
    ("/v1/sandboxes", "POST", sandboxes.create),
    ("/v1/sandboxes", "GET", sandboxes.list_all),
    (SANDBOX, "GET", sandboxes.get),
    (SANDBOX, "DELETE", sandboxes.delete),
    (f"{SANDBOX}/exec", "POST", sandboxes.exec_),
    (f"{SANDBOX}/processes", "POST", processes.spawn),
    (f"{SANDBOX}/processes", "GET", processes.list_all),
    (f"{SANDBOX}/processes/{{id}}", "GET", processes.get),
    (f"{SANDBOX}/processes/{{id}}/output", "GET", processes.output),
    (f"{SANDBOX}/processes/{{id}}/signal", "POST", processes.signal),
    (f"{SANDBOX}/processes/{{id}}/stdin", "POST", processes.stdin),
    (f"{SANDBOX}/files", "GET", files.get),
    (f"{SANDBOX}/files", "PUT", files.put),
    (f"{SANDBOX}/files", "DELETE", files.delete),
    (f"{SANDBOX}/files/stat", "GET", files.stat),
    (f"{SANDBOX}/files/mkdir", "POST", files.mkdir),
    (f"{SANDBOX}/files/move", "POST", files.move),
    (f"{SANDBOX}/ports", "POST", network.expose),
    (f"{SANDBOX}/ports", "GET", network.ports),
    (f"{SANDBOX}/ports/{{port}}", "DELETE", network.close_port),
    (f"{SANDBOX}/spawns", "GET", processes.spawns),
    (f"{SANDBOX}/netlog", "GET", network.net_log),
    (f"{SANDBOX}/events", "GET", events.events),
    (f"{SANDBOX}/network", "GET", network.net_policy),
    (f"{SANDBOX}/network", "POST", network.net_change),
    (f"{SANDBOX}/network/pending/{{request}}", "POST", network.net_answer),
    (f"{SANDBOX}/stats", "GET", sandboxes.stats),
    (f"{SANDBOX}/pause", "POST", sandboxes.pause),
    (f"{SANDBOX}/resume", "POST", sandboxes.resume),
    (f"{SANDBOX}/snapshot", "POST", sandboxes.snapshot),
    *review.ROUTES,
    ("/v1/snapshots", "GET", sandboxes.snapshots),
    ("/v1/snapshots/{id}", "DELETE", sandboxes.remove_snapshot),
)


def _wrap(handler: Handler) -> Handler:
    async def route(request: Request) -> Response:
        try:
            return await handler(request)
        except WarrenError as e:
            return JSONResponse(error_body(e), status_code=status_of(e))
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            return JSONResponse(error_body(internal_error(e)), status_code=500)

    return route


def routes(service: Service) -> list[Route]:
    by_path: dict[str, dict[str, Handler]] = {}
    for path, method, handler in ROUTES:
        by_path.setdefault(path, {})[method] = _wrap(functools.partial(handler, service))
    return [Route(path, _dispatch(methods), methods=list(methods)) for path, methods in by_path.items()]


def _dispatch(methods: dict[str, Handler]) -> Handler:
    async def route(request: Request) -> Response:
        return await methods[request.method](request)

    return route
