"""Handlers of API v1 for sandboxes as a whole: the one-shot run, create, list, get,
stop/remove, exec, pause/resume, stats — and the service's own health and OpenAPI
document. Each checks its input and calls the ``Transport`` method the SDK calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import codec
from ..client.transport import Command, OutputCallback
from ..models import Result
from ..names import check_name
from ..policy.spec import from_mapping
from . import fields
from .body import command_of, flag, json_body, name_of
from .core import Service
from .sse import streamed, wants_sse
from .status import HttpError, bad_request


async def health(svc: Service, request: Request) -> Response:
    from ..extras import version

    return JSONResponse({"status": "ok", "version": version(), "api": "v1"})


async def openapi(svc: Service, request: Request) -> Response:
    from .openapi import document

    return JSONResponse(document())


async def run(svc: Service, request: Request) -> Response:
    data = await json_body(request, fields.RUN)
    with bad_request():
        spec = from_mapping(data.get("policy") or {}, "request policy")
        command = command_of(data, "run")
    return await _answer(
        svc, request, command, lambda c: svc.transport.run(spec, c, config=False, profile=None)
    )


async def _answer(
    svc: Service, request: Request, command: Command, call: Callable[[Command], Result]
) -> Response:
    """A command's result: its output as server-sent events as it comes when the
    client asks for them, else the result as one JSON object at the end."""

    def start(on_stdout: OutputCallback, on_stderr: OutputCallback) -> Result:
        return call(dataclasses.replace(command, on_stdout=on_stdout, on_stderr=on_stderr))

    if wants_sse(request):
        return streamed(svc, start)
    return JSONResponse(codec.result(await svc.call(start, None, None)))


async def create(svc: Service, request: Request) -> Response:
    data = await json_body(request, fields.CREATE, empty_ok=False)
    name = data.pop("name", None)
    if name is None:
        import uuid

        name = f"sb-{uuid.uuid4().hex[:10]}"
    if not isinstance(name, str):
        raise HttpError(400, "name must be a string", hint="letters, digits, '-', '_', '.'")
    with bad_request():
        spec = from_mapping(data, "request body")
        name = check_name(name)
    info = await svc.call(svc.transport.create, spec, name, config=False, profile=None)
    return JSONResponse(codec.encode(info), status_code=201)


async def list_all(svc: Service, request: Request) -> Response:
    items = await svc.call(svc.transport.list)
    return JSONResponse({"sandboxes": [codec.encode(i) for i in items]})


async def get(svc: Service, request: Request) -> Response:
    return JSONResponse(codec.encode(await svc.call(svc.transport.get, name_of(request))))


async def delete(svc: Service, request: Request) -> Response:
    name, remove = name_of(request), flag(request, "remove", True)
    info = await svc.call(svc.transport.stop, name, remove=remove)
    return JSONResponse(codec.encode(info))


async def exec_(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.EXEC)
    with bad_request():
        command = command_of(data, "exec")
    return await _answer(svc, request, command, lambda c: svc.transport.exec(name, c))


async def stats(svc: Service, request: Request) -> Response:
    return JSONResponse(codec.encode(await svc.call(svc.transport.stats, name_of(request))))


async def pause(svc: Service, request: Request) -> Response:
    return JSONResponse(codec.encode(await svc.call(svc.transport.pause, name_of(request), True)))


async def resume(svc: Service, request: Request) -> Response:
    return JSONResponse(codec.encode(await svc.call(svc.transport.pause, name_of(request), False)))


async def snapshot(svc: Service, request: Request) -> Response:
    snap = await svc.call(svc.transport.snapshot, name_of(request))
    return JSONResponse(codec.encode(snap), status_code=201)


async def snapshots(svc: Service, request: Request) -> Response:
    items = await svc.call(svc.transport.snapshots)
    return JSONResponse({"snapshots": [codec.encode(s) for s in items]})


async def remove_snapshot(svc: Service, request: Request) -> Response:
    snap_id = request.path_params["id"]
    return JSONResponse(codec.encode(await svc.call(svc.transport.remove_snapshot, snap_id)))
