"""Handlers of API v1 for a sandbox's network: forward a host port into it (list and
close the forwards), and the proxy's decisions (``--network allow``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import codec
from ..client import checks
from . import fields
from .body import json_body, name_of
from .core import Service
from .status import bad_request


async def expose(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.EXPOSE)
    host_port = data.get("host_port")
    with bad_request():
        port = checks.port(data["port"], "port", "expose")
        host_port = checks.port(0 if host_port is None else host_port, "host_port", "expose", 0)
    address = await svc.call(svc.transport.expose, name, port, host_port)
    return JSONResponse({"address": address}, status_code=201)


async def ports(svc: Service, request: Request) -> Response:
    exposed = await svc.call(svc.transport.exposed, name_of(request))
    return JSONResponse({"ports": [{"port": p, "address": a} for p, a in sorted(exposed.items())]})


async def close_port(svc: Service, request: Request) -> Response:
    name = name_of(request)
    with bad_request():
        port = checks.port(_int(request.path_params["port"]), "port", "unexpose")
    await svc.call(svc.transport.unexpose, name, port)
    return JSONResponse({})


def _int(text: str) -> int | str:
    return int(text) if text.isdigit() else text  # not digits: checks.port names it


async def net_log(svc: Service, request: Request) -> Response:
    events = await svc.call(svc.transport.net_log, name_of(request))
    return JSONResponse({"events": [codec.encode(e) for e in events]})
