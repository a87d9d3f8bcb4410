"""``warren diff``, ``apply``, ``discard``: a review sandbox's layer (``create --review``)."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable

from ..client.local import LocalTransport
from ..models import Change, Checkpoint, Review
from ..names import check_name
from ..policy.limits import show_size
from . import flags

_MARK = {"added": "A", "modified": "M", "removed": "D", "mode": "T", "renamed": "R"}


def _line(c: Change) -> str:
    what = f"{c.renamed_from} -> {c.path}" if c.renamed_from else c.path
    if c.type == "dir":
        what += "/"
    elif c.type == "symlink":
        what += " (link)"
    if c.kind == "mode" or (c.old_mode is not None and c.new_mode is not None and c.old_mode != c.new_mode):
        what += f" (mode {c.old_mode:o} -> {c.new_mode:o})"
    if c.held:
        what += f"  [not applied: {c.held}]"
    return f"{_MARK.get(c.kind, '?')} {what}"


def _json(review: Review) -> str:
    return json.dumps(dataclasses.asdict(review), indent=2)


def diff(args: list[str]) -> int:
    p = flags.parser(
        "warren diff",
        "What review sandbox NAME changed in its workspace (A added, M modified, D removed, "
        "T mode, R renamed); the host's files are untouched until `warren apply`.",
    )
    p.add_argument("--patch", action="store_true", help="a git-style patch (binary files named)")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("name")
    ns = p.parse_args(args)
    review = LocalTransport().review(check_name(ns.name), "diff", [], patch=ns.patch)
    if ns.json:
        print(_json(review))
    elif ns.patch:
        sys.stdout.write(review.patch)
    else:
        for c in review.changes:
            print(_line(c))
    return 0


def apply(args: list[str]) -> int:
    p = flags.parser(
        "warren apply",
        "Write stopped review sandbox NAME's changes (or those at or beneath PATH, relative to the "
        "workspace) to the host workspace, each file atomically.",
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite host files changed since the sandbox started"
    )
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("name")
    p.add_argument("paths", nargs="*", metavar="PATH")
    ns = p.parse_args(args)
    review = LocalTransport().review(check_name(ns.name), "apply", ns.paths, force=ns.force)
    if ns.json:
        print(_json(review))
        return 0
    applied = set(review.applied)
    for c in review.changes:
        if c.path in applied or c.held:
            print(_line(c))
    print(f"applied {len(review.applied)} change(s)", file=sys.stderr)
    return 0


def discard(args: list[str]) -> int:
    p = flags.parser("warren discard", "Drop every change of stopped review sandbox NAME.")
    p.add_argument("name")
    ns = p.parse_args(args)
    LocalTransport().review(check_name(ns.name), "discard", [])
    return 0


def _when(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _checkpoint_line(c: Checkpoint) -> str:
    return f"{c.id:>4}  {_when(c.time)}  {show_size(c.bytes):>8}  {c.command or '-'}"


def checkpoint(args: list[str]) -> int:
    p = flags.parser(
        "warren checkpoint",
        "Freeze review sandbox NAME's workspace as it is now (prints the checkpoint's id); one is "
        "also taken before each command. On a sandbox on an image (--image), its root. Refused "
        "while a process runs in it.",
    )
    p.add_argument("name")
    ns = p.parse_args(args)
    taken = LocalTransport().checkpoint(check_name(ns.name), "take")[0]
    print(taken.id)
    return 0


def checkpoints(args: list[str]) -> int:
    p = flags.parser(
        "warren checkpoints",
        "Review (or image) sandbox NAME's checkpoints, oldest first: id, time, the bytes its "
        "changes hold, the commands that followed it.",
    )
    p.add_argument("--json", action="store_true", help="one JSON array")
    p.add_argument("name")
    ns = p.parse_args(args)
    found = LocalTransport().checkpoint(check_name(ns.name), "list")
    if ns.json:
        print(json.dumps([{k: v for k, v in dataclasses.asdict(c).items() if k != "stopped"} for c in found]))
    else:
        for c in found:
            print(_checkpoint_line(c))
    return 0


def rollback(args: list[str]) -> int:
    p = flags.parser(
        "warren rollback",
        "Return review sandbox NAME's workspace (on an image: its root) to checkpoint ID (the last "
        "one without): what was written since is gone, later checkpoints with it. Processes still "
        "running are stopped first (named).",
    )
    p.add_argument(
        "--keep-running", action="store_true", help="refuse (naming them) rather than stop running processes"
    )
    p.add_argument("name")
    p.add_argument("id", nargs="?", type=int, default=0, metavar="ID")
    ns = p.parse_args(args)
    back = LocalTransport().checkpoint(check_name(ns.name), "rollback", ns.id, ns.keep_running)[0]
    if back.stopped:
        print(f"warren: stopped first: {back.stopped}", file=sys.stderr)
    print(f"warren: {ns.name} rolled back to checkpoint {back.id} ({_when(back.time)})", file=sys.stderr)
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "diff": diff,
    "apply": apply,
    "discard": discard,
    "checkpoint": checkpoint,
    "checkpoints": checkpoints,
    "rollback": rollback,
}


def run(spec: dict[str, object], profile: str | None, command: list[str], timeout: float | None) -> int:
    """``warren run --review``: the command in a review sandbox of its own, which is kept,
    stopped, for ``diff``/``apply``/``discard`` (a one-shot sandbox would take its layer
    with it). Exit status: the command's."""
    import os
    import secrets

    from ..policy.spec import from_mapping
    from . import attach

    transport = LocalTransport()
    name = f"review-{secrets.token_hex(4)}"
    info = transport.create(from_mapping(spec, "flags"), name, config=True, profile=profile)
    for w in info.warnings:
        print(f"warren: WARNING: {w}", file=sys.stderr)
    here = os.getcwd()
    inside = here == info.workspace or here.startswith(info.workspace.rstrip("/") + "/")
    try:
        status = attach.exec_(name, command, here if inside else None, {}, timeout)
    finally:
        transport.stop(name, remove=False)
    changes = transport.review(name, "diff", []).changes
    for c in changes[:20]:
        print(f"warren: {_line(c)}", file=sys.stderr)
    if len(changes) > 20:
        print(f"warren: ... and {len(changes) - 20} more", file=sys.stderr)
    print(
        f"warren: {len(changes)} change(s) kept in review sandbox {name} (stopped): `warren diff {name}` "
        f"shows them, `warren apply {name}` writes them, `warren rm {name}` drops them",
        file=sys.stderr,
    )
    return status
