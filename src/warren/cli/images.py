"""``warren image``: build, import, list, inspect, remove and collect images.

One parser for the group (the reference and completions are made from it): the first
word is the action, the flags say which actions they apply to. Progress goes to
stderr, one rewritten line, only when stderr is a terminal.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from ..terminal import printable
from . import flags, listing
from .progress import Progress, human_size

ACTIONS = ("build", "import", "ls", "inspect", "rm", "gc")
_USAGE = {
    "build": "build NAME --debian SUITE [--include PKG,...] [--mirror URL] [--variant V]",
    "import": "import NAME FILE",
    "ls": "ls [-q] [--format json|table|TEMPLATE]",
    "inspect": "inspect NAME",
    "rm": "rm [--force] NAME...",
    "gc": "gc",
}


def _usage(action: str, why: str) -> flags.UsageError:
    return flags.UsageError(
        f"warren image {action}: {why}", operation="cli", hint=f"usage: warren image {_USAGE[action]}"
    )


def _warn(progress: Progress) -> Callable[[str], None]:
    def warn(line: str) -> None:
        progress.end()
        sys.stderr.write(f"warren: warning: {printable(line)}\n")

    return warn


def image(args: list[str]) -> int:
    p = flags.parser(
        "warren image",
        "Images: root filesystems a sandbox can run on. Actions: "
        + "; ".join(f"warren image {u}" for u in _USAGE.values()),
    )
    p.add_argument("action", choices=ACTIONS, help="what to do")
    p.add_argument("names", nargs="*", metavar="NAME", help="the image (for import: NAME FILE)")
    p.add_argument("--debian", metavar="SUITE", help="build: the Debian suite (bookworm, trixie, ...)")
    p.add_argument(
        "--include", action="append", default=[], metavar="PKG,...", help="build: more packages (repeatable)"
    )
    p.add_argument("--mirror", metavar="URL", help="build: the Debian mirror (default: mmdebstrap's)")
    p.add_argument("--variant", default="minbase", help="build: mmdebstrap's variant (default minbase)")
    p.add_argument(
        "--max-size",
        metavar="SIZE",
        help="build, import: refuse an image whose files add up to more (default 32G)",
    )
    p.add_argument(
        "--allow-devices",
        action="store_true",
        help="import (as root only): keep the archive's device nodes (else skipped with a warning)",
    )
    p.add_argument("--json", action="store_true", help="ls, inspect: print JSON")
    listing.add_flags(p, json_flag=False)
    p.add_argument(
        "--force",
        action="store_true",
        help="rm: forget the name even while sandboxes or snapshots use the image "
        "(its layers stay until the last of them is gone)",
    )
    ns = p.parse_args(_flags_first(args))

    from ..images.store import ImageStore

    store = ImageStore()
    action, names = ns.action, ns.names
    if action in ("build", "import", "inspect") and not names:
        raise _usage(action, "name the image")
    max_size: dict[str, Any] = {}
    if ns.max_size is not None:
        from ..policy.limits import parse_size

        max_size["max_size"] = parse_size(ns.max_size, "--max-size")
    if action == "build":
        return _build(store, ns, max_size)
    if action == "import":
        if len(names) != 2:
            raise _usage(action, "give NAME and FILE")
        return _added(
            functools.partial(
                store.import_archive, names[0], names[1], allow_devices=ns.allow_devices, **max_size
            )
        )
    if action == "ls":
        if names:
            raise _usage(action, "takes no name")
        return _ls(store, ns)
    if action == "inspect":
        infos = [store.inspect(n) for n in names]
        if ns.json:
            print(json.dumps([i.to_json() for i in infos], indent=2))
        else:
            for info in infos:
                _show(info.to_json())
        return 0
    if action == "rm":
        if not names:
            raise _usage(action, "name the image")
        for n in names:
            store.remove(n, collect=False, force=ns.force)
        store.gc()
        return 0
    if names:
        raise _usage(action, "takes no name")
    removed = store.gc()
    print(f"removed {len(removed)} layer{'s' * (len(removed) != 1)}")
    return 0


_VALUED = ("--debian", "--include", "--mirror", "--variant", "--max-size", "--format")


def _flags_first(args: list[str]) -> list[str]:
    """Flags before the words, so that flags may come anywhere (``inspect --json NAME``):
    argparse ends a ``*`` positional at the first flag."""
    flags_, words = [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            words += args[i + 1 :]
            break
        if arg.startswith("-"):
            flags_.append(arg)
            if arg in _VALUED and i + 1 < len(args):
                flags_.append(args[i + 1])
                i += 1
        else:
            words.append(arg)
        i += 1
    return [*flags_, *words]


def _build(store: Any, ns: Any, max_size: dict[str, Any]) -> int:
    from ..images import build

    if len(ns.names) != 1:
        raise _usage("build", "name one image")
    if not ns.debian:
        raise _usage("build", "--debian SUITE is required")
    include = [pkg.strip() for item in ns.include for pkg in item.split(",") if pkg.strip()]
    return _added(
        functools.partial(
            build.debian,
            store,
            ns.names[0],
            ns.debian,
            include=include,
            mirror=ns.mirror,
            variant=ns.variant,
            show_output=sys.stderr.isatty(),
            **max_size,
        )
    )


def _added(add: Callable[..., Any]) -> int:
    """Build or import an image (``add``) with its progress on stderr, then print its
    name and short id."""
    progress = Progress()
    try:
        ref = add(progress=progress, warn=_warn(progress))
    finally:
        progress.end()
    print(f"{ref.name} {ref.id[7:19]}")
    return 0


def _ls(store: Any, ns: argparse.Namespace) -> int:
    rows = [i.to_json() for i in store.images()]
    columns = [
        listing.Column("NAME", lambda r: r["name"]),
        listing.Column("ID", lambda r: r["id"][7:19]),
        listing.Column("LAYERS", lambda r: str(len(r["layers"])), right=True),
        listing.Column("SIZE", lambda r: human_size(r["size"]), right=True),
        listing.Column("ADDED", lambda r: time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"]))),
        listing.Column("SOURCE", lambda r: r["source"]),
    ]
    listing.emit(ns, rows, columns)
    if not rows and not ns.quiet and not ns.json and ns.format in (None, "table"):
        print("warren: no images yet (warren image build or warren image import makes one)", file=sys.stderr)
    return 0


def _show(data: dict[str, Any]) -> None:
    for key in ("name", "id", "source", "size", "created"):
        value = data[key]
        if key == "size":
            value = human_size(value)
        elif key == "created":
            value = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
        print(printable(f"{key}: {value}"))
    print("layers:")
    for layer in data["layers"]:
        print(f"  {layer}")
    for key, value in data["config"].items():
        if value:
            print(printable(f"{key}: {json.dumps(value)}"))


COMMANDS: dict[str, Callable[[list[str]], int]] = {"image": image}
