"""The names warren's callers choose, and the one check each gets before use.

Shared by every layer that takes a name from outside — the CLI, the HTTP service,
the client API and the supervisor — so a name is judged the same way wherever it
arrives. A sandbox's name also names its directory in the state directory, which is
why the rule is strict.

Imported by the CLI's fast path: standard library only.
"""

from __future__ import annotations

from .errors import PolicyError


def check_name(name: object) -> str:
    """A sandbox name: 1-63 letters, digits, '.', '_', '-', starting with a letter or
    digit (it names a directory in the state directory)."""
    ok = isinstance(name, str) and 0 < len(name) <= 63 and name[0].isascii() and name[0].isalnum()
    if ok and isinstance(name, str):
        ok = all(c.isascii() and (c.isalnum() or c in "._-") for c in name)
    if not ok:
        raise PolicyError(
            f"invalid sandbox name {name!r}",
            operation="name",
            hint="use 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    assert isinstance(name, str)
    return name


def is_utf8(name: str) -> bool:
    """Whether a file name read from the system (undecodable bytes kept as surrogates)
    is valid UTF-8: only such a name can cross warren's JSON messages."""
    try:
        name.encode()
        return True
    except UnicodeEncodeError:
        return False
