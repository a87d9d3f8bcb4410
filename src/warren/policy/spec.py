"""PolicySpec: a policy as a user writes it, before it is resolved for a caller.

Owns the one mapping between a spec and its dictionary form, whose keys are exactly
the keys of ``warren.toml``: TOML files, the protocol (a client sends the spec, the
supervisor resolves it) and later HTTP and MCP bodies all go through ``from_mapping``
and ``to_mapping``, so a key means the same everywhere and a bad one is the same
typed error naming where it came from. No filesystem access here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from typing import Any, TypeVar

from ..errors import ConfigError, PolicyError
from . import limits as _limits

# key -> attribute; both spellings of the list keys are accepted, the first is canonical.
LIST_KEYS = {
    "write": "write",
    "read": "read",
    "deny": "deny",
    "env_pass": "env_pass",
    "preset": "presets",
    "presets": "presets",
    "allow_host": "allow_hosts",
    "allow_hosts": "allow_hosts",
    # secrets put in by the proxy, HTTP rules of intercepted hosts (net.secrets)
    "secrets": "secrets",
    "secret": "secrets",
    "allow_http": "allow_http",
}
# attribute -> its canonical key, the one ``to_mapping`` writes
_LIST_KEY_OF = {attr: next(k for k, a in LIST_KEYS.items() if a == attr) for attr in LIST_KEYS.values()}
BOOL_KEYS = (
    "default_deny",
    "workspace_writable",
    "allow_nested",
    "allow_broad_workspace",
    "require_namespaces",
    "review",
    "workspace_link",
)
STR_KEYS = ("workspace", "network", "workspace_at")
TABLE_KEYS = ("env", "resolve")
LIMIT_KEYS = ("memory", "pids", "cpus", "tmp_size", "idle_timeout")
PATH_KEYS = ("write", "read", "deny")
# Sandboxes on an image (docs/images.md): the image's name, the size of its writable layer.
IMAGE_KEYS = ("image", "disk", "from_snapshot")
# How long a connection of ``network = "ask"`` waits for an answer (net.live).
ASK_KEYS = ("ask_timeout",)
KNOWN = sorted({*LIST_KEYS, *BOOL_KEYS, *STR_KEYS, *TABLE_KEYS, *LIMIT_KEYS, *IMAGE_KEYS, *ASK_KEYS})
Raw = str | int | float
_Many = str | list[str] | None


_T = TypeVar("_T")


@dataclass
class PolicySpec:
    """Unvalidated options as a user writes them (flags, TOML, a request body)."""

    workspace: str | None = None
    # where the sandbox sees its workspace, when not at its host path (E2B's /home/user)
    workspace_at: str | None = None
    # workspace_at is a symbolic link to the workspace, which stays at its host path (on
    # its host mount: links and renames with the caches work), not a mount of it
    workspace_link: bool | None = None
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
    allow_broad_workspace: bool | None = None
    # Resource limits as written ("512M", 64, 0.5); policy.limits gives their meaning.
    memory: Raw | None = None
    pids: Raw | None = None
    cpus: Raw | None = None
    tmp_size: Raw | None = None
    idle_timeout: Raw | None = None
    # On an image: its name (or a root directory's absolute path); the writable layer's size.
    image: str | None = None
    disk: Raw | None = None
    from_snapshot: str | None = None  # a snapshot's id: its image with its layer on top
    # NAME=ENVVAR@HOST[,HOST] / NAME=file:PATH@HOST; "METHOD HOST/PREFIX" (net.secrets)
    secrets: list[str] = field(default_factory=list)
    allow_http: list[str] = field(default_factory=list)
    require_namespaces: bool | None = None  # refuse the degraded mode (plan.degraded)
    # the workspace as an overlay: changes go to a layer of the sandbox's own until applied
    review: bool | None = None
    ask_timeout: Raw | None = None  # seconds, or a duration such as "2m"
    # The keys' other spellings, as the CLI, config files and HTTP accept them
    # (``PolicySpec(preset="python")``): added to their list.
    preset: InitVar[_Many] = None
    allow_host: InitVar[_Many] = None
    secret: InitVar[_Many] = None

    def __post_init__(self, preset: _Many, allow_host: _Many, secret: _Many) -> None:
        # A string where a list is meant is that one value, as in a TOML file
        # (``presets="python"`` was ['p', 'y', ...]: "unknown preset 'p'").
        for attr in set(LIST_KEYS.values()):
            value = getattr(self, attr)
            if isinstance(value, str):
                value = [value]
            elif isinstance(value, (tuple, set, frozenset)):
                value = list(value)
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise type_error("PolicySpec", _LIST_KEY_OF[attr], "a string or a list of strings")
            setattr(self, attr, value)
        for key, value in (("preset", preset), ("allow_host", allow_host), ("secret", secret)):
            if value is None:
                continue
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise type_error("PolicySpec", key, "a string or a list of strings")
            getattr(self, LIST_KEYS[key]).extend(value)

    def limits(self, where: str) -> _limits.Limits:
        return _limits.parse(self.memory, self.pids, self.cpus, self.tmp_size, where, self.idle_timeout)

    def merged(self, other: PolicySpec) -> PolicySpec:
        """``other`` layered on top of ``self``: scalars replace, lists extend."""
        return PolicySpec(
            workspace=other.workspace or self.workspace,
            workspace_at=other.workspace_at or self.workspace_at,
            workspace_link=_pick(other.workspace_link, self.workspace_link),
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
            allow_broad_workspace=_pick(other.allow_broad_workspace, self.allow_broad_workspace),
            memory=other.memory if other.memory is not None else self.memory,
            pids=other.pids if other.pids is not None else self.pids,
            cpus=other.cpus if other.cpus is not None else self.cpus,
            tmp_size=other.tmp_size if other.tmp_size is not None else self.tmp_size,
            idle_timeout=other.idle_timeout if other.idle_timeout is not None else self.idle_timeout,
            image=other.image or self.image,
            disk=other.disk if other.disk is not None else self.disk,
            from_snapshot=other.from_snapshot or self.from_snapshot,
            secrets=[*self.secrets, *other.secrets],
            allow_http=[*self.allow_http, *other.allow_http],
            require_namespaces=_pick(other.require_namespaces, self.require_namespaces),
            review=_pick(other.review, self.review),
            ask_timeout=other.ask_timeout if other.ask_timeout is not None else self.ask_timeout,
        )

    def to_mapping(self) -> dict[str, object]:
        """The ``warren.toml`` form, with only what is set."""
        out: dict[str, object] = {}
        if self.workspace is not None:
            out["workspace"] = self.workspace
        for attr, key in _LIST_KEY_OF.items():
            value = getattr(self, attr)
            if value:
                out[key] = list(value)
        if self.env:
            out["env"] = dict(self.env)
        if self.resolve:
            out["resolve"] = dict(self.resolve)
        if self.network is not None:
            out["network"] = self.network
        if self.workspace_at is not None:
            out["workspace_at"] = self.workspace_at
        for key in (*BOOL_KEYS, *LIMIT_KEYS, *IMAGE_KEYS, *ASK_KEYS):
            value = getattr(self, key)
            if value is not None:
                out[key] = value
        return out


def _pick(a: _T | None, b: _T | None) -> _T | None:
    return a if a is not None else b


def type_error(where: str, key: str, expected: str) -> ConfigError:
    return ConfigError(
        f"{where}: {key!r} must be {expected}",
        operation="config",
        hint="see the policy file reference (docs/reference/config.md) for the schema",
    )


def from_mapping(table: Mapping[str, Any], where: str, *, skip: tuple[str, ...] = ("profile",)) -> PolicySpec:
    """A spec from its dictionary form, every key and value checked; paths are kept as
    written (``resolve`` makes them absolute for a caller). ``where`` names the source
    in errors (a file, "--write", "request")."""
    if not isinstance(table, Mapping):
        raise type_error(where, "policy", "a table of keys")
    spec = PolicySpec()
    for key, value in table.items():
        if key in skip:
            continue
        if key in LIST_KEYS:
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise type_error(where, key, "a list of strings")
            for v in value:
                check_text(v, f"{where}: {key}")
            getattr(spec, LIST_KEYS[key]).extend(value)
        elif key in BOOL_KEYS:
            if not isinstance(value, bool):
                raise type_error(where, key, "true or false")
            setattr(spec, key, value)
        elif key in STR_KEYS:
            if not isinstance(value, str):
                raise type_error(where, key, "a string")
            check_text(value, f"{where}: {key}")
            setattr(spec, key, value)
        elif key in TABLE_KEYS:
            expected = "a table of strings" if key == "env" else 'a table of NAME = "ADDRESS"'
            if not isinstance(value, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in value.items()
            ):
                raise type_error(where, key, expected)
            for k, v in value.items():
                check_text(k, f"{where}: {key}")
                check_text(v, f"{where}: {key}.{k}")
            getattr(spec, key).update(value)
        elif key in LIMIT_KEYS:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise type_error(where, key, "a number or a size such as 512M")
            # Checked now, so a bad value is an error naming where it was written.
            _limits.parse(**{k: value if k == key else None for k in LIMIT_KEYS}, where=where)
            setattr(spec, key, value)
        elif key in ("image", "from_snapshot"):
            if not isinstance(value, str) or not value:
                raise type_error(where, key, "a name" if key == "image" else "a snapshot id")
            setattr(spec, key, check_text(value, f"{where}: {key}"))
        elif key == "disk":
            if isinstance(value, bool) or not isinstance(value, (str, int)):
                raise type_error(where, key, "a size such as 4G")
            _limits.parse_size(value, f"{where}: disk")
            spec.disk = value
        elif key == "ask_timeout":
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise type_error(where, key, 'seconds, or a duration such as "2m"')
            ask_timeout(value, f"{where}: ask_timeout")
            spec.ask_timeout = value
        else:
            raise ConfigError(
                f"{where}: unknown key {key!r}",
                operation="config",
                hint=f"known keys: {', '.join(KNOWN)}",
            )
    return spec


DEFAULT_ASK_TIMEOUT = 60.0
MAX_ASK_TIMEOUT = 3600.0


def ask_timeout(value: object, where: str) -> float:
    """``ask_timeout`` in seconds: more than 0 and at most an hour (a connection waiting
    holds a thread of the proxy)."""
    seconds = _limits.parse_duration(value, where)
    if not 0 < seconds <= MAX_ASK_TIMEOUT:
        raise PolicyError(
            f"{where}: {value!r} is not between 0 and {MAX_ASK_TIMEOUT:g} seconds",
            operation="policy",
            hint='write seconds (30) or a duration ("2m"), at most an hour',
        )
    return seconds


def check_text(value: str, where: str) -> str:
    """Paths, names and values end up as C strings: no NUL, and not absurdly long."""
    if "\x00" in value:
        raise PolicyError(
            f"{where}: {value[:60]!r} contains a NUL byte",
            operation="policy",
            hint="paths, names and values cannot contain NUL (\\0)",
        )
    if len(value) > 65536:
        raise PolicyError(
            f"{where}: value of {len(value)} characters is too long",
            operation="policy",
            hint="paths are at most 4096 bytes; values at most 64 KiB",
        )
    return value
