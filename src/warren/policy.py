"""Policy: what a sandbox may see and do, as plain validated data.

Owns the meaning of every policy field and its validation. Building a policy reads
the filesystem only to check that named paths exist (``stat``); it makes no mount,
namespace or Landlock call. Presets are expanded here into concrete paths.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from . import netpolicy as _netpolicy
from . import presets as _presets
from .errors import PolicyError

NETWORK_MODES = ("none", "allow", "open")

# Passed from the caller's environment unless the policy says otherwise.
DEFAULT_ENV_PASS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "LANG",
    "LANGUAGE",
    "TZ",
    "NO_COLOR",
    "FORCE_COLOR",
    "COLUMNS",
    "LINES",
    # Which certificates to trust (file names, not secrets): without them uv, pip,
    # npm, git and curl fail TLS behind a corporate or CI proxy with its own CA.
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "NIX_SSL_CERT_FILE",
    "UV_NATIVE_TLS",
)
_ENV_PASS_PATTERNS = (re.compile(r"LC_[A-Z_]+"),)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Credentials that are unreadable by default when they exist (host mode shows the host).
DEFAULT_DENIED = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.azure",
    "~/.kube",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.pypirc",
    "~/.config/gh",
    "~/.config/gcloud",
)

# Writable roots here would hand the sandbox the kernel or the device tree.
_FORBIDDEN_WRITABLE = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class Root:
    """A path the policy names, with where the grant came from (shown in the plan)."""

    path: Path
    source: str
    create: bool = False


@dataclass(frozen=True)
class Policy:
    workspace: Path
    writable: tuple[Root, ...] = ()
    readable: tuple[Root, ...] = ()
    denied: tuple[Root, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    env_pass: tuple[str, ...] = DEFAULT_ENV_PASS
    network: str = "none"
    presets: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    resolve: Mapping[str, str] = field(default_factory=dict)
    allow_nested: bool = False

    def __post_init__(self) -> None:
        self._validate()

    # -- validation ------------------------------------------------------------

    def _validate(self) -> None:
        _require_dir(self.workspace, "workspace")
        if self.network not in NETWORK_MODES:
            raise PolicyError(
                f"unknown network mode {self.network!r}",
                operation="policy",
                hint=f"use one of: {', '.join(NETWORK_MODES)}",
            )
        # Parsed here so a bad entry is an error before anything starts.
        _netpolicy.parse_rules(self.allowed_hosts)
        _netpolicy.parse_resolve(self.resolve)
        for root in (*self.writable, *self.readable, *self.denied):
            if not root.path.is_absolute():
                raise PolicyError(
                    f"{root.source}: path must be absolute: {root.path}",
                    operation="policy",
                    path=str(root.path),
                    hint="write it as an absolute path or start it with ~/",
                )
        for root in (*self.writable, *self.readable):
            if not root.create and not os.path.lexists(root.path):
                raise PolicyError(
                    f"{root.source}: path does not exist: {root.path}",
                    operation="policy",
                    path=str(root.path),
                    hint="create it first, or remove it from the policy",
                )
        for root in self.denied:
            if root.source != "default" and not os.path.lexists(root.path):
                raise PolicyError(
                    f"{root.source}: denied path does not exist: {root.path}",
                    operation="policy",
                    path=str(root.path),
                    hint="check the spelling; a deny rule that matches nothing protects nothing",
                )
        for root in self.writable:
            for forbidden in _FORBIDDEN_WRITABLE:
                if _is_within(root.path, Path(forbidden)):
                    raise PolicyError(
                        f"{root.source}: {root.path} cannot be writable",
                        operation="policy",
                        path=str(root.path),
                        hint=f"{forbidden} is the kernel's; the sandbox gets its own",
                    )
            for deny in self.denied:
                if _is_within(root.path, deny.path):
                    raise PolicyError(
                        f"{root.source}: writable path {root.path} is inside denied path "
                        f"{deny.path} ({deny.source})",
                        operation="policy",
                        path=str(root.path),
                        hint="remove one of the two rules; a denied path hides everything below it",
                    )
        for name in (*self.env, *self.env_pass):
            if not _ENV_NAME.fullmatch(name):
                raise PolicyError(
                    f"invalid environment variable name {name!r}",
                    operation="policy",
                    hint="names are letters, digits and _, not starting with a digit",
                )

    # -- derived views -----------------------------------------------------------

    def passes_env(self, name: str) -> bool:
        return name in self.env_pass or any(p.fullmatch(name) for p in _ENV_PASS_PATTERNS)


def _is_within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def _require_dir(path: Path, what: str) -> None:
    if not path.is_absolute():
        raise PolicyError(
            f"{what} must be an absolute path: {path}",
            operation="policy",
            path=str(path),
            hint="pass an absolute path",
        )
    if not path.exists():
        raise PolicyError(
            f"{what} does not exist: {path}",
            operation="policy",
            path=str(path),
            hint=f"create it (mkdir -p {path}) or pass another --workspace",
        )
    if not path.is_dir():
        raise PolicyError(
            f"{what} is not a directory: {path}",
            operation="policy",
            path=str(path),
            hint="the workspace must be a directory",
        )


def absolute(raw: str, where: str, base: Path | None, home: Path) -> Path:
    """Turn a user-written path into a normalized absolute one.

    ``base`` is where relative paths are anchored (the cwd for CLI flags); ``None``
    means relative paths are an error (config files).
    """
    if raw.startswith("~"):
        if raw != "~" and not raw.startswith("~/"):
            raise PolicyError(
                f"{where}: only ~/ is supported, not {raw!r}",
                operation="policy",
                path=raw,
                hint="write the full path of another user's home",
            )
        raw = str(home) + raw[1:]
    path = Path(raw)
    if not path.is_absolute():
        if base is None:
            raise PolicyError(
                f"{where}: path must be absolute: {raw}",
                operation="policy",
                path=raw,
                hint="config files need absolute paths (or ~/...)",
            )
        path = base / path
    # Resolve symlinks so the plan names what the kernel will see.
    return Path(os.path.realpath(path))


@dataclass
class PolicySpec:
    """Unvalidated options as a user writes them (flags or TOML), before resolution."""

    workspace: str | None = None
    write: list[str] = field(default_factory=list)
    read: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    env_pass: list[str] = field(default_factory=list)
    presets: list[str] = field(default_factory=list)
    network: str | None = None
    allow_hosts: list[str] = field(default_factory=list)
    resolve: dict[str, str] = field(default_factory=dict)
    default_deny: bool | None = None
    workspace_writable: bool | None = None
    allow_nested: bool | None = None

    def merged(self, other: PolicySpec) -> PolicySpec:
        """``other`` layered on top of ``self``: scalars replace, lists extend."""
        return PolicySpec(
            workspace=other.workspace or self.workspace,
            write=[*self.write, *other.write],
            read=[*self.read, *other.read],
            deny=[*self.deny, *other.deny],
            env={**self.env, **other.env},
            env_pass=[*self.env_pass, *other.env_pass],
            presets=[*self.presets, *other.presets],
            network=other.network or self.network,
            allow_hosts=[*self.allow_hosts, *other.allow_hosts],
            resolve={**self.resolve, **other.resolve},
            default_deny=_pick(other.default_deny, self.default_deny),
            workspace_writable=_pick(other.workspace_writable, self.workspace_writable),
            allow_nested=_pick(other.allow_nested, self.allow_nested),
        )


def _pick(a: bool | None, b: bool | None) -> bool | None:
    return a if a is not None else b


def build(
    spec: PolicySpec,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    relative_base: Path | None = None,
) -> Policy:
    """Resolve a spec into a validated :class:`Policy` for the calling user."""
    env = os.environ if env is None else env
    home = home or Path(env.get("HOME") or os.path.expanduser("~"))
    cwd = cwd or Path.cwd()
    base = relative_base if relative_base is not None else cwd
    workspace = absolute(spec.workspace, "--workspace", base, home) if spec.workspace else cwd.resolve()
    grant = _presets.expand(tuple(spec.presets), env, home)
    network = _network_mode(spec)

    writable: list[Root] = []
    if spec.workspace_writable is not False:
        writable.append(Root(workspace, "workspace"))
    writable += [Root(absolute(p, "--write", base, home), "--write") for p in spec.write]
    writable += [Root(Path(os.path.realpath(p)), src, create=True) for p, src in grant.writable]
    readable = [Root(absolute(p, "--read", base, home), "--read") for p in spec.read]
    denied = [Root(absolute(p, "--deny", base, home), "--deny") for p in spec.deny]
    if spec.default_deny is not False:
        for raw in DEFAULT_DENIED:
            path = absolute(raw, "default deny", None, home)
            writes_inside = any(_is_within(w.path, path) for w in writable)
            if os.path.lexists(path) and not writes_inside:
                denied.append(Root(path, "default"))
    return Policy(
        workspace=workspace,
        writable=tuple(_dedupe(writable)),
        readable=tuple(_dedupe(readable)),
        denied=tuple(_dedupe(denied)),
        env=dict(spec.env),
        env_pass=tuple(dict.fromkeys([*DEFAULT_ENV_PASS, *grant.env_pass, *spec.env_pass])),
        network=network,
        presets=tuple(spec.presets),
        allowed_hosts=tuple(dict.fromkeys([*grant.hosts, *spec.allow_hosts])) if network == "allow" else (),
        resolve=dict(spec.resolve),
        allow_nested=bool(spec.allow_nested),
    )


def _network_mode(spec: PolicySpec) -> str:
    """``--allow-host`` alone means ``--network allow``; with another mode it is a
    contradiction, said as such rather than silently ignored."""
    if spec.network is None:
        return "allow" if spec.allow_hosts else "none"
    if spec.allow_hosts and spec.network != "allow":
        raise PolicyError(
            f"allowed hosts ({', '.join(spec.allow_hosts[:3])}) given with network mode {spec.network!r}",
            operation="policy",
            hint="allowed hosts only apply to --network allow; drop them or use --network allow",
        )
    return spec.network


def _dedupe(roots: Iterable[Root]) -> list[Root]:
    seen: dict[Path, Root] = {}
    for root in roots:
        seen.setdefault(root.path, root)
    return list(seen.values())
