"""Sizes as warren writes them (``512M``, ``1G``: powers of 1024): the units, and a
number of bytes shown in the largest unit.

Standard library only, and nothing else of warren's: ``warren stats`` shows a
sandbox's usage without importing the policy package (``policy.limits`` parses what a
user writes with the same units).
"""

from __future__ import annotations

UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def show(n: int) -> str:
    """Exact when a whole number of a unit, else one decimal of the largest unit."""
    for unit in ("T", "G", "M", "K"):
        scale = UNITS[unit]
        if n >= scale:
            return f"{n // scale}{unit}" if n % scale == 0 else f"{n / scale:.1f}{unit}"
    return str(n)
