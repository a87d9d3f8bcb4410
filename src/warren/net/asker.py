"""Which process inside a sandbox opened a connection to its proxy, for the list of
``--network ask``'s waiting requests (``warren net NAME pending``).

Read from the host's /proc, as any tool would: the connection's socket is found in the
TCP table of the sandbox's network namespace (``/proc/PID1/net/tcp``, by its two ends),
then among the open descriptors of the sandbox's processes (PID 1's tree, through
``task/*/children``). Informational and best effort: a process may have passed the
socket on, or ended; nothing is decided on it. Everything read is bounded (processes,
descriptors, the command line) because the sandbox decides how much there is, and what
is returned is escaped (``printable``): the command line is the sandbox's to write.
Nothing here follows a link or opens a file of the sandbox's: only /proc entries.
"""

from __future__ import annotations

import os

from ..terminal import printable

MAX_PROCS = 512  # processes looked at, PID 1's tree breadth first
MAX_FDS = 8192  # descriptors looked at, all processes together
MAX_ARGV = 4096  # bytes of a command line read
SHOWN = 200  # characters of it shown


def _hex_port(port: int) -> str:
    return f"{port:04X}"


def socket_inode(pid1: int, local: tuple[str, int], proxy_port: int) -> int | None:
    """The inode of the sandbox's end of a connection to the proxy: the IPv4 socket whose
    local address is ``local`` (what the proxy sees as its peer) and whose remote port is
    the proxy's."""
    if local[0] != "127.0.0.1":
        return None
    want_local = f"0100007F:{_hex_port(local[1])}"
    want_remote = f"0100007F:{_hex_port(proxy_port)}"
    try:
        with open(f"/proc/{pid1}/net/tcp", "rb") as f:
            table = f.read(4 << 20).decode(errors="replace")
    except OSError:
        return None
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 9 and fields[1] == want_local and fields[2] == want_remote:
            return int(fields[9]) if fields[9].isdigit() else None
    return None


def _tree(pid1: int) -> list[int]:
    """PID 1 and its descendants, breadth first, at most ``MAX_PROCS``."""
    found: list[int] = []
    queue = [pid1]
    while queue and len(found) < MAX_PROCS:
        pid = queue.pop(0)
        found.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks[:64]:
            try:
                with open(f"/proc/{pid}/task/{tid}/children", "rb") as f:
                    queue += [int(c) for c in f.read(65536).split() if c.isdigit()]
            except OSError:
                continue
    return found


def describe(pid: int) -> str:
    """ "pid N: ARGV", N as the sandbox numbers it (its own pid namespace)."""
    inner = str(pid)
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f.read(16384).decode(errors="replace").splitlines():
                if line.startswith("NSpid:"):
                    inner = line.split()[-1]
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read(MAX_ARGV).split(b"\0") if a]
    except OSError:
        return ""
    shown = " ".join(argv)
    if len(shown) > SHOWN:
        shown = shown[:SHOWN] + "..."
    return printable(f"pid {inner}: {shown}")


def of_connection(pid1: int, proxy_port: int, peer: tuple[str, int]) -> str:
    """The process holding the sandbox's end of the proxy connection from ``peer``, as
    ``describe`` says it, or "" when it cannot be told."""
    inode = socket_inode(pid1, peer, proxy_port)
    if inode is None:
        return ""
    target = f"socket:[{inode}]"
    budget = MAX_FDS
    for pid in _tree(pid1):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for name in names[:budget]:
            try:
                if os.readlink(f"/proc/{pid}/fd/{name}") == target:
                    return describe(pid)
            except OSError:
                continue
        budget -= len(names)
        if budget <= 0:
            return ""
    return ""
