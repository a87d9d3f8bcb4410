"""Developer-tool presets: what a tool writes while it works, and which settings it reads.

Owns the knowledge of where uv, pip, pipx, pre-commit, npm, corepack, cargo, go and git
keep their caches, which environment variables configure them (private indexes and
registries included), and where their installed programs land. A preset grants caches,
never a place the host runs programs from later (``hostrun``: uv's tools and Pythons,
pipx's venvs, corepack's package managers, pre-commit's hook environments, bin
directories, toolchains): a tool that needs a home of installed programs merely to run
(``uvx`` locks uv's tool directory, ``pipx run`` and pre-commit keep their venvs in
theirs) gets a private one in the sandbox's TMPDIR instead (``private``). A preset never
passes a credential: ``is_credential_name`` keeps such names out. A pure function of
the caller's environment; no I/O: whether a directory exists is decided later (a
preset's directory is created on launch when missing).

The coding-agent presets (claude-code, codex, gemini-cli) give the agent a home of its
own instead of the user's ``~/.claude``, ``~/.codex`` or ``~/.gemini``: those hold the
user's logins and settings that the user's unsandboxed agent obeys later (hooks, MCP
servers, allowed commands), so a sandbox that could write them could run code on the
host. They stay denied; the sandboxed agent keeps its config and state in
``$XDG_DATA_HOME/warren/agents/NAME``, named by the variable the agent reads its home
from (``CLAUDE_CONFIG_DIR``, ``CODEX_HOME``, ``GEMINI_CLI_HOME``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .. import xdg
from ..errors import PolicyError

# A preset passes its tool's settings, never its credentials: a name containing one
# of these stays out unless the caller passes it explicitly (--pass-env NAME); AUTH
# counts as a word of its own (npm's _auth, BASIC_AUTH), not inside GIT_AUTHOR_NAME.
CREDENTIAL_PARTS = ("TOKEN", "PASSWORD", "PASSWD", "SECRET", "CREDENTIAL", "API_KEY", "APIKEY", "ACCESS_KEY")
_AUTH_WORD = re.compile(r"(^|_)AUTH(_|$)")


def is_credential_name(name: str) -> bool:
    upper = name.upper()
    return any(part in upper for part in CREDENTIAL_PARTS) or bool(_AUTH_WORD.search(upper))


@dataclass(frozen=True)
class Preset:
    name: str
    summary: str
    # Each entry: (environment variable that overrides it, default below $HOME or XDG).
    # Defaults use {home}, {cache} ($XDG_CACHE_HOME), {data} ($XDG_DATA_HOME), {state}
    # ($XDG_STATE_HOME), {cargo}.
    caches: tuple[tuple[str, str], ...] = ()
    env_pass: tuple[str, ...] = ()
    # Families of settings named per index or registry (regular expressions, full match).
    env_patterns: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    hosts: tuple[str, ...] = field(default=())
    # Where the tool installs programs the host runs later (``hostrun``): never made
    # writable by a preset (shown by `warren presets`).
    not_writable: tuple[str, ...] = ()
    # A home of installed programs the tool needs writable merely to run: (variable,
    # the host's directory with the same placeholders as caches, name). The host's stays
    # read-only; the sandbox's tool is pointed at ``$TMPDIR/name``, private to the
    # sandbox and removed with it, unless a --write grants the host's.
    private: tuple[tuple[str, str, str], ...] = ()
    # A home of the tool's own: (variable the tool reads it from, directory, same
    # placeholders as caches). Writable, and the variable is set to it in the sandbox
    # whatever the caller's says (the caller's names the user's own, which stays denied).
    homes: tuple[tuple[str, str], ...] = ()
    # The agent's own API key, as a secret the proxy puts in (``net.secrets``): the
    # sandbox sees a placeholder. Only when the caller has the variable set.
    secrets: tuple[str, ...] = ()
    # Variables naming a directory above caches that have no variable of their own (same
    # placeholders): set on an image, whose HOME is not the caller's (``plan.envroot``).
    locate: tuple[tuple[str, str], ...] = ()


# Where a tool looks for its cache, data and programs when its own variable is unset:
# the sandbox must look where the preset made things writable.
_XDG = ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_BIN_HOME")

_PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "uv",
            "uv's cache (hardlinked into venvs); a private tool directory for uvx",
            caches=(("UV_CACHE_DIR", "{cache}/uv"),),
            private=(("UV_TOOL_DIR", "{data}/uv/tools", "uv-tools"),),
            env_pass=(
                *_XDG,
                "UV_CACHE_DIR",
                "UV_TOOL_DIR",
                "UV_TOOL_BIN_DIR",
                "UV_PYTHON_INSTALL_DIR",
                "UV_PYTHON_BIN_DIR",
                "UV_PYTHON_INSTALL_MIRROR",
                "UV_PYPY_INSTALL_MIRROR",
                "UV_PYTHON_DOWNLOADS",
                "UV_PYTHON_DOWNLOADS_JSON_URL",
                "UV_PYTHON_PREFERENCE",
                "UV_MANAGED_PYTHON",
                "UV_NO_MANAGED_PYTHON",
                "UV_PYTHON",
                "UV_INDEX",
                "UV_INDEX_URL",
                "UV_DEFAULT_INDEX",
                "UV_EXTRA_INDEX_URL",
                "UV_FIND_LINKS",
                "UV_INDEX_STRATEGY",
                "UV_INSECURE_HOST",
                "UV_NO_INDEX",
                "UV_OFFLINE",
                "UV_NO_CACHE",
                "UV_LINK_MODE",
                "UV_CONSTRAINT",
                "UV_OVERRIDE",
                "UV_PRERELEASE",
                "UV_RESOLUTION",
                "UV_EXCLUDE_NEWER",
                "UV_HTTP_TIMEOUT",
                "UV_CONCURRENT_DOWNLOADS",
                "UV_CONCURRENT_BUILDS",
                "UV_CONCURRENT_INSTALLS",
                "UV_COMPILE_BYTECODE",
                "UV_NO_PROGRESS",
                "UV_CONFIG_FILE",
                "UV_NO_CONFIG",
                "UV_PROJECT_ENVIRONMENT",
                "UV_SYSTEM_PYTHON",
                "UV_FROZEN",
                "UV_LOCKED",
                "UV_NO_SYNC",
            ),
            hosts=("pypi.org", "files.pythonhosted.org"),
            not_writable=(
                "~/.local/share/uv/tools (uv tool install)",
                "~/.local/share/uv/python (uv python install; installed Pythons are used read-only)",
                "~/.local/bin (UV_TOOL_BIN_DIR, UV_PYTHON_BIN_DIR)",
            ),
        ),
        Preset(
            "pip",
            "pip's HTTP and wheel cache",
            caches=(("PIP_CACHE_DIR", "{cache}/pip"),),
            env_pass=(
                *_XDG,
                "PIP_CACHE_DIR",
                "PIP_NO_CACHE_DIR",
                "PIP_INDEX_URL",
                "PIP_EXTRA_INDEX_URL",
                "PIP_FIND_LINKS",
                "PIP_NO_INDEX",
                "PIP_TRUSTED_HOST",
                "PIP_CONSTRAINT",
                "PIP_PRE",
                "PIP_ONLY_BINARY",
                "PIP_NO_BINARY",
                "PIP_PREFER_BINARY",
                "PIP_DEFAULT_TIMEOUT",
                "PIP_TIMEOUT",
                "PIP_RETRIES",
                "PIP_DISABLE_PIP_VERSION_CHECK",
                "PIP_REQUIRE_VIRTUALENV",
                "PIP_BREAK_SYSTEM_PACKAGES",
                "PIP_CONFIG_FILE",
                "PIP_NO_INPUT",
                "PIP_PROGRESS_BAR",
                "PIP_CLIENT_CERT",
                "PIP_USER",
            ),
            hosts=("pypi.org", "files.pythonhosted.org"),
            not_writable=("~/.local/lib and ~/.local/bin (pip install --user)",),
        ),
        Preset(
            "npm",
            "npm's content-addressed cache (npx too)",
            caches=(("npm_config_cache", "{home}/.npm"),),
            env_pass=(
                *_XDG,
                "npm_config_cache",
                "npm_config_registry",
                "npm_config_prefix",
                "npm_config_offline",
                "npm_config_prefer_offline",
                "npm_config_prefer_online",
                "npm_config_strict_ssl",
                "npm_config_cafile",
                "npm_config_fetch_retries",
                "npm_config_fetch_timeout",
                "npm_config_userconfig",
                "npm_config_globalconfig",
                "npm_config_update_notifier",
                "npm_config_fund",
                "npm_config_audit",
                "NPM_CONFIG_CACHE",
                "NPM_CONFIG_REGISTRY",
                "NPM_CONFIG_PREFIX",
                "NPM_CONFIG_OFFLINE",
                "NPM_CONFIG_PREFER_OFFLINE",
                "NPM_CONFIG_USERCONFIG",
                "COREPACK_HOME",
                "COREPACK_NPM_REGISTRY",
                "COREPACK_ENABLE_DOWNLOAD_PROMPT",
                "COREPACK_ENABLE_NETWORK",
                "COREPACK_ENABLE_STRICT",
                "COREPACK_DEFAULT_TO_LATEST",
                "YARN_REGISTRY",
                "YARN_NPM_REGISTRY_SERVER",
            ),
            # A scope's registry (npm reads npm_config_@scope:registry from the environment).
            env_patterns=(r"(npm|NPM)_(config|CONFIG)_@[A-Za-z0-9._-]+:registry",),
            hosts=("registry.npmjs.org",),
            not_writable=(
                "the global prefix (npm install -g)",
                "~/.cache/node/corepack (corepack's package managers; those downloaded are used read-only)",
            ),
        ),
        Preset(
            "cargo",
            "cargo's registry and git checkouts",
            # Only the download caches: ~/.cargo/bin holds programs the host runs.
            caches=(("", "{cargo}/registry"), ("", "{cargo}/git")),
            locate=(("CARGO_HOME", "{cargo}"),),
            env_pass=(
                "CARGO_HOME",
                "RUSTUP_HOME",
                "RUSTUP_TOOLCHAIN",
                "RUSTUP_DIST_SERVER",
                "RUSTUP_UPDATE_ROOT",
                "CARGO_REGISTRY_DEFAULT",
                "CARGO_NET_OFFLINE",
                "CARGO_NET_RETRY",
                "CARGO_NET_GIT_FETCH_WITH_CLI",
                "CARGO_HTTP_TIMEOUT",
                "CARGO_HTTP_MULTIPLEXING",
                "CARGO_TARGET_DIR",
                "CARGO_BUILD_JOBS",
                "CARGO_BUILD_TARGET",
                "CARGO_INCREMENTAL",
                "CARGO_TERM_COLOR",
                "RUSTFLAGS",
                "RUSTDOCFLAGS",
            ),
            # [registries.NAME] and [source.NAME]; their tokens are credentials, left out.
            env_patterns=(
                r"CARGO_REGISTRIES_[A-Z0-9_]+_(INDEX|PROTOCOL)",
                r"CARGO_SOURCE_[A-Z0-9_]+_(REGISTRY|REPLACE_WITH|LOCAL_REGISTRY|DIRECTORY)",
            ),
            hosts=("crates.io", "index.crates.io", "static.crates.io"),
            not_writable=("~/.cargo/bin (cargo install)", "~/.rustup (rustup toolchain install)"),
        ),
        Preset(
            "go",
            "go's module and build caches",
            caches=(("GOMODCACHE", "{home}/go/pkg/mod"), ("GOCACHE", "{cache}/go-build")),
            env_pass=(
                *_XDG,
                "GOPATH",
                "GOMODCACHE",
                "GOCACHE",
                "GOPROXY",
                "GOFLAGS",
                "GOPRIVATE",
                "GONOPROXY",
                "GONOSUMDB",
                "GOSUMDB",
                "GOINSECURE",
                "GOTOOLCHAIN",
                "GOBIN",
                "GOENV",
            ),
            hosts=("proxy.golang.org", "sum.golang.org"),
            not_writable=("~/go/bin (go install)",),
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
        Preset(
            "pre-commit",
            "pre-commit, with a private home for its hook environments",
            private=(("PRE_COMMIT_HOME", "{cache}/pre-commit", "pre-commit"),),
            env_pass=("XDG_CACHE_HOME", "PRE_COMMIT_HOME", "PRE_COMMIT_COLOR", "SKIP"),
            not_writable=("~/.cache/pre-commit (the hook environments your git commits run)",),
        ),
        Preset(
            "pipx",
            "pipx run, with a private home for its venvs",
            private=(("PIPX_HOME", "{data}/pipx", "pipx"),),
            env_pass=(
                *_XDG,
                "XDG_STATE_HOME",
                "PIPX_HOME",
                "PIPX_BIN_DIR",
                "PIPX_MAN_DIR",
                "PIPX_DEFAULT_PYTHON",
                "PIPX_DEFAULT_BACKEND",
                "PIPX_FETCH_MISSING_PYTHON",
                "PIPX_USE_EMOJI",
            ),
            hosts=("pypi.org", "files.pythonhosted.org"),
            not_writable=(
                "~/.local/share/pipx and ~/.cache/pipx (pipx install, pipx run's venvs)",
                "~/.local/bin and ~/.local/share/man (PIPX_BIN_DIR, PIPX_MAN_DIR)",
            ),
        ),
        Preset(
            "claude-code",
            "Claude Code (claude) with a config home of its own; $ANTHROPIC_API_KEY as a secret",
            homes=(("CLAUDE_CONFIG_DIR", "{data}/warren/agents/claude-code"),),
            env_pass=(
                "ANTHROPIC_BASE_URL",
                "ANTHROPIC_MODEL",
                "ANTHROPIC_SMALL_FAST_MODEL",
                "ANTHROPIC_DEFAULT_OPUS_MODEL",
                "ANTHROPIC_DEFAULT_SONNET_MODEL",
                "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                "CLAUDE_CODE_USE_BEDROCK",
                "CLAUDE_CODE_USE_VERTEX",
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC",
                "CLAUDE_CODE_DISABLE_TERMINAL_TITLE",
                "DISABLE_AUTOUPDATER",
                "DISABLE_TELEMETRY",
                "DISABLE_ERROR_REPORTING",
                "BASH_DEFAULT_TIMEOUT_MS",
                "BASH_MAX_TIMEOUT_MS",
                "ANTHROPIC_VERTEX_PROJECT_ID",
                "CLOUD_ML_REGION",
                "AWS_REGION",
            ),
            includes=("git",),
            hosts=("api.anthropic.com", "claude.ai", "platform.claude.com"),
            secrets=("ANTHROPIC_API_KEY=ANTHROPIC_API_KEY@api.anthropic.com",),
        ),
        Preset(
            "codex",
            "OpenAI Codex CLI (codex) with a home of its own; $OPENAI_API_KEY as a secret",
            homes=(("CODEX_HOME", "{data}/warren/agents/codex"),),
            # Its endpoint comes from its config (model_providers, in its home), not the environment.
            env_pass=("OPENAI_ORGANIZATION", "RUST_LOG"),
            includes=("git",),
            hosts=("api.openai.com", "auth.openai.com", "chatgpt.com"),
            secrets=("OPENAI_API_KEY=OPENAI_API_KEY@api.openai.com",),
        ),
        Preset(
            "gemini-cli",
            "Gemini CLI (gemini) with a home of its own; $GEMINI_API_KEY as a secret",
            homes=(("GEMINI_CLI_HOME", "{data}/warren/agents/gemini-cli"),),
            env_pass=(
                "GEMINI_MODEL",
                "GOOGLE_CLOUD_PROJECT",
                "GOOGLE_CLOUD_LOCATION",
                "GOOGLE_GENAI_USE_VERTEXAI",
                "GOOGLE_GENAI_USE_GCA",
            ),
            includes=("git",),
            hosts=(
                "generativelanguage.googleapis.com",
                "cloudcode-pa.googleapis.com",
                "oauth2.googleapis.com",
                "accounts.google.com",
            ),
            secrets=("GEMINI_API_KEY=GEMINI_API_KEY@generativelanguage.googleapis.com",),
        ),
        Preset(
            "python",
            "uv + pip + pipx + pre-commit + git",
            includes=("uv", "pip", "pipx", "pre-commit", "git"),
        ),
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
    env_patterns: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # (variable, value) set in the sandbox
    secrets: tuple[str, ...] = ()  # --secret entries (the caller has their variables)
    # (variable, path) telling each tool where its cache is: set on an image only, where
    # the caller's HOME and XDG directories are not the sandbox's.
    locations: tuple[tuple[str, str], ...] = ()
    # (variable, host directory, name): see ``Preset.private``.
    private: tuple[tuple[str, Path, str], ...] = ()


def names() -> list[str]:
    return sorted(_PRESETS)


def describe() -> list[tuple[str, str]]:
    return [(p.name, p.summary) for p in sorted(_PRESETS.values(), key=lambda p: p.name)]


def get(name: str) -> Preset:
    return _flatten(name, set())[0]


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
    # A relative XDG base is ignored, as the specification says (``xdg.base``).
    cache_home, data_home, state_home = (
        xdg.base(env, name, str(home)) for name in ("XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME")
    )
    writable: list[tuple[Path, str]] = []
    env_pass: list[str] = []
    patterns: list[str] = []
    hosts: list[str] = []
    settings: list[tuple[str, str]] = []
    secrets: list[str] = []
    locations: list[tuple[str, str]] = []
    private: list[tuple[str, Path, str]] = []
    cargo_home = env.get("CARGO_HOME") or f"{home}/.cargo"

    def place(name: str, var: str, default: str, own: bool) -> Path:
        raw = (env.get(var) if var and not own else None) or default.format(
            home=home, cache=cache_home, data=data_home, state=state_home, cargo=cargo_home
        )
        path = Path(raw).expanduser()
        if not path.is_absolute():
            raise PolicyError(
                f"preset {name}: ${var} is a relative path: {raw}",
                operation="policy",
                path=raw,
                hint=f"set {var} to an absolute path",
            )
        return path

    for preset in presets:
        places = [(var, default, False) for var, default in preset.caches]
        places += [(var, default, True) for var, default in preset.homes]
        for var, default, own in places:
            path = place(preset.name, var, default, own)
            if all(path != w for w, _ in writable):
                writable.append((path, f"preset:{preset.name}"))
            if own:
                settings.append((var, str(path)))
            elif var and all(var != v for v, _ in locations):
                locations.append((var, str(path)))
        for var, default, dirname in preset.private:
            if all(var != v for v, _, _ in private):
                private.append((var, place(preset.name, var, default, False), dirname))
        for var, default in preset.locate:
            if all(var != v for v, _ in locations):
                locations.append((var, str(place(preset.name, var, default, False))))
        env_pass.extend(v for v in preset.env_pass if v not in env_pass and not is_credential_name(v))
        patterns.extend(p for p in preset.env_patterns if p not in patterns)
        hosts.extend(h for h in preset.hosts if h not in hosts)
        secrets.extend(s for s in preset.secrets if env.get(s.partition("=")[2].partition("@")[0]))
    return PresetGrant(
        tuple(writable),
        tuple(env_pass),
        tuple(hosts),
        tuple(patterns),
        tuple(settings),
        tuple(secrets),
        tuple(locations),
        tuple(private),
    )


def not_writable(requested: tuple[str, ...]) -> list[tuple[str, str]]:
    """(preset, place) for each place a preset's tool installs programs and leaves read-only."""
    seen: set[str] = set()
    return [(p.name, where) for name in requested for p in _flatten(name, seen) for where in p.not_writable]
