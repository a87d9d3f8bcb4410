"""Handlers of API v1 for review sandboxes (``create`` with ``"review": true``): the
changes (``diff``), writing them to the host workspace (``apply``) or dropping them
(``discard``), and the workspace's checkpoints (take, list, ``rollback``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..models import Checkpoint, Review
from . import fields
from .body import flag, json_body, name_of
from .core import Service
from .status import HttpError


def _review(review: Review) -> dict[str, Any]:
    return dataclasses.asdict(review)


def _checkpoint(point: Checkpoint) -> dict[str, Any]:
    return dataclasses.asdict(point)


async def diff(svc: Service, request: Request) -> Response:
    found = await svc.call(svc.transport.review, name_of(request), "diff", [], patch=flag(request, "patch"))
    return JSONResponse(_review(found))


async def apply(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.APPLY)
    paths = data.get("paths", [])
    force = data.get("force", False)
    if not isinstance(paths, list) or not all(isinstance(p, str) and p and "\0" not in p for p in paths):
        raise HttpError(400, "paths must be a list of paths relative to the workspace", path="paths")
    if not isinstance(force, bool):
        raise HttpError(400, "force must be true or false", path="force")
    done = await svc.call(svc.transport.review, name, "apply", paths, force=force)
    return JSONResponse(_review(done))


async def discard(svc: Service, request: Request) -> Response:
    await svc.call(svc.transport.review, name_of(request), "discard", [])
    return JSONResponse({})


async def take(svc: Service, request: Request) -> Response:
    taken = await svc.call(svc.transport.checkpoint, name_of(request), "take")
    return JSONResponse(_checkpoint(taken[0]), status_code=201)


async def listing(svc: Service, request: Request) -> Response:
    found = await svc.call(svc.transport.checkpoint, name_of(request), "list")
    return JSONResponse({"checkpoints": [_checkpoint(c) for c in found]})


async def rollback(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.ROLLBACK)
    ident = data.get("id") or 0
    keep = data.get("keep_running", False)
    if isinstance(ident, bool) or not isinstance(ident, int) or ident < 0:
        raise HttpError(400, "id must be a checkpoint's id (an integer; 0 or none: the last one)", path="id")
    if not isinstance(keep, bool):
        raise HttpError(400, "keep_running must be true or false", path="keep_running")
    back = await svc.call(svc.transport.checkpoint, name, "rollback", ident, keep)
    return JSONResponse(_checkpoint(back[0]))


_AT = "/v1/sandboxes/{name}"
# Listed in ``routes.ROUTES`` (one line there).
ROUTES = (
    (f"{_AT}/diff", "GET", diff),
    (f"{_AT}/apply", "POST", apply),
    (f"{_AT}/discard", "POST", discard),
    (f"{_AT}/checkpoints", "POST", take),
    (f"{_AT}/checkpoints", "GET", listing),
    (f"{_AT}/rollback", "POST", rollback),
)
