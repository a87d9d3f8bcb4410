"""The JSON forms of warren's values on the HTTP API, both ways: the service encodes,
the HTTP transport decodes, with the same functions. No HTTP library here, so the
client side carries none of the service.

A value's fields are its model's (``warren.models``, ``NetEvent``): ``encode`` and
``decode`` walk the dataclass, and the OpenAPI document describes the same fields
(``wire_fields``), so a field added to a model reaches the wire, both sides and the
schema at once. Two differences are declared here, not scattered: a field shown
under another name (a process's ``spawn_id`` is ``id``) and one never shown (a
sandbox's ``pid1``: this host's pid means nothing to a remote client).

Output bytes travel as UTF-8 text when they are valid UTF-8, else base64 with
``"<stream>_encoding": "base64"``; error bodies are
``{"error": {"type", "message", "path", "errno", "hint", "operation"}}`` where
``type`` is the ``WarrenError`` subclass, so the client raises the same type.
"""

from __future__ import annotations

import base64
import dataclasses
import types
import typing
from typing import Any, TypeVar

from .errors import WarrenError, from_record
from .models import ProcessInfo, Result, SandboxInfo

T = TypeVar("T")

RENAMED: dict[type, dict[str, str]] = {ProcessInfo: {"spawn_id": "id"}}
HIDDEN: dict[type, frozenset[str]] = {SandboxInfo: frozenset({"pid1"})}


WireFields = tuple[tuple[str, "dataclasses.Field[Any]", Any], ...]
_WIRE_FIELDS: dict[type, WireFields] = {}
_OWN_FIELDS: dict[type, WireFields] = {}


def wire_fields(model: type) -> WireFields:
    """(name on the wire, the model's field, its resolved type) for each field shown."""
    found = _WIRE_FIELDS.get(model)
    if found is None:
        hints = typing.get_type_hints(model)
        renamed, hidden = RENAMED.get(model, {}), HIDDEN.get(model, frozenset())
        found = _WIRE_FIELDS[model] = tuple(
            (renamed.get(f.name, f.name), f, hints[f.name])
            for f in dataclasses.fields(model)
            if f.name not in hidden
        )
    return found


def encode(value: object) -> dict[str, Any]:
    """A model value as its JSON object (bytes per ``put_bytes``)."""
    out: dict[str, Any] = {}
    for wire, field, _kind in wire_fields(type(value)):
        item = getattr(value, field.name)
        if isinstance(item, bytes):
            put_bytes(out, wire, item)
        else:
            out[wire] = _plain(item)
    return out


def _plain(item: object) -> object:
    if isinstance(item, tuple | list):
        return [_plain(i) for i in item]
    if dataclasses.is_dataclass(item) and not isinstance(item, type):
        return encode(item)
    return item


def decode(model: type[T], data: dict[str, Any]) -> T:
    """The model value a JSON object of the HTTP API stands for; absent optional fields
    take the model's defaults."""
    return _build(model, data, wire_fields(model))


def model_of(model: type[T], fields: dict[str, Any]) -> T:
    """The model value a protocol message mirrors (``Message.to_fields()``): the same
    names as the model's, every one shown, lists made tuples; fields the message has
    beyond the model's (a process state's output lengths) are not the model's."""
    return _build(model, fields, _own_fields(model))


def _own_fields(model: type) -> WireFields:
    found = _OWN_FIELDS.get(model)
    if found is None:
        hints = typing.get_type_hints(model)
        found = _OWN_FIELDS[model] = tuple((f.name, f, hints[f.name]) for f in dataclasses.fields(model))
    return found


def _build(model: type[T], data: dict[str, Any], shown: WireFields) -> T:
    values: dict[str, Any] = {}
    for wire, field, kind in shown:
        if kind is bytes:
            values[field.name] = get_bytes(data, wire)
        elif wire in data and data[wire] is not None:
            values[field.name] = _typed(data[wire], kind)
        elif field.default is not dataclasses.MISSING:
            values[field.name] = field.default
        else:
            values[field.name] = _typed(data[wire], kind)  # KeyError/None: not this model's form
    return model(**values)


def _typed(item: Any, kind: Any) -> Any:
    if isinstance(kind, types.UnionType):
        kind = next(k for k in typing.get_args(kind) if k is not type(None))
    if typing.get_origin(kind) is tuple:
        inner = typing.get_args(kind)[0]
        return tuple(_typed(i, inner) for i in item or ())
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return decode(kind, item)
    if kind in (int, float, str, bool):
        return kind(item)
    return item


def put_bytes(out: dict[str, Any], key: str, data: bytes) -> None:
    try:
        out[key] = data.decode()
        out[f"{key}_encoding"] = "utf-8"
    except UnicodeDecodeError:
        out[key] = base64.b64encode(data).decode()
        out[f"{key}_encoding"] = "base64"


def get_bytes(data: dict[str, Any], key: str) -> bytes:
    value = data.get(key) or ""
    if data.get(f"{key}_encoding") == "base64":
        return base64.b64decode(value)
    return str(value).encode()


def result(r: Result) -> dict[str, Any]:
    """A command's result; ``truncated`` says whether either stream was cut."""
    return {**encode(r), "truncated": r.stdout_truncated or r.stderr_truncated}


def error_of(body: object, status: int) -> WarrenError:
    """The exception an error body stands for (the same class as on the server)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        record = dict(body["error"])
        record["kind"] = record.pop("type", "WarrenError")
        return from_record(record)
    return WarrenError(
        f"the service answered HTTP {status} without a warren error body",
        operation="http",
        hint="is the URL a `warren serve`? check WARREN_URL",
    )
