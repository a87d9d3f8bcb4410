"""``GET /v1/sandboxes/{name}/events``: a sandbox's trail (``server.trail``) after a
cursor, as one JSON page; with ``Accept: text/event-stream``, followed: each record an
SSE ``record`` event as it comes (its ``id`` the cursor to resume from), then ``end``
once the sandbox has ended."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..client.transport import EventPage
from .body import name_of
from .core import Service
from .sse import event_stream, sse, wants_sse
from .status import HttpError

POLL = 0.25  # seconds between looks while following


def _cursor(request: Request) -> tuple[str, int]:
    after = request.query_params.get("after", "")
    skip = request.query_params.get("skip", "0")
    if not skip.isdigit() or len(after) > 64:
        raise HttpError(
            400, "after must be a record's time and skip a count", hint="pass back a page's after and skip"
        )
    return after, int(skip)


async def events(svc: Service, request: Request) -> Response:
    name = name_of(request)
    after, skip = _cursor(request)
    if not wants_sse(request):
        page: EventPage = await svc.call(svc.transport.events, name, after, skip)
        body = {
            "records": list(page.records),
            "after": page.after,
            "skip": page.skip,
            "running": page.running,
        }
        return JSONResponse(body)
    first: EventPage = await svc.call(svc.transport.events, name, after, skip)  # an unknown name: 404 now

    async def follow() -> AsyncIterator[bytes]:
        page = first
        while True:
            for record in page.records:
                yield sse("record", record)
            if page.records:
                yield sse("cursor", {"after": page.after, "skip": page.skip}, f"{page.after}/{page.skip}")
            elif not page.running:
                yield sse("end", {})
                return
            else:
                await asyncio.sleep(POLL)
            page = await svc.call(svc.transport.events, name, page.after, page.skip)

    return event_stream(follow())
