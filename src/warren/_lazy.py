"""Names a package loads when first named (PEP 562): ``warren``, ``warren.protocol``,
``warren.plan`` and ``warren.policy`` each keep a table (name -> the module of theirs
that defines it) and a module ``__getattr__`` that calls ``named``.

Standard library only, and imported only when a name is first asked for (the CLI's
fast path never needs it)."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, MutableMapping


def named(
    package: str, table: Mapping[str, str], namespace: MutableMapping[str, object], name: str
) -> object:
    """``package``'s ``name``, imported from its module in ``table`` and kept in the
    package's ``namespace`` (its globals: looked up once); AttributeError for a name
    the table does not hold."""
    module = table.get(name)
    if module is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{package}.{module}"), name)
    namespace[name] = value
    return value
