"""CLI commands for long-lived sandboxes: create, ls, ps, wait, cp, port, logs, stats, pause,
resume, stop, rm, shutdown. Each parses its flags and calls the public API (``Sandbox`` over the local
transport); errors reach the entrypoint as ``WarrenError`` (one line + hint)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import signal
import sys
import time
from collections.abc import Callable

from .. import protocol
from ..client import connect, local
from ..client.local import LocalTransport
from ..errors import ProcessNotFound, SandboxTimeout, WarrenError
from ..names import check_name
from . import flags, lifecycle, listing

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..client.sandbox import Sandbox


def _transport() -> LocalTransport:
    return LocalTransport()


def _sandbox(name: str) -> Sandbox:
    """The live sandbox ``name`` (``Sandbox.get``); its module only for the commands that
    act through it, not ``rm`` or ``stop``."""
    from ..client.sandbox import Sandbox

    return Sandbox.get(name, transport=_transport())


def create(args: list[str]) -> int:
    from ..policy.spec import from_mapping
    from . import attach

    p = flags.parser("warren create", "Create a long-lived sandbox NAME (policy flags as for `warren run`).")
    flags.add_policy_flags(p)
    p.add_argument("name")
    ns = p.parse_args(args)
    # Sent already by the native front end (native/warren.c), with a reply to show here
    # (a warning it could not print, an error): read, as the transport reads its own.
    handed = attach.handed_reply("create", (protocol.SandboxInfo,))
    if isinstance(handed, protocol.SandboxInfo):
        info = local.info(handed)
    else:
        spec = from_mapping(flags.spec_of(ns), "flags")
        info = _transport().create(spec, check_name(ns.name), config=True, profile=ns.profile)
    for w in info.warnings:
        print(f"warren: WARNING: {w}", file=sys.stderr)
    print(info.name)
    return 0


OWN = "[warren]"  # how `ps` shows warren's own processes (PID 1, exec helpers)


def _exit(row: listing.Row) -> str:
    if row["exit_code"] is None:
        return "-"
    if row.get("timed_out"):
        return f"{row['exit_code']} (timeout)"
    code = row["exit_code"]
    return f"{code} ({signal.Signals(code - 128).name})" if 128 < code < 128 + signal.NSIG else str(code)


def ps(args: list[str]) -> int:
    p = flags.parser(
        "warren ps",
        f"List the processes running in sandbox NAME; warren's own (PID 1, helpers) show as {OWN}. "
        "-a adds the background processes (warren exec -d) that ended, with their exit status.",
    )
    listing.add_flags(p, "pid")
    p.add_argument(
        "-a",
        "--all",
        action="store_true",
        help="also the background processes that ended (EXIT: their status)",
    )
    p.add_argument("name")
    ns = p.parse_args(args)
    sandbox = _sandbox(check_name(ns.name))
    procs = sandbox.processes()
    rows: list[dict[str, object]] = [
        {
            **dataclasses.asdict(q),
            "warren": connect.is_supervisor(q.argv) or tuple(q.argv[:1]) == ("warren-init",),
            "exit_code": None,
            "timed_out": False,
        }
        for q in procs
    ]
    if ns.all:
        # Listed after the live ones: a spawn still running is among those already.
        for s in sandbox.spawns():
            if not s.running:
                rows.append(
                    {
                        "pid": s.pid,
                        "ppid": None,
                        "state": "exited" if s.status is not None else "lost",
                        "argv": list(s.argv),
                        "spawn_id": s.spawn_id,
                        "warren": False,
                        "exit_code": s.exit_code,
                        "timed_out": s.timed_out,
                    }
                )
    columns = [
        listing.Column("PID", lambda r: str(r["pid"]), width=6, right=True),
        listing.Column("PPID", lambda r: "-" if r["ppid"] is None else str(r["ppid"]), width=6, right=True),
        listing.Column("S", lambda r: r["state"]),
        listing.Column("SPAWN", lambda r: r["spawn_id"] or "-", width=12),
        *([listing.Column("EXIT", _exit, width=4)] if ns.all else []),
        listing.Column("COMMAND", lambda r: OWN if r["warren"] else shlex.join(r["argv"])),
    ]
    listing.emit(ns, rows, columns, "pid")
    return 0


WAIT_POLL = 0.25  # seconds between two looks at a sandbox that is still alive


def wait(args: list[str]) -> int:
    p = flags.parser(
        "warren wait",
        "Wait until background process ID (or PID) of sandbox NAME ends, print its exit status and exit "
        "with it (128+N for signal N); without ID, wait until sandbox NAME stops and print its state.",
    )
    p.add_argument(
        "--timeout", type=float, metavar="SECONDS", help="give up after this (exit 124); nothing is stopped"
    )
    p.add_argument("name")
    p.add_argument("id", nargs="?", metavar="ID|PID", help="a background process (the id exec -d printed)")
    ns = p.parse_args(args)
    name = check_name(ns.name)
    timeout = flags.timeout(ns.timeout, "wait", "to wait as long as it takes")
    if ns.id is None:
        deadline = None if timeout is None else time.monotonic() + timeout
        info = _transport().get(name)
        while info.alive or info.state == "stopping":
            if deadline is not None and time.monotonic() >= deadline:
                raise SandboxTimeout(
                    f"sandbox {name} still {info.state} after {timeout:g} s",
                    operation="wait",
                    path=name,
                    hint=f"stop it with warren stop {name}, or wait longer",
                )
            time.sleep(WAIT_POLL)
            info = _transport().get(name)
        print(info.state + (f": {info.reason}" if info.state == "dead" and info.reason else ""))
        return 0
    sandbox = _sandbox(name)
    code = sandbox.process(_spawn_id(sandbox, ns.id)).wait(timeout)
    print(code)
    return code


def _spawn_id(sandbox: Sandbox, ident: str) -> str:
    """A spawn id as given, or the latest background process that had pid ``ident``."""
    if not ident.isdigit():
        return ident
    started = [s for s in sandbox.spawns() if str(s.pid) == ident]
    if not started:
        raise ProcessNotFound(
            f"no background process with pid {ident} in sandbox {sandbox.name}",
            operation="wait",
            path=ident,
            hint=f"warren ps -a {sandbox.name} lists them (SPAWN is the id exec -d printed)",
        )
    return started[-1].spawn_id


def _split(spec: str) -> tuple[str | None, str]:
    name, sep, path = spec.partition(":")
    if sep and name and "/" not in name:
        return check_name(name), path or "."
    return None, spec


def cp(args: list[str]) -> int:
    from . import copy  # ctypes and the safe walks: only cp needs them

    p = flags.parser(
        "warren cp",
        "Copy between host and sandbox: warren cp [-r] SRC NAME:DEST, or warren cp [-r] NAME:SRC DEST. "
        "A DEST ending in / (or an existing directory) receives SRC under its own name.",
    )
    p.add_argument("-r", "--recursive", action="store_true", help="copy directories")
    p.add_argument("src")
    p.add_argument("dst")
    ns = p.parse_args(args)
    s_name, s_path = _split(ns.src)
    d_name, d_path = _split(ns.dst)
    if (s_name is None) == (d_name is None):
        raise WarrenError(
            "exactly one side of cp must be NAME:PATH in a sandbox",
            operation="cp",
            hint="warren cp ./file NAME:dir/  or  warren cp NAME:file ./file",
        )
    if d_name is not None:
        copy.to_sandbox(_sandbox(d_name), s_path, d_path, ns.recursive)
    else:
        assert s_name is not None
        copy.from_sandbox(_sandbox(s_name), s_path, d_path, ns.recursive)
    return 0


def port(args: list[str]) -> int:
    p = flags.parser(
        "warren port",
        "Forward a loopback port on this host to PORT inside sandbox NAME (prints the host address); "
        "without PORT, list the forwarded ports; --close PORT stops forwarding to it.",
    )
    p.add_argument(
        "--host-port", type=int, default=0, metavar="N", help="host port to use (default: a free one)"
    )
    p.add_argument("--close", action="store_true", help="stop forwarding to PORT (open connections go on)")
    listing.add_flags(p, "port")
    p.add_argument("name")
    p.add_argument("port", type=int, nargs="?")
    ns = p.parse_args(args)
    sandbox = _sandbox(check_name(ns.name))
    if ns.port is None:
        if ns.close or ns.host_port:
            raise flags.UsageError(
                "--close and --host-port need the sandbox's PORT",
                operation="port",
                hint=f"warren port {sandbox.name} lists them; warren port --close {sandbox.name} PORT",
            )
        rows = [{"port": p, "address": a} for p, a in sorted(sandbox.exposed().items())]
        columns = [
            listing.Column("PORT", lambda r: str(r["port"]), width=5, right=True),
            listing.Column("HOST ADDRESS", lambda r: r["address"]),
        ]
        listing.emit(ns, rows, columns, "port")
        return 0
    if ns.close:
        sandbox.unexpose(ns.port)
        return 0
    print(sandbox.expose(ns.port, ns.host_port))
    return 0


def logs(args: list[str]) -> int:
    p = flags.parser(
        "warren logs",
        "Show what background process ID of sandbox NAME wrote (warren exec -d printed its ID); "
        "-f follows it until it ends. --net lists every network decision of NAME instead.",
    )
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the process ends")
    p.add_argument("--net", action="store_true", help="the network proxy's decisions (--network allow)")
    p.add_argument("--json", action="store_true", help="with --net: one JSON object per line")
    p.add_argument("name")
    p.add_argument("id", nargs="?", help="a background process's id (from warren exec -d)")
    ns = p.parse_args(args)
    name = check_name(ns.name)
    if ns.net:
        if ns.id is not None or ns.follow:
            raise flags.UsageError(
                "--net shows the sandbox's network log: no process ID, no -f",
                operation="logs",
                hint=f"warren logs --net {name}",
            )
        for event in _transport().net_log(name):
            print(json.dumps(event.to_dict()) if ns.json else event.line())
        return 0
    if ns.id is None:
        raise flags.UsageError(
            "say whose log: a background process's ID, or --net",
            operation="logs",
            hint=f"warren exec -d {name} CMD prints an ID for warren logs {name} ID; "
            f"warren logs --net {name} shows the network log",
        )
    from . import background

    return background.show(name, ns.id, ns.follow)


def pause(args: list[str]) -> int:
    p = flags.parser(
        "warren pause",
        "Freeze every process of sandbox NAME: no CPU used, processes and memory kept, "
        "until `warren resume NAME`.",
    )
    lifecycle.names_flags(p, "pause")
    ns = p.parse_args(args)
    return lifecycle.each(ns, "pause", lambda name: _sandbox(name).pause(), alive_only=True)


def resume(args: list[str]) -> int:
    p = flags.parser("warren resume", "Let paused sandboxes run again where they stopped.")
    lifecycle.names_flags(p, "resume")
    ns = p.parse_args(args)
    return lifecycle.each(ns, "resume", lambda name: _sandbox(name).resume(), alive_only=True)


def _of(limit: object) -> str:
    return f" of {limit}" if limit is not None else " (no limit)"


def stats(args: list[str]) -> int:
    from ..sizes import show as show_size

    p = flags.parser("warren stats", "Memory, processes and CPU time of sandbox NAME against its limits.")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("name")
    ns = p.parse_args(args)
    s = _sandbox(check_name(ns.name)).stats()
    if ns.json:
        print(json.dumps(dataclasses.asdict(s), indent=2))
        return 0
    print(f"memory    {show_size(s.memory)}{_of(show_size(s.memory_limit) if s.memory_limit else None)}")
    print(f"pids      {s.pids}{_of(s.pids_limit)}")
    print(f"cpu time  {s.cpu_time:.2f} s{_of(f'{s.cpus_limit:g} CPUs' if s.cpus_limit else None)}")
    print(f"source    {s.source}")
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "stats": stats,
    "pause": pause,
    "resume": resume,
    "create": create,
    "ps": ps,
    "cp": cp,
    "port": port,
    "logs": logs,
    "wait": wait,
}
