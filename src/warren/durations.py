"""Durations as warren writes them (``90s``, ``10m``, ``2h``, ``1d``): the units, and
a number of seconds shown in the largest unit that divides it.

Standard library only, and nothing else of warren's: the listing's fast path
(``cli.ls``) shows a sandbox's idle timeout without importing the policy package
(``policy.limits`` parses what a user writes with the same units).
"""

from __future__ import annotations

SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def show(seconds: float) -> str:
    """``seconds`` as ``2h``, ``10m``, ``1d`` (or ``90s``, ``1.5s``)."""
    for unit in ("d", "h", "m"):
        scale = SECONDS[unit]
        if seconds >= scale and seconds % scale == 0:
            return f"{int(seconds // scale)}{unit}"
    return f"{seconds:g}s"
