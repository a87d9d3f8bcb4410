"""The message engine every channel of warren's protocol shares: the ``Message`` base
class (declared fields, checked on decode), the protocol version, ``decode`` /
``from_dict``, and how an error crosses a process boundary (``Error``,
``error_message``, ``raise_error``).

Every message is a declared class: its fields, their types and defaults are the
annotations of its class. On the wire a message is one JSON object carrying the
protocol version ``v``, its kind ``t`` and its fields; ``decode`` accepts exactly that
and rejects everything else (unknown kind or field, wrong type, NUL byte in a string,
another version) with a ``ProtocolError`` naming the field. A field may hold another
message (its fields as an object) or, declared as ``A | B``, any message of those kinds
(a tagged union: the object carries its kind ``t`` too). Raw payloads (file
contents) and descriptors travel beside the JSON (``wire``).

This module is on the CLI's fast path: it uses no ``typing``, ``dataclasses``, ``enum``
or ``re`` at run time (each costs milliseconds of start-up; JSON goes through
``jsonc``), which is why messages are declared with the small ``Message`` base below
rather than dataclasses. mypy sees them as dataclasses (``dataclass_transform``), so
constructing one is type-checked.
"""

from __future__ import annotations

import math

from .. import jsonc
from ..errors import ProtocolError

TYPE_CHECKING = False  # not typing's: importing typing costs milliseconds (mypy knows the name)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar, NoReturn, dataclass_transform
else:

    def dataclass_transform(**_kw: object) -> object:
        return lambda cls: cls


VERSION = 7  # bumped whenever a message changes: a supervisor of other code refuses cleanly

_MISSING = object()
# Said with every message one side could not read: the usual cause is a supervisor still
# running from before warren was upgraded (it lingers while it holds sandboxes).
SAME_VERSION = (
    "the client and the supervisor must be the same warren version: a supervisor started "
    "before warren was upgraded may still run; `warren shutdown` ends it (stopping its "
    "sandboxes) and the next command starts the new one"
)
_KINDS: dict[str, type[Message]] = {}


def _bad(where: str, expected: str, value: object) -> ProtocolError:
    got = type(value).__name__ if value is not None else "null"
    return ProtocolError(
        f"malformed message: {where} must be {expected}, not {got}",
        operation="decode",
        hint=SAME_VERSION,
    )


def _check_str(value: object, where: str) -> object:
    if not isinstance(value, str):
        raise _bad(where, "a string", value)
    if "\x00" in value:
        raise ProtocolError(
            f"{where} contains a NUL byte",
            operation="decode",
            hint="paths, arguments and environment values cannot contain NUL (\\0)",
        )
    return value


def _check_int(value: object, where: str) -> object:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _bad(where, "an integer", value)
    return value


def _check_float(value: object, where: str) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _bad(where, "a number", value)
    if not math.isfinite(value):
        raise ProtocolError(f"{where} must be a finite number, not {value}", operation="decode")
    return float(value)


def _check_bool(value: object, where: str) -> object:
    if not isinstance(value, bool):
        raise _bad(where, "true or false", value)
    return value


def _check_any(value: object, where: str) -> object:
    return value


def _split_top(text: str, sep: str) -> list[str]:
    """Split a type expression at top-level ``sep`` (not inside brackets)."""
    if sep not in text:
        return [text.strip()]
    parts, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == sep and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


_CHECKERS: dict[str, Callable[[object, str], object]] = {}
_SCALARS: dict[str, Callable[[object, str], object]] = {
    "str": _check_str,
    "int": _check_int,
    "float": _check_float,
    "bool": _check_bool,
}
_SCALARS_BY_TYPE = {str: "str", int: "int", float: "float", bool: "bool"}


def _checker(expr: str, owner: str) -> Callable[[object, str], object]:
    """A validator for one annotation, written as the small subset used here. Made
    once per distinct annotation (validators hold no state): building them for every
    field of every message was most of this module's import time."""
    check = _CHECKERS.get(expr)
    if check is None:
        check = _CHECKERS[expr] = _make_checker(expr, owner)
    return check


def _make_checker(expr: str, owner: str) -> Callable[[object, str], object]:
    alts = _split_top(expr, "|")
    if len(alts) > 1 and "None" in alts:
        inner = _checker(" | ".join(a for a in alts if a != "None"), owner)

        def optional(value: object, where: str) -> object:
            return None if value is None else inner(value, where)

        return optional
    if len(alts) > 1 and not set(alts) & set(_SCALARS):
        return _nested(alts, owner)
    if len(alts) > 1:
        # a scalar of one of several types ("str | int | float"), checked as its own type
        choices = {alt: _checker(alt, owner) for alt in alts}
        if not set(choices) <= set(_SCALARS):  # pragma: no cover - a declaration error
            raise TypeError(f"{owner}: scalar and message types may not be mixed: {expr}")

        def one_of(value: object, where: str) -> object:
            kind = _SCALARS_BY_TYPE.get(type(value), "")
            if kind == "int" and kind not in choices:
                kind = "float"  # an integer is a number
            check = choices.get(kind)
            if check is None:
                raise _bad(where, " or ".join(choices), value)
            return check(value, where)

        return one_of
    if expr.startswith("list[") and expr.endswith("]"):
        item = _checker(expr[5:-1], owner)

        def list_of(value: object, where: str) -> object:
            if not isinstance(value, list):
                raise _bad(where, "a list", value)
            return [item(v, f"{where}[{i}]") for i, v in enumerate(value)]

        return list_of
    if expr.startswith("dict[str,") and expr.endswith("]"):
        val = _checker(expr[9:-1].strip(), owner)

        def dict_of(value: object, where: str) -> object:
            if not isinstance(value, dict):
                raise _bad(where, "an object", value)
            return {_check_str(k, f"{where} key"): val(v, f"{where}.{k}") for k, v in value.items()}

        return dict_of
    if expr in _SCALARS:
        return _SCALARS[expr]
    if expr == "object":
        return _check_any
    return _nested([expr], owner)


def _nested(names: list[str], owner: str) -> Callable[[object, str], object]:
    """A field holding a message of one of the classes ``names``: an object of its
    fields, and its kind ``t`` when the class has a tag. Of several classes (a tagged
    union, ``ExecRequest | SpawnRequest``) each must have a tag: ``t`` says which."""
    expected = " or ".join(names)
    classes: dict[str, type[Message]] = {}

    def resolve() -> dict[str, type[Message]]:
        # Named by class, resolved when first used: the classes may be declared after
        # the field that names them, or in a channel module not loaded yet.
        if not classes:
            if not set(names) <= set(_BY_NAME):
                _load_channels()
            for name in names:
                cls = _BY_NAME.get(name)
                if cls is None or (len(names) > 1 and not cls.TAG):  # pragma: no cover
                    raise TypeError(f"{owner}: {name} is not a message of a union's kinds")
                classes[cls.TAG] = cls
        return classes

    def nested(value: object, where: str) -> object:
        kinds = resolve()
        if not isinstance(value, dict):
            raise _bad(where, f"a {expected} object", value)
        tag = value.get("t", "")
        cls = kinds.get(tag) if isinstance(tag, str) else None
        if cls is None:
            shown = ", ".join(repr(t) for t in kinds if t)
            raise ProtocolError(
                f"malformed message: {where} is of kind {tag!r}, not one of {shown}"
                if shown
                else f"malformed message: {where} must be a {expected} object, which has no kind",
                operation="decode",
                hint=SAME_VERSION,
            )
        return cls._from_fields(value, where)

    return nested


_BY_NAME: dict[str, type[Message]] = {}


@dataclass_transform(kw_only_default=True)
class Message:
    """A declared message. Subclasses name their kind in ``TAG`` and their fields as
    annotations; defaults are class attributes (lists and dicts are copied)."""

    TAG: ClassVar[str] = ""
    _fields: ClassVar[tuple[tuple[str, Callable[[object, str], object], object], ...]] = ()

    def __init_subclass__(cls) -> None:
        fields: dict[str, tuple[str, Callable[[object, str], object], object]] = {}
        for klass in reversed(cls.__mro__):
            for name, expr in klass.__dict__.get("__annotations__", {}).items():  # noqa: RUF063
                if name.startswith("_") or str(expr).startswith("ClassVar"):
                    continue
                fields[name] = (name, _checker(str(expr), cls.__name__), klass.__dict__.get(name, _MISSING))
        cls._fields = tuple(fields.values())
        _BY_NAME[cls.__name__] = cls
        if cls.TAG:
            if cls.TAG in _KINDS:  # pragma: no cover - a declaration error
                raise TypeError(f"two messages with the tag {cls.TAG!r}")
            _KINDS[cls.TAG] = cls

    def __init__(self, **values: Any) -> None:
        for name, _check, default in self._fields:
            if name in values:
                value = values.pop(name)
            elif default is _MISSING:
                raise TypeError(f"{type(self).__name__}: missing field {name}")
            else:
                value = default.copy() if isinstance(default, (list, dict)) else default
            setattr(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(values)}")

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name, _c, _d in self._fields)
        return f"{type(self).__name__}({inner})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(
            getattr(self, n) == getattr(other, n) for n, _c, _d in self._fields
        )

    __hash__ = None  # type: ignore[assignment]

    # --- codecs ---------------------------------------------------------------------

    def to_fields(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for name, _check, _default in self._fields:
            value = getattr(self, name)
            if isinstance(value, Message):
                value = value._nested_fields()
            elif isinstance(value, list) and value and isinstance(value[0], Message):
                value = [v._nested_fields() for v in value]
            out[name] = value
        return out

    def _nested_fields(self) -> dict[str, object]:
        """This message inside another: its fields, and its kind if it has one (a
        tagged union's field says by it which message it holds)."""
        fields = self.to_fields()
        return {"t": self.TAG, **fields} if self.TAG else fields

    def to_dict(self) -> dict[str, object]:
        return {"v": VERSION, "t": self.TAG, **self.to_fields()}

    def encode(self) -> bytes:
        return jsonc.dumps(self.to_dict()).encode()

    @classmethod
    def _from_fields(cls, data: dict[str, object], where: str) -> Any:
        values = {}
        for name, check, default in cls._fields:
            if name in data:
                values[name] = check(data[name], f"{where}.{name}" if where else name)
            elif default is _MISSING:
                field = f"{where}.{name}" if where else name
                raise ProtocolError(
                    f"malformed message: {cls.TAG or cls.__name__} lacks {field}",
                    operation="decode",
                    hint=SAME_VERSION,
                )
        # the envelope: version and kind at the top, a nested message's kind within
        envelope = ("t",) if where and cls.TAG else () if where else ("v", "t")
        unknown = set(data) - {name for name, _c, _d in cls._fields} - set(envelope)
        if unknown:
            field = f"{where}.{sorted(unknown)[0]}" if where else repr(sorted(unknown)[0])
            raise ProtocolError(
                f"malformed message: unknown field {field} in {cls.TAG or cls.__name__}",
                operation="decode",
                hint=SAME_VERSION,
            )
        return cls(**values)


def decode(raw: bytes, expect: tuple[type[Message], ...] = ()) -> Message:
    """One message from its JSON bytes; ``expect`` limits which kinds are acceptable."""
    try:
        data = jsonc.loads(raw.decode())
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise ProtocolError(f"malformed message: not JSON ({e})", operation="decode") from None
    return from_dict(data, expect)


def from_dict(data: object, expect: tuple[type[Message], ...] = ()) -> Message:
    """One message from its decoded JSON object (``decode`` without the parsing)."""
    if not isinstance(data, dict):
        raise ProtocolError("malformed message: not a JSON object", operation="decode")
    version = data.get("v")
    if version != VERSION:
        raise ProtocolError(
            f"protocol version mismatch: got {version!r}, this side speaks {VERSION}",
            operation="decode",
            hint="a warren supervisor of another version is running; it exits 5 s after its "
            "last sandbox ends (see `warren ls`), or stop it with `warren shutdown`",
        )
    cls = _KINDS.get(str(data.get("t")))
    if cls is None:
        _load_channels()
        cls = _KINDS.get(str(data.get("t")))
    if cls is None or (expect and cls not in expect):
        raise ProtocolError(f"unexpected message kind {data.get('t')!r}", operation="decode")
    message: Message = cls._from_fields(data, "")
    return message


def _load_channels() -> None:
    """Declare every channel's messages (the package loads some only when named)."""
    from . import handoff, pid1  # noqa: F401


# --- errors, on every channel ------------------------------------------------------------


class ErrorRecord(Message):
    kind: str
    message: str
    operation: str = ""
    path: str | None = None
    errno: int | None = None
    hint: str = ""


class Error(Message):
    TAG = "error"
    error: ErrorRecord


def error_message(error: Exception) -> Error:
    from ..errors import WarrenError, to_record

    if not isinstance(error, WarrenError):
        error = WarrenError(f"internal error: {error!r}", hint="this is a bug in warren; please report it")
    record = to_record(error)
    return Error(error=ErrorRecord._from_fields(record, "error"))


def raise_error(record: ErrorRecord) -> NoReturn:
    """Raise the error a record carries (an ``Error`` reply, PID 1's ``Failed``) as the
    same ``WarrenError`` subclass the other side raised."""
    from ..errors import from_record

    raise from_record(record.to_fields())
