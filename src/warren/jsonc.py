"""JSON for warren's own protocol messages, without loading ``re``.

The standard ``json`` package imports ``re`` (and with it ``enum``), which costs more
start-up time than everything else a ``warren run`` client does. The C accelerator
module ``_json`` that ``json`` itself uses encodes and scans without it, so the
protocol uses that directly for the compact JSON it writes and reads; where ``_json``
is missing, ``json`` does the same job. Only for warren's own messages: anything from
outside goes through ``json``.
"""

from __future__ import annotations

try:
    import _json
except ImportError:  # pragma: no cover - every CPython has it
    _json = None  # type: ignore[assignment]


def _no_constant(name: str) -> object:
    raise ValueError(f"non-finite number {name} in JSON")


class _Context:
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = staticmethod(_no_constant)

    def __init__(self) -> None:
        self.memo: dict[str, str] = {}


if _json is not None and hasattr(_json, "make_scanner") and hasattr(_json, "make_encoder"):
    _scan = _json.make_scanner(_Context())  # type: ignore[arg-type]
    # (markers, default, encoder, indent, key sep, item sep, sort_keys, skipkeys, allow_nan)
    _encode = _json.make_encoder(None, None, _json.encode_basestring, None, ":", ",", False, False, False)  # type: ignore[arg-type]

    def dumps(value: object) -> str:
        """Compact JSON (non-ASCII kept as is); ValueError for NaN and infinities."""
        return "".join(_encode(value, 0))

    def loads(text: str) -> object:
        """One JSON value filling all of ``text``; ValueError otherwise."""
        try:
            value, end = _scan(text, 0)
        except StopIteration:
            raise ValueError("not a JSON value") from None
        except SystemError:
            # An unterminated string: _json reports it through json.decoder's error,
            # which it finds only if json was imported, and else sets no exception.
            raise ValueError("not a JSON value: a string without its end") from None
        if end != len(text):
            raise ValueError(f"extra data after the JSON value at {end}")
        return value

else:  # pragma: no cover
    import json

    def dumps(value: object) -> str:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)

    def loads(text: str) -> object:
        return json.loads(text)
