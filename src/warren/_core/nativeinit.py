"""The native init (``native/init.c``, compiled at install as ``warren-init``): what a
sandbox's PID 1 becomes once it has set the sandbox up and forked the *keeper*, the
Python process that serves the sandbox from then on (``pid1.Init``: the channel to the
supervisor, the broker, the helpers).

Loaded once, before any sandbox, into a sealed memfd that every PID 1 inherits
(close-on-exec), like the exec stub: it runs in image sandboxes too. Without the
program (no C compiler at install) or with ``WARREN_NATIVE_INIT=0``, PID 1 stays the
Python process it was, and serves the sandbox itself.

Owns: finding and loading the program, and becoming it.
"""

from __future__ import annotations

import os
from typing import NoReturn

from . import programs

NAME = "warren-init"


def program() -> str | None:
    """Where the compiled init is (``programs.find``); None with ``WARREN_NATIVE_INIT=0``."""
    return programs.find(NAME, "WARREN_NATIVE_INIT")


def load() -> int | None:
    """In the supervisor, before any sandbox (``programs.load``)."""
    return programs.load(NAME, program)


def loaded() -> int | None:
    return programs.loaded(NAME)


def forget() -> None:
    """In the keeper: close the program's descriptor (PID 1 has become it)."""
    fd = programs.loaded(NAME)
    if fd is not None:
        os.close(fd)
        programs.forget(NAME)


def become(program: int, keeper: int) -> NoReturn:
    """In PID 1: exec the init, which reaps and waits for ``keeper``. Every descriptor
    but the program's is closed first (the init holds none); if the exec fails, PID 1
    ends, and the sandbox with it (the supervisor hears why from the keeper's end)."""
    try:
        os.closerange(3, program)
        os.closerange(program + 1, 1 << 20)
        os.execve(program, [NAME, str(keeper)], {})
    finally:
        os._exit(125)
