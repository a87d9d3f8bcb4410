"""Server-sent events: the frame, the choice (``Accept: text/event-stream``), and a
command's output streamed as it comes, ending with ``exit`` (its result) or ``error``.
``client.http.events`` reads the same frames."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from .. import codec
from ..errors import WarrenError
from .core import Service
from .status import error_body, internal_error

OutputFeeds = Callable[[Callable[[bytes], None], Callable[[bytes], None]], Any]


def sse(event: str, data: object, event_id: str | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def chunk(data: bytes) -> dict[str, str]:
    return {"data": base64.b64encode(data).decode()}


def wants_sse(request: Request) -> bool:
    return "text/event-stream" in request.headers.get("accept", "")


def event_stream(events: AsyncIterator[bytes]) -> Response:
    return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def streamed(service: Service, start: OutputFeeds) -> Response:
    """SSE of a command's output as it comes, then ``exit`` (or ``error``). ``start``
    runs the command (in a worker thread) with a callback for stdout and one for
    stderr."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

    def feed(kind: str) -> Callable[[bytes], None]:
        def put(data: bytes) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, data))

        return put

    task = asyncio.ensure_future(service.call(start, feed("stdout"), feed("stderr")))
    task.add_done_callback(lambda _: queue.put_nowait(("done", None)))

    async def events() -> AsyncIterator[bytes]:
        while True:
            kind, data = await queue.get()
            if kind != "done":
                yield sse(kind, chunk(data))
                continue
            error = task.exception()
            if isinstance(error, WarrenError):
                yield sse("error", error_body(error))
            elif error is not None:
                yield sse("error", error_body(internal_error(error)))
            else:
                yield sse("exit", codec.result(task.result()))
            return

    return event_stream(events())
