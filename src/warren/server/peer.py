"""Who is on the other end of a connection to the supervisor.

The supervisor's socket is abstract, so only processes in the host's network
namespace can reach it at all — never a sandboxed one. On top of that, every
connection is verified: the peer runs as this user, and in this user, mount and pid
namespace (a process inside any sandbox is in namespaces of its own). The peer is
pinned by a pidfd taken at connect time (SO_PEERPIDFD), so a recycled pid cannot
stand in for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket

from .. import wire

_NAMESPACES = ("user", "mnt", "pid")
_OURS = {ns: os.readlink(f"/proc/self/ns/{ns}") for ns in _NAMESPACES}


def verify(conn: socket.socket) -> str | None:
    """None when the peer may talk to the supervisor, else why not."""
    pid, uid, _gid = wire.peer_creds(conn)
    if uid != os.getuid():
        return f"uid {uid} is not this supervisor's user"
    if pid <= 0:
        return "the peer is in another pid namespace"
    pidfd = wire.peer_pidfd(conn)
    if pidfd is None:
        with contextlib.suppress(OSError):
            pidfd = os.pidfd_open(pid)
    if pidfd is None:
        return "the peer is gone"
    try:
        for ns in _NAMESPACES:
            try:
                theirs = os.readlink(f"/proc/{pid}/ns/{ns}")
            except OSError:
                return "the peer is gone"
            if theirs != _OURS[ns]:
                return f"the peer is in another {ns} namespace (a sandbox?)"
        try:
            # Still the same process (not a recycled pid): the pidfd names it.
            signal.pidfd_send_signal(pidfd, 0)
        except OSError:
            return "the peer is gone"
    finally:
        os.close(pidfd)
    return None
