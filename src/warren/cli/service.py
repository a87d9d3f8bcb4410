"""CLI commands ``serve`` (the HTTP API and /mcp) and ``mcp`` (an MCP server on stdio).

Both import their server stack only when run, so ``warren run``/``exec`` never load it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from . import flags


def serve(args: list[str]) -> int:
    p = flags.parser(
        "warren serve",
        "Serve this user's sandboxes over HTTP (API v1 at /v1, MCP at /mcp). "
        "TCP needs a bearer token; the default unix socket is closed to other users.",
    )
    p.add_argument(
        "--listen", metavar="unix:PATH|HOST:PORT", help="default: unix:$XDG_STATE_HOME/warren/serve.sock"
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="the bearer token (else $WARREN_TOKEN, else for TCP $XDG_STATE_HOME/warren/serve.token, "
        "made if absent); denied in every sandbox started after",
    )
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback TCP address")
    p.add_argument(
        "--mcp-workspace",
        metavar="DIR",
        help="the workspace of /mcp's sandboxes (default: the current directory); default policy",
    )
    p.add_argument(
        "--header-timeout",
        metavar="SECONDS",
        type=float,
        default=10.0,
        help="close a connection that has not sent a whole request head in this time, or whose "
        "body pauses for 3 times it (default 10)",
    )
    ns = p.parse_args(args)
    from ..service import serve as srv

    listen = srv.parse_listen(ns.listen, os.environ)
    token = srv.read_token(ns.token_file, os.environ, listen)
    srv.check(listen, token, ns.allow_remote)
    if not 0.1 <= ns.header_timeout <= 3600:
        raise srv.ServeError(
            f"--header-timeout {ns.header_timeout} is out of range",
            operation="serve",
            hint="pass 0.1 to 3600 seconds",
        )
    return srv.serve(
        listen,
        token,
        mcp_workspace=ns.mcp_workspace,
        allow_remote=ns.allow_remote,
        head_timeout=ns.header_timeout,
    )


MCP_IDLE_TIMEOUT = "30m"


def mcp(args: list[str]) -> int:
    p = flags.parser(
        "warren mcp",
        "An MCP server on stdio giving an agent a sandboxed shell for one project. The policy flags "
        "fix what every sandbox of this server may do; no tool call can change them. Its sandboxes "
        f"stop after {MCP_IDLE_TIMEOUT} without a call (--idle-timeout, or $WARREN_MCP_IDLE_TIMEOUT), "
        "and the default one is removed when the server ends.",
    )
    flags.add_policy_flags(p)
    ns = p.parse_args(args)
    import dataclasses
    import signal

    from ..client.local import LocalTransport
    from ..mcp.server import build
    from ..policy.limits import parse_duration
    from ..policy.spec import from_mapping

    if ns.profile is not None:
        raise flags.UsageError("warren mcp does not take --profile", operation="cli", hint="pass the flags")
    spec = from_mapping(flags.spec_of(ns), "flags")
    if spec.idle_timeout is None:
        idle = os.environ.get("WARREN_MCP_IDLE_TIMEOUT") or MCP_IDLE_TIMEOUT
        parse_duration(idle, "$WARREN_MCP_IDLE_TIMEOUT")  # refused here, not at the first tool call
        spec = dataclasses.replace(spec, idle_timeout=idle)
    server = build(LocalTransport(), spec, spec.workspace)

    def ended(signum: int, _frame: object) -> None:
        # Unwinding would wait for the SDK's thread blocked reading stdin: clean up, leave.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        server.warren.remove_default()
        os._exit(128 + signum)

    # A client ends a session by closing our stdin, and sends SIGTERM if we linger.
    signal.signal(signal.SIGTERM, ended)
    try:
        server.run("stdio")
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up below is short; let it finish
        server.warren.remove_default()
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"serve": serve, "mcp": mcp}
