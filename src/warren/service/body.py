"""Reading a request: its body within a size bound, a JSON body against its table
(``fields``), query flags and integers, the sandbox name and paths, a command's
arguments. Every refusal is an ``HttpError`` 400/413, or a ``client.checks`` error
marked as the request's fault (``status.bad_request``), naming the key.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request

from .. import wire
from ..client import checks
from ..client.transport import Command
from ..names import check_name
from ..output import DEFAULT_OUTPUT_LIMIT
from .fields import Body
from .status import HttpError, bad_request

MAX_JSON = 16 * 1024 * 1024
MAX_FILE = wire.MAX_PAYLOAD


async def body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise HttpError(
            413, f"request body of {declared} bytes is over the limit of {limit}", hint=_big(limit)
        )
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(413, f"request body is over the limit of {limit} bytes", hint=_big(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _big(limit: int) -> str:
    return f"send at most {limit} bytes per request (large files: write them in parts with append)"


async def json_body(request: Request, table: Body, empty_ok: bool = True) -> dict[str, Any]:
    """The request's JSON object with only the keys of ``table``, and all it requires;
    an empty body is ``{}`` when ``empty_ok``."""
    raw = await body(request, MAX_JSON)
    if not raw and not empty_ok:
        raise HttpError(
            400,
            "request body is empty",
            hint='send a JSON object, e.g. {"workspace": "/path"} (without one the sandbox would '
            "get the service's working directory)",
        )
    try:
        data = json.loads(raw or b"{}")
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, f"request body is not valid JSON: {e}", hint="send a JSON object") from None
    if not isinstance(data, dict):
        raise HttpError(400, "request body must be a JSON object", hint="send a JSON object {...}")
    for key in data:
        if key not in table.fields:
            raise HttpError(
                400,
                f"unknown key {key!r} in request body",
                hint=f"known keys: {', '.join(sorted(table.fields))}",
            )
    for key in table.required:
        if key not in data:
            raise HttpError(400, f"request body lacks {key!r}", hint=f"{key}: {table.fields[key].hint}")
    return data


def _stdin(data: Mapping[str, Any]) -> bytes | None:
    value = data.get("stdin")
    if value is None:
        return None
    if not isinstance(value, str):
        raise HttpError(400, "stdin must be a string", hint='text, or base64 with "stdin_encoding": "base64"')
    if data.get("stdin_encoding") == "base64":
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise HttpError(400, "stdin is not valid base64", hint="encode with standard base64") from None
    return value.encode()


def stdin_json(data: Mapping[str, Any]) -> tuple[bytes, bool]:
    """(data, eof) of a JSON body for a process's stdin."""
    text, encoding, eof = data.get("data", ""), data.get("encoding", "utf-8"), data.get("eof", False)
    if not isinstance(text, str):
        raise HttpError(400, "data must be a string", hint='text, or base64 with "encoding": "base64"')
    if encoding not in ("utf-8", "base64"):
        raise HttpError(
            400,
            f"encoding must be 'utf-8' or 'base64', not {encoding!r}",
            hint="other bytes: base64, or a raw body with Content-Type application/octet-stream",
        )
    if not isinstance(eof, bool):
        raise HttpError(400, f"eof must be true or false, not {eof!r}", hint="true closes stdin after data")
    if encoding == "utf-8":
        return text.encode(), eof
    try:
        return base64.b64decode(text, validate=True), eof
    except ValueError:
        raise HttpError(400, "data is not valid base64", hint="encode with standard base64") from None


def int_field(value: object, what: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"{what} must be an integer, not {value!r}", hint=f"pass e.g. {default}")
    return value


def query_int(request: Request, key: str, default: int) -> int:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > checks.MAX_OFFSET:
        raise HttpError(
            400, f"query parameter {key}={raw[:40]!r} must be an integer from 0 to {checks.MAX_OFFSET}"
        )
    return int(raw)


def offsets(out: int, err: int) -> tuple[int, int]:
    with bad_request():
        return checks.offset(out, "offset", "process"), checks.offset(err, "stderr_offset", "process")


def command_of(data: Mapping[str, Any], op: str) -> Command:
    """The command of a run, exec or spawn request from its body."""
    limit = int_field(data.get("output_limit"), "output_limit", DEFAULT_OUTPUT_LIMIT)
    cwd, env, timeout = data.get("cwd"), data.get("env"), data.get("timeout")
    return Command.checked(op, data["argv"], cwd, env, _stdin(data), timeout, limit)


def flag(request: Request, key: str, default: bool = False) -> bool:
    raw = request.query_params.get(key)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("", "0", "false", "no"):
        return False
    raise HttpError(400, f"query parameter {key}={raw[:40]!r} must be true or false", hint=f"?{key}=true")


def name_of(request: Request) -> str:
    with bad_request():
        return check_name(request.path_params["name"])


def path_of(request: Request, key: str = "path", value: object = None) -> str:
    raw = request.query_params.get(key) if value is None else value
    if raw is None:
        raise HttpError(400, f"query parameter {key!r} is required", hint=f"add ?{key}=PATH")
    # ``..`` and symlinks are resolved by the kernel inside the sandbox (as for the SDK):
    # a path leads only where the sandbox's own view and policy let it.
    with bad_request():
        return checks.path(raw, "files")
