"""Pure: one reading of the XDG base directories for every path warren derives from them
(a relative or empty value ignored, as the specification says), so that the supervisor's
state, the presets' grants, the places the host runs programs from, the user's config and
the sandbox's TMPDIR agree. No sandbox runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren import statedir, xdg
from warren.doctor.evidence import tool_caches
from warren.plan.tmpdir import cache_home
from warren.policy import PolicySpec, build, hostrun
from warren.policy.config import user_config_path

RELATIVE = {name: "relative/dir" for name in xdg.DEFAULTS}


@pytest.mark.parametrize("name", sorted(xdg.DEFAULTS))
@pytest.mark.parametrize("value", ["", "relative/dir", "./dir", "~/dir"])
def test_a_base_that_is_not_absolute_is_the_default_under_home(name: str, value: str) -> None:
    assert xdg.base({name: value}, name, "/home/u") == f"/home/u/{xdg.DEFAULTS[name]}"


def test_an_absolute_base_is_taken_normalized() -> None:
    assert xdg.base({"XDG_CACHE_HOME": "/srv//c/./x/"}, "XDG_CACHE_HOME", "/home/u") == "/srv/c/x"


def test_relative_bases_give_the_defaults_everywhere_they_are_read(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), **RELATIVE}
    assert statedir.location(env) == f"{tmp_path}/.local/state/warren"
    assert statedir.data_home(env) == f"{tmp_path}/.local/share/warren"
    assert user_config_path(env, tmp_path) == tmp_path / ".config" / "warren" / "config.toml"
    assert cache_home(env, str(tmp_path)) == f"{tmp_path}/.cache"
    places = {place.path for place in hostrun.places(env, tmp_path)}
    expected = {f"{tmp_path}/{rel}" for rel in (".local/share/uv/tools", ".local/bin", ".config/git")}
    assert expected <= places


def test_presets_grant_the_default_caches_under_a_relative_xdg_base(tmp_path: Path) -> None:
    """A relative XDG_CACHE_HOME once failed the uv preset, naming UV_CACHE_DIR (which
    the caller never set) as the relative path."""
    ws = tmp_path / "proj"
    ws.mkdir()
    spec = PolicySpec(workspace=str(ws), presets=["uv", "pip"])
    policy = build(spec, env={"HOME": str(tmp_path), **RELATIVE}, home=tmp_path)
    paths = {r.path for r in policy.writable}
    assert {tmp_path / ".cache" / "uv", tmp_path / ".cache" / "pip"} <= paths
    tools = tmp_path / ".local" / "share" / "uv" / "tools"
    assert policy.private_homes == (("UV_TOOL_DIR", tools, "uv-tools"),)
    # The private home stands in for the very place the host runs uv's tools from.
    host_runs = hostrun.places({"HOME": str(tmp_path), **RELATIVE}, tmp_path)
    assert str(tools) in {place.path for place in host_runs}


def test_the_doctor_looks_for_each_tools_cache_where_the_tool_does(tmp_path: Path) -> None:
    """uv ignores a relative XDG_CACHE_HOME (`uv cache dir` says ~/.cache/uv); pip takes
    it relative to its working directory (`pip cache dir`)."""
    caches = dict(tool_caches({"XDG_CACHE_HOME": "relative/dir"}, str(tmp_path)))
    assert caches["uv"] == f"{tmp_path}/.cache/uv"
    assert caches["pip"] == str(Path.cwd() / "relative" / "dir" / "pip")
