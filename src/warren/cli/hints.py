"""Hints for a command that failed in a sandbox: a command that needed the network in a
sandbox without one, tool commands that install programs where no preset lets them
write, and git commands that write a repository whose ``.git`` lies above the workspace
(read-only there). Pure (argv and output in, text out); the CLI prints them after the
command, MCP's ``run_command`` returns them with its result.

A preset makes a tool's caches writable, never the places the host runs programs from
later (``policy.hostrun``: ``~/.local/bin``, uv's tools and Pythons, pipx's venvs,
``~/.cargo/bin``, ``~/go/bin``, npm's global prefix, corepack's package managers, a
toolchain directory): what is put there runs later outside the sandbox, with your
rights. So ``uv tool install``, ``uv python install``, ``pipx install``,
``pip install --user``, ``npm install -g``, ``cargo install``, ``go install``,
``corepack install`` and ``rustup toolchain install`` fail there as on a read-only
disk; when one does, warren names the directory and the two ways on.
"""

from __future__ import annotations

import os
import signal

_NETWORK_VERBS = {
    "pip": ("install", "download", "index"),
    "uv": ("pip", "add", "sync", "lock", "tool", "python", "run"),
    "uvx": (),
    "npm": ("install", "i", "ci", "update", "exec"),
    "npx": (),
    "cargo": ("fetch", "build", "install", "update", "add"),
    "git": ("clone", "fetch", "pull", "push", "ls-remote"),
    "curl": (),
    "wget": (),
    "go": ("get", "install", "mod"),
}
# What a program prints when it could not even look a name up (curl, git, pip, getaddrinfo).
_NO_RESOLVER = (
    b"Could not resolve host",
    b"Temporary failure in name resolution",
    b"Name or service not known",
    b"getaddrinfo failed",
    b"Could not resolve proxy",
)
NO_NETWORK = (
    "the sandbox has no network (--network none, the default); to reach package "
    "registries use --network allow (presets add theirs) or --allow-host HOST"
)


_SHELLS = ("sh", "bash", "dash", "zsh", "ash", "ksh")


def simple_commands(argv: list[str]) -> list[list[str]]:
    """``argv``'s commands as an agent runs them: through ``sh -c LINE`` or
    ``bash -lc LINE`` (any option cluster holding ``c``, ``-l -c`` too) they are the
    line's simple commands, each split into words; otherwise ``argv`` itself."""
    if not argv or os.path.basename(argv[0]) not in _SHELLS:
        return [argv]
    for i, arg in enumerate(argv[1:], 1):
        if not arg.startswith("-") or arg == "--":
            break
        if "c" in arg.lstrip("-") and not arg.startswith("--") and i + 1 < len(argv):
            return [_words(part) for part in _commands(argv[i + 1])]
    return [argv]


def _assignment(word: str) -> bool:
    name, eq, _value = word.partition("=")
    return bool(eq) and name.isidentifier()


def _words(command: str) -> list[str]:
    import shlex

    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    # leading VAR=value assignments and wrappers name no program
    while words and (_assignment(words[0]) or words[0] in ("exec", "env", "sudo", "time", "command")):
        words = words[1:]
    return words


def _looks_networked(argv: list[str]) -> bool:
    commands = simple_commands(argv)
    if commands != [argv]:
        return any(_looks_networked(words) for words in commands)
    if not argv:
        return False
    prog = os.path.basename(argv[0])
    if prog.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        prog, argv = argv[2], argv[2:]
    verbs = _NETWORK_VERBS.get(prog)
    if verbs is None:
        return False
    return not verbs or any(a in verbs for a in argv[1:3])


def _commands(line: str) -> list[str]:
    """The simple commands of a shell line, roughly: split at ; & | and newlines."""
    for sep in ("&&", "||", "|", ";", "&", "\n"):
        line = line.replace(sep, "\0")
    return [part for part in line.split("\0") if part.strip()]


def needs_network(argv: list[str], network: str, stderr: bytes = b"") -> bool:
    """Whether a failed command probably failed for want of the network it does not have."""
    if network not in ("none", ""):
        return False
    return _looks_networked(argv) or any(s in stderr for s in _NO_RESOLVER)


def limit_reached(limit: str, exit_code: int) -> str:
    """What a sandbox limit did to the command: killed it (SIGKILL, the memory limit), or
    made a fork or an allocation fail (the command then failed its own way)."""
    if exit_code == 128 + signal.SIGKILL:
        return f"killed: {limit}"
    return f"{limit} (a fork or an allocation failed)"


def after_failure(argv: list[str], network: str, repository: str | None, stderr: bytes = b"") -> list[str]:
    """Every hint for a command that exited non-zero, without the "warren: hint: " prefix."""
    hints = [NO_NETWORK] if network == "none" and needs_network(argv, network, stderr) else []
    for words in simple_commands(argv):
        hint = installs_programs(words) or writes_repository(words, repository)
        if hint and hint not in hints:
            hints.append(hint)
    return hints


# (program, verbs, options of which one must be present or () for none) -> where it writes
_INSTALLERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str, str], ...] = (
    (
        "uv",
        ("tool install", "tool upgrade", "tool update-shell"),
        (),
        "~/.local/share/uv/tools and ~/.local/bin",
        "UV_TOOL_DIR and UV_TOOL_BIN_DIR",
    ),
    (
        "uv",
        ("python install", "python upgrade"),
        (),
        "~/.local/share/uv/python and ~/.local/bin",
        "UV_PYTHON_INSTALL_DIR and UV_PYTHON_BIN_DIR",
    ),
    (
        "pipx",
        ("install", "upgrade", "ensurepath", "inject"),
        (),
        "~/.local/share/pipx and ~/.local/bin",
        "PIPX_HOME and PIPX_BIN_DIR",
    ),
    ("pip", ("install",), ("--user",), "~/.local/lib and ~/.local/bin", "PYTHONUSERBASE"),
    ("npm", ("install", "i", "add", "link", "update"), ("-g", "--global"), "npm's global prefix", "--prefix"),
    ("cargo", ("install",), (), "~/.cargo/bin", "--root"),
    ("go", ("install",), (), "~/go/bin", "GOBIN"),
    (
        "rustup",
        ("toolchain install", "install", "update", "component add", "target add"),
        (),
        "~/.rustup",
        "",
    ),
    ("corepack", ("enable",), (), "the directory of node", "--install-directory"),
    ("corepack", ("install", "prepare", "use", "up"), (), "~/.cache/node/corepack", "COREPACK_HOME"),
)


def _program(argv: list[str]) -> tuple[str, list[str]]:
    prog = os.path.basename(argv[0])
    if prog.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        return argv[2], argv[3:]
    if prog.startswith("pip"):
        prog = "pip"
    return prog, argv[1:]


def installs_programs(argv: list[str]) -> str | None:
    """A one-line hint when ``argv`` installs programs where no preset writes, else None."""
    if not argv:
        return None
    prog, rest = _program(argv)
    words = " ".join(a for a in rest if not a.startswith("-"))
    for name, verbs, options, where, override in _INSTALLERS:
        verb = next((v for v in verbs if words == v or words.startswith(v + " ")), None)
        if prog != name or verb is None:
            continue
        if options and not any(o in rest for o in options):
            continue
        how = f" ({override} to put them elsewhere)" if override else ""
        return (
            f"`{name} {verb}` writes programs to {where}, which no preset makes "
            f"writable (they would run later outside the sandbox); add --write for it if you mean it, "
            f"or install into the workspace{how}"
        )
    return None


# git commands that write the repository (its index, objects, refs or config).
_GIT_WRITES = frozenset(
    (
        *("add", "am", "apply", "branch", "checkout", "cherry-pick", "clean", "commit", "config"),
        *("fetch", "gc", "merge", "mv", "notes", "pull", "push", "rebase", "reset", "restore"),
        *("revert", "rm", "stash", "switch", "tag", "update-index", "update-ref", "worktree"),
    )
)
_GIT_VALUED = frozenset(("-C", "-c", "--git-dir", "--work-tree", "--namespace", "--exec-path"))


def _git_verb(argv: list[str]) -> str | None:
    if not argv or os.path.basename(argv[0]) != "git":
        return None
    rest = iter(argv[1:])
    for arg in rest:
        if arg in _GIT_VALUED:
            next(rest, None)
        elif not arg.startswith("-"):
            return arg
    return None


def writes_repository(argv: list[str], repository: str | None) -> str | None:
    """A one-line hint when ``argv`` is a git command that writes the repository and
    the workspace lies in ``repository`` whose ``.git`` is read-only in the sandbox."""
    if not repository or _git_verb(argv) not in _GIT_WRITES:
        return None
    return (
        f"the workspace lies in the git repository {repository}, whose .git is outside "
        f"the workspace and read-only here; use --workspace {repository}, or --write {repository}/.git "
        "if you mean to let the sandbox write it"
    )
