"""`warren ls`: the user's sandboxes, dead ones with the reason.

On a fast path of its own: with a thousand sandboxes alive it still answers at once
(issue 36: under 100 ms). It asks the supervisor with the protocol alone
(``connect.request``) and prints the reply's fields as they are, without the client
library, the models or the HTTP codec: importing those took more than half of the
command's time, and turning a thousand replies into models and back into the HTTP
API's form took longer than reading them. The rows are still exactly what the HTTP API
shows of each sandbox (``codec.encode`` of its ``SandboxInfo``): ``row`` says how, and
tests/test_cli_ls.py checks it against the codec field by field and in order.
"""

from __future__ import annotations

import time

from .. import durations, protocol
from ..client import connect
from . import flags, listing

# What a sandbox's row leaves out of its message: codec.HIDDEN (the host's pid of its
# PID 1 means nothing to a remote client, and the listing is the HTTP API's form).
HIDDEN = frozenset({"pid1"})


def row(item: protocol.SandboxInfo) -> dict[str, object]:
    """A sandbox as the HTTP API shows it: its message's fields, in its model's order
    (protocol.SandboxInfo declares them so), ``pid1`` left out."""
    return {k: v for k, v in item.to_fields().items() if k not in HIDDEN}


def rows() -> list[dict[str, object]]:
    reply, _ = connect.request(protocol.ListRequest(), (protocol.SandboxList,))
    assert isinstance(reply, protocol.SandboxList)
    return [row(item) for item in reply.items]


def age(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 7200:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds // 3600)}h"


def alive(r: listing.Row) -> bool:
    return r["state"] in ("running", "paused")  # as SandboxInfo.alive


def _where(r: listing.Row) -> str:
    return str(r["workspace"]) if alive(r) else f"{r['workspace']}  ({r['reason']})"


def ls(args: list[str]) -> int:
    p = flags.parser("warren ls", "List your sandboxes; dead ones say why.")
    listing.add_flags(p)
    ns = p.parse_args(args)
    items = rows()
    now = time.time()

    def idle(r: listing.Row) -> str:
        if not alive(r) or not r.get("last_active"):
            return "-"
        shown = age(now - r["last_active"])
        return shown + (f"/{durations.show(r['idle_timeout'])}" if r.get("idle_timeout") else "")

    columns = [
        listing.Column("NAME", lambda r: r["name"], width=20),
        listing.Column("STATE", lambda r: r["state"], width=8),
        listing.Column("AGE", lambda r: age(now - r["created"]), width=8, right=True),
        listing.Column("IDLE", idle, width=12, right=True),  # idle for / stops after
        listing.Column("WORKSPACE / REASON", _where),
    ]
    listing.emit(ns, items, columns)
    return 0


COMMANDS = {"ls": ls}
