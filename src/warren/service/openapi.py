"""The OpenAPI 3.1 document of API v1, generated from the route table (``app.TABLE``)
and the schemas below; a test checks that every route is described and every
description is a route, and a schemathesis run (tests/test_service_schema.py) that the
server keeps to it. Every constraint the server enforces is stated here, from the
same constants (``client.checks``)."""

from __future__ import annotations

from typing import Any

from ..client import checks
from ..policy.spec import BOOL_KEYS, LIMIT_KEYS, LIST_KEYS, STR_KEYS, TABLE_KEYS

STR: dict[str, Any] = {"type": "string"}
INT: dict[str, Any] = {"type": "integer"}
BOOL: dict[str, Any] = {"type": "boolean"}
NUM: dict[str, Any] = {"type": "number"}
STRS: dict[str, Any] = {"type": "array", "items": STR}
STRMAP: dict[str, Any] = {"type": "object", "additionalProperties": STR}
NO_NUL = "^[^\\u0000]*$"
TEXT: dict[str, Any] = {"type": "string", "pattern": NO_NUL}  # paths, arguments: no NUL
NAME_PATTERN = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$"
PATH_TEXT: dict[str, Any] = {"type": "string", "minLength": 1, "maxLength": 4095, "pattern": NO_NUL}


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _object(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


def _policy_props() -> dict[str, Any]:
    props: dict[str, Any] = {}
    for key in LIST_KEYS:
        props[key] = {"oneOf": [STRS, STR]}
    for key in BOOL_KEYS:
        props[key] = BOOL
    for key in STR_KEYS:
        props[key] = STR
    for key in TABLE_KEYS:
        props[key] = STRMAP
    for key in LIMIT_KEYS:
        props[key] = {"oneOf": [STR, NUM]}  # "512M", 64, 0.5, "10m", "none"
    props["network"] = {"type": "string", "enum": ["none", "allow", "open"]}
    return props


COMMAND = {
    "argv": {
        "type": "array",
        "prefixItems": [{"type": "string", "minLength": 1, "pattern": NO_NUL}],
        "items": TEXT,
        "minItems": 1,
        "description": "the program (non-empty) and its arguments; no NUL, each under "
        f"{checks.MAX_ARG_STRLEN} bytes",
    },
    "cwd": {"type": ["string", "null"], "minLength": 1, "pattern": NO_NUL},
    "env": {"type": ["object", "null"], "additionalProperties": TEXT},
    "stdin": {"type": ["string", "null"]},
    "stdin_encoding": {"type": "string", "enum": ["utf-8", "base64"]},
    "timeout": {
        "type": ["number", "null"],
        "exclusiveMinimum": 0,
        "maximum": checks.MAX_TIMEOUT,
        "description": "seconds; null: no limit (0 is refused, not 'no limit')",
    },
    "output_limit": {"type": ["integer", "null"], "minimum": 0, "maximum": checks.MAX_OUTPUT_LIMIT},
}

SCHEMAS: dict[str, Any] = {
    "Error": _object(
        {
            "error": _object(
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
    "Policy": _object(_policy_props()),
    "CreateSandbox": _object(
        {"name": {"type": "string", "pattern": NAME_PATTERN}, **_policy_props()},
    ),
    "Run": _object(
        {
            "policy": {"anyOf": [_ref("Policy"), {"type": "null"}]},
            **{k: v for k, v in COMMAND.items() if k != "env"},
        },
        ("argv",),
    ),
    "Exec": _object(COMMAND, ("argv",)),
    "Spawn": _object(
        {
            **{k: v for k, v in COMMAND.items() if not k.startswith("stdin")},
            "stdin": {
                "type": "boolean",
                "description": "true: stdin is a pipe fed by POST .../processes/{id}/stdin "
                "(default false: /dev/null, the process reads end of file at once)",
            },
        },
        ("argv",),
    ),
    "Stdin": _object(
        {
            "data": STR,
            "encoding": {"type": "string", "enum": ["utf-8", "base64"]},
            "eof": {"type": "boolean", "description": "close stdin after data"},
        }
    ),
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
    "Result": {
        "type": "object",
        "properties": {
            "exit_code": INT,
            "stdout": STR,
            "stdout_encoding": {"type": "string", "enum": ["utf-8", "base64"]},
            "stderr": STR,
            "stderr_encoding": {"type": "string", "enum": ["utf-8", "base64"]},
            "duration": NUM,
            "truncated": BOOL,
            "stdout_truncated": BOOL,
            "stderr_truncated": BOOL,
            "timed_out": BOOL,
            "limit": {"type": ["string", "null"]},
            "signal": {"type": ["integer", "null"]},
            "warnings": STRS,
            "cwd": {"type": ["string", "null"]},
            "net_log": {"type": "array", "items": {"type": "object"}},
        },
        "required": ["exit_code", "stdout", "stderr", "duration", "truncated"],
    },
    "Sandbox": {
        "type": "object",
        "properties": {
            "name": STR,
            "id": STR,
            "state": {
                "type": "string",
                "enum": ["running", "paused", "stopping", "stopped", "dead", "removed"],
                "description": "removed: the answer of DELETE when the sandbox is gone",
            },
            "reason": STR,
            "workspace": STR,
            "created": NUM,
            "warnings": STRS,
            "idle_timeout": {"type": ["number", "null"]},
            "last_active": NUM,
        },
        "required": ["name", "id", "state"],
    },
    "SandboxList": {
        "type": "object",
        "properties": {"sandboxes": {"type": "array", "items": _ref("Sandbox")}},
    },
    "Process": {
        "type": "object",
        "properties": {
            "pid": INT,
            "ppid": INT,
            "state": STR,
            "argv": STRS,
            "id": {"type": ["string", "null"]},
        },
    },
    "ProcessList": {
        "type": "object",
        "properties": {"processes": {"type": "array", "items": _ref("Process")}},
    },
    "Started": {"type": "object", "properties": {"id": STR, "pid": INT}, "required": ["id", "pid"]},
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
    "Signal": _object(
        {"signal": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 64}, {"type": "string"}]}}
    ),
    "FileInfo": {
        "type": "object",
        "properties": {
            "name": STR,
            "type": {"type": "string", "enum": ["file", "dir", "symlink", "other"]},
            "size": INT,
            "mode": INT,
            "mtime": NUM,
            "uid": INT,
            "gid": INT,
        },
    },
    "Listing": {
        "type": "object",
        "properties": {"path": STR, "entries": {"type": "array", "items": _ref("FileInfo")}},
    },
    "Mkdir": _object(
        {
            "path": PATH_TEXT,
            "parents": BOOL,
            "exist_ok": BOOL,
            "mode": {"type": ["integer", "null"], "minimum": 0, "maximum": 0o1777},
        },
        ("path",),
    ),
    "Move": _object({"src": PATH_TEXT, "dst": PATH_TEXT}, ("src", "dst")),
    "Expose": _object(
        {
            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
            "host_port": {"type": ["integer", "null"], "minimum": 0, "maximum": 65535},
        },
        ("port",),
    ),
    "Exposed": {"type": "object", "properties": {"address": STR}},
    "NetLog": {"type": "object", "properties": {"events": {"type": "array", "items": {"type": "object"}}}},
    "Ok": {"type": "object"},
    "Stats": {
        "type": "object",
        "properties": {
            "memory": {"type": "integer"},
            "pids": {"type": "integer"},
            "cpu_time": {"type": "number"},
            "source": STR,
            "memory_limit": {"type": ["integer", "null"]},
            "pids_limit": {"type": ["integer", "null"]},
            "cpus_limit": {"type": ["number", "null"]},
        },
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
PATHQ = {"name": "path", "in": "query", "required": True, "schema": PATH_TEXT}
FLAG: dict[str, Any] = {"type": "string", "enum": ["true", "false", "1", "0", "yes", "no"]}
OFFSET: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": checks.MAX_OFFSET}


def _q(name: str, schema: dict[str, Any], description: str = "") -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


SSE = {"text/event-stream": {"schema": STR}}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(name)}}


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
    ("/v1/sandboxes/{name}/netlog", "GET"): ("The network proxy's decisions", None, 200, _json("NetLog"), []),
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
}

ERRORS = {
    "400": "bad request: invalid JSON, unknown key, bad policy or argument",
    "401": "missing or wrong bearer token",
    "403": "the sandbox's policy forbids it; or a Host/Origin that does not name the service",
    "404": "no such sandbox, process, file or route",
    "409": "a sandbox of that name exists, or it is paused or dead; a process's stdin is not open, "
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
    for (path, method), (summary, request, status, content, params) in OPS.items():
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
