"""Policy files: ``warren.toml`` in the workspace and the user's config, with profiles.

Owns the TOML schema and the layering order. Layers, later wins (lists extend):
user config top level < user profile < workspace file top level < workspace profile
< command-line flags. A workspace file comes with the repository (nobody vetted it),
so it may only narrow the sandbox: deny paths, make paths inside the workspace
read-only, set environment values, keep the network off and the default deny on,
lower resource limits.
Every other key, or a value that widens, is refused naming the file and the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import xdg
from ..errors import ConfigError, PolicyError
from . import limits as _limits
from . import lookups as _lookups
from .resolve import absolute, as_path, env_and_home, granted
from .spec import PATH_KEYS, PolicySpec, from_mapping, type_error

WORKSPACE_FILE = "warren.toml"
# Keys of the user's own config that are no sandbox's policy: the supervisor reads them.
USER_ONLY = ("snapshot_budget", "trail_budget")
DEFAULT_SNAPSHOT_BUDGET = "25%"
DEFAULT_TRAIL_BUDGET = 4 << 20  # bytes per generation of a sandbox's trail (server.trail)


def user_config_path(env: Mapping[str, str], home: Path) -> Path:
    return Path(xdg.base(env, "XDG_CONFIG_HOME", str(home))) / "warren" / "config.toml"


# A config file is a few lines; a workspace's is the sandbox's to write, and is read
# whole by the supervisor.
MAX_CONFIG = 1 << 20


def _load(path: Path, follow: bool = True) -> dict[str, Any]:
    """The TOML table of the config file at ``path`` ({} where there is none).
    ``follow`` False (a workspace's file, the sandbox's to write): a link there is an
    error, never read through."""
    try:
        data = _lookups.read_file(path, MAX_CONFIG, follow)
    except _lookups.IsLink:
        raise ConfigError(
            f"{path}: a symbolic link: a workspace's {WORKSPACE_FILE} is never followed (a "
            "sandbox of this workspace may have made it, to have warren read a file it names)",
            operation="config",
            path=str(path),
            hint=f'put the file itself there (cp --remove-destination "$(readlink -f {path})" {path}), '
            "or move shared settings into a profile of your user config",
        ) from None
    except _lookups.NotRegular:
        raise ConfigError(
            f"{path}: not a regular file",
            operation="config",
            path=str(path),
            hint="make it a file of TOML, or remove it (a FIFO or a device is never read)",
        ) from None
    except _lookups.TooLarge:
        raise ConfigError(
            f"{path}: larger than {MAX_CONFIG >> 20} MiB",
            operation="config",
            path=str(path),
            hint="a config file is a few lines of TOML; was it written by something else?",
        ) from None
    except OSError as e:
        raise ConfigError.from_os(
            e, f"{path}: cannot read", "config", str(path), hint="check the file's permissions"
        ) from None
    if data is None:
        return {}
    import tomllib  # only when a file exists: keeps `warren run` start-up short

    try:
        return tomllib.loads(data.decode())
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: not valid TOML: not UTF-8 ({e.reason} at byte {e.start})",
            operation="config",
            path=str(path),
            hint="save the file as UTF-8; see the policy file reference (docs/reference/config.md)",
        ) from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"{path}: not valid TOML: {e}",
            operation="config",
            path=str(path),
            hint="fix the syntax; see the policy file reference (docs/reference/config.md)",
        ) from None


def _spec_from_table(
    table: Mapping[str, Any], where: str, home: Path, base: Path | None = None, workspace: Path | None = None
) -> PolicySpec:
    """``base``: where relative paths start (the workspace, for its own file); the
    user's config has no directory of its own, so paths there are absolute or ~/.
    ``workspace``: a ``write`` or ``read`` path led out of it by a link inside it is an
    error (``resolve.granted``)."""
    spec = from_mapping(table, where)
    for key in PATH_KEYS:
        at = f"{where}: {key}"
        paths = [
            granted(v, at, base, home, workspace, key)
            if workspace is not None and key in ("write", "read")
            else absolute(v, at, base, home)
            for v in getattr(spec, key)
        ]
        setattr(spec, key, [str(p) for p in paths])
    if spec.workspace is not None:
        spec.workspace = str(absolute(spec.workspace, f"{where}: workspace", None, home))
    return spec


def _profile(data: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any] | None:
    profiles = data.get("profile", {})
    if not isinstance(profiles, dict):
        raise type_error(where, "profile", "a table of [profile.NAME] tables")
    table = profiles.get(name)
    if table is not None and not isinstance(table, dict):
        raise type_error(where, f"profile.{name}", "a table")
    return table


# What a workspace's own file may set, and the values that keep it narrowing: it comes
# with the repository, so it may only take away (deny, make read-only, set values).
_NARROWING = {
    "deny": "any path",
    "read": "paths inside the workspace",
    "env": "literal values",
    "network": '"none"',
    "default_deny": "true",
    "workspace_writable": "false",
    "allow_nested": "false",
    "memory": "a lower limit",
    "pids": "a lower limit",
    "cpus": "a lower limit",
    "tmp_size": "a lower limit",
    "idle_timeout": "a shorter timeout",
    "require_namespaces": "true",
    "review": "true",
}
_FLAG_FOR = {
    "write": "--write PATH",
    "read": "--read PATH",
    "preset": "--preset NAME",
    "presets": "--preset NAME",
    "env_pass": "--pass-env NAME",
    "network": "--network MODE",
    "allow_host": "--allow-host HOST",
    "allow_hosts": "--allow-host HOST",
    "resolve": "--resolve NAME=ADDR",
    "default_deny": "--no-default-deny",
    "workspace_writable": "(leave out --read-only-workspace)",
    "allow_nested": "(your own config only)",
    "workspace": "--workspace DIR",
    "workspace_at": "(your own config or the API)",
    "workspace_link": "(your own config or the API)",
    "image": "--image NAME",
    "disk": "--disk SIZE",
    "from_snapshot": "--from-snapshot ID",
    "secret": "--secret NAME=ENVVAR@HOST",
    "secrets": "--secret NAME=ENVVAR@HOST",
    "allow_http": "--allow-http 'METHOD HOST/PATH'",
    "require_namespaces": "--require-namespaces",
    "review": "--review",
    "ask_timeout": "(your own config or the API)",
    "snapshot_budget": "(your own config only)",
    "trail_budget": "(your own config only)",
}


def _check_narrowing(table: Mapping[str, Any], spec: PolicySpec, workspace: Path, where: str) -> None:
    """Refuse every key or value of a workspace file that would widen the policy."""

    def refuse(key: str, value: object, why: str) -> ConfigError:
        return ConfigError(
            f"{where}: {key} = {value!r} {why}",
            operation="config",
            path=where.split(" [", 1)[0],
            hint="a repository's own warren.toml may only narrow the sandbox "
            f"({', '.join(f'{k}: {v}' for k, v in _NARROWING.items())}); "
            f"put this in your ~/.config/warren/config.toml or pass {_FLAG_FOR.get(key, 'the flag')}",
        )

    for key, value in table.items():
        if key == "profile":
            continue
        if key not in _NARROWING:
            raise refuse(key, value, "would widen the policy")
        if key == "network" and value != "none":
            raise refuse(key, value, "would open the network")
        if key == "default_deny" and value is not True:
            raise refuse(key, value, "would reveal credentials in your home")
        if key == "workspace_writable" and value is not False:
            raise refuse(key, value, "would make the workspace writable")
        if key == "allow_nested" and value is not False:
            raise refuse(key, value, "would allow nested sandboxes")
        if key == "require_namespaces" and value is not True:
            raise refuse(key, value, "would allow the degraded mode")
        if key == "review" and value is not True:
            raise refuse(key, value, "would let the sandbox write the workspace directly")
    for p in spec.read:
        path = Path(p)
        if path != workspace and workspace not in path.parents:
            raise refuse("read", p, "is outside the workspace")


def load_spec(
    workspace: Path,
    profile: str | None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    user_config: Path | None = None,
) -> PolicySpec:
    """The layered spec from config files (without command-line flags)."""
    env, home = env_and_home(env, home)
    user_path = user_config or user_config_path(env, home)
    ws_path = workspace / WORKSPACE_FILE
    user = _load(user_path)
    ws = _load(ws_path, follow=False)

    inside = as_path(_lookups.realpath(workspace))
    spec = _spec_from_table(
        {k: v for k, v in user.items() if k not in USER_ONLY}, str(user_path), home, workspace=inside
    )
    found = False
    for data, path in ((user, user_path), (ws, ws_path)):
        if data is ws:
            ws_spec = _spec_from_table(ws, str(ws_path), home, workspace, inside)
            _check_narrowing(ws, ws_spec, workspace, str(ws_path))
            spec = spec.merged(_only_lower(ws_spec, spec, str(ws_path)))
        if profile is None:
            continue
        table = _profile(data, profile, str(path))
        if table is None:
            continue
        found = True
        where = f"{path} [profile.{profile}]"
        prof = _spec_from_table(table, where, home, workspace if data is ws else None, inside)
        if data is ws:
            _check_narrowing(table, prof, workspace, where)
            prof = _only_lower(prof, spec, where)
        spec = spec.merged(prof)
    if profile is not None and not found:
        raise ConfigError(
            f"profile {profile!r} is not defined",
            operation="config",
            hint=f"define [profile.{profile}] in {user_path} or {ws_path}",
        )
    return spec


def profile_names(
    workspace: Path | None = None, env: Mapping[str, str] | None = None, home: Path | None = None
) -> list[str]:
    """Every ``[profile.NAME]`` of the user config and (given a workspace) the
    workspace's file, in name order."""
    env, home = env_and_home(env, home)
    names: set[str] = set()
    files = [(user_config_path(env, home), True)]
    if workspace is not None:
        files.append((workspace / WORKSPACE_FILE, False))
    for path, follow in files:
        profiles = _load(path, follow).get("profile", {})
        if isinstance(profiles, dict):
            names.update(str(n) for n, t in profiles.items() if isinstance(t, dict))
    return sorted(names)


def _only_lower(ws: PolicySpec, below: PolicySpec, where: str) -> PolicySpec:
    """A workspace file's limits, each no higher than what it would otherwise be (the
    layers below it, else the default): a repository may tighten, never loosen."""
    given = ws.limits(where)
    if given == _limits.Limits():
        return ws
    ceiling = _limits.lowered(below.limits("your config"), _limits.defaults(_limits.mem_total()))
    low = _limits.lowered(given, ceiling)
    return replace(
        ws,
        memory=low.memory if ws.memory is not None else None,
        pids=low.pids if ws.pids is not None else None,
        cpus=low.cpus if ws.cpus is not None else None,
        tmp_size=low.tmp_size if ws.tmp_size is not None else None,
        idle_timeout=low.idle_timeout if ws.idle_timeout is not None else None,
    )


def snapshot_budget(total: int, env: Mapping[str, str], home: Path) -> tuple[int | None, str]:
    """The user's snapshot budget on a state disk of ``total`` bytes, and how it was set
    (for messages): ``snapshot_budget`` of the user's config, a size (``20G``), a share
    of the disk (``25%``) or ``none``; by default DEFAULT_SNAPSHOT_BUDGET. None: no
    budget (the disk's reserve still holds)."""
    path = user_config_path(env, home)
    given = _load(path).get("snapshot_budget")
    value = DEFAULT_SNAPSHOT_BUDGET if given is None else given
    origin = f"snapshot_budget = {value!r}" + (" (the default)" if given is None else f" in {path}")
    if _limits.is_none_word(value):
        return None, origin
    try:
        if isinstance(value, str) and value.strip().endswith("%"):
            share = float(value.strip()[:-1])
            if not 0 < share <= 100:
                raise ValueError(value)
            budget = int(total * share / 100)
            return budget, f"{origin}: {_limits.show_size(budget)} of this disk"
        return _limits.parse_size(value, "snapshot_budget"), origin
    except (ValueError, PolicyError):
        raise ConfigError(
            f"{path}: snapshot_budget = {value!r} is not a size, a share of the disk or none",
            operation="config",
            path=str(path),
            hint='write a size such as "20G", a share of the state disk such as "25%", or "none"',
        ) from None


def trail_budget(env: Mapping[str, str], home: Path) -> int:
    """The size of one generation of a sandbox's trail (two are kept): ``trail_budget``
    of the user's config, a size from 16K to 1G; by default DEFAULT_TRAIL_BUDGET."""
    path = user_config_path(env, home)
    given = _load(path).get("trail_budget")
    if given is None:
        return DEFAULT_TRAIL_BUDGET
    try:
        size = _limits.parse_size(given, "trail_budget")
    except (ValueError, PolicyError):
        size = -1
    if not 16 << 10 <= size <= 1 << 30:
        raise ConfigError(
            f"{path}: trail_budget = {given!r} is not a size from 16K to 1G",
            operation="config",
            path=str(path),
            hint='write a size such as "4M" (each sandbox keeps two such files of its trail)',
        )
    return size
