"""Command-line flags: the argument parser warren uses (argparse, with usage errors as
warren errors: one line, a hint, exit 125) and the policy flags shared by ``run``,
``create``, ``plan`` and ``doctor``, turned into a policy spec in ``warren.toml``'s
own keys. Relative paths stay relative: the supervisor resolves them against the
caller's directory.

On the CLI's fast path: no policy or planning code is imported here.
"""

from __future__ import annotations

import argparse

from ..errors import WarrenError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import NoReturn

PRESETS = "uv, pip, npm, cargo, go, git, python, node, rust, golang"


class UsageError(WarrenError):
    """Bad command-line usage."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message, operation="cli", hint=f"see `{self.prog} --help`")


def parser(prog: str, description: str) -> Parser:
    return Parser(prog=prog, description=description, allow_abbrev=False)


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("policy")
    g.add_argument("--workspace", "-w", metavar="DIR", help="the workspace (default: the current directory)")
    g.add_argument("--write", action="append", default=[], metavar="PATH", help="also writable (repeatable)")
    g.add_argument(
        "--read", action="append", default=[], metavar="PATH", help="read-only, even inside a writable root"
    )
    g.add_argument(
        "--deny", action="append", default=[], metavar="PATH", help="unreadable: hidden by an empty mount"
    )
    g.add_argument("--env", action="append", default=[], metavar="K=V", help="set an environment variable")
    g.add_argument(
        "--pass-env", action="append", default=[], metavar="NAME", help="pass a variable from the caller"
    )
    g.add_argument("--preset", action="append", default=[], metavar="NAME", help=f"tool caches: {PRESETS}")
    g.add_argument("--profile", metavar="NAME", help="a [profile.NAME] from warren.toml or the user config")
    g.add_argument(
        "--network",
        choices=("none", "allow", "open"),
        help="none (default): only loopback; allow: through warren's proxy to --allow-host hosts only; "
        "open: outbound through pasta, never the host's loopback",
    )
    g.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="reachable in --network allow (implies it): pypi.org, *.example.org, host:8443, "
        "10.0.0.5:80, [::1]:8080; presets add their registries",
    )
    g.add_argument(
        "--resolve",
        action="append",
        default=[],
        metavar="NAME=ADDR",
        help="answer NAME with ADDR in the proxy",
    )
    g.add_argument(
        "--no-default-deny", action="store_true", help="do not hide ~/.ssh, ~/.aws and other credentials"
    )
    g.add_argument("--read-only-workspace", action="store_true", help="mount the workspace read-only")


def pairs(values: list[str], flag: str, value_name: str = "VALUE") -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(
                f"{flag}: expected NAME={value_name}, got {pair!r}",
                operation="cli",
                hint=f"write it as {flag} NAME={value_name.lower()}",
            )
        out[key] = value
    return out


def spec_of(ns: argparse.Namespace) -> dict[str, object]:
    """The policy flags as a spec, in warren.toml's keys (only what was given)."""
    spec: dict[str, object] = {}
    if ns.workspace is not None:
        spec["workspace"] = ns.workspace
    for key, attr in (
        ("write", "write"),
        ("read", "read"),
        ("deny", "deny"),
        ("env_pass", "pass_env"),
        ("preset", "preset"),
        ("allow_host", "allow_host"),
    ):
        if getattr(ns, attr):
            spec[key] = list(getattr(ns, attr))
    if ns.env:
        spec["env"] = pairs(ns.env, "--env")
    if ns.resolve:
        spec["resolve"] = pairs(ns.resolve, "--resolve", "ADDRESS")
    if ns.network is not None:
        spec["network"] = ns.network
    if ns.no_default_deny:
        spec["default_deny"] = False
    if ns.read_only_workspace:
        spec["workspace_writable"] = False
    return spec


def command_of(rest: list[str], what: str) -> list[str]:
    """Everything after the flags (or NAME) is the command; a leading ``--`` is optional."""
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise UsageError("no command given", operation="cli", hint=f"warren {what} CMD [ARGS...]")
    return rest
