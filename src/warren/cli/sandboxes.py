"""CLI commands for long-lived sandboxes: create, ls, ps, cp, port, logs, stats, pause,
resume, stop, rm, shutdown. Each parses its flags and calls the public API (``Sandbox`` over the local
transport); errors reach the entrypoint as ``WarrenError`` (one line + hint)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from collections.abc import Callable

from .. import codec, protocol, statedir
from ..client import connect
from ..client.local import LocalTransport
from ..client.sandbox import Sandbox
from ..errors import SandboxError, WarrenError
from ..models import ProcessInfo, SandboxInfo
from ..names import check_name
from . import copy, flags


def _transport() -> LocalTransport:
    return LocalTransport()


def create(args: list[str]) -> int:
    from ..policy.spec import from_mapping

    p = flags.parser("warren create", "Create a long-lived sandbox NAME (policy flags as for `warren run`).")
    flags.add_policy_flags(p)
    p.add_argument("name")
    ns = p.parse_args(args)
    spec = from_mapping(flags.spec_of(ns), "flags")
    info = _transport().create(spec, check_name(ns.name), config=True, profile=ns.profile)
    for w in info.warnings:
        print(f"warren: WARNING: {w}", file=sys.stderr)
    print(info.name)
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 7200:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds // 3600)}h"


def ls(args: list[str]) -> int:
    p = flags.parser("warren ls", "List your sandboxes; dead ones say why.")
    p.add_argument("--json", action="store_true", help="one JSON array")
    ns = p.parse_args(args)
    items = Sandbox.list(transport=_transport())
    if ns.json:
        print(json.dumps([codec.encode(i) for i in items], indent=2))  # as the HTTP API shows it
        return 0
    from ..policy.limits import show_duration

    print(f"{'NAME':20} {'STATE':8} {'AGE':>8} {'IDLE':>12}  WORKSPACE / REASON")
    now = time.time()
    for i in items:
        extra = i.workspace if i.alive else f"{i.workspace}  ({i.reason})"
        idle = "-"
        if i.alive and i.last_active:
            idle = _age(now - i.last_active)
            if i.idle_timeout:
                idle += f"/{show_duration(i.idle_timeout)}"  # idle for / stops after
        print(f"{i.name:20} {i.state:8} {_age(now - i.created):>8} {idle:>12}  {extra}")
    return 0


OWN = "[warren]"  # how `ps` shows warren's own processes (PID 1, exec helpers)


def _command(q: ProcessInfo) -> str:
    """The command line as the user typed it (shell-quoted), or ``OWN`` for warren's own."""
    import shlex

    return OWN if connect.is_supervisor(q.argv) else shlex.join(q.argv)


def ps(args: list[str]) -> int:
    p = flags.parser(
        "warren ps",
        f"List the processes running in sandbox NAME; warren's own (PID 1, helpers) show as {OWN}.",
    )
    p.add_argument("--json", action="store_true", help="one JSON array")
    p.add_argument("name")
    ns = p.parse_args(args)
    procs = Sandbox.get(check_name(ns.name), transport=_transport()).processes()
    if ns.json:
        rows = [{**dataclasses.asdict(q), "warren": connect.is_supervisor(q.argv)} for q in procs]
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'PID':>6} {'PPID':>6} S  {'SPAWN':12}  COMMAND")
    for q in procs:
        print(f"{q.pid:>6} {q.ppid:>6} {q.state}  {q.spawn_id or '-':12}  {_command(q)}")
    return 0


def _split(spec: str) -> tuple[str | None, str]:
    name, sep, path = spec.partition(":")
    if sep and name and "/" not in name:
        return check_name(name), path or "."
    return None, spec


def cp(args: list[str]) -> int:
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
        copy.to_sandbox(Sandbox.get(d_name, transport=_transport()), s_path, d_path, ns.recursive)
    else:
        assert s_name is not None
        copy.from_sandbox(Sandbox.get(s_name, transport=_transport()), s_path, d_path, ns.recursive)
    return 0


def port(args: list[str]) -> int:
    p = flags.parser("warren port", "Forward a loopback port on this host to PORT inside sandbox NAME.")
    p.add_argument(
        "--host-port", type=int, default=0, metavar="N", help="host port to use (default: a free one)"
    )
    p.add_argument("name")
    p.add_argument("port", type=int)
    ns = p.parse_args(args)
    print(Sandbox.get(check_name(ns.name), transport=_transport()).expose(ns.port, ns.host_port))
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


def stop(args: list[str]) -> int:
    p = flags.parser(
        "warren stop", "Stop sandbox NAME: SIGTERM to its processes, SIGKILL after a grace period."
    )
    p.add_argument("name")
    ns = p.parse_args(args)
    _warn(_transport().stop(check_name(ns.name), remove=False))
    return 0


def rm(args: list[str]) -> int:
    p = flags.parser("warren rm", "Forget sandbox NAME (the workspace is kept); -f also stops a running one.")
    p.add_argument("-f", "--force", action="store_true", help="stop it first if it is running")
    p.add_argument("name")
    ns = p.parse_args(args)
    transport = _transport()
    info = transport.get(check_name(ns.name))
    if (info.alive or info.state == "stopping") and not ns.force:
        raise SandboxError(
            f"sandbox {ns.name} is {info.state}",
            operation="rm",
            path=ns.name,
            hint=f"stop it first (warren stop {ns.name}), or remove it at once with warren rm -f {ns.name}",
        )
    _warn(transport.stop(ns.name, remove=True))
    return 0


def _warn(info: SandboxInfo) -> None:
    for w in info.warnings:
        print(f"warren: WARNING: {w}", file=sys.stderr)


def shutdown(args: list[str]) -> int:
    flags.parser("warren shutdown", "Let this user's supervisor exit once it holds no sandbox.").parse_args(
        args
    )
    env = os.environ
    if statedir.read_address(statedir.location(env)) is None:
        print("warren: no supervisor is running", file=sys.stderr)
        return 0
    reply, _ = connect.request(protocol.ShutdownRequest(), (protocol.SandboxList,))
    assert isinstance(reply, protocol.SandboxList)
    live = [i.name for i in reply.items]
    if live:
        print(
            f"warren: the supervisor exits once these {len(live)} sandbox(es) are gone: {', '.join(live)}\n"
            "  hint: stop them (warren stop NAME, or warren rm -f NAME) and it exits at once",
            file=sys.stderr,
        )
    return 0


def pause(args: list[str]) -> int:
    p = flags.parser(
        "warren pause",
        "Freeze every process of sandbox NAME: no CPU used, processes and memory kept, "
        "until `warren resume NAME`.",
    )
    p.add_argument("name")
    ns = p.parse_args(args)
    Sandbox.get(check_name(ns.name), transport=_transport()).pause()
    return 0


def resume(args: list[str]) -> int:
    p = flags.parser("warren resume", "Let paused sandbox NAME run again where it stopped.")
    p.add_argument("name")
    ns = p.parse_args(args)
    Sandbox.get(check_name(ns.name), transport=_transport()).resume()
    return 0


def _of(limit: object) -> str:
    return f" of {limit}" if limit is not None else " (no limit)"


def stats(args: list[str]) -> int:
    from ..policy.limits import show_size

    p = flags.parser("warren stats", "Memory, processes and CPU time of sandbox NAME against its limits.")
    p.add_argument("--json", action="store_true", help="one JSON object")
    p.add_argument("name")
    ns = p.parse_args(args)
    s = Sandbox.get(check_name(ns.name), transport=_transport()).stats()
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
    "ls": ls,
    "ps": ps,
    "cp": cp,
    "port": port,
    "logs": logs,
    "stop": stop,
    "rm": rm,
    "shutdown": shutdown,
}
