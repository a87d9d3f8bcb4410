"""``warren stop``, ``warren rm``, ``warren shutdown``: a sandbox's end, on the protocol
alone (``connect.request``), as ``warren ls`` lists them.

Without the client library, the models or the codec: a test suite's or an agent's
cleanup runs these once per sandbox, and those imports were more than half of each
one's time. What a reply says is read from its message (``protocol.SandboxInfo``), the
errors are the supervisor's own, raised by ``connect.request`` as the library raises
them.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from .. import protocol, statedir, wire
from ..client import connect
from ..errors import SandboxError, WarrenError
from ..names import check_name
from . import flags, ls


def _ask(message: protocol.Message) -> protocol.SandboxInfo:
    # Sent already by the native front end (`stop NAME`, `rm -f NAME`), whose reply it
    # handed over (a warning it could not print, an error): that connection was taken
    # over (``attach.take_over``), which loaded the module; otherwise it is not loaded.
    attach = sys.modules.get(f"{__package__}.attach")
    handed = attach.handed_reply(message.TAG, (protocol.SandboxInfo,)) if attach is not None else None
    if handed is None:
        handed, _ = connect.request(message, (protocol.SandboxInfo,))
    assert isinstance(handed, protocol.SandboxInfo)
    return handed


def names_flags(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("names", nargs="*", metavar="NAME", help=f"the sandboxes to {what}")
    p.add_argument("-a", "--all", action="store_true", help=f"{what} every sandbox of yours")


def each(ns: argparse.Namespace, op: str, act: Callable[[str], None], alive_only: bool = False) -> int:
    """``act`` on every sandbox named (or, with --all, every one listed), as docker does:
    each done is printed, each failure said on its own line, and the rest still done;
    exit 125 if any failed."""
    if ns.all and ns.names:
        raise flags.UsageError(f"warren {op}: give names or --all, not both", operation="cli")
    if ns.all:
        names = [str(r["name"]) for r in ls.rows() if ls.alive(r) or not alive_only]
    elif ns.names:
        names = [check_name(n) for n in ns.names]
    else:
        raise flags.UsageError(
            f"warren {op}: which sandbox?", operation="cli", hint=f"warren {op} NAME [NAME...], or --all"
        )
    failed = 0
    for name in names:
        try:
            act(name)
        except WarrenError as e:
            failed += 1
            print(f"warren: {name}: {e.message}" + (f"\n  hint: {e.hint}" if e.hint else ""), file=sys.stderr)
            continue
        if len(names) > 1 or ns.all:
            print(name)
    return 125 if failed else 0


def _warn(item: protocol.SandboxInfo) -> None:
    for w in item.warnings:
        print(f"warren: WARNING: {w}", file=sys.stderr)


def stop(args: list[str]) -> int:
    p = flags.parser(
        "warren stop", "Stop sandboxes: SIGTERM to their processes, SIGKILL after a grace period."
    )
    names_flags(p, "stop")
    ns = p.parse_args(args)
    return each(ns, "stop", lambda name: _warn(_ask(protocol.StopRequest(name=name, remove=False))), True)


def rm(args: list[str]) -> int:
    p = flags.parser("warren rm", "Forget sandboxes (their workspaces are kept); -f also stops running ones.")
    p.add_argument("-f", "--force", action="store_true", help="stop it first if it is running")
    names_flags(p, "remove")
    ns = p.parse_args(args)

    def remove(name: str) -> None:
        if ns.force:  # whatever its state: one request (the native front end's too)
            _warn(_ask(protocol.StopRequest(name=name, remove=True)))
            return
        item = _ask(protocol.GetRequest(name=name))
        if ls.alive(ls.row(item)) or item.state == "stopping":
            raise SandboxError(
                f"sandbox {name} is {item.state}",
                operation="rm",
                path=name,
                hint=f"stop it first (warren stop {name}), or remove it at once with warren rm -f {name}",
            )
        _warn(_ask(protocol.StopRequest(name=name, remove=True)))

    return each(ns, "rm", remove)


EXIT_WAIT = 10.0  # seconds `warren shutdown` waits for a supervisor that holds no sandbox


def shutdown(args: list[str]) -> int:
    flags.parser(
        "warren shutdown",
        "Let this user's supervisor exit once it holds no sandbox; without one, return once it has exited.",
    ).parse_args(args)
    root = statedir.location(os.environ)
    found = statedir.read_address(root)
    if found is None:
        print("warren: no supervisor is running", file=sys.stderr)
        return 0
    # Its pidfd, taken before it is asked: without a sandbox it goes at once, ending the
    # sandboxes it booted ahead and removing their groups, and a caller that goes on
    # (removes the state directory, the cgroup it ran in, upgrades warren) must find it
    # gone, not going.
    exited = _pidfd(found[1])
    try:
        reply, _ = connect.request(protocol.ShutdownRequest(), (protocol.SandboxList,))
        assert isinstance(reply, protocol.SandboxList)
        live = [i.name for i in reply.items]
        if live:
            print(
                f"warren: the supervisor exits once these {len(live)} sandbox(es) are gone: "
                f"{', '.join(live)}\n"
                "  hint: stop them (warren stop NAME, or warren rm -f NAME) and it exits at once",
                file=sys.stderr,
            )
        elif exited is not None and not wire.readable(exited, EXIT_WAIT):  # it has not exited
            print(
                f"warren: the supervisor (pid {found[1]}) is still running {EXIT_WAIT:g} s after agreeing "
                "to exit: it goes once the requests it is serving are done (another client's, a "
                "snapshot being saved)\n"
                f"  hint: see {os.path.join(root, statedir.LOG_FILE)}",
                file=sys.stderr,
            )
    finally:
        if exited is not None:
            os.close(exited)
    return 0


def _pidfd(pid: int) -> int | None:
    """A descriptor readable once ``pid`` has exited; None if it has already (or cannot
    be watched here: then the shutdown is only asked for, as before pidfds)."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


COMMANDS = {"stop": stop, "rm": rm, "shutdown": shutdown}
