"""warren's own native programs, compiled at install beside the Python code
(``hatch_build.py``): where they are, and loading one into a sealed memfd.

A program a sandbox execs (the exec stub, the credentials sender) is loaded once per
process tree, before any sandbox: every PID 1 inherits the descriptor (close-on-exec:
no command ever holds it) and execs it with ``execveat``. Landlock allows executing a
memfd, so this works in image sandboxes, where the install's own files are not there.
The seals refuse every write: its contents cannot change after.

Owns: the places looked in, and the sealed copy.
"""

from __future__ import annotations

import fcntl
import os
import sys
import sysconfig
from collections.abc import Callable

_SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_loaded: dict[str, int | None] = {}


def find(name: str, switch: str) -> str | None:
    """Where the compiled ``name`` is: among this Python's scripts (a venv's bin, or
    ``~/.local/bin`` for ``pip install --user``), or beside the interpreter. None when
    the environment variable ``switch`` is 0 (the Python path asked for on purpose)."""
    if os.environ.get(switch) == "0":
        return None
    places = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable)]
    if sys.prefix == sys.base_prefix:  # not a venv: a --user install puts it there
        places.insert(1, sysconfig.get_path("scripts", f"{os.name}_user"))
    for directory in places:
        candidate = os.path.join(directory, name)
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def load(name: str, locate: Callable[[], str | None]) -> int | None:
    """The program ``locate`` names, in a sealed memfd named ``name`` (made once per
    process tree), or None when there is none to load. ``locate`` is asked only the first
    time: every clone loads its programs, and a look through sysconfig's places costs
    more than half a millisecond."""
    if name in _loaded:
        return _loaded[name]
    path = locate()
    fd = _sealed(name, path) if path is not None else None
    _loaded[name] = fd
    return fd


def loaded(name: str) -> int | None:
    return _loaded.get(name)


def forget(name: str) -> None:
    """This process no longer holds ``name`` (its descriptor was closed)."""
    _loaded[name] = None


def _sealed(name: str, path: str) -> int | None:
    try:
        with open(path, "rb") as f:
            data = f.read()
        fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
    except OSError:
        os.close(fd)
        return None
    return fd
