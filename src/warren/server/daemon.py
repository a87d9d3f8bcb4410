"""Starting a supervisor: the per-user daemon behind a state directory, or one inline
for a single client when there is no usable state directory.

Start-up only (the lock, the descriptor limit, publishing the address); the serving is
``supervisor``'s. The client starts this through ``supervisor.main``.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys

from .. import wire
from .._core import clone
from ..errors import WarrenError
from . import logfile, statedir
from .supervisor import LINKS_FILE, Supervisor

DEFAULT_IDLE = 60.0


def _idle() -> float:
    try:
        return max(0.5, float(os.environ.get("WARREN_SUPERVISOR_IDLE", DEFAULT_IDLE)))
    except ValueError:
        return DEFAULT_IDLE


def _raise_nofile() -> None:
    """Room for ``connections.MAX_CLIENTS`` connections beside every sandbox's descriptors: the soft
    descriptor limit up to the hard one (sandboxes get the old one back: ``clone``)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if want > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            clone.sandbox_nofile = soft


def daemon(root: str, ready_fd: int) -> int:
    """The per-user supervisor: one per state directory (a lock decides), reachable at
    the abstract address it publishes there."""
    import fcntl

    os.chdir("/")
    logfile.install(os.path.join(root, statedir.LOG_FILE))
    try:
        statedir.prepare(root)
    except WarrenError as e:
        os.write(ready_fd, f"error {e.message}\n".encode())
        return 1
    lock = os.open(os.path.join(root, statedir.LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.write(ready_fd, b"other\n")  # another supervisor serves this state directory
        return 0
    _raise_nofile()
    token = secrets.token_hex(16)
    listener = wire.listen_abstract(wire.abstract_name(token))
    try:
        sup = Supervisor(root, listener, _idle())
    except WarrenError as e:
        os.write(ready_fd, f"error {e.message}\n".encode())
        return 1
    statedir.write_address(root, token)
    os.write(ready_fd, b"ready\n")
    os.close(ready_fd)
    clone.start_spawner()  # beside the first request, which is being sent now
    try:
        sup.serve(lambda: statedir.clear_address(root, token), lambda: statedir.write_address(root, token))
    finally:
        # Unpublish before releasing the lock, so a racing client either reached this
        # supervisor (and gets an answer) or starts the next one.
        statedir.clear_address(root, token)
        listener.close()
        sup.links.save(os.path.join(root, LINKS_FILE))
    return 0


def inline(fd: int) -> int:
    """A supervisor for one client on an inherited socket, without state: the
    fallback that runs one-shot sandboxes when the state directory is unusable."""
    os.chdir("/")
    sock = socket.socket(fileno=fd)
    sup = Supervisor(None, None, 0)
    clone.start_spawner()  # before anything of the client's is read
    sup.clients.add(sock, os.getuid(), os.getgid())
    sup.serve()
    return 0


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "daemon":
        return daemon(argv[1], int(argv[2]))
    if len(argv) == 2 and argv[0] == "inline":
        return inline(int(argv[1]))
    print("usage: python -m warren.server.daemon daemon ROOT READY_FD | inline FD", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
