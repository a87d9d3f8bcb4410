"""CLI command ``sandboxd``: warren as the in-pod runtime of kubernetes-sigs/agent-sandbox
(``warren.sandboxd``). Imports its gRPC and web stack only when run."""

from __future__ import annotations

import os
from collections.abc import Callable

from .. import extras
from . import flags


def sandboxd(args: list[str]) -> int:
    p = flags.parser(
        "warren sandboxd",
        "Speak agent-sandbox's sandboxd contract (gRPC process.v1.ProcessService, REST /v1/files, "
        "/v1/health, /v1/metadata) over one sandbox whose workspace is /workspace (or --workspace). "
        "Every command runs in that sandbox and every file operation is done by it; paths are "
        "confined to the workspace. Needs the extra warren-sandbox[sandboxd].",
    )
    p.add_argument(
        "--grpc-addr",
        metavar="HOST:PORT",
        help="where ProcessService listens (default: $SANDBOXD_GRPC_ADDR, else 0.0.0.0:9090)",
    )
    p.add_argument(
        "--rest-addr",
        metavar="HOST:PORT",
        help="where the REST API listens (default: $SANDBOXD_REST_ADDR, else 0.0.0.0:8080)",
    )
    p.add_argument(
        "--metadata-env-prefix",
        metavar="PREFIX",
        default="SANDBOX_",
        help="/v1/metadata shows this daemon's variables with this prefix, none named like a "
        "credential (default: SANDBOX_)",
    )
    p.add_argument("--name", metavar="NAME", help="the sandbox's name (default: sandboxd-PID)")
    flags.add_policy_flags(p)
    ns = p.parse_args(args)
    if ns.profile is not None:
        raise flags.UsageError(
            "warren sandboxd does not take --profile", operation="cli", hint="pass the flags"
        )
    from ..policy.spec import from_mapping
    from ..sandboxd import main

    spec = from_mapping(flags.spec_of(ns), "flags")
    spec.workspace = spec.workspace or "/workspace"
    grpc_addr, rest_addr = main.addresses(ns.grpc_addr, ns.rest_addr, os.environ)
    try:
        return main.serve(main.Options(spec, grpc_addr, rest_addr, ns.metadata_env_prefix, ns.name))
    except ModuleNotFoundError as e:
        if extras.is_missing("sandboxd", e):
            raise extras.missing("sandboxd", "warren sandboxd", e) from None
        raise


COMMANDS: dict[str, Callable[[list[str]], int]] = {"sandboxd": sandboxd}
