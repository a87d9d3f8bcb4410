"""CLI commands ``serve`` (the HTTP API and /mcp) and ``mcp`` (an MCP server on stdio).

Both import their server stack only when run, so ``warren run``/``exec`` never load it.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from . import flags


def serve(args: list[str]) -> int:
    from ..service import serve as srv

    p = flags.parser(
        "warren serve",
        "Serve this user's sandboxes over HTTP (API v1 at /v1, MCP at /mcp). "
        "TCP needs a bearer token; the default unix socket is closed to other users.",
    )
    p.add_argument(
        "--listen", metavar="unix:PATH|HOST:PORT", help="default: unix:$XDG_STATE_HOME/warren/serve.sock"
    )
    p.add_argument("--token-file", metavar="FILE", help="the bearer token (else $WARREN_TOKEN)")
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
    listen = srv.parse_listen(ns.listen, os.environ)
    token = srv.read_token(ns.token_file, os.environ)
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


def mcp(args: list[str]) -> int:
    p = flags.parser(
        "warren mcp",
        "An MCP server on stdio giving an agent a sandboxed shell for one project. The policy flags "
        "fix what every sandbox of this server may do; no tool call can change them.",
    )
    flags.add_policy_flags(p)
    ns = p.parse_args(args)
    from ..client.local import LocalTransport
    from ..mcp.server import build
    from ..policy.spec import from_mapping

    if ns.profile is not None:
        raise flags.UsageError("warren mcp does not take --profile", operation="cli", hint="pass the flags")
    spec = from_mapping(flags.spec_of(ns), "flags")
    build(LocalTransport(), spec, spec.workspace).run("stdio")
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"serve": serve, "mcp": mcp}
