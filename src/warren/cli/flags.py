"""Command-line flags: one table of the policy flags shared by ``run``, ``create``,
``plan`` and ``doctor``, turned into a policy spec in ``warren.toml``'s own keys
(relative paths stay relative: the supervisor resolves them against the caller's
directory).

argparse is the parser — for help, usage errors (one line, a hint, exit 125) and
every command. ``run`` and ``exec``, which an agent issues thousands of times, first
try ``quick``: the same table read by a small loop that accepts only the plain forms
and hands anything else (``--help``, an unknown or malformed flag) to argparse,
because importing argparse (and the ``re`` it loads) costs more start-up time than the
rest of the client.
"""

from __future__ import annotations

import os

from ..errors import WarrenError

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Iterable
    from typing import Any, NoReturn

PRESETS = "uv, pip, npm, cargo, go, git, python, node, rust, golang"


class Flag:
    """One flag: its names, where its value goes, and its kind: "value" (the last one
    wins), "multi" (each adds one), "switch" (no value), "float" (a number)."""

    def __init__(
        self,
        names: tuple[str, ...],
        dest: str,
        kind: str,
        help: str,
        metavar: str | None = None,
        choices: tuple[str, ...] | None = None,
    ) -> None:
        self.names, self.dest, self.kind, self.help = names, dest, kind, help
        self.metavar, self.choices = metavar, choices

    def add_to(self, p: argparse._ActionsContainer) -> None:
        kw: dict[str, Any] = {"dest": self.dest, "help": self.help}
        if self.kind == "switch":
            kw["action"] = "store_true"
        else:
            kw["metavar"] = self.metavar
            if self.kind == "multi":
                kw.update(action="append", default=[])
            if self.kind == "float":
                kw["type"] = float
            if self.choices:
                kw.update(choices=self.choices, metavar=None)
        p.add_argument(*self.names, **kw)


POLICY_FLAGS = (
    Flag(
        ("--workspace", "-w"), "workspace", "value", "the workspace (default: the current directory)", "DIR"
    ),
    Flag(("--write",), "write", "multi", "also writable (repeatable)", "PATH"),
    Flag(("--read",), "read", "multi", "read-only, even inside a writable root", "PATH"),
    Flag(("--deny",), "deny", "multi", "unreadable: hidden by an empty mount", "PATH"),
    Flag(("--env",), "env", "multi", "set an environment variable", "K=V"),
    Flag(("--pass-env",), "pass_env", "multi", "pass a variable from the caller", "NAME"),
    Flag(("--preset",), "preset", "multi", f"tool caches: {PRESETS}", "NAME"),
    Flag(("--profile",), "profile", "value", "a [profile.NAME] from warren.toml or the user config", "NAME"),
    Flag(
        ("--network",),
        "network",
        "value",
        "none (default): only loopback; allow: through warren's proxy to --allow-host hosts only; "
        "ask: allow, and a connection to another host waits for `warren net NAME approve`; "
        "open: outbound through pasta, never the host's loopback",
        choices=("none", "allow", "ask", "open"),
    ),
    Flag(
        ("--allow-host",),
        "allow_host",
        "multi",
        "reachable in --network allow (implies it): pypi.org, *.example.org, host:8443, 10.0.0.5:80, "
        "[::1]:8080; presets add their registries",
        "HOST[:PORT]",
    ),
    Flag(("--resolve",), "resolve", "multi", "answer NAME with ADDR in the proxy", "NAME=ADDR"),
    Flag(
        ("--no-default-deny",),
        "no_default_deny",
        "switch",
        "do not hide ~/.ssh, ~/.aws and other credentials",
    ),
    Flag(("--read-only-workspace",), "read_only_workspace", "switch", "mount the workspace read-only"),
    Flag(
        ("--allow-broad-workspace",),
        "allow_broad_workspace",
        "switch",
        "allow /, your home, or a system directory as the workspace or a writable path",
    ),
    Flag(("--memory",), "memory", "value", "memory of the whole sandbox (default: half of RAM)", "SIZE"),
    Flag(
        ("--pids",),
        "pids",
        "value",
        "processes + threads in the sandbox (default: 512 per CPU, within 256-32768)",
        "N",
    ),
    Flag(("--cpus",), "cpus", "value", "CPU time, in CPUs (e.g. 0.5; default: no limit)", "N"),
    Flag(("--tmp-size",), "tmp_size", "value", "size of /tmp and of /dev/shm (default: RAM/8)", "SIZE"),
    Flag(
        ("--idle-timeout",),
        "idle_timeout",
        "value",
        "long-lived sandboxes: stop after this long without a request (e.g. 30m; default: never)",
        "DURATION",
    ),
    # Sandboxes on an image (docs/environments.md).
    Flag(
        ("--image",),
        "image",
        "value",
        "the sandbox's root is this image, copy-on-write (an image name, or a root directory's "
        "absolute path); the workspace is at /workspace",
        "NAME",
    ),
    Flag(
        ("--disk",),
        "disk",
        "value",
        "on an image: size of the sandbox's writable layer (default: RAM/4)",
        "SIZE",
    ),
    Flag(
        ("--from-snapshot",),
        "from_snapshot",
        "value",
        "start from a snapshot (`warren snapshot`): its image, with the snapshot's files",
        "ID",
    ),
    # secrets put in by the proxy and the HTTP rules of intercepted hosts (docs/secrets.md)
    Flag(
        ("--secret",),
        "secret",
        "multi",
        "inside, $NAME is a placeholder; the proxy puts the caller's $ENVVAR (or the file's "
        "first line) in request headers to HOST only, over HTTPS (repeatable)",
        "NAME=ENVVAR@HOST",
    ),
    Flag(
        ("--allow-http",),
        "allow_http",
        "multi",
        "only these requests to HOST (its HTTPS is intercepted): 'POST api.example.org/v1/', "
        "METHOD * for any (repeatable)",
        "'METHOD HOST/PATH'",
    ),
    Flag(
        ("--require-namespaces",),
        "require_namespaces",
        "switch",
        "refuse to run where user namespaces are unavailable or powerless, instead of the degraded mode",
    ),
    Flag(
        ("--review",),
        "review",
        "switch",
        "the sandbox's changes to the workspace go to a layer of its own: see them with `warren diff`, "
        "keep them with `warren apply`",
    ),
)
TIMEOUT = Flag(
    ("--timeout",), "timeout", "float", "kill the command's whole tree after this (exit 124)", "SECONDS"
)
RUN_FLAGS = (*POLICY_FLAGS, TIMEOUT)
EXEC_FLAGS = (
    Flag(
        ("-d", "--detach"),
        "detach",
        "switch",
        "start CMD in the background and print its id (its output: warren logs NAME ID)",
    ),
    Flag(("--cwd",), "cwd", "value", "working directory inside the sandbox (default: the workspace)", "DIR"),
    Flag(("--env",), "env", "multi", "set an environment variable", "K=V"),
    TIMEOUT,
)


class UsageError(WarrenError):
    """Bad command-line usage."""


def timeout(value: float | None, op: str, without: str) -> float | None:
    """``--timeout``'s seconds, or None when not given; ``without``: what leaving it out does."""
    if value is not None and not 0 < value < float("inf"):
        raise UsageError(
            f"--timeout must be a positive number of seconds, not {value}",
            operation=op,
            hint=f"e.g. --timeout 30 or --timeout 0.5 (seconds; leave it out {without})",
        )
    return value


class Namespace:
    """Parsed flags as attributes (argparse's or ``quick``'s)."""

    def __init__(self, **values: Any) -> None:
        self.__dict__.update(values)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)


def quick(args: list[str], table: tuple[Flag, ...]) -> tuple[Any, list[str]] | None:
    """Flags up to the first argument that is not one (or ``--``), and the rest; None
    when anything is not plain, so argparse decides (and explains)."""
    by_name = {name: flag for flag in table for name in flag.names}
    values: dict[str, Any] = {
        f.dest: [] if f.kind == "multi" else (False if f.kind == "switch" else None) for f in table
    }
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            return Namespace(**values), args[i:]
        name, eq, given = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        flag = by_name.get(name)
        if flag is None:
            return None
        if flag.kind == "switch":
            if eq:
                return None
            values[flag.dest] = True
            i += 1
            continue
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None
            i += 1
            given = args[i]
        if flag.choices and given not in flag.choices:
            return None
        if flag.kind == "float":
            try:
                values[flag.dest] = float(given)
            except ValueError:
                return None
        elif flag.kind == "multi":
            values[flag.dest].append(given)
        else:
            values[flag.dest] = given
        i += 1
    return Namespace(**values), []


class Described(Exception):
    """Raised by a parser's ``parse_args`` in ``describe``: the parser, unused."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


_describing = False


def describing() -> bool:
    """Whether parsers are being collected (a command whose fast path skips its parser
    must then build it)."""
    return _describing


def describe(handler: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    """The parser ``handler`` builds, without running the command: each command builds its
    parser next to its code, and completion scripts and the man page are made from those
    very parsers, so they cannot drift from what is accepted."""
    global _describing
    _describing = True
    try:
        handler([])
    except Described as d:
        return d.parser
    finally:
        _describing = False
    raise AssertionError(f"{handler.__name__} ran without parsing its arguments")


def suggest(word: str, known: Iterable[str]) -> str:
    """`did you mean ...?` for a mistyped command or flag, or nothing."""
    import difflib

    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def parser(prog: str, description: str) -> argparse.ArgumentParser:
    import argparse

    class Formatter(argparse.HelpFormatter):
        """argparse's, without its import of shutil just to learn the width."""

        def __init__(
            self, prog: str, indent_increment: int = 2, max_help_position: int = 24, width: int | None = None
        ):
            if width is None:
                try:
                    width = os.get_terminal_size(1).columns - 2
                except OSError:
                    width = 78
            super().__init__(prog, indent_increment, max_help_position, width)

    class Parser(argparse.ArgumentParser):
        def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
            if _describing:
                raise Described(self)
            return super().parse_args(args, namespace)

        def error(self, message: str) -> NoReturn:
            hint = f"see `{self.prog} --help`"
            unknown = [a for a in self._unknown(message) if a.startswith("-")]
            close = suggest(unknown[0].partition("=")[0], self._option_string_actions) if unknown else ""
            raise UsageError(message, operation="cli", hint=f"{close} {hint}" if close else hint)

        @staticmethod
        def _unknown(message: str) -> list[str]:
            head = "unrecognized arguments: "
            return message[len(head) :].split() if message.startswith(head) else []

    return Parser(prog=prog, description=description, allow_abbrev=False, formatter_class=Formatter)


def add_policy_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group("policy")
    for flag in POLICY_FLAGS:
        flag.add_to(group)


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


def spec_of(ns: Any) -> dict[str, object]:
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
        ("secrets", "secret"),
        ("allow_http", "allow_http"),
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
    if ns.allow_broad_workspace:
        spec["allow_broad_workspace"] = True
    for key in ("memory", "pids", "cpus", "tmp_size", "idle_timeout", "image", "disk", "from_snapshot"):
        if getattr(ns, key) is not None:
            spec[key] = getattr(ns, key)
    if getattr(ns, "require_namespaces", False):
        spec["require_namespaces"] = True
    if getattr(ns, "review", False):
        spec["review"] = True
    return spec


def split_options(args: list[str], table: tuple[Flag, ...]) -> tuple[list[str], list[str]]:
    """``args`` cut where the command starts: after ``--``, or at the first word that is
    neither a flag nor a flag's value. Unknown flags stay on the options side, for the
    parser to name (and suggest a near one)."""
    by_name = {name: flag for flag in table for name in flag.names}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[:i], args[i + 1 :]
        if not arg.startswith("-") or arg == "-":
            break
        flag = by_name.get(arg)
        i += 2 if flag is not None and flag.kind != "switch" else 1
    return args[:i], args[i:]


def command_of(rest: list[str], what: str) -> list[str]:
    """Everything after the flags (or NAME) is the command; a leading ``--`` is optional."""
    if rest and rest[0] == "--":
        rest = rest[1:]
    if not rest:
        raise UsageError("no command given", operation="cli", hint=f"warren {what} CMD [ARGS...]")
    return rest
