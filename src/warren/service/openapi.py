"""The OpenAPI 3.1 document of API v1, built from what the service itself runs on:
the route table (``routes.ROUTES``: every route is described, a description without
a route fails the build), the request-body tables the handlers validate with
(``fields``), and the models the responses are encoded from (``warren.models`` via
``codec.wire_fields``). Only what the tables do not say is written here — summaries,
status codes, query parameters, a few enums and descriptions of response fields — and
a schemathesis run (tests/test_service_schema.py) checks that the server keeps to it.
Every bound is stated from the constants the checks use (``client.checks``)."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from .. import codec
from ..client import checks
from ..models import (
    Change,
    Checkpoint,
    FileInfo,
    NetPending,
    NetPolicy,
    ProcessInfo,
    Result,
    SandboxInfo,
    SnapshotInfo,
    SpawnInfo,
    Stats,
)
from ..net.allowlist import NetEvent
from .fields import BODIES, BOOL, ENCODING, INT, NAME_PATTERN, PATH_TEXT, STR, STRS, closed_object, ref
from .routes import ROUTES

_SCALARS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _type_schema(kind: Any) -> dict[str, Any]:
    """The JSON schema of a model field's type (the subset models use)."""
    if isinstance(kind, types.UnionType):
        (inner,) = (k for k in typing.get_args(kind) if k is not type(None))
        return {"type": [_SCALARS[inner], "null"]}
    if typing.get_origin(kind) is tuple:
        item = typing.get_args(kind)[0]
        return {
            "type": "array",
            "items": ref(item.__name__)
            if isinstance(item, type) and dataclasses.is_dataclass(item)
            else _type_schema(item),
        }
    if kind is bytes:  # output: UTF-8 text, or base64 per <field>_encoding
        return STR
    return {"type": _SCALARS[kind]}


def model_schema(
    model: type,
    *,
    required: tuple[str, ...] = (),
    override: dict[str, dict[str, Any]] | None = None,
    extra: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A response's schema from its model's fields as ``codec`` encodes them;
    ``override`` refines a field (an enum), ``extra`` adds what the encoder adds."""
    props: dict[str, Any] = {}
    for wire, _field, kind in codec.wire_fields(model):
        props[wire] = (override or {}).get(wire) or _type_schema(kind)
        if kind is bytes:
            props[f"{wire}_encoding"] = ENCODING
    props.update(extra or {})
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = list(required)
    return out


SCHEMAS: dict[str, Any] = {
    "Error": closed_object(
        {
            "error": closed_object(
                {
                    "type": STR,
                    "message": STR,
                    "operation": STR,
                    "path": {"type": ["string", "null"]},
                    "errno": {"type": ["integer", "null"]},
                    "hint": STR,
                },
                ("type", "message", "path", "errno", "hint"),
            )
        },
        ("error",),
    ),
    **{name: body.schema() for name, body in BODIES.items()},
    "StdinState": {
        "type": "object",
        "properties": {
            "queued": {
                "type": "integer",
                "description": "bytes waiting in warren for the process to read (beyond its pipe)",
            },
            "closed": BOOL,
        },
        "required": ["queued", "closed"],
    },
    "Result": model_schema(
        Result,
        required=("exit_code", "stdout", "stderr", "duration", "truncated"),
        extra={"truncated": BOOL},
    ),
    "NetEvent": model_schema(NetEvent),
    "NetPending": model_schema(NetPending),
    "NetPolicy": model_schema(NetPolicy),
    "Sandbox": model_schema(
        SandboxInfo,
        required=("name", "id", "state"),
        override={
            "state": {
                "type": "string",
                "enum": ["running", "paused", "stopping", "stopped", "dead", "removed"],
                "description": "removed: the answer of DELETE when the sandbox is gone",
            }
        },
    ),
    "SandboxList": {
        "type": "object",
        "properties": {"sandboxes": {"type": "array", "items": ref("Sandbox")}},
    },
    "Process": model_schema(ProcessInfo),
    "ProcessList": {
        "type": "object",
        "properties": {"processes": {"type": "array", "items": ref("Process")}},
    },
    "Started": {"type": "object", "properties": {"id": STR, "pid": INT}, "required": ["id", "pid"]},
    "SpawnRecord": model_schema(SpawnInfo),
    "SpawnList": {
        "type": "object",
        "properties": {"spawns": {"type": "array", "items": ref("SpawnRecord")}},
    },
    "ProcessState": {
        "type": "object",
        "properties": {
            "pid": INT,
            "argv": STRS,
            "running": BOOL,
            "exit_code": {"type": ["integer", "null"]},
            "timed_out": BOOL,
            "limit": {"type": ["string", "null"]},
            "stdout": STR,
            "stderr": STR,
            "next_offset": INT,
            "next_stderr_offset": INT,
        },
    },
    "FileInfo": model_schema(
        FileInfo, override={"type": {"type": "string", "enum": ["file", "dir", "symlink", "other"]}}
    ),
    "Listing": {
        "type": "object",
        "properties": {"path": STR, "entries": {"type": "array", "items": ref("FileInfo")}},
    },
    "Exposed": {"type": "object", "properties": {"address": STR}},
    "PortList": {
        "type": "object",
        "properties": {
            "ports": {
                "type": "array",
                "items": {"type": "object", "properties": {"port": INT, "address": STR}},
            }
        },
    },
    "NetLog": {"type": "object", "properties": {"events": {"type": "array", "items": ref("NetEvent")}}},
    "Events": {
        "type": "object",
        "properties": {
            "records": {"type": "array", "items": {"type": "object"}},
            "after": STR,
            "skip": INT,
            "running": {"type": "boolean"},
        },
    },
    "Ok": {"type": "object"},
    "Stats": model_schema(Stats),
    "Snapshot": model_schema(SnapshotInfo),
    "SnapshotList": {
        "type": "object",
        "properties": {"snapshots": {"type": "array", "items": ref("Snapshot")}},
    },
    "Change": model_schema(Change),
    "Review": {
        "type": "object",
        "properties": {
            "changes": {"type": "array", "items": ref("Change")},
            "patch": STR,
            "applied": {"type": "array", "items": STR},
        },
    },
    "Checkpoint": model_schema(Checkpoint),
    "CheckpointList": {
        "type": "object",
        "properties": {"checkpoints": {"type": "array", "items": ref("Checkpoint")}},
    },
}

NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "pattern": NAME_PATTERN}}
ID = {
    "name": "id",
    "in": "path",
    "required": True,
    "schema": STR,
    "description": "process id from POST processes",
}
PORT = {
    "name": "port",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1, "maximum": 65535},
    "description": "the sandbox's port (as forwarded with POST ports)",
}
REQUEST = {
    "name": "request",
    "in": "path",
    "required": True,
    "schema": {"type": "integer", "minimum": 1},
    "description": "a waiting connection's request id (from GET network)",
}
PATHQ = {"name": "path", "in": "query", "required": True, "schema": PATH_TEXT}
FLAG: dict[str, Any] = {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"]}
OFFSET: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": checks.MAX_OFFSET}


def _q(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


SSE = {"text/event-stream": {"schema": STR}}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": ref(name)}}


# (path, method) -> summary, request body schema, success status, success content, extra params
OPS: dict[tuple[str, str], tuple[str, dict[str, Any] | None, int, dict[str, Any], list[dict[str, Any]]]] = {
    ("/v1/health", "GET"): (
        "Liveness and version",
        None,
        200,
        {"application/json": {"schema": {"type": "object"}}},
        [],
    ),
    ("/v1/openapi.json", "GET"): (
        "This document",
        None,
        200,
        {"application/json": {"schema": {"type": "object"}}},
        [],
    ),
    ("/v1/run", "POST"): (
        "Run a command in a fresh one-shot sandbox (SSE with Accept: text/event-stream)",
        _json("Run"),
        200,
        {**_json("Result"), **SSE},
        [],
    ),
    ("/v1/sandboxes", "POST"): (
        "Create a sandbox from a policy spec",
        _json("CreateSandbox"),
        201,
        _json("Sandbox"),
        [],
    ),
    ("/v1/sandboxes", "GET"): ("Every sandbox of this user", None, 200, _json("SandboxList"), []),
    ("/v1/sandboxes/{name}", "GET"): ("One sandbox", None, 200, _json("Sandbox"), []),
    ("/v1/sandboxes/{name}", "DELETE"): (
        "Stop and remove a sandbox (?remove=false: only stop)",
        None,
        200,
        _json("Sandbox"),
        [_q("remove", FLAG, "default true; false: only stop")],
    ),
    ("/v1/sandboxes/{name}/exec", "POST"): (
        "Run a command in the sandbox; SSE events stdout, stderr, exit with Accept: text/event-stream",
        _json("Exec"),
        200,
        {**_json("Result"), **SSE},
        [],
    ),
    ("/v1/sandboxes/{name}/processes", "POST"): (
        "Start a background process",
        _json("Spawn"),
        201,
        _json("Started"),
        [],
    ),
    ("/v1/sandboxes/{name}/processes", "GET"): (
        "Processes running in the sandbox",
        None,
        200,
        _json("ProcessList"),
        [],
    ),
    ("/v1/sandboxes/{name}/processes/{id}", "GET"): (
        "A background process's state and output from byte offsets",
        None,
        200,
        _json("ProcessState"),
        [_q("offset", OFFSET), _q("stderr_offset", OFFSET)],
    ),
    ("/v1/sandboxes/{name}/processes/{id}/output", "GET"): (
        "SSE of a background process's output; event ids are STDOUT:STDERR offsets "
        "(resume with Last-Event-ID)",
        None,
        200,
        SSE,
        [_q("offset", OFFSET), _q("stderr_offset", OFFSET)],
    ),
    ("/v1/sandboxes/{name}/processes/{id}/signal", "POST"): (
        "Signal a process group (id: process id or pid)",
        _json("Signal"),
        200,
        _json("Ok"),
        [],
    ),
    ("/v1/sandboxes/{name}/processes/{id}/stdin", "POST"): (
        "Write to the stdin of a background process started with stdin: true (id: process id "
        "or pid). JSON body, or the raw bytes with Content-Type application/octet-stream "
        "(then ?eof=true closes stdin after them). At most 4 MiB may wait for the process: "
        "beyond, 413 StdinFull (it is not reading; retry later). 409: started without "
        "stdin (StdinNotOpen), stdin closed (StdinClosed), or the process ended (ProcessEnded)",
        {
            **_json("Stdin"),
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
        200,
        _json("StdinState"),
        [_q("eof", FLAG, "with a raw body: close stdin after it")],
    ),
    ("/v1/sandboxes/{name}/files", "GET"): (
        "A file's bytes, or a directory's listing as JSON",
        None,
        200,
        {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}, **_json("Listing")},
        [
            PATHQ,
            _q("type", {"type": "string", "enum": ["file", "dir"]}),
            _q("max_bytes", {"type": "integer", "minimum": 0, "maximum": 1 << 28}),
        ],
    ),
    ("/v1/sandboxes/{name}/files", "PUT"): (
        "Write a file from the raw body, all or nothing (a new file renamed over the old one)",
        {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        201,
        _json("Ok"),
        [
            PATHQ,
            _q("parents", BOOL),
            _q("append", BOOL, "add to the file in place; a failed append is taken back off"),
            _q("mode", STR, "octal, e.g. 644; for a new file (an existing one keeps its mode)"),
        ],
    ),
    ("/v1/sandboxes/{name}/files", "DELETE"): (
        "Remove a file or (recursive) a directory",
        None,
        200,
        _json("Ok"),
        [PATHQ, _q("recursive", FLAG)],
    ),
    ("/v1/sandboxes/{name}/files/stat", "GET"): (
        "Stat a path (?exists=1: only whether it exists)",
        None,
        200,
        _json("FileInfo"),
        [PATHQ, _q("follow", FLAG), _q("exists", FLAG)],
    ),
    ("/v1/sandboxes/{name}/files/mkdir", "POST"): ("Make a directory", _json("Mkdir"), 201, _json("Ok"), []),
    ("/v1/sandboxes/{name}/files/move", "POST"): ("Rename a path", _json("Move"), 200, _json("Ok"), []),
    ("/v1/sandboxes/{name}/ports", "POST"): (
        "Forward a host port to a port in the sandbox",
        _json("Expose"),
        201,
        _json("Exposed"),
        [],
    ),
    ("/v1/sandboxes/{name}/ports", "GET"): (
        "The host ports forwarded into the sandbox",
        None,
        200,
        _json("PortList"),
        [],
    ),
    ("/v1/sandboxes/{name}/ports/{port}", "DELETE"): (
        "Stop forwarding to the sandbox's port (the host port takes no new connection)",
        None,
        200,
        _json("Ok"),
        [],
    ),
    ("/v1/sandboxes/{name}/spawns", "GET"): (
        "Every background process on record, running or ended (the newest 1000), with its "
        "exit status once it ended",
        None,
        200,
        _json("SpawnList"),
        [],
    ),
    ("/v1/sandboxes/{name}/netlog", "GET"): ("The network proxy's decisions", None, 200, _json("NetLog"), []),
    ("/v1/sandboxes/{name}/events", "GET"): (
        "The sandbox's trail after a cursor: commands, file operations, signals, network decisions "
        "(follow it, SSE events record, cursor and end, with Accept: text/event-stream)",
        None,
        200,
        {**_json("Events"), **SSE},
        [
            _q("after", STR, "a page's after (a record's time): records from there on"),
            _q("skip", {"type": "integer", "minimum": 0}, "a page's skip: records of that time already had"),
        ],
    ),
    ("/v1/sandboxes/{name}/network", "GET"): (
        "The running sandbox's network policy (--network allow or ask): the rules it started with, "
        "those allowed and denied since, the connections waiting for an answer; with Accept: "
        "text/event-stream, a stream of `pending` (a NetPending, as a connection starts to wait) and "
        "`ended` ({id}: answered or timed out) events",
        None,
        200,
        {**_json("NetPolicy"), **SSE},
        [],
    ),
    ("/v1/sandboxes/{name}/network", "POST"): (
        "Allow or deny HOST[:PORT] from the next connection on (checked as allow_host is at create)",
        _json("NetChange"),
        200,
        _json("NetPolicy"),
        [],
    ),
    ("/v1/sandboxes/{name}/network/pending/{request}", "POST"): (
        "Approve (always: for the sandbox's life) or reject a waiting connection",
        _json("NetAnswer"),
        200,
        _json("NetPolicy"),
        [REQUEST],
    ),
    ("/v1/sandboxes/{name}/pause", "POST"): (
        "Freeze every process of the sandbox (it keeps its memory and uses no CPU)",
        None,
        200,
        _json("Sandbox"),
        [],
    ),
    ("/v1/sandboxes/{name}/resume", "POST"): (
        "Let a paused sandbox run again",
        None,
        200,
        _json("Sandbox"),
        [],
    ),
    ("/v1/sandboxes/{name}/stats", "GET"): (
        "Memory, processes and CPU time now, against the limits",
        None,
        200,
        _json("Stats"),
        [],
    ),
    ("/v1/sandboxes/{name}/snapshot", "POST"): (
        "Snapshot a sandbox on an image: its own layer (no processes), frozen where it is between "
        "commands and copied to the state directory in the background (saved: false until then), "
        "else copied while the sandbox is paused; create another from it with the policy key "
        "from_snapshot",
        None,
        201,
        _json("Snapshot"),
        [],
    ),
    ("/v1/sandboxes/{name}/diff", "GET"): (
        "A review sandbox's changes to its workspace (?patch=1: with a git-style patch)",
        None,
        200,
        _json("Review"),
        [_q("patch", FLAG)],
    ),
    ("/v1/sandboxes/{name}/apply", "POST"): (
        "Write a stopped review sandbox's changes (or those at or beneath paths) to the host "
        "workspace, each file atomically; 409 ReviewConflict for files changed on the host meanwhile",
        _json("Apply"),
        200,
        _json("Review"),
        [],
    ),
    ("/v1/sandboxes/{name}/discard", "POST"): (
        "Drop a stopped review sandbox's changes",
        None,
        200,
        _json("Ok"),
        [],
    ),
    ("/v1/sandboxes/{name}/checkpoints", "POST"): (
        "Freeze a review sandbox's workspace as it is now (409 while a process runs in it)",
        None,
        201,
        _json("Checkpoint"),
        [],
    ),
    ("/v1/sandboxes/{name}/checkpoints", "GET"): (
        "A review sandbox's checkpoints, oldest first (one is taken before each command that follows a "
        "change)",
        None,
        200,
        _json("CheckpointList"),
        [],
    ),
    ("/v1/sandboxes/{name}/rollback", "POST"): (
        "Return a review sandbox's workspace to a checkpoint (the last one without an id); running "
        "processes are stopped first (named in stopped), or with keep_running the rollback is refused",
        _json("Rollback"),
        200,
        _json("Checkpoint"),
        [],
    ),
    ("/v1/snapshots", "GET"): ("Every snapshot, oldest first", None, 200, _json("SnapshotList"), []),
    ("/v1/snapshots/{id}", "DELETE"): (
        "Remove a snapshot no sandbox or other snapshot stands on",
        None,
        200,
        _json("Snapshot"),
        [],
    ),
}

ERRORS = {
    "400": "bad request: invalid JSON, unknown key, bad policy or argument",
    "401": "missing or wrong bearer token",
    "403": "the sandbox's policy forbids it; or a Host/Origin that does not name the service",
    "404": "no such sandbox, process, file or route",
    "409": "a sandbox of that name exists, or it is paused or dead, or not on an image (snapshot); "
    "a review sandbox still running (apply, discard), files changed on the host (ReviewConflict), "
    "processes running (checkpoint), past the snapshot budget or a full disk (CheckpointError); "
    "a snapshot is in use; a process's stdin is not open, "
    "closed, or the process ended",
    "405": "the route has no such method (the Allow header lists those it has)",
    "413": "request body or file too large; a process's stdin is full (it is not reading)",
    "422": "the command or its working directory cannot be executed",
    "429": "the sandbox is at its pids or memory limit: the command could not start",
    "500": "warren failed (setup error or bug)",
    "503": "every connection is busy (retry)",
    "504": "timed out",
}


def _operation_id(method: str, path: str) -> str:
    words = path.strip("/").replace("{", "").replace("}", "").replace(".", "_").split("/")
    return "_".join([method.lower(), *words])


def document() -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for path, method, _handler in ROUTES:
        summary, request, status, content, params = OPS[path, method]
        op: dict[str, Any] = {
            "summary": summary,
            "operationId": _operation_id(method, path),
            "responses": {
                str(status): {"description": "success", "content": content},
                **{code: {"description": text, "content": _json("Error")} for code, text in ERRORS.items()},
            },
        }
        parameters = [NAME] if "{name}" in path else []
        if "{id}" in path:
            parameters.append(ID)
        if "{port}" in path:
            parameters.append(PORT)
        if parameters or params:
            op["parameters"] = [*parameters, *params]
        if request is not None:
            op["requestBody"] = {"required": True, "content": request}
        paths.setdefault(path, {})[method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "warren",
            "version": "1",
            "description": "Sandboxes for AI coding agents. Every request needs "
            "'Authorization: Bearer TOKEN' when the service was started with a token (always on TCP).",
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
