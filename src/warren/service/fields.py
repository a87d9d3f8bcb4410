"""The JSON request bodies of API v1, one table each: the keys a body may have, those
it must, and what each must be (its JSON schema, with the bounds of
``client.checks``).

The handlers validate every body with these tables (``body.json_body``) and the
OpenAPI document is built from the same tables (``openapi``), so the document cannot
list a key the service refuses or miss one it takes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..client import checks
from ..policy.spec import BOOL_KEYS, IMAGE_KEYS, LIMIT_KEYS, LIST_KEYS, STR_KEYS, TABLE_KEYS

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
ENCODING: dict[str, Any] = {"type": "string", "enum": ["utf-8", "base64"]}


def ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def closed_object(props: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    """The schema of a JSON object with exactly these keys (no others)."""
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


@dataclass(frozen=True)
class Field:
    schema: dict[str, Any]
    hint: str  # what the value must be, told to a caller who left a required key out


@dataclass(frozen=True)
class Body:
    """One request body: its keys (name -> ``Field``) and the keys it must have."""

    fields: dict[str, Field]
    required: tuple[str, ...] = field(default=())

    def schema(self) -> dict[str, Any]:
        return closed_object({k: f.schema for k, f in self.fields.items()}, self.required)


def _policy_fields() -> dict[str, Field]:
    """The keys of warren.toml, as a policy in a request body."""
    out: dict[str, Field] = {}
    hint = "a key of warren.toml"
    for key in LIST_KEYS:
        out[key] = Field({"oneOf": [STRS, STR]}, hint)
    for key in BOOL_KEYS:
        out[key] = Field(BOOL, hint)
    for key in STR_KEYS:
        out[key] = Field(STR, hint)
    for key in TABLE_KEYS:
        out[key] = Field(STRMAP, hint)
    for key in LIMIT_KEYS:
        out[key] = Field({"oneOf": [STR, NUM]}, hint)  # "512M", 64, 0.5, "10m", "none"
    out["network"] = Field({"type": "string", "enum": ["none", "allow", "ask", "open"]}, hint)
    out["ask_timeout"] = Field({"oneOf": [STR, NUM]}, hint)
    for key in IMAGE_KEYS:  # image, from_snapshot: names; disk: a size
        out[key] = Field({"oneOf": [STR, NUM]} if key == "disk" else STR, hint)
    return out


POLICY = Body(_policy_fields())

COMMAND: dict[str, Field] = {
    "argv": Field(
        {
            "type": "array",
            "prefixItems": [{"type": "string", "minLength": 1, "pattern": NO_NUL}],
            "items": TEXT,
            "minItems": 1,
            "description": "the program (non-empty) and its arguments; no NUL, each under "
            f"{checks.MAX_ARG_STRLEN} bytes",
        },
        "list of strings",
    ),
    "cwd": Field(
        {"type": ["string", "null"], "minLength": 1, "pattern": NO_NUL}, "directory inside the sandbox"
    ),
    "env": Field({"type": ["object", "null"], "additionalProperties": TEXT}, "object of strings"),
    "stdin": Field({"type": ["string", "null"]}, "string"),
    "stdin_encoding": Field(ENCODING, "'utf-8' or 'base64'"),
    "timeout": Field(
        {
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "maximum": checks.MAX_TIMEOUT,
            "description": "seconds; null: no limit (0 is refused, not 'no limit')",
        },
        "seconds",
    ),
    "output_limit": Field(
        {"type": ["integer", "null"], "minimum": 0, "maximum": checks.MAX_OUTPUT_LIMIT}, "bytes per stream"
    ),
}

RUN = Body(
    {
        "policy": Field(
            {"anyOf": [ref("Policy"), {"type": "null"}]}, "policy spec (the keys of warren.toml)"
        ),
        **{k: v for k, v in COMMAND.items() if k != "env"},
    },
    ("argv",),
)
EXEC = Body(COMMAND, ("argv",))
SPAWN = Body(
    {
        **{k: v for k, v in COMMAND.items() if not k.startswith("stdin")},
        "stdin": Field(
            {
                "type": "boolean",
                "description": "true: stdin is a pipe fed by POST .../processes/{id}/stdin "
                "(default false: /dev/null, the process reads end of file at once)",
            },
            "bool: a pipe fed by POST .../processes/{id}/stdin (default: /dev/null)",
        ),
    },
    ("argv",),
)
CREATE = Body({"name": Field({"type": "string", "pattern": NAME_PATTERN}, "sandbox name"), **POLICY.fields})
STDIN = Body(
    {
        "data": Field(STR, "string"),
        "encoding": Field(ENCODING, "'utf-8' (default) or 'base64'"),
        "eof": Field(
            {"type": "boolean", "description": "close stdin after data"}, "bool: close stdin after data"
        ),
    }
)
SIGNAL = Body(
    {
        "signal": Field(
            {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 64}, {"type": "string"}]},
            "a signal number or name (default SIGTERM)",
        )
    }
)
MKDIR = Body(
    {
        "path": Field(PATH_TEXT, "path"),
        "parents": Field(BOOL, "bool"),
        "exist_ok": Field(BOOL, "bool"),
        "mode": Field(
            {"type": ["integer", "null"], "minimum": 0, "maximum": 0o1777}, "int (e.g. 493 = 0o755)"
        ),
    },
    ("path",),
)
MOVE = Body({"src": Field(PATH_TEXT, "path"), "dst": Field(PATH_TEXT, "path")}, ("src", "dst"))
EXPOSE = Body(
    {
        "port": Field({"type": "integer", "minimum": 1, "maximum": 65535}, "port in the sandbox"),
        "host_port": Field(
            {"type": ["integer", "null"], "minimum": 0, "maximum": 65535}, "port on the host (0: a free one)"
        ),
    },
    ("port",),
)
NET_CHANGE = Body(
    {
        "action": Field({"type": "string", "enum": ["allow", "deny"]}, "allow or deny"),
        "rule": Field(STR, "HOST[:PORT], as --allow-host writes it"),
    },
    ("action", "rule"),
)
NET_ANSWER = Body(
    {
        "action": Field({"type": "string", "enum": ["approve", "reject"]}, "approve or reject"),
        "always": Field(BOOL, "bool: approve the host and port for the sandbox's life"),
    },
    ("action",),
)
APPLY = Body(
    {
        "paths": Field(
            {"type": "array", "items": PATH_TEXT}, "paths relative to the workspace (all without)"
        ),
        "force": Field(BOOL, "bool: overwrite host files changed since the sandbox started"),
    }
)
ROLLBACK = Body(
    {
        "id": Field(
            {"type": ["integer", "null"], "minimum": 0}, "a checkpoint's id (none or 0: the last one)"
        ),
        "keep_running": Field(BOOL, "bool: refuse, naming them, rather than stop running processes"),
    }
)

# The name each body's schema has in the OpenAPI document.
BODIES: dict[str, Body] = {
    "Policy": POLICY,
    "CreateSandbox": CREATE,
    "Run": RUN,
    "Exec": EXEC,
    "Spawn": SPAWN,
    "Stdin": STDIN,
    "Signal": SIGNAL,
    "Mkdir": MKDIR,
    "Move": MOVE,
    "Expose": EXPOSE,
    "NetChange": NET_CHANGE,
    "NetAnswer": NET_ANSWER,
    "Apply": APPLY,
    "Rollback": ROLLBACK,
}
