"""Developer-tool presets: which cache directories a tool needs writable, and its env.

Owns the knowledge of where uv, pip, npm, cargo, go and git keep their caches, as a
pure function of the caller's environment. Does no I/O: whether a directory exists
is decided later (a preset's cache is created on launch when missing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import PolicyError


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    # Each entry: (environment variable that overrides it, default below $HOME or XDG).
    caches: tuple[tuple[str, str], ...] = ()
    env_pass: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    hosts: tuple[str, ...] = field(default=())


_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "uv",
            "uv's cache (hardlinked into venvs)",
            caches=(("UV_CACHE_DIR", "{cache}/uv"),),
            env_pass=("UV_CACHE_DIR", "UV_INDEX_URL", "UV_DEFAULT_INDEX", "UV_LINK_MODE", "UV_PYTHON"),
            hosts=("pypi.org", "files.pythonhosted.org"),
        ),
        Preset(
            "pip",
            "pip's HTTP and wheel cache",
            caches=(("PIP_CACHE_DIR", "{cache}/pip"),),
            env_pass=("PIP_CACHE_DIR", "PIP_INDEX_URL", "PIP_NO_CACHE_DIR"),
            hosts=("pypi.org", "files.pythonhosted.org"),
        ),
        Preset(
            "npm",
            "npm's content-addressed cache",
            caches=(("npm_config_cache", "{home}/.npm"),),
            env_pass=("npm_config_cache", "npm_config_registry"),
            hosts=("registry.npmjs.org",),
        ),
        Preset(
            "cargo",
            "cargo's registry and git checkouts",
            # Only the download caches: ~/.cargo/bin holds programs the host runs.
            caches=(("", "{cargo}/registry"), ("", "{cargo}/git")),
            env_pass=("CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"),
            hosts=("crates.io", "index.crates.io", "static.crates.io"),
        ),
        Preset(
            "go",
            "go's module and build caches",
            caches=(("GOMODCACHE", "{home}/go/pkg/mod"), ("GOCACHE", "{cache}/go-build")),
            env_pass=("GOPATH", "GOMODCACHE", "GOCACHE", "GOPROXY", "GOFLAGS"),
            hosts=("proxy.golang.org", "sum.golang.org"),
        ),
        Preset(
            "git",
            "git identity and config from the caller",
            env_pass=(
                "GIT_AUTHOR_NAME",
                "GIT_AUTHOR_EMAIL",
                "GIT_COMMITTER_NAME",
                "GIT_COMMITTER_EMAIL",
                "GIT_CONFIG_GLOBAL",
            ),
        ),
        Preset("python", "uv + pip + git", includes=("uv", "pip", "git")),
        Preset("node", "npm + git", includes=("npm", "git")),
        Preset("rust", "cargo + git", includes=("cargo", "git")),
        Preset("golang", "go + git", includes=("go", "git")),
    )
}


@dataclass(frozen=True)
class PresetGrant:
    """What a set of presets adds to a policy."""

    writable: tuple[tuple[Path, str], ...]  # (path, "preset:NAME")
    env_pass: tuple[str, ...]
    hosts: tuple[str, ...]


def names() -> list[str]:
    return sorted(_PRESETS)


def describe() -> list[tuple[str, str]]:
    return [(p.name, p.summary) for p in sorted(_PRESETS.values(), key=lambda p: p.name)]


def _flatten(name: str, seen: set[str]) -> list[Preset]:
    preset = _PRESETS.get(name)
    if preset is None:
        raise PolicyError(
            f"unknown preset {name!r}",
            operation="policy",
            hint=f"known presets: {', '.join(names())}",
        )
    if name in seen:
        return []
    seen.add(name)
    out = [preset]
    for inc in preset.includes:
        out.extend(_flatten(inc, seen))
    return out


def expand(requested: tuple[str, ...], env: Mapping[str, str], home: Path) -> PresetGrant:
    """Resolve preset names into concrete cache paths for this caller."""
    seen: set[str] = set()
    presets = [p for name in requested for p in _flatten(name, seen)]
    cache_home = Path(env.get("XDG_CACHE_HOME") or home / ".cache")
    writable: list[tuple[Path, str]] = []
    env_pass: list[str] = []
    hosts: list[str] = []
    for preset in presets:
        for var, default in preset.caches:
            cargo_home = env.get("CARGO_HOME") or f"{home}/.cargo"
            raw = (env.get(var) if var else None) or default.format(
                home=home, cache=cache_home, cargo=cargo_home
            )
            path = Path(raw).expanduser()
            if not path.is_absolute():
                raise PolicyError(
                    f"preset {preset.name}: ${var} is a relative path: {raw}",
                    operation="policy",
                    path=raw,
                    hint=f"set {var} to an absolute path",
                )
            if all(path != w for w, _ in writable):
                writable.append((path, f"preset:{preset.name}"))
        env_pass.extend(v for v in preset.env_pass if v not in env_pass)
        hosts.extend(h for h in preset.hosts if h not in hosts)
    return PresetGrant(tuple(writable), tuple(env_pass), tuple(hosts))
