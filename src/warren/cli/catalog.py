"""``warren completion bash|zsh|fish`` and ``warren man``: shell completion scripts and
a man page (roff), each written from the very parsers the commands parse with
(``flags.describe``), so a flag added to a command shows up in both at once.

Only text is made here; nothing is installed. What is the caller's own (sandbox names,
images, snapshots, presets, profiles) the scripts ask of ``warren completion --values
KIND`` when the shell completes, so it is always the current list; that never starts a
supervisor and prints nothing it cannot read.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from . import flags

SHELLS = ("bash", "zsh", "fish")
KINDS = ("names", "images", "snapshots", "presets", "profiles")
# An option's value, or a command's positional, that is one of the caller's KINDS.
_OPTION_VALUES = {"preset": "presets", "profile": "profiles", "image": "images", "from_snapshot": "snapshots"}
_POSITIONALS = {"name": "names", "names": "names", "ids": "snapshots"}


@dataclass(frozen=True)
class Option:
    names: tuple[str, ...]
    help: str
    metavar: str | None  # None: a switch
    choices: tuple[str, ...]
    repeatable: bool
    values: str = ""  # one of KINDS: its value is one of the caller's


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    usage: str
    options: tuple[Option, ...]
    takes_name: bool  # its first positional is a sandbox NAME
    first: tuple[str, ...] = ()  # the choices of its first positional (image's actions)
    rest: str = ""  # one of KINDS: what its positionals after ``first`` (or all) are
    many: bool = False  # every positional is one (rm NAME...), not only the first


def _options(p: argparse.ArgumentParser) -> Iterator[Option]:
    for action in p._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        switch = action.nargs == 0
        choices = tuple(str(c) for c in action.choices) if action.choices else ()
        metavar = None if switch else str(action.metavar or action.dest.upper())
        yield Option(
            tuple(action.option_strings),
            str(action.help or ""),
            metavar,
            choices,
            isinstance(action, argparse._AppendAction),
            _OPTION_VALUES.get(action.dest, ""),
        )


def commands() -> list[Command]:
    """Every sub-command, in name order, read from its parser."""
    from .. import cli

    handlers: dict[str, Callable[[list[str]], int]] = {"run": cli.run, "exec": cli.exec_, **cli.commands()}
    out = []
    for name in sorted(handlers):
        p = flags.describe(handlers[name])
        positionals = [a for a in p._actions if not a.option_strings]
        usage = " ".join(p.format_usage().split())
        first = tuple(str(c) for c in positionals[0].choices or ()) if positionals else ()
        kinds = [a for a in positionals[1 if first else 0 :] if a.dest in _POSITIONALS]
        rest = kinds[0] if kinds else None
        out.append(
            Command(
                name,
                (p.description or "").split(": ")[0].split(". ")[0].rstrip("."),
                usage.removeprefix("usage: "),
                tuple(_options(p)),
                bool(positionals) and positionals[0].dest == "name",
                first,
                "images" if name == "image" else _POSITIONALS[rest.dest] if rest else "",
                name == "image" or (rest is not None and rest.nargs in ("*", "+")),
            )
        )
    return out


# --- bash ---------------------------------------------------------------------------


_BASH_CASE = """\
        {name})
            opts='{words}'; valued=' {valued} '; first='{first}'; kind={kind}; many={many}
            case $prev in
{choices}            *) [[ $valued == *" $prev "* ]] && COMPREPLY=($(compgen -f -- "$cur")) && return;;
            esac;;
"""
_BASH_CHOICE = """\
            {names}) COMPREPLY=($(compgen -W '{choices}' -- "$cur")); return;;
"""
_BASH_VALUES = """\
            {names}) COMPREPLY=($(compgen -W "$(warren completion --values {kind} 2>/dev/null)" -- "$cur"))
                return;;
"""


def bash(cmds: list[Command]) -> str:
    cases = []
    for c in cmds:
        choices = "".join(
            _BASH_CHOICE.format(names="|".join(o.names), choices=" ".join(o.choices))
            for o in c.options
            if o.choices
        ) + "".join(
            _BASH_VALUES.format(names="|".join(o.names), kind=o.values) for o in c.options if o.values
        )
        cases.append(
            _BASH_CASE.format(
                name=c.name,
                words=" ".join(n for o in c.options for n in o.names),
                valued=" ".join(n for o in c.options if o.metavar for n in o.names),
                first=" ".join(c.first),
                kind=c.rest,
                many="1" if c.many else "",
                choices=choices,
            )
        )
    return (
        "# bash completion for warren (generated by `warren completion bash`)\n"
        "_warren() {\n"
        "    local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]}\n"
        "    local opts='' valued=' ' first='' kind='' many='' word i n=0\n"
        "    if [[ $COMP_CWORD -eq 1 ]]; then\n"
        f"        COMPREPLY=($(compgen -W '{' '.join(c.name for c in cmds)} --help --version' -- \"$cur\"))\n"
        "        return\n"
        "    fi\n"
        "    case ${COMP_WORDS[1]} in\n"
        f"{''.join(cases)}"
        "    esac\n"
        "    # which positional this word is: the words before it that are neither flags nor their values\n"
        "    for ((i = 2; i < COMP_CWORD; i++)); do\n"
        "        word=${COMP_WORDS[i]}\n"
        '        if [[ $word == -* ]]; then [[ $valued == *" $word "* ]] && ((i++)); else ((n++)); fi\n'
        "    done\n"
        "    if [[ $cur == -* ]]; then\n"
        '        COMPREPLY=($(compgen -W "$opts --help" -- "$cur"))\n'
        "    elif [[ -n $first && $n -eq 0 ]]; then\n"
        '        COMPREPLY=($(compgen -W "$first" -- "$cur"))\n'
        "    elif [[ -n $kind ]] && { [[ -n $many ]] || [[ $n -eq 0 ]]; }; then\n"
        '        COMPREPLY=($(compgen -W "$(warren completion --values $kind 2>/dev/null)" -- "$cur"))\n'
        "    else\n"
        '        COMPREPLY=($(compgen -f -- "$cur"))\n'
        "    fi\n"
        "}\n"
        "complete -F _warren warren\n"
    )


# --- zsh ----------------------------------------------------------------------------


def _zsh_text(text: str) -> str:
    return (
        text.replace("\\", "\\\\")
        .replace("'", "'\\''")
        .replace("[", "(")
        .replace("]", ")")
        .replace(":", "\\:")
    )


def _zsh_option(o: Option) -> str:
    names = o.names[0] if len(o.names) == 1 else "{" + ",".join(o.names) + "}"
    excl = "" if len(o.names) == 1 or o.repeatable else "'(" + " ".join(o.names) + ")'"
    star = "'*'" if o.repeatable else ""
    arg = ""
    if o.metavar:
        action = (
            f"({' '.join(o.choices)})"
            if o.choices
            else f"_warren_values {o.values}"
            if o.values
            else "_files"
        )
        arg = f":{_zsh_text(o.metavar)}:{action}"
    return f"{excl}{star}{names}'[{_zsh_text(o.help)}]{arg}'"


def _zsh_positionals(c: Command) -> str:
    first = f"'1:argument:({' '.join(c.first)})'" if c.first else ""
    if c.rest and c.many:
        then = f"'*:{c.rest}:_warren_values {c.rest}'"
    elif c.rest:
        then = f"'{2 if c.first else 1}:{c.rest}:_warren_values {c.rest}' '*::argument:_files'"
    else:
        then = "'*::argument:_files'"
    return f"{first} {then}".strip()


def zsh(cmds: list[Command]) -> str:
    described = "\n".join(f"        '{c.name}:{_zsh_text(c.summary)}'" for c in cmds)
    cases = []
    for c in cmds:
        specs = " \\\n                ".join(_zsh_option(o) for o in c.options)
        rest = _zsh_positionals(c)
        indent = " " * 16
        cases.append(
            f"        {c.name})\n            _arguments -s \\\n{indent}{specs} \\\n{indent}{rest};;\n"
        )
    return (
        "#compdef warren\n"
        "# zsh completion for warren (generated by `warren completion zsh`)\n"
        "_warren_values() {\n"
        "    local -a values\n"
        '    values=(${(f)"$(warren completion --values $1 2>/dev/null)"})\n'
        "    compadd -a values\n"
        "}\n"
        "_warren() {\n"
        "    local -a commands\n"
        f"    commands=(\n{described}\n    )\n"
        "    if (( CURRENT == 2 )); then\n"
        "        _describe command commands\n"
        "        return\n"
        "    fi\n"
        "    shift words; (( CURRENT-- ))\n"
        "    case $words[1] in\n"
        f"{''.join(cases)}"
        "    esac\n"
        "}\n"
        '_warren "$@"\n'
    )


# --- fish ---------------------------------------------------------------------------


def _fish_text(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_values(kind: str) -> str:
    return f'"(warren completion --values {kind} 2>/dev/null)"'


def fish(cmds: list[Command]) -> str:
    lines = [
        "# fish completion for warren (generated by `warren completion fish`)",
        "complete -c warren -f",
        "complete -c warren -n __fish_use_subcommand -s V -l version -d 'print the version'",
    ]
    for c in cmds:
        lines.append(f"complete -c warren -n __fish_use_subcommand -a {c.name} -d {_fish_text(c.summary)}")
        cond = f"-n '__fish_seen_subcommand_from {c.name}'"
        for o in c.options:
            parts = []
            for n in o.names:
                parts.append(f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}")
            if o.choices:
                parts.append(f"-x -a {_fish_text(' '.join(o.choices))}")
            elif o.values:
                parts.append(f"-x -a {_fish_values(o.values)}")
            elif o.metavar:
                parts.append("-r -F")
            lines.append(f"complete -c warren {cond} {' '.join(parts)} -d {_fish_text(o.help)}")
        if c.first:
            lines.append(f"complete -c warren {cond} -a {_fish_text(' '.join(c.first))}")
        if c.rest:
            lines.append(f"complete -c warren {cond} -a {_fish_values(c.rest)}")
    return "\n".join(lines) + "\n"


def completion(args: list[str]) -> int:
    p = flags.parser(
        "warren completion",
        'Print a completion script for SHELL. bash: eval "$(warren completion bash)" in ~/.bashrc; '
        "zsh: warren completion zsh > a directory of $fpath, as _warren; "
        "fish: warren completion fish > ~/.config/fish/completions/warren.fish.",
    )
    p.add_argument("shell", choices=SHELLS, nargs="?", help="bash, zsh or fish")
    p.add_argument(
        "--values",
        choices=KINDS,
        help="print your current sandbox names, images, snapshots, presets or profiles, one per line "
        "(what the scripts ask for as you type)",
    )
    ns = p.parse_args(args)
    if ns.values is not None:
        for value in values(ns.values):
            print(value)
        return 0
    if ns.shell is None:
        raise flags.UsageError(
            "warren completion: which shell?", operation="cli", hint="warren completion bash|zsh|fish"
        )
    sys.stdout.write({"bash": bash, "zsh": zsh, "fish": fish}[ns.shell](commands()))
    return 0


def values(kind: str) -> list[str]:
    """The caller's current ``kind`` (one of KINDS). A shell asks while the user types:
    nothing is started (no supervisor, no image store) and what cannot be read is left out."""
    import os
    from pathlib import Path

    from .. import statedir
    from ..errors import WarrenError

    try:
        if kind == "presets":
            from ..policy import presets

            return [name for name, _ in presets.describe()]
        if kind == "profiles":
            from ..policy.config import profile_names

            return profile_names(Path.cwd())
        if kind == "images":
            from ..images.location import default_root
            from ..images.store import ImageStore

            return [i.name for i in ImageStore().images()] if default_root().is_dir() else []
        if statedir.read_address(statedir.location(os.environ)) is None:
            return []  # no supervisor: no sandbox and no snapshot to name, and none is started
        from ..client.local import LocalTransport

        if kind == "snapshots":
            return [s.id for s in LocalTransport().snapshots()]
        return [i.name for i in LocalTransport().list()]
    except (WarrenError, OSError):
        return []


# --- man ----------------------------------------------------------------------------


def _roff(text: str) -> str:
    """Text safe in a roff line: backslashes and hyphens escaped, no leading control character."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\\&" + text if text[:1] in (".", "'") else text


def man_page(cmds: list[Command], version: str) -> str:
    from . import USAGE

    exit_status = (
        ("0\\-255", "the command's own exit status; 128+N when signal N ended it"),
        ("124", "the command ran out of time (\\-\\-timeout) and its whole tree was killed"),
        ("125", "warren could not do it: bad flags, an invalid policy, no such sandbox, a failed setup"),
        ("126", "the command was found but could not be executed"),
        ("127", "the command was not found"),
    )
    out = [
        f'.TH WARREN 1 "" "warren {_roff(version)}" "User Commands"',
        ".nh",  # command lines and flags are not to be hyphenated
        ".ad l",
        ".SH NAME",
        "warren \\- " + _roff(USAGE.splitlines()[3]),
        ".SH SYNOPSIS",
        ".B warren",
        ".I COMMAND",
        "[\\fIARGS\\fR...]",
        ".br",
        ".B warren",
        "\\-\\-version | \\-\\-help",
        ".SH DESCRIPTION",
        "warren runs commands in a sandbox that sees the host read\\-only, may write only its",
        "workspace and the tool caches its policy grants, and reaches the network only as the",
        "policy says. One\\-shot sandboxes come from",
        ".BR run ;",
        "long\\-lived ones from",
        ".B create",
        "and",
        ".BR exec .",
        "Each command's flags are below;",
        ".B warren",
        "\\fICOMMAND\\fR \\-\\-help says the same.",
        ".SH COMMANDS",
    ]
    for c in cmds:
        out += [f'.SS "{_roff(c.usage)}"', _roff(c.summary) + "."]
        for o in c.options:
            names = ", ".join(f"\\fB{_roff(n)}\\fR" for n in o.names)
            arg = f" \\fI{_roff(o.metavar)}\\fR" if o.metavar and not o.choices else ""
            if o.choices:
                arg = " {" + "|".join(_roff(ch) for ch in o.choices) + "}"
            out += [".TP", names + arg, _roff(o.help) if o.help else "\\&"]
    out += [".SH EXIT STATUS"]
    for code, meaning in exit_status:
        out += [".TP", f"\\fB{code}\\fR", meaning]
    out += [
        ".SH FILES",
        ".TP",
        "\\fI$XDG_STATE_HOME/warren\\fR (default \\fI~/.local/state/warren\\fR)",
        "the supervisor's state: its registry of sandboxes and their logs",
        ".TP",
        "\\fIwarren.toml\\fR, \\fI~/.config/warren/config.toml\\fR",
        "policy for a project, and the user's defaults and profiles",
        ".SH SEE ALSO",
        ".BR bwrap (1),",
        ".BR landlock (7),",
        ".BR user_namespaces (7)",
    ]
    return "\n".join(out) + "\n"


def man(args: list[str]) -> int:
    from . import _version

    flags.parser(
        "warren man",
        "Print warren's man page (roff). Read it with: warren man | man -l -",
    ).parse_args(args)
    sys.stdout.write(man_page(commands(), _version()))
    return 0


COMMANDS: dict[str, Callable[[list[str]], int]] = {"completion": completion, "man": man}
