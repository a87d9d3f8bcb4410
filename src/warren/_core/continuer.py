"""The native continuer (``native/continuer.c``, compiled at install as
``warren-continuer.so``): a thread in PID 1 that answers "go on" to the calls of a
command started during the hard-link walk, once the walk is done.

Such a command carries the walk's window filter for its life: its writing opens,
truncates and file ioctls each wait for PID 1's answer, which after the walk is always
"go on". Answered by the Python broker, that is about 50 microseconds a call, a
regression a command writing thousands of files (an ``npm ci`` started as a large
workspace's first command) would feel; answered by this thread, a few. The calls the
broker judges are passed on to it whole (a packet per call on a pipe,
``Broker._forwarded``).

The library is loaded (``load``) by the process every PID 1 is cloned from, before any
clone: PID 1 inherits the mapping, so it runs in image sandboxes too, where the
install's files are not there. Without it (no C compiler at install, or
``WARREN_NATIVE_CONTINUER=0``), the Python broker answers as before; both ways are
tested (``tests/test_linkwalk_optimistic.py``).

Owns: finding and loading the library, starting its thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Iterable

from . import _sys, programs

NAME = "warren-continuer.so"
MAX_NR = 1024  # syscall numbers the thread can answer (``native/continuer.c``)
THREAD = "warren-continue"  # its name in /proc/PID/task/*/comm
_lib: ctypes.CDLL | None = None
_tried = False


def program() -> str | None:
    return programs.find(NAME, "WARREN_NATIVE_CONTINUER")


def load() -> None:
    """Load the library into this process (once; before any clone: PID 1 inherits it)."""
    global _lib, _tried
    if _tried:
        return
    _tried = True
    path = program()
    if path is None:
        return
    try:
        lib = ctypes.CDLL(path)
        lib.warren_continuer_start.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        lib.warren_continuer_start.restype = ctypes.c_int
        if lib.warren_continuer_record_size() != _sys.NOTIF_SIZE:
            return  # built from other sources than this Python speaks
    except (OSError, AttributeError):
        return
    _lib = lib


def available() -> bool:
    return _lib is not None


def start(listener: int, go_on: Iterable[int]) -> int | None:
    """The thread, answering "go on" on ``listener`` to the syscall numbers ``go_on``;
    the read end of the pipe it passes every other call on (a ``_sys.NOTIF_SIZE``
    record each), or None where there is no thread (the caller answers as before)."""
    if _lib is None:
        return None
    mask = (ctypes.c_uint64 * (MAX_NR // 64))()
    for nr in go_on:
        if 0 <= nr < MAX_NR:
            mask[nr // 64] |= 1 << (nr % 64)
    forward_r, forward_w = os.pipe2(os.O_CLOEXEC | os.O_DIRECT)
    stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
    if _lib.warren_continuer_start(listener, forward_w, stop_r, ctypes.addressof(mask)) != 0:
        for fd in (forward_r, forward_w, stop_r, stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        return None
    # The thread's ends stay open for PID 1's life (it ends with PID 1, or when no
    # process holds the filter any more); ``stop_w`` too: closing it would end it.
    _kept.extend((forward_w, stop_r, stop_w))
    return forward_r


_kept: list[int] = []


def kept() -> list[int]:
    """The descriptors the thread holds, which a helper forked from PID 1 closes."""
    return list(_kept)
