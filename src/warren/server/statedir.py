"""The supervisor's side of the state directory: publishing and withdrawing its
address, the lock that makes it the only one, a sandbox's own directory.

Where the directory is and the checks made before trusting it are shared with the
client (``warren.statedir``) and re-exported here, so server code has one name for
both halves.
"""

from __future__ import annotations

import contextlib
import os

from ..statedir import (
    ADDRESS_FILE,
    LOG_FILE,
    SANDBOXES,
    e2b_homes,
    location,
    prepare,
    read_address,
    secret_files,
)

__all__ = [
    "ADDRESS_FILE",
    "LOCK_FILE",
    "LOG_FILE",
    "SANDBOXES",
    "clear_address",
    "e2b_homes",
    "location",
    "prepare",
    "read_address",
    "sandbox_dir",
    "secret_files",
    "write_address",
]

LOCK_FILE = "supervisor.lock"


def write_address(path: str, token: str) -> None:
    tmp = os.path.join(path, f".{ADDRESS_FILE}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, f"{token} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    os.rename(tmp, os.path.join(path, ADDRESS_FILE))


def clear_address(path: str, token: str) -> None:
    """Unpublish the address, only if it is still this supervisor's."""
    found = read_address(path)
    if found is not None and found[0] == token:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(path, ADDRESS_FILE))


def sandbox_dir(path: str, name: str) -> str:
    return os.path.join(path, SANDBOXES, name)
