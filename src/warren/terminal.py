"""Text that reaches a terminal: anything that came from a sandbox (a host name it
asked for, a reason quoting it) is escaped first, so no control sequence — cursor
moves, OSC 52 clipboard writes, forged newlines — can pass through warren.

Standard library only: used on the CLI's fast path.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """``text`` with every non-printable character (ESC, CR, newline, OSC, C1 ...)
    written as an escape, so it is one inert line on any terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)
