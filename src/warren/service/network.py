"""Handlers of API v1 for a sandbox's network: forward a host port into it (list and
close the forwards), the proxy's decisions (``--network allow``), its live policy
(allow, deny) and the answers to ``--network ask``, whose waiting requests are also a
stream of server-sent events (``pending``, then ``ended`` once answered or timed out)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .. import codec
from ..client import checks
from ..errors import WarrenError
from . import fields
from .body import json_body, name_of
from .core import Service
from .sse import event_stream, sse, wants_sse
from .status import HttpError, bad_request, error_body

PENDING_POLL = 0.25  # seconds between two looks at the waiting requests, for a stream
KEEP_ALIVE = 60  # polls between two comment lines of an idle stream (what proxies wait for)


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


async def net_policy(svc: Service, request: Request) -> Response:
    """The policy now; with ``Accept: text/event-stream``, the waiting requests as events."""
    name = name_of(request)
    if wants_sse(request):
        await svc.call(svc.transport.net_policy, name, "show", via="http")  # refused here, not in the stream
        return event_stream(_pending_events(svc, name))
    return JSONResponse(codec.encode(await svc.call(svc.transport.net_policy, name, "show", via="http")))


async def net_change(svc: Service, request: Request) -> Response:
    name = name_of(request)
    data = await json_body(request, fields.NET_CHANGE, empty_ok=False)
    action, rule = data["action"], data["rule"]
    if action not in ("allow", "deny") or not isinstance(rule, str):
        raise HttpError(
            400,
            "action must be allow or deny and rule a string",
            hint='{"action": "allow", "rule": "pypi.org"}',
        )
    policy = await svc.call(svc.transport.net_policy, name, action, rule=rule, via="http")
    return JSONResponse(codec.encode(policy))


async def net_answer(svc: Service, request: Request) -> Response:
    name = name_of(request)
    raw = request.path_params["request"]
    if not raw.isdigit():
        raise HttpError(
            400, f"request id {raw[:40]!r} is not a number", hint="ids are those GET network lists"
        )
    data = await json_body(request, fields.NET_ANSWER, empty_ok=False)
    action, always = data["action"], data.get("always", False)
    if action not in ("approve", "reject") or not isinstance(always, bool):
        raise HttpError(
            400, "action must be approve or reject and always true or false", hint='{"action": "approve"}'
        )
    policy = await svc.call(
        svc.transport.net_policy, name, action, request_id=int(raw), always=always, via="http"
    )
    return JSONResponse(codec.encode(policy))


async def _pending_events(svc: Service, name: str) -> AsyncIterator[bytes]:
    """``pending`` for each request that starts to wait, ``ended`` when it no longer does;
    ``error`` (and the end) when the sandbox is gone."""
    known: set[int] = set()
    for poll in itertools.count(1):
        try:
            policy = await svc.call(svc.transport.net_policy, name, "pending", via="http")
        except WarrenError as e:
            yield sse("error", error_body(e))
            return
        now = {p.id for p in policy.pending}
        for p in policy.pending:
            if p.id not in known:
                yield sse("pending", codec.encode(p), str(p.id))
        for gone in sorted(known - now):
            yield sse("ended", {"id": gone})
        known = now
        if poll % KEEP_ALIVE == 0:
            yield b": waiting\n\n"
        await asyncio.sleep(PENDING_POLL)
