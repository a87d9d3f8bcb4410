"""Places the host runs programs from later: what no preset may make writable.

A tool's cache is data the tool reads when it next installs something; the places
below hold programs (and their interpreters, libraries and startup files) that the
user's own, unsandboxed commands execute directly: uv's installed tools and managed
Pythons, pipx's venvs, corepack's package managers, pre-commit's hook environments,
``~/.local/bin``, ``~/.cargo/bin``, rustup's toolchains, npm's global prefix and
node version managers, ``go install``'s bin directory, ``pip install --user``'s
site-packages, shell startup files. A sandbox that writes one reaches the host the
next time the user runs that program. Presets never grant them (``resolve`` refuses a
preset path that reaches one); an explicit ``--write`` may, and the plan warns once
per root, naming what it allows.

Pure: the caller's environment and home in, paths out. Where a path is a symlink,
``resolve`` compares what it resolves to.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import xdg
from .model import Root


@dataclass(frozen=True)
class HostRun:
    """A place the host runs programs from: ``path`` (absolute, normalized) and what the
    host runs there."""

    path: str
    what: str


# The startup files of a home's shells, sessions and editors: run by every login, new
# shell or editor.
_STARTUP = (
    ".bashrc",
    ".bash_profile",
    ".bash_login",
    ".bash_logout",
    ".profile",
    ".zshrc",
    ".zshenv",
    ".zprofile",
    ".zlogin",
    ".config/fish",
    ".config/systemd/user",
    ".config/autostart",
    ".vimrc",
    ".config/nvim",
    ".emacs",
    ".emacs.d",
)


def places(env: Mapping[str, str], home: Path) -> tuple[HostRun, ...]:
    """Every place of this caller the host runs programs from (whether it exists or not)."""
    join = posixpath.join

    def var(name: str, default: str) -> str:
        value = env.get(name, "")
        return posixpath.normpath(value) if value.startswith("/") else default

    h = str(home)
    data = xdg.base(env, "XDG_DATA_HOME", h)
    cache = xdg.base(env, "XDG_CACHE_HOME", h)
    local_bin = xdg.base(env, "XDG_BIN_HOME", h)
    cargo = var("CARGO_HOME", join(h, ".cargo"))
    user_base = var("PYTHONUSERBASE", join(h, ".local"))
    gopath = var("GOPATH", join(h, "go")).split(":")[0]
    found: list[tuple[str, str]] = [
        (var("UV_TOOL_DIR", join(data, "uv/tools")), "uv tool install's tools"),
        (var("UV_PYTHON_INSTALL_DIR", join(data, "uv/python")), "uv python install's Pythons"),
        (local_bin, "programs on your PATH"),
        (var("UV_TOOL_BIN_DIR", local_bin), "uv tool install's programs"),
        (var("UV_PYTHON_BIN_DIR", local_bin), "uv python install's programs"),
        (var("PIPX_HOME", join(data, "pipx")), "pipx's venvs and its shared pip"),
        (var("PIPX_BIN_DIR", local_bin), "pipx's programs"),
        (join(cache, "pipx"), "pipx run's cached venvs"),
        (join(user_base, "bin"), "pip install --user's programs"),
        (join(user_base, "lib"), "pip install --user's packages, imported by your Pythons"),
        (var("COREPACK_HOME", join(cache, "node/corepack")), "corepack's pnpm and yarn"),
        (
            var("PRE_COMMIT_HOME", join(cache, "pre-commit")),
            "pre-commit's hook environments, run by your git hooks",
        ),
        (join(cargo, "bin"), "cargo install's programs"),
        (join(cargo, ".crates.toml"), "cargo install's record of installed crates"),
        (join(cargo, ".crates2.json"), "cargo install's record of installed crates"),
        (join(cargo, "config.toml"), "cargo's config (its rustc-wrapper and runners run)"),
        (join(cargo, "config"), "cargo's config (its rustc-wrapper and runners run)"),
        (join(h, ".gitconfig"), "git's global config (the programs it names run)"),
        (
            xdg.base(env, "XDG_CONFIG_HOME", h) + "/git",
            "git's global config (the programs it names run)",
        ),
        (var("RUSTUP_HOME", join(h, ".rustup")), "rustup's toolchains"),
        (var("GOBIN", join(gopath, "bin")), "go install's programs"),
        (join(h, ".npm-global"), "npm install -g's prefix"),
        (join(h, ".npm-packages"), "npm install -g's prefix"),
        (var("NVM_DIR", join(h, ".nvm")), "nvm's node versions and their global packages"),
        (var("VOLTA_HOME", join(h, ".volta")), "volta's node versions and tools"),
        (var("FNM_DIR", join(data, "fnm")), "fnm's node versions"),
        (join(cache, "node-gyp"), "node-gyp's headers, compiled into native modules"),
        *((join(h, name), "a startup file of your shell, session or editor") for name in _STARTUP),
    ]
    for name in ("npm_config_prefix", "NPM_CONFIG_PREFIX"):
        if env.get(name, "").startswith("/"):
            found.append((posixpath.normpath(env[name]), "npm install -g's prefix"))
    out: dict[str, HostRun] = {}
    for path, what in found:
        if path not in out:
            out[path] = HostRun(path, what)
    return tuple(out.values())


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent if parent == "/" else parent + "/")


def reached(root: Path, where: Iterable[HostRun]) -> tuple[HostRun, ...]:
    """The places a writable ``root`` lets a sandbox write: those in it, or holding it."""
    r = str(root)
    return tuple(p for p in where if _within(p.path, r) or _within(r, p.path))


def warnings(writable: Iterable[Root], where: tuple[HostRun, ...]) -> list[str]:
    """One line per writable root that reaches a place the host runs programs from."""
    out = []
    for root in writable:
        hit = reached(root.path, where)
        if not hit:
            continue
        named = ", ".join(f"{p.path} ({p.what})" for p in hit[:3]) + (
            f" and {len(hit) - 3} more" if len(hit) > 3 else ""
        )
        out.append(
            f"{root.source} {root.path}: the host runs programs from {named} later; "
            "a sandbox that writes there reaches the host"
        )
    return out
