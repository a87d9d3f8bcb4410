"""CLI commands for long-lived sandboxes: create, exec, ps, ls, cp, stop, rm.

Registered onto the main ``warren`` group by ``cli``; errors propagate as
``WarrenError`` to its entrypoint (one line + hint, exit codes of DESIGN section 8).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from .errors import WarrenError
from .policy import Policy

_EXEC_SETTINGS = {"ignore_unknown_options": False, "allow_interspersed_args": True}


def register(
    main: click.Group,
    policy_options: Callable[[Callable[..., Any]], Callable[..., Any]],
    policy_from_flags: Callable[[dict[str, Any]], Policy],
    parse_env: Callable[[tuple[str, ...]], dict[str, str]],
) -> None:
    @main.command("create")
    @policy_options
    @click.argument("name")
    def create_cmd(name: str, **opts: Any) -> None:
        """Create a long-lived sandbox NAME with these policy flags (as for `warren run`)."""
        from .sandbox import Sandbox

        sb = Sandbox.create(policy_from_flags(opts), name=name)
        click.echo(sb.name)

    @main.command("exec", context_settings=_EXEC_SETTINGS)
    @click.option("--cwd", metavar="DIR", help="Working directory inside the sandbox (default: workspace).")
    @click.option("--env", "env", multiple=True, metavar="K=V", help="Set an environment variable.")
    @click.option(
        "--timeout", type=float, metavar="SECONDS", help="Kill the command's whole tree after this."
    )
    @click.argument("name")
    @click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
    def exec_cmd(
        name: str, command: tuple[str, ...], cwd: str | None, env: tuple[str, ...], timeout: float | None
    ) -> None:
        """Run COMMAND in sandbox NAME with this terminal's stdio: warren exec NAME -- CMD..."""
        from .sandbox import Sandbox

        sb = Sandbox.get(name)
        code, warnings = sb.exec_attached(list(command), cwd=cwd, env=parse_env(env), timeout=timeout)
        for w in warnings:
            click.echo(f"warren: WARNING: {w}", err=True)
        sys.exit(code)

    @main.command("ps")
    @click.argument("name")
    def ps_cmd(name: str) -> None:
        """List the processes running in sandbox NAME."""
        from .sandbox import Sandbox

        click.echo(f"{'PID':>6} {'PPID':>6} S  {'SPAWN':12}  COMMAND")
        for p in Sandbox.get(name).processes():
            click.echo(f"{p.pid:>6} {p.ppid:>6} {p.state}  {p.spawn_id or '-':12}  {' '.join(p.argv)}")

    @main.command("ls")
    def ls_cmd() -> None:
        """List your sandboxes; dead ones say why."""
        from .sandbox import Sandbox

        entries = Sandbox.list()
        click.echo(f"{'NAME':20} {'STATE':8} {'AGE':>8}  WORKSPACE / REASON")
        for e in entries:
            age = _age(time.time() - e.created)
            extra = e.workspace if e.state == "running" else f"{e.workspace}  ({e.reason})"
            click.echo(f"{e.name:20} {e.state:8} {age:>8}  {extra}")

    @main.command("cp")
    @click.argument("src")
    @click.argument("dst")
    def cp_cmd(src: str, dst: str) -> None:
        """Copy a file between host and sandbox: warren cp FILE NAME:PATH, or NAME:PATH FILE."""
        from .sandbox import Sandbox

        s_name, s_path = _split(src)
        d_name, d_path = _split(dst)
        if (s_name is None) == (d_name is None):
            raise WarrenError(
                "exactly one side of cp must be NAME:PATH in a sandbox",
                operation="cp",
                hint="warren cp ./file NAME:dir/file  or  warren cp NAME:file ./file",
            )
        if d_name is not None:
            try:
                data = Path(s_path).read_bytes()
            except OSError as e:
                raise WarrenError(
                    f"cannot read {s_path} on the host",
                    operation="cp",
                    path=s_path,
                    errno=e.errno,
                    hint="copy regular files one at a time",
                ) from None
            Sandbox.get(d_name).files.write(d_path, data)
        else:
            assert s_name is not None
            data = Sandbox.get(s_name).files.read(s_path)
            target = Path(d_path)
            if target.is_dir():
                target = target / Path(s_path).name
            try:
                target.write_bytes(data)
            except OSError as e:
                raise WarrenError(
                    f"cannot write {target} on the host",
                    operation="cp",
                    path=str(target),
                    errno=e.errno,
                    hint="check the destination directory exists and is writable",
                ) from None

    @main.command("port")
    @click.option(
        "--host-port", type=int, default=0, metavar="N", help="Host port to use (default: a free one)."
    )
    @click.argument("name")
    @click.argument("port", type=click.IntRange(1, 65535))
    def port_cmd(name: str, port: int, host_port: int) -> None:
        """Forward a loopback port on this host to PORT inside sandbox NAME; print the address."""
        from .sandbox import Sandbox

        click.echo(Sandbox.get(name).expose(port, host_port))

    @main.command("logs")
    @click.option("--net", "net", is_flag=True, help="The network proxy's decisions (--network allow).")
    @click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
    @click.argument("name")
    def logs_cmd(name: str, net: bool, as_json: bool) -> None:
        """Show sandbox NAME's logs: `warren logs --net NAME` lists every network decision."""
        import json

        from .errors import WarrenError

        if not net:
            raise WarrenError(
                "say which log: only the network log exists (--net)",
                operation="logs",
                hint=f"warren logs --net {name}; a spawned process's output is in its Process.output()",
            )
        for event in _registered(name).net_log():
            click.echo(json.dumps(event.to_dict()) if as_json else event.line())

    @main.command("stop")
    @click.argument("name")
    def stop_cmd(name: str) -> None:
        """Stop sandbox NAME: SIGTERM to its processes, SIGKILL after a grace period."""
        _registered(name).stop()

    @main.command("rm")
    @click.argument("name")
    def rm_cmd(name: str) -> None:
        """Stop sandbox NAME if running and forget it (the workspace is kept)."""
        _registered(name).remove()


def _registered(name: str) -> Any:
    """A handle on a registered sandbox in any state (stop/rm work on dead ones)."""
    from . import registry
    from .errors import SandboxNotFound
    from .sandbox import Sandbox

    root = registry.state_dir()
    reg = registry.Registry(root)
    try:
        entry = reg.get(name)
    finally:
        reg.close()
    if entry is None:
        raise SandboxNotFound(f"no sandbox named {name}", operation="rm", path=name, hint="see `warren ls`")
    return Sandbox(entry, root)


def _split(spec: str) -> tuple[str | None, str]:
    name, sep, path = spec.partition(":")
    if sep and name and "/" not in name:
        return name, path
    return None, spec


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{int(seconds)}s"
    if seconds < 7200:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds // 3600)}h"
