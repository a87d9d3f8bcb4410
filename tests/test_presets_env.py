"""Pure: what each preset makes writable and passes, credentials kept out (no sandbox
runs). Where the sandbox's TMPDIR goes: tests/test_tmpdir.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from warren.cli.hints import installs_programs
from warren.plan import CallerFacts, HostFacts
from warren.plan import make_plan as _make_plan
from warren.plan.env import strip_url_credentials
from warren.plan.facts import parse_mountinfo
from warren.policy import PolicySpec, build
from warren.policy import presets as _presets

ROOT_ONLY = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"


def _build(tmp_path: Path, presets: list[str], env: dict[str, str], **kw: object) -> object:
    ws = tmp_path / "proj"
    ws.mkdir(exist_ok=True)
    return build(
        PolicySpec(workspace=str(ws), presets=presets, **kw),  # type: ignore[arg-type]
        env={"HOME": str(tmp_path), **env},
        home=tmp_path,
    )


def test_python_preset_makes_uv_tool_and_python_dirs_writable(tmp_path: Path) -> None:
    p = _build(tmp_path, ["python"], {})
    sources = {str(r.path): r.source for r in p.writable}  # type: ignore[attr-defined]
    data = tmp_path / ".local" / "share" / "uv"
    assert sources[str(data / "tools")] == "preset:uv"
    assert sources[str(data / "python")] == "preset:uv"
    assert sources[str(tmp_path / ".cache" / "pre-commit")] == "preset:pre-commit"
    assert sources[str(tmp_path / ".local" / "share" / "pipx")] == "preset:pipx"
    assert sources[str(tmp_path / ".local" / "state" / "pipx" / "log")] == "preset:pipx"
    # Programs for your PATH and uv's credential store: never writable by a preset.
    assert not any(path.startswith(str(tmp_path / ".local" / "bin")) for path in sources)
    assert str(data) not in sources and str(data / "credentials") not in sources


def test_uv_dirs_follow_their_variables_and_xdg(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "UV_PYTHON_INSTALL_DIR": str(tmp_path / "py")}
    p = _build(tmp_path, ["uv"], env)
    paths = {str(r.path) for r in p.writable}  # type: ignore[attr-defined]
    assert str(tmp_path / "xdg" / "uv" / "tools") in paths
    assert str(tmp_path / "py") in paths
    assert p.passes_env("XDG_DATA_HOME")  # type: ignore[attr-defined]


def test_node_preset_makes_npm_cache_and_corepack_home_writable(tmp_path: Path) -> None:
    p = _build(tmp_path, ["node"], {})
    paths = {str(r.path) for r in p.writable}  # type: ignore[attr-defined]
    assert {str(tmp_path / ".npm"), str(tmp_path / ".cache" / "node" / "corepack")} <= paths


@pytest.mark.parametrize(
    ("preset", "name"),
    [
        ("pip", "PIP_FIND_LINKS"),
        ("pip", "PIP_INDEX_URL"),
        ("pip", "PIP_EXTRA_INDEX_URL"),
        ("uv", "UV_INDEX"),
        ("uv", "UV_INDEX_URL"),
        ("uv", "UV_EXTRA_INDEX_URL"),
        ("uv", "UV_TOOL_DIR"),
        ("uv", "UV_PYTHON_INSTALL_DIR"),
        ("npm", "npm_config_registry"),
        ("npm", "COREPACK_NPM_REGISTRY"),
        ("npm", "npm_config_@corp:registry"),
        ("cargo", "CARGO_REGISTRIES_MY_CORP_INDEX"),
        ("cargo", "CARGO_REGISTRY_DEFAULT"),
        ("cargo", "CARGO_SOURCE_CRATES_IO_REPLACE_WITH"),
        ("go", "GOPROXY"),
        ("go", "GOPRIVATE"),
    ],
)
def test_a_preset_passes_its_tools_settings(tmp_path: Path, preset: str, name: str) -> None:
    assert _build(tmp_path, [preset], {}).passes_env(name)  # type: ignore[attr-defined]
    assert not _build(tmp_path, [], {}).passes_env(name)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "name",
    [
        "CARGO_REGISTRIES_MY_CORP_TOKEN",
        "CARGO_REGISTRY_TOKEN",
        "UV_INDEX_PRIVATE_PASSWORD",
        "NPM_TOKEN",
        "npm_config__authToken",
        "PIP_SECRET_THING",
        "GITHUB_TOKEN",
        "npm_config__auth",
        "BASIC_AUTH",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "OPENAI_API_KEY",
        "GEMINI_API_KEY",
        "GOOGLE_API_KEY",
        "AWS_ACCESS_KEY_ID",
    ],
)
def test_no_preset_passes_a_credential_unless_named_explicitly(tmp_path: Path, name: str) -> None:
    every = _presets.names()
    assert not _build(tmp_path, every, {}).passes_env(name)  # type: ignore[attr-defined]
    assert _build(tmp_path, every, {}, env_pass=[name]).passes_env(name)  # type: ignore[attr-defined]


def test_npms_per_registry_token_is_not_a_scope_registry(tmp_path: Path) -> None:
    p = _build(tmp_path, ["node"], {})
    assert not p.passes_env("npm_config_//registry.example/:_authToken")  # type: ignore[attr-defined]
    assert not p.passes_env("npm_config_@corp:_authToken")  # type: ignore[attr-defined]


def test_author_is_not_auth() -> None:
    assert not _presets.is_credential_name("GIT_AUTHOR_NAME")


def test_every_presets_own_list_is_free_of_credential_names() -> None:
    for name in _presets.names():
        for var in _presets.get(name).env_pass:
            assert not _presets.is_credential_name(var), (name, var)


def test_url_credentials_are_stripped_from_every_url_in_a_value() -> None:
    value = "https://u:p%40ss@idx.example/simple http://tok@b.example:8080/s,file:///x"
    assert strip_url_credentials(value) == "https://idx.example/simple http://b.example:8080/s,file:///x"
    assert strip_url_credentials("name=https://a:b@h/simple") == "name=https://h/simple"
    assert strip_url_credentials("/opt/wheels") == "/opt/wheels"


def _plan(tmp_path: Path, mountinfo: str, env: dict[str, str], **kw: object) -> object:
    p = _build(tmp_path, ["pip"], env, **kw)
    ws = str(tmp_path / "proj")
    host = HostFacts(parse_mountinfo(mountinfo), 7, 40, True, writable_dirs=frozenset({ws}))
    caller = CallerFacts(1001, 1001, str(tmp_path), {"HOME": str(tmp_path), **env}, str(tmp_path / "proj"))
    return _make_plan(p, host, caller, scratch_id="abc")  # type: ignore[arg-type]


def test_preset_index_url_loses_its_credentials_with_a_warning(tmp_path: Path) -> None:
    env = {"PIP_INDEX_URL": "https://me:hunter2@idx.example/simple"}
    plan = _plan(tmp_path, ROOT_ONLY, env)
    assert plan.env["PIP_INDEX_URL"] == "https://idx.example/simple"  # type: ignore[attr-defined]
    assert any("PIP_INDEX_URL" in w and "--pass-env" in w for w in plan.warnings)  # type: ignore[attr-defined]
    kept = _plan(tmp_path, ROOT_ONLY, env, env_pass=["PIP_INDEX_URL"])
    assert kept.env["PIP_INDEX_URL"] == env["PIP_INDEX_URL"]  # type: ignore[attr-defined]
    assert not any("PIP_INDEX_URL" in w for w in kept.warnings)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("argv", "where"),
    [
        (["uv", "tool", "install", "ruff"], "~/.local/bin"),
        (["/usr/bin/pip3", "install", "--user", "x"], "~/.local"),
        (["python3", "-m", "pip", "install", "--user", "x"], "~/.local"),
        (["npm", "install", "-g", "x"], "global prefix"),
        (["cargo", "install", "--path", "."], "~/.cargo/bin"),
        (["go", "install", "example.org/x@latest"], "~/go/bin"),
        (["rustup", "toolchain", "install", "stable"], "~/.rustup"),
    ],
)
def test_a_failed_install_of_programs_names_the_directory(argv: list[str], where: str) -> None:
    hint = installs_programs(argv)
    assert hint is not None and where in hint and "--write" in hint


@pytest.mark.parametrize(
    "argv", [["uvx", "ruff"], ["uv", "tool", "run", "x"], ["pip", "install", "x"], ["npm", "install", "x"]]
)
def test_commands_that_install_nothing_for_path_get_no_such_hint(argv: list[str]) -> None:
    assert installs_programs(argv) is None


AGENTS = {
    "claude-code": ("CLAUDE_CONFIG_DIR", ("~/.claude", "~/.claude.json"), "api.anthropic.com"),
    "codex": ("CODEX_HOME", ("~/.codex",), "api.openai.com"),
    "gemini-cli": ("GEMINI_CLI_HOME", ("~/.gemini",), "generativelanguage.googleapis.com"),
}


@pytest.mark.parametrize("agent", sorted(AGENTS))
def test_an_agent_preset_gives_the_agent_a_home_of_its_own_and_keeps_the_users_denied(
    tmp_path: Path, agent: str
) -> None:
    var, users, host = AGENTS[agent]
    # the caller's own variable names the user's config: ignored, never passed
    p = _build(tmp_path, [agent], {var: str(tmp_path / ".claude")}, network="allow")
    own = tmp_path / ".local" / "share" / "warren" / "agents" / agent
    assert {str(r.path): r.source for r in p.writable}[str(own)] == f"preset:{agent}"  # type: ignore[attr-defined]
    assert p.env[var] == str(own)  # type: ignore[attr-defined]
    assert not p.passes_env(var)  # type: ignore[attr-defined]
    denied = {str(r.path) for r in p.denied}  # type: ignore[attr-defined]
    for place in users:
        path = str(tmp_path / place[2:])
        assert path in denied
        assert not any(str(r.path) == path or path.startswith(f"{r.path}/") for r in p.writable)  # type: ignore[attr-defined]
    assert host in p.allowed_hosts  # type: ignore[attr-defined]
    assert "github.com" not in p.allowed_hosts  # type: ignore[attr-defined]


def test_an_agents_home_follows_xdg_data_home_and_an_explicit_env_wins(tmp_path: Path) -> None:
    p = _build(tmp_path, ["claude-code"], {"XDG_DATA_HOME": str(tmp_path / "xdg")})
    assert p.env["CLAUDE_CONFIG_DIR"] == str(tmp_path / "xdg" / "warren" / "agents" / "claude-code")  # type: ignore[attr-defined]
    mine = str(tmp_path / "mine")
    ws = tmp_path / "proj"
    ws.mkdir(exist_ok=True)
    p = build(
        PolicySpec(workspace=str(ws), presets=["claude-code"], env={"CLAUDE_CONFIG_DIR": mine}),
        env={"HOME": str(tmp_path)},
        home=tmp_path,
    )
    assert p.env["CLAUDE_CONFIG_DIR"] == mine  # type: ignore[attr-defined]


def test_an_agent_preset_passes_its_settings_but_not_its_key(tmp_path: Path) -> None:
    p = _build(tmp_path, ["claude-code", "codex", "gemini-cli"], {})
    for name in (
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_MODEL",
        "OPENAI_ORGANIZATION",
        "GEMINI_MODEL",
        "GIT_AUTHOR_NAME",
    ):
        assert p.passes_env(name), name  # type: ignore[attr-defined]
    for name in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY"):
        assert not p.passes_env(name), name  # type: ignore[attr-defined]


def test_warren_presets_shows_each_agents_own_home(tmp_path: Path) -> None:
    listed = run_cli(["presets"], cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    for agent, (var, _, _) in AGENTS.items():
        assert f"its own home: $XDG_DATA_HOME/warren/agents/{agent} (${var})" in listed.stdout
