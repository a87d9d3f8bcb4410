"""Policy files: ``warren.toml`` in the workspace and the user's config, with profiles.

Owns the TOML schema and the layering order. Layers, later wins (lists extend):
user config top level < user profile < workspace file top level < workspace profile
< command-line flags. A workspace file comes with the repository, so it may not
widen the sandbox beyond the workspace: its writable and readable paths must lie
inside the workspace (presets, denies and env are fine), and it may not open the
network (mode, allowed hosts, resolver entries).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .resolve import absolute
from .spec import PATH_KEYS, PolicySpec, from_mapping, type_error

WORKSPACE_FILE = "warren.toml"


def user_config_path(env: Mapping[str, str], home: Path) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(home / ".config")
    return Path(base) / "warren" / "config.toml"


def _load(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    import tomllib  # only when a file exists: keeps `warren run` start-up short

    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        return {}
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"{path}: not valid TOML: {e}",
            operation="config",
            path=str(path),
            hint="fix the syntax; see README 'Policy files'",
        ) from None
    except OSError as e:
        raise ConfigError(
            f"{path}: cannot read",
            operation="config",
            path=str(path),
            errno=e.errno,
            hint="check the file's permissions",
        ) from None


def _spec_from_table(table: Mapping[str, Any], where: str, home: Path) -> PolicySpec:
    spec = from_mapping(table, where)
    # Paths in files are absolute or ~/ (relative to what? a file has no cwd).
    for key in PATH_KEYS:
        setattr(spec, key, [str(absolute(v, f"{where}: {key}", None, home)) for v in getattr(spec, key)])
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


def _check_inside_workspace(spec: PolicySpec, workspace: Path, where: str) -> None:
    for key, paths in (("write", spec.write), ("read", spec.read)):
        for p in paths:
            path = Path(p)
            if path != workspace and workspace not in path.parents:
                raise ConfigError(
                    f"{where}: {key} = {p!r} is outside the workspace",
                    operation="config",
                    path=p,
                    hint="a workspace file may only grant paths inside the workspace; "
                    "put this in your user config or pass --write/--read",
                )
    # Network reach is a grant beyond the workspace too: only the user gives it.
    if spec.network not in (None, "none") or spec.allow_hosts or spec.resolve:
        given = (
            "network = " + repr(spec.network)
            if spec.network not in (None, "none")
            else ("allow_host" if spec.allow_hosts else "resolve")
        )
        raise ConfigError(
            f"{where}: {given} cannot be set in the workspace's own file",
            operation="config",
            hint="a workspace file may not open the network; put it in your user config "
            "or pass --network/--allow-host",
        )
    if spec.workspace is not None:
        raise ConfigError(
            f"{where}: 'workspace' cannot be set in the workspace's own file",
            operation="config",
            hint="remove the key; the file's directory is the workspace",
        )


def load_spec(
    workspace: Path,
    profile: str | None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    user_config: Path | None = None,
) -> PolicySpec:
    """The layered spec from config files (without command-line flags)."""
    env = os.environ if env is None else env
    home = home or Path(env.get("HOME") or os.path.expanduser("~"))
    user_path = user_config or user_config_path(env, home)
    ws_path = workspace / WORKSPACE_FILE
    user = _load(user_path)
    ws = _load(ws_path)

    spec = _spec_from_table(user, str(user_path), home)
    found = False
    for data, path in ((user, user_path), (ws, ws_path)):
        if data is ws:
            ws_spec = _spec_from_table(ws, str(ws_path), home)
            _check_inside_workspace(ws_spec, workspace, str(ws_path))
            spec = spec.merged(ws_spec)
        if profile is None:
            continue
        table = _profile(data, profile, str(path))
        if table is None:
            continue
        found = True
        prof = _spec_from_table(table, f"{path} [profile.{profile}]", home)
        if data is ws:
            _check_inside_workspace(prof, workspace, f"{path} [profile.{profile}]")
        spec = spec.merged(prof)
    if profile is not None and not found:
        raise ConfigError(
            f"profile {profile!r} is not defined",
            operation="config",
            hint=f"define [profile.{profile}] in {user_path} or {ws_path}",
        )
    return spec
