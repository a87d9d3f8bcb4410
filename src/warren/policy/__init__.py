"""What a sandbox may see and do: the spec a user writes (``spec``), config files
(``config``), tool presets (``presets``), and the validated ``Policy`` resolved for
one caller (``resolve.build``).

The names below load when first named: a module of the package (``policy.limits``)
is imported without the rest (see ``warren.plan``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import Policy, Root
    from .resolve import build
    from .spec import PolicySpec

_LAZY = {"Policy": "model", "Root": "model", "build": "resolve", "PolicySpec": "spec"}


def __getattr__(name: str) -> object:
    from .._lazy import named

    return named(__name__, _LAZY, globals(), name)


__all__ = ["Policy", "PolicySpec", "Root", "build"]
