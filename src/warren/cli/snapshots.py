"""CLI commands for snapshots of sandboxes on an image: ``warren snapshot NAME``,
``warren snapshot ls``, ``warren snapshot rm ID``, ``warren fork NAME NEW``."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable

from ..client.local import LocalTransport
from ..client.sandbox import Sandbox
from ..names import check_name
from ..policy.limits import show_size
from ..policy.spec import from_mapping
from . import flags, listing

COLUMNS = (
    listing.Column("ID", lambda r: r["id"]),
    listing.Column("SANDBOX", lambda r: r["sandbox"]),
    listing.Column("IMAGE", lambda r: r["image"]),
    listing.Column("SIZE", lambda r: show_size(r["size"]), right=True),
    listing.Column("CREATED", lambda r: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["created"]))),
    listing.Column("STATE", lambda r: "saved" if r["saved"] else "saving"),
    listing.Column("WORKSPACE", lambda r: r["workspace"]),
)


def snapshot(args: list[str]) -> int:
    if args[:1] == ["ls"]:
        p = flags.parser("warren snapshot ls", "Every snapshot of this user, oldest first.")
        listing.add_flags(p, "id")
        ns = p.parse_args(args[1:])
        items = Sandbox.snapshots(transport=LocalTransport())
        listing.emit(ns, [dataclasses.asdict(s) for s in items], COLUMNS, "id")
        return 0
    if args[:1] == ["rm"]:
        p = flags.parser("warren snapshot rm", "Remove snapshots no sandbox or other snapshot stands on.")
        p.add_argument("ids", nargs="+", metavar="ID")
        ns = p.parse_args(args[1:])
        for snap_id in ns.ids:
            Sandbox.remove_snapshot(snap_id, transport=LocalTransport())
        return 0
    p = flags.parser(
        "warren snapshot",
        "Snapshot sandbox NAME (on an image): its own layer — what it changed in the image, and "
        "/workspace when that lives there; prints the id. Between commands the layer is frozen where "
        "it is (milliseconds, whatever its size) and copied to warren's state directory in the "
        "background (`snapshot ls` says `saving` until then); with a process running in it, it is "
        "copied while the sandbox is paused. Processes and memory are not included, nor a host "
        "workspace. `warren snapshot ls`, `warren snapshot rm ID`; use one with "
        "`warren create --from-snapshot ID NEW`.",
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("name")
    ns = p.parse_args(args)
    snap = Sandbox.get(check_name(ns.name), transport=LocalTransport()).snapshot()
    if ns.json:
        print(json.dumps(dataclasses.asdict(snap), indent=2))
    else:
        print(snap.id)
    return 0


def fork(args: list[str]) -> int:
    p = flags.parser(
        "warren fork",
        "A new sandbox NEW from a snapshot of sandbox NAME taken now (paused briefly): the same "
        "image, files and host workspace; the policy flags set the rest.",
    )
    flags.add_policy_flags(p)
    p.add_argument("name")
    p.add_argument("new")
    ns = p.parse_args(args)
    spec = from_mapping(flags.spec_of(ns), "flags")
    source = Sandbox.get(check_name(ns.name), transport=LocalTransport())
    forked = source.fork(check_name(ns.new), spec)
    print(forked.name)
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"snapshot": snapshot, "fork": fork}
