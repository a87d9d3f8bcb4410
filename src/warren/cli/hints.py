"""Hints for a command that failed in a sandbox: which tool commands install programs
where no preset lets them write, and which git commands write a repository whose
``.git`` lies above the workspace (read-only there). Pure (argv in, text out).

A preset makes a tool's caches writable, never the places its programs land for your
PATH (``~/.local/bin``, ``~/.cargo/bin``, ``~/go/bin``, npm's global prefix, a
toolchain directory): what is put there runs later outside the sandbox, with your
rights. So ``uv tool install``, ``pipx install``, ``pip install --user``,
``npm install -g``, ``cargo install``, ``go install`` and ``rustup toolchain install``
fail there as on a read-only disk; when one does, warren names the directory and the
two ways on.
"""

from __future__ import annotations

import os

# (program, verbs, options of which one must be present or () for none) -> where it writes
_INSTALLERS: tuple[tuple[str, tuple[str, ...], tuple[str, ...], str, str], ...] = (
    ("uv", ("tool install", "tool upgrade", "tool update-shell"), (), "~/.local/bin", "UV_TOOL_BIN_DIR"),
    ("uv", ("python install",), (), "~/.local/bin", "UV_PYTHON_BIN_DIR"),
    ("pipx", ("install", "upgrade", "ensurepath", "inject"), (), "~/.local/bin", "PIPX_BIN_DIR"),
    ("pip", ("install",), ("--user",), "~/.local", "PYTHONUSERBASE"),
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
    ("corepack", ("enable", "install"), (), "the directory of node", "--install-directory"),
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
            f"warren: hint: `{name} {verb}` writes programs to {where}, which no preset makes "
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
        f"warren: hint: the workspace lies in the git repository {repository}, whose .git is outside "
        f"the workspace and read-only here; use --workspace {repository}, or --write {repository}/.git "
        "if you mean to let the sandbox write it"
    )
