"""The ``warren`` command line.

Dispatch looks at the subcommand first and imports only what it needs: ``run`` and
``exec`` (the commands an agent issues thousands of times) load the flag parser, the
protocol and the connection to the supervisor, nothing else.

Exit codes: the command's own status (128+N for signal N); 124 a timeout; 125 warren
could not do it (bad flags, invalid policy, no such sandbox, setup failed); 126 the
command could not be executed; 127 it was not found. Errors print one line and a
hint, never a traceback.
"""

from __future__ import annotations

import os
import sys

from ..errors import WarrenError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

USAGE = """\
usage: warren COMMAND [ARGS...]
       warren --version

a sandbox for AI coding agents in which real developer tools work

one-shot:
  run [POLICY FLAGS] [--timeout S] [--json] [--] CMD [ARGS...]   run CMD in a fresh sandbox
  plan [POLICY FLAGS] [--json]            print exactly what `run` would set up
long-lived:
  create [POLICY FLAGS] NAME              create a sandbox
  exec [-d] [--cwd DIR] [--env K=V] [--timeout S] NAME [--] CMD [ARGS...]
                                          (flags may also follow NAME; -d: in the background)
  ps [-a] [--json] NAME                   its processes (-a: with ended background ones)
  wait NAME [ID]                          until a background process ends (its status), or NAME stops
  stats [--json] NAME                     memory, pids, CPU time against its limits
  pause NAME / resume NAME                freeze every process of it; let it run again
  ls [--json]                             every sandbox, alive or dead and why, idle time
  cp [-r] SRC DST                         copy host <-> sandbox (NAME:PATH)
  port [--host-port N] NAME PORT          forward a host port into the sandbox
  port NAME / port --close NAME PORT      its forwarded ports; stop forwarding one
  logs [-f] NAME ID                       a background process's output (ID from exec -d)
  logs --net [--json] NAME                the network proxy's decisions
  events [-f] [--json] [--otlp URL] NAME  its trail: commands, files, network (docs/events.md)
  net NAME [show|allow HOST|deny HOST]    its network policy, changed while it runs
  net NAME pending|approve [--always] ID|reject ID   answer --network ask's waiting connections
  stop NAME / rm [-f] NAME                stop; stop and forget
review (create --review NAME or run --review CMD: changes go to a layer of their own):
  diff [--patch] [--json] NAME            what it changed: a list, or a git-style patch
  apply [--force] NAME [PATH...]          write them (stopped) to the host workspace
  discard NAME                            drop them
  checkpoint NAME / checkpoints [--json] NAME   freeze the workspace now (one before each command too)
  rollback [--keep-running] NAME [ID]     the workspace back to a checkpoint (the last one)
on an image (--image NAME):
  snapshot NAME / snapshot ls / snapshot rm ID   its own layer, copied (prints the id)
  fork [POLICY FLAGS] NAME NEW            a new sandbox from a snapshot of NAME taken now
  create --from-snapshot ID NEW           a sandbox from a snapshot
  shutdown                                let the supervisor exit once idle
images:
  image build NAME --debian SUITE [--include PKG,...]   a root from Debian's packages (mmdebstrap)
  image import NAME FILE                  a docker-archive or OCI image layout (directory or tar)
  image ls [--json] / image inspect NAME  the images here; one image's layers and config
  image rm [--force] NAME... / image gc   forget images; remove layers no image uses
service:
  serve [--listen unix:PATH|HOST:PORT] [--token-file F]   the HTTP API v1 (+ MCP at /mcp)
  mcp [POLICY FLAGS]                      an MCP server on stdio for one workspace
  sandboxd [POLICY FLAGS] [--grpc-addr A] [--rest-addr A]   the agent-sandbox runtime (Kubernetes)
diagnostics:
  doctor [--sandbox] [...]                probe what developer tools need, here or inside
  presets                                 list the tool presets
shell:
  completion bash|zsh|fish                a completion script for your shell
  man                                     this manual as a man page (warren man | man -l -)

`warren COMMAND --help` shows each command's flags.
"""


def _version() -> str:
    """The installed distribution's version: pyproject.toml's ``version`` is the one place it is written."""
    from ..extras import version

    return version()


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(USAGE)
        return 0
    if argv[0] in ("--version", "-V"):
        print(f"warren {_version()}")
        return 0
    cmd, rest = argv[0], argv[1:]
    from ..client import origin

    origin.set_default("cli")
    if cmd == "run":
        return run(rest)
    if cmd == "exec":
        return exec_(rest)
    handler = _handler(cmd)
    if handler is None:
        from .flags import UsageError, suggest

        close = suggest(cmd, [*commands(), "run", "exec"])
        raise UsageError(
            f"unknown command {cmd!r}", operation="cli", hint=f"{close} see `warren --help`".lstrip()
        )
    return handler(rest)


# The module of each sub-command: a command imports its own module alone (`warren ls`
# skipped ~20 ms of imports, ctypes among them, when every module was loaded for it).
# tests/test_cli_usability.py checks it names exactly what the modules' COMMANDS hold.
WHERE = {
    "net": "net",
    **dict.fromkeys(
        ("stats", "pause", "resume", "create", "ps", "cp", "port", "logs", "wait"),
        "sandboxes",
    ),
    # stop, rm, shutdown: on the protocol alone (a cleanup runs them once per sandbox)
    **dict.fromkeys(("stop", "rm", "shutdown"), "lifecycle"),
    "ls": "ls",  # a module of its own: its imports are what a listing of 1,000 costs most
    **dict.fromkeys(("plan", "presets", "doctor"), "info"),
    **dict.fromkeys(("serve", "mcp"), "service"),
    **dict.fromkeys(("completion", "man"), "catalog"),
    "image": "images",
    **dict.fromkeys(("snapshot", "fork"), "snapshots"),
    "sandboxd": "sandboxd",
    **dict.fromkeys(("diff", "apply", "discard", "checkpoint", "checkpoints", "rollback"), "review"),
    "events": "events",
}


def _handler(cmd: str) -> Callable[[list[str]], int] | None:
    module = WHERE.get(cmd)
    if module is None:
        return None
    from importlib import import_module

    handlers: dict[str, Callable[[list[str]], int]] = import_module(f".{module}", __name__).COMMANDS
    return handlers.get(cmd)


def commands() -> dict[str, Callable[[list[str]], int]]:
    """Every sub-command but the fast two (``run``, ``exec``), by name."""
    from . import (
        catalog,
        events,
        images,
        info,
        lifecycle,
        ls,
        net,
        review,
        sandboxd,
        sandboxes,
        service,
        snapshots,
    )

    return {
        **net.COMMANDS,
        **sandboxes.COMMANDS,
        **lifecycle.COMMANDS,
        **ls.COMMANDS,
        **info.COMMANDS,
        **service.COMMANDS,
        **catalog.COMMANDS,
        **images.COMMANDS,
        **snapshots.COMMANDS,
        **sandboxd.COMMANDS,
        **review.COMMANDS,
        **events.COMMANDS,
    }


def run(rest: list[str]) -> int:
    from . import attach, flags

    got = flags.quick(rest, flags.RUN_FLAGS)
    if got is None or flags.describing():
        p = flags.parser("warren run", "Run CMD in a one-shot sandbox: warren run [FLAGS] [--] CMD [ARGS]...")
        flags.add_policy_flags(p)
        flags.TIMEOUT.add_to(p)
        p.add_argument(
            "--json",
            action="store_true",
            help="print the result as one JSON document (exit status, output, warnings) instead of "
            "passing the output through; exit with the command's status",
        )
        p.add_argument("command", nargs="...", help="the command and its arguments")
        ns = p.parse_args(rest)
        got = ns, ns.command
    ns, command = got
    argv = flags.command_of(command, "run")
    if getattr(ns, "review", False) and getattr(ns, "json", False):
        from .flags import UsageError

        raise UsageError(
            "--review and --json cannot be combined",
            operation="cli",
            hint="run --review keeps the sandbox for `warren diff --json NAME`; drop one of the two",
        )
    if getattr(ns, "review", False):
        from . import review

        return review.run(flags.spec_of(ns), ns.profile, argv, _timeout(ns.timeout))
    if getattr(ns, "json", False):
        return attach.run_json(flags.spec_of(ns), ns.profile, argv, _timeout(ns.timeout))
    return attach.run(flags.spec_of(ns), ns.profile, argv, _timeout(ns.timeout))


def exec_(rest: list[str]) -> int:
    """``exec [FLAGS] NAME [FLAGS] [--] CMD``: flags go before or after NAME; the command
    starts after ``--`` or at the first word that is not a flag."""
    from ..names import check_name
    from . import flags

    ns: Any = None
    got = flags.quick(rest, flags.EXEC_FLAGS)
    split = got is not None and bool(got[1]) and not got[1][0].startswith("-") and not flags.describing()
    if got is not None and split:
        before = rest[: len(rest) - len(got[1])]
        name, after = got[1][0], got[1][1:]
        options, command = flags.split_options(after, flags.EXEC_FLAGS)
        parsed = flags.quick([*before, *options], flags.EXEC_FLAGS)
        if parsed is not None and not parsed[1]:
            ns = parsed[0]
    if ns is None:
        p = flags.parser(
            "warren exec",
            "Run CMD in sandbox NAME. Flags go before or after NAME; the command starts after `--`, "
            "or at the first word that is not a flag.",
        )
        for flag in flags.EXEC_FLAGS:
            flag.add_to(p)
        p.add_argument("name")
        p.add_argument("command", nargs="...", help="the command and its arguments")
        if split:
            ns = p.parse_args([*before, *options, "--", name])
        else:
            ns = p.parse_args(rest)
            name, command = ns.name, ns.command
    name = check_name(name)
    command = flags.command_of(command, f"exec {name}")
    env = flags.pairs(ns.env, "--env")
    if ns.detach:
        from . import background

        return background.detach(name, command, ns.cwd, env, _timeout(ns.timeout))
    from . import attach

    return attach.exec_(name, command, ns.cwd, env, _timeout(ns.timeout))


def _timeout(value: float | None) -> float | None:
    from . import flags

    return flags.timeout(value, "cli", "for no timeout")


def entrypoint(argv: list[str] | None = None) -> int:
    try:
        handed = os.environ.pop("WARREN_NATIVE_RESUME", None)
        if handed is not None:  # the native front end (native/warren.c) sent the request
            from .attach import take_over

            take_over(handed)
        return _dispatch(sys.argv[1:] if argv is None else argv)
    except WarrenError as e:
        try:  # noqa: SIM105 - contextlib is not loaded on the fast path
            sys.stdout.flush()
        except OSError:
            pass
        try:
            sys.stderr.write(str(e) + "\n")
            sys.stderr.flush()
        except OSError:
            pass
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141


def console_main() -> None:
    code = entrypoint()
    try:
        sys.stdout.flush()
    except (OSError, ValueError):  # a closed pipe; or closed already (the MCP SDK's stdio does)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    if sys.argv[1:2] in (["run"], ["exec"]):
        # The agent's hot path ends here: its streams are flushed and it holds no
        # thread, no atexit hook and nothing a finalizer must release (the terminal
        # was restored before returning). Tearing the interpreter down would cost
        # about 2 ms on every command for nothing.
        try:  # noqa: SIM105 - contextlib is not loaded on the fast path
            sys.stderr.flush()
        except OSError:
            pass
        os._exit(code)
    sys.exit(code)
