"""The MCP server: warren's sandboxes as tools an agent can call.

Built on the official ``mcp`` SDK (FastMCP). The policy is fixed by whoever starts
the server (``warren mcp [policy flags]``): no tool takes a policy, every sandbox a
tool creates gets the server's policy, and a call with an argument a tool does not
declare is refused (``Tools.call_tool``) rather than silently ignored, so an agent
cannot widen anything through a tool argument.

Sandboxes of one server are named ``mcp-<hash of workspace and policy>-<name>``:
a tool reaches only those (never a sandbox the user made with another policy), and
a restarted server with the same policy finds them again. ``run_command`` without a
sandbox uses the workspace's default one, created on first use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal as _signal
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import anyio
import anyio.to_thread
from mcp.server.transport_security import TransportSecuritySettings
from pydantic import Field

from .. import protocol
from ..cli.hints import after_failure, limit_reached
from ..client import checks, origin
from ..client import transport as transports
from ..client.sandbox import feed_stdin
from ..client.transport import Transport
from ..errors import ProcessNotFound, SandboxExists, SandboxNotFound, WarrenError
from ..models import FileOp, FileResult
from ..policy.spec import PolicySpec
from . import review
from .sdk import Server, ToolError, http_app_kwargs, server_kwargs

OUTPUT_LIMIT = 1 << 20
READ_LIMIT = 4 << 20
EVENTS_PAGE = 100  # trail records in one answer: an agent's context is the budget
STDIN_WAIT = 10.0  # seconds write_stdin waits for a process that is not reading
_Fn = TypeVar("_Fn", bound=Callable[..., Any])
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")

INSTRUCTIONS = """\
A Linux sandbox (warren) for one project. Commands run with the project's workspace as
the working directory; the network, writable paths and hidden files are fixed by the
person who started this server. Use run_command for builds, tests and git; files
outside the workspace are mostly read-only. Long-running servers: start_process, then
process_output; reach them with expose_port. Interactive programs (a REPL, a tool that
reads requests on stdin): start_process with stdin=true, then write_stdin."""


def _prefix(spec: PolicySpec, workspace: str) -> str:
    digest = hashlib.sha256(json.dumps([workspace, spec.to_mapping()], sort_keys=True).encode()).hexdigest()
    return f"mcp-{digest[:8]}-"


def _error(e: WarrenError) -> Exception:
    text = e.message + (f" (path: {e.path})" if e.path and e.path not in e.message else "")
    if e.hint:
        text += f"\nhint: {e.hint}"
    return ToolError(text)


class Tools(Server):  # type: ignore[misc]  # the SDK's server class, of either major (sdk.py)
    """The SDK's server (FastMCP, MCPServer) refusing undeclared arguments instead of ignoring them."""

    warren: Warren

    def __init__(self, *args: Any, streamable_path: str, security: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs, **server_kwargs(streamable_path, security))
        self._http_app_kwargs = http_app_kwargs(streamable_path, security)

    def streamable_http_app(self) -> Any:
        return super().streamable_http_app(**self._http_app_kwargs)

    def tool(self) -> Callable[[_Fn], _Fn]:
        decorate: Callable[[_Fn], _Fn] = super().tool()
        return decorate

    async def call_tool(self, name: str, arguments: dict[str, Any], *context: Any) -> Any:
        tool = self._tool_manager.get_tool(name)
        if tool is not None:
            known = set(tool.parameters.get("properties", {}))
            unknown = sorted(set(arguments) - known)
            if unknown:
                raise ToolError(
                    f"{name} has no argument {', '.join(map(repr, unknown))}; the sandbox policy (paths, "
                    "network, environment) is fixed by whoever started this MCP server and cannot be "
                    "changed by a tool call\nhint: known arguments: " + ", ".join(sorted(known))
                )
        # Who asks, for the sandbox's trail: this MCP server, and (over `warren serve`)
        # the token it was reached with. The task's own context: it goes with each call.
        asked = origin.ORIGIN.get()
        if asked is None or not asked.startswith("mcp"):
            origin.ORIGIN.set("mcp" if asked is None else f"mcp via {asked}")
        return await super().call_tool(name, arguments, *context)


class Warren:
    """The tools' state: the transport, the fixed policy and the sandbox names."""

    def __init__(self, transport: Transport, spec: PolicySpec, workspace: str) -> None:
        self.transport = transport
        self.spec = PolicySpec(**{**vars(spec), "workspace": workspace})
        self.workspace = workspace
        self.prefix = _prefix(self.spec, workspace)
        self.default = "default"

    async def call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))
        except WarrenError as e:
            raise _error(e) from None

    def full(self, name: str | None) -> str:
        name = self.default if name is None else name  # "" is not the default: refused below
        if not NAME.match(name):
            raise ToolError(
                f"sandbox name {name!r} is not allowed\nhint: 1-40 letters, digits, '.', '_', '-'; "
                "start with a letter or digit"
            )
        return self.prefix + name

    async def ensure(self, name: str | None) -> str:
        """The sandbox's full name; the default one is created on first use."""
        full = self.full(name)
        if name is not None and name != self.default:
            return full
        try:
            info = await anyio.to_thread.run_sync(self.transport.get, full)
            if info.alive:  # running, or paused by its user (then a tool says so)
                return full
            await self.call(self.transport.stop, full, remove=True)
        except SandboxNotFound:
            pass
        except WarrenError as e:
            raise _error(e) from None
        try:
            await anyio.to_thread.run_sync(
                lambda: self.transport.create(self.spec, full, config=False, profile=None)
            )
        except SandboxExists:
            pass
        except WarrenError as e:
            raise _error(e) from None
        return full

    def remove_default(self) -> None:
        """Stop and forget the default sandbox (when the server ends): its processes and
        its place in the registry; the workspace stays."""
        with contextlib.suppress(SandboxNotFound):
            self.transport.stop(self.full(None), remove=True)


def _argv(command: str | None, argv: list[str] | None) -> list[str]:
    if (command is None) == (argv is None):
        raise ToolError('give exactly one of "command" (a shell string) or "argv" (a list of strings)')
    args: list[str] = _checked(
        checks.argv, ["sh", "-c", command] if command is not None else argv, "run_command"
    )
    return args


def _checked(check: Any, *args: Any) -> Any:
    """A value through ``checks`` (the bounds the SDK and HTTP use), as a tool error."""
    try:
        return check(*args)
    except WarrenError as e:
        raise _error(e) from None


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


SandboxArg = Annotated[
    str | None,
    Field(description="a sandbox made by create_sandbox; omit for the workspace's default sandbox"),
]
Command = Annotated[str | None, Field(description="a shell command line, run with `sh -c` (or use argv)")]
Argv = Annotated[list[str] | None, Field(description="the program and its arguments, run without a shell")]
Cwd = Annotated[str | None, Field(description="working directory in the sandbox (default: the workspace)")]
Timeout = Annotated[
    float | None,
    Field(
        description="seconds before the command's whole tree is killed (above 0, at most a week); "
        "null: no limit",
        gt=0,
        le=checks.MAX_TIMEOUT,
    ),
]
Offset = Annotated[int, Field(ge=0, le=checks.MAX_OFFSET)]


def build(
    transport: Transport, spec: PolicySpec | None, workspace: str | None, *, streamable_path: str = "/mcp"
) -> Tools:
    """The MCP server over ``transport`` with the fixed policy ``spec``."""
    base = spec or PolicySpec()
    ws = os.path.abspath(workspace or base.workspace or os.getcwd())
    w = Warren(transport, base, ws)
    mcp = Tools(
        "warren",
        instructions=INSTRUCTIONS,
        streamable_path=streamable_path,
        security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        log_level="WARNING",
    )
    mcp.warren = w
    network = base.network or ("allow" if base.allow_hosts else "none")

    @mcp.tool()
    async def run_command(
        command: Command = None,
        argv: Argv = None,
        cwd: Cwd = None,
        timeout: Timeout = 120,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Run a command in the sandbox and wait for it. Returns exit_code, stdout, stderr
        (each capped at 1 MiB; truncated says so) and timed_out (then exit_code is 124). A
        non-zero exit code is a result, not an error; hints, when present, say what warren
        thinks stopped it (a limit of the sandbox, no network in it, a read-only install
        directory), and warnings what warren noticed."""
        args = _argv(command, argv)
        limit = _checked(checks.timeout, timeout, "run_command")
        cwd = _checked(checks.cwd, cwd, "run_command")
        name = await w.ensure(sandbox)
        run = transports.Command(args, cwd, timeout=limit, output_limit=OUTPUT_LIMIT)
        result = await w.call(transport.exec, name, run)
        # As the CLI: a timeout is 124 (the kill that ended it is warren's, not the command's).
        code = 124 if result.timed_out else result.exit_code
        out = {
            "exit_code": code,
            "stdout": _text(result.stdout),
            "stderr": _text(result.stderr),
            "truncated": result.stdout_truncated or result.stderr_truncated,
            "timed_out": result.timed_out,
        }
        hints = [] if code == 0 or result.timed_out else after_failure(args, network, None, result.stderr)
        if result.limit is not None:
            hints.insert(0, limit_reached(result.limit, code))
        if hints:
            out["hints"] = hints
        if result.warnings:
            out["warnings"] = list(result.warnings)
        return out

    @mcp.tool()
    async def create_sandbox(
        name: Annotated[str, Field(description="a short name: letters, digits, '.', '_', '-'")],
    ) -> dict[str, Any]:
        """Create another sandbox with this server's policy (an isolated set of processes;
        it shares the workspace). Use it by passing `sandbox` to the other tools."""
        full = w.full(name)
        info = await w.call(transport.create, w.spec, full, config=False, profile=None)
        return {
            "name": name,
            "state": info.state,
            "workspace": info.workspace,
            "warnings": list(info.warnings),
        }

    @mcp.tool()
    async def list_sandboxes() -> dict[str, Any]:
        """The sandboxes of this server, with their state ("running", "stopped", "dead")."""
        items = await w.call(transport.list)
        return {
            "sandboxes": [
                {"name": i.name[len(w.prefix) :], "state": i.state, "reason": i.reason}
                for i in items
                if i.name.startswith(w.prefix)
            ]
        }

    @mcp.tool()
    async def remove_sandbox(
        name: Annotated[str, Field(description="the sandbox to stop and remove (the workspace stays)")],
    ) -> dict[str, Any]:
        """Stop every process of a sandbox and remove it. Files in the workspace stay."""
        await w.call(transport.stop, w.full(name), remove=True)
        return {"removed": name}

    async def _file(
        sandbox: str | None, op: str, path: str, data: bytes = b"", **extra: Any
    ) -> tuple[FileResult, bytes]:
        name = await w.ensure(sandbox)
        try:
            request = FileOp(op=op, path=checks.path(path, op), **extra)
        except WarrenError as e:
            raise _error(e) from None
        result: FileResult = await w.call(transport.file, name, request, data)
        return result, result.data

    @mcp.tool()
    async def read_file(
        path: Annotated[str, Field(description="relative to the workspace, or absolute in the sandbox")],
        sandbox: SandboxArg = None,
    ) -> str:
        """Read a text file (at most 4 MiB) as the sandbox sees it."""
        _, data = await _file(sandbox, "read", path, max_bytes=READ_LIMIT)
        return _text(data)

    @mcp.tool()
    async def write_file(
        path: Annotated[str, Field(description="relative to the workspace, or absolute in the sandbox")],
        content: Annotated[str, Field(description="the whole new content (UTF-8 text)")],
        append: Annotated[bool, Field(description="append instead of replacing")] = False,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Write a text file, creating missing parent directories. Only paths the policy
        makes writable (the workspace, usually) can be written."""
        raw = content.encode()
        await _file(sandbox, "write", path, raw, mode=0o644, parents=True, append=append)
        return {"path": path, "bytes": len(raw)}

    @mcp.tool()
    async def list_files(
        path: Annotated[str, Field(description="a directory; default the workspace")] = ".",
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """List a directory: name, type ("file", "dir", "symlink", "other") and size."""
        reply, _ = await _file(sandbox, "list", path)
        return {"entries": [{"name": e.name, "type": e.type, "size": e.size} for e in reply.entries]}

    @mcp.tool()
    async def start_process(
        command: Command = None,
        argv: Argv = None,
        cwd: Cwd = None,
        stdin: Annotated[
            bool,
            Field(
                description="true: its stdin is a pipe you feed with write_stdin; false (default): "
                "it reads end of file at once"
            ),
        ] = False,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Start a long-running command (a dev server, a watcher, an interactive program)
        in the background. Returns its id for process_output, write_stdin and stop_process."""
        args = _argv(command, argv)
        cwd = _checked(checks.cwd, cwd, "start_process")
        name = await w.ensure(sandbox)
        started = transports.Command(args, cwd, output_limit=16 << 20, stdin_pipe=stdin)
        spawn_id, pid = await w.call(transport.spawn, name, started)
        return {"id": spawn_id, "pid": pid}

    @mcp.tool()
    async def write_stdin(
        id: Annotated[str, Field(description="the id start_process returned (started with stdin=true)")],
        data: Annotated[
            str, Field(description="text for its stdin, sent as UTF-8 (add \\n to end a line)")
        ] = "",
        eof: Annotated[
            bool, Field(description="then close its stdin: the program reads end of file")
        ] = False,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Write text to the stdin of a background process started with stdin=true, in
        order; with eof=true close it afterwards. Read what it answers with process_output.
        Fails if the process has ended, its stdin is closed, or it does not read for
        10 s while a few MiB already wait for it."""
        name = await w.ensure(sandbox)
        raw = data.encode()
        if raw or not eof:
            await w.call(feed_stdin, transport, name, id, raw, STDIN_WAIT)
        if eof:
            await w.call(transport.write_stdin, name, id, b"", eof=True)
        return {"written": len(raw), "closed": eof}

    @mcp.tool()
    async def process_output(
        id: Annotated[str, Field(description="the id start_process returned")],
        offset: Annotated[
            Offset, Field(description="stdout bytes already seen (returns only what follows)")
        ] = 0,
        stderr_offset: Annotated[Offset, Field(description="stderr bytes already seen")] = 0,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """A background process's output since the given offsets, whether it still runs,
        and its exit code once it ended. Pass back next_offset/next_stderr_offset."""
        _checked(checks.offset, offset, "offset", "process_output")
        _checked(checks.offset, stderr_offset, "stderr_offset", "process_output")
        name = await w.ensure(sandbox)
        state, out, err = await w.call(transport.process, name, id, offset, stderr_offset)
        return {
            "running": state.status is None and state.running,
            "exit_code": None if state.status is None else protocol.exit_code(state.status),
            "stdout": _text(out[:OUTPUT_LIMIT]),
            "stderr": _text(err[:OUTPUT_LIMIT]),
            "next_offset": offset + len(out[:OUTPUT_LIMIT]),
            "next_stderr_offset": stderr_offset + len(err[:OUTPUT_LIMIT]),
        }

    @mcp.tool()
    async def stop_process(
        id: Annotated[str, Field(description="the id start_process returned")],
        signal: Annotated[str, Field(description="SIGTERM (default), SIGINT or SIGKILL")] = "SIGTERM",
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Send a signal to a background process's whole process group (nothing when it
        has already ended: then ended is true)."""
        if signal not in ("SIGTERM", "SIGINT", "SIGKILL", "SIGHUP"):
            raise ToolError(f"signal {signal!r} is not one of SIGTERM, SIGINT, SIGKILL, SIGHUP")
        name = await w.ensure(sandbox)
        state, _, _ = await w.call(transport.process, name, id, checks.MAX_OFFSET, checks.MAX_OFFSET)
        if state.status is None:
            try:
                await anyio.to_thread.run_sync(
                    transport.signal, name, state.pid, int(_signal.Signals[signal])
                )
            except ProcessNotFound:
                pass  # it ended meanwhile
            except WarrenError as e:
                raise _error(e) from None
        return {"signalled": id, "signal": signal, "ended": state.status is not None}

    @mcp.tool()
    async def expose_port(
        port: Annotated[
            int, Field(description="a TCP port a server in the sandbox listens on", ge=1, le=65535)
        ],
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Make a port of the sandbox reachable from the host; returns the host address
        (127.0.0.1:NNNN) to open, e.g. with a browser or curl on the host."""
        name = await w.ensure(sandbox)
        address = await w.call(transport.expose, name, port, 0)
        return {"address": address, "url": f"http://{address}/"}

    @mcp.tool()
    async def sandbox_events(
        after: Annotated[
            str, Field(description="the cursor a previous call returned: records after it")
        ] = "",
        skip: Annotated[int, Field(description="the skip a previous call returned", ge=0)] = 0,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """The sandbox's trail, oldest first, at most 100 records a call: every command run
        in it (argv, cwd, how it ended), file operation and network decision (host, port,
        allowed or refused, and why). Pass the returned after and skip back for the next."""
        name = await w.ensure(sandbox)
        page = await w.call(transport.events, name, after, skip)
        records = list(page.records[:EVENTS_PAGE])
        if len(records) < len(page.records):  # the cursor after the last one given
            last = str(records[-1].get("time", ""))
            at_last = sum(1 for r in records if r.get("time") == last)
            after, skip = last, at_last + (skip if last == after else 0)
        else:
            after, skip = page.after, page.skip
        return {"records": records, "after": after, "skip": skip, "more": len(records) < len(page.records)}

    @mcp.tool()
    async def sandbox_network(sandbox: SandboxArg = None) -> dict[str, Any]:
        """The sandbox's network policy, read-only: its mode, the hosts it may reach (given
        at create, allowed and denied since) and, under --network ask, the connections
        waiting for an answer (id, host, port, age). Only the user changes the policy or
        answers (warren net NAME approve ID): to reach a host that waits, tell them its id."""
        name = await w.ensure(sandbox)
        policy = await w.call(transport.net_policy, name, "show", via="mcp")
        return dataclasses.asdict(policy)

    review.register(mcp, w)
    return mcp
