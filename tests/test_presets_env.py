"""Pure: what each preset makes writable and passes, credentials kept out (no sandbox
runs). Where the sandbox's TMPDIR goes: tests/test_tmpdir.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from warren.cli.hints import installs_programs
from warren.errors import PolicyError
from warren.plan import CallerFacts, HostFacts
from warren.plan import make_plan as _make_plan
from warren.plan.env import strip_url_credentials
from warren.plan.facts import parse_mountinfo
from warren.policy import PolicySpec, build, hostrun
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


def test_python_preset_grants_caches_and_no_place_the_host_runs_programs_from(tmp_path: Path) -> None:
    p = _build(tmp_path, ["python"], {})
    sources = {str(r.path): r.source for r in p.writable}  # type: ignore[attr-defined]
    assert sources[str(tmp_path / ".cache" / "uv")] == "preset:uv"
    assert sources[str(tmp_path / ".cache" / "pip")] == "preset:pip"
    data = tmp_path / ".local" / "share"
    for held in (data / "uv" / "tools", data / "uv" / "python", data / "pipx", tmp_path / ".local" / "bin"):
        assert not any(path.startswith(str(held)) for path in sources), held
    for held in (tmp_path / ".cache" / "pipx", tmp_path / ".cache" / "pre-commit"):
        assert str(held) not in sources
    assert str(data / "uv") not in sources and str(data / "uv" / "credentials") not in sources
    # uvx, pipx run and pre-commit get private homes instead of the host's.
    private = {var: (str(host), name) for var, host, name in p.private_homes}  # type: ignore[attr-defined]
    assert private == {
        "UV_TOOL_DIR": (str(data / "uv" / "tools"), "uv-tools"),
        "PIPX_HOME": (str(data / "pipx"), "pipx"),
        "PRE_COMMIT_HOME": (str(tmp_path / ".cache" / "pre-commit"), "pre-commit"),
    }


def test_uv_cache_and_private_tool_dir_follow_their_variables_and_xdg(tmp_path: Path) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "xdg"), "UV_CACHE_DIR": str(tmp_path / "c")}
    p = _build(tmp_path, ["uv"], env)
    paths = {str(r.path) for r in p.writable}  # type: ignore[attr-defined]
    assert str(tmp_path / "c") in paths and str(tmp_path / "xdg" / "uv" / "tools") not in paths
    assert p.private_homes == (("UV_TOOL_DIR", tmp_path / "xdg" / "uv" / "tools", "uv-tools"),)  # type: ignore[attr-defined]
    assert p.passes_env("XDG_DATA_HOME")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("preset", "var", "default"),
    [
        ("uv", "UV_CACHE_DIR", ".cache/uv"),
        ("pip", "PIP_CACHE_DIR", ".cache/pip"),
        ("npm", "npm_config_cache", ".npm"),
    ],
)
def test_a_cache_variable_set_for_the_sandbox_moves_the_grant(
    tmp_path: Path, preset: str, var: str, default: str
) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    private = ws / ".private-cache"

    def sandbox_env(value: str) -> object:
        spec = PolicySpec(workspace=str(ws), presets=[preset], env={var: value})
        return build(spec, env={"HOME": str(tmp_path)}, home=tmp_path)

    paths = {r.path for r in sandbox_env(str(private)).writable}  # type: ignore[attr-defined]
    assert private in paths and tmp_path / default not in paths
    assert tmp_path / default in {r.path for r in _build(tmp_path, [preset], {}).writable}  # type: ignore[attr-defined]
    with pytest.raises(PolicyError) as err:
        sandbox_env("relative/cache")
    assert var in str(err.value)


def test_node_preset_grants_npms_cache_and_not_corepacks_package_managers(tmp_path: Path) -> None:
    p = _build(tmp_path, ["node"], {})
    paths = {str(r.path) for r in p.writable}  # type: ignore[attr-defined]
    assert str(tmp_path / ".npm") in paths
    assert not any(path.startswith(str(tmp_path / ".cache" / "node")) for path in paths)


@pytest.mark.parametrize("preset", _presets.names())
def test_no_preset_reaches_a_place_the_host_runs_programs_from(tmp_path: Path, preset: str) -> None:
    p = _build(tmp_path, [preset], {})
    places = hostrun.places({}, tmp_path)
    granted = [r for r in p.writable if r.source.startswith("preset:")]  # type: ignore[attr-defined]
    assert not [(r.path, hostrun.reached(r.path, places)) for r in granted if hostrun.reached(r.path, places)]


def test_a_preset_cache_pointed_at_a_host_run_place_is_refused(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as err:
        _build(tmp_path, ["uv"], {"UV_CACHE_DIR": str(tmp_path / ".local" / "bin" / "c")})
    assert "preset:uv" in str(err.value) and "programs on your PATH" in str(err.value)
    assert "--write" in (err.value.hint or "")


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        ("~/.local/share/uv/tools", "uv tool install's tools"),
        ("~/.local/share/uv/python", "uv python install's Pythons"),
        ("~/.local/share/pipx/venvs", "pipx's venvs"),
        ("~/.cache/pipx", "pipx run's cached venvs"),
        ("~/.cache/node/corepack", "corepack's pnpm and yarn"),
        ("~/.cache/pre-commit", "pre-commit's hook environments"),
        ("~/.local/bin", "programs on your PATH"),
        ("~/.local/lib/python3.11/site-packages", "pip install --user's packages"),
        ("~/.cargo/bin", "cargo install's programs"),
        ("~/.cargo", "cargo install's programs"),
        ("~/.rustup/toolchains", "rustup's toolchains"),
        ("~/go/bin", "go install's programs"),
        ("~/.nvm", "nvm's node versions"),
        ("~/.npm-global", "npm install -g's prefix"),
        ("~/.bashrc", "startup file"),
        ("~/.config", "startup file"),
        ("~/.vimrc", "startup file"),
        ("~/.gitconfig", "git's global config"),
        ("~/.config/git", "git's global config"),
        ("~/.cargo/config.toml", "cargo's config"),
    ],
)
def test_places_the_host_runs_programs_from(tmp_path: Path, raw: str, what: str) -> None:
    root = tmp_path / raw[2:]
    assert any(what in p.what for p in hostrun.reached(root, hostrun.places({}, tmp_path)))


@pytest.mark.parametrize(
    "raw", ["~/.cache/uv", "~/.cache/pip", "~/.npm", "~/.cargo/registry", "~/go/pkg/mod", "~/src/proj"]
)
def test_caches_and_projects_are_not_places_the_host_runs_programs_from(tmp_path: Path, raw: str) -> None:
    assert hostrun.reached(tmp_path / raw[2:], hostrun.places({}, tmp_path)) == ()


def test_host_run_places_follow_the_tools_variables(tmp_path: Path) -> None:
    env = {
        "UV_TOOL_DIR": str(tmp_path / "t"),
        "PIPX_HOME": str(tmp_path / "px"),
        "COREPACK_HOME": str(tmp_path / "cp"),
        "CARGO_HOME": str(tmp_path / "cg"),
        "npm_config_prefix": str(tmp_path / "np"),
        "GOPATH": f"{tmp_path / 'gp'}:/elsewhere",
        "XDG_BIN_HOME": str(tmp_path / "b"),
    }
    paths = {p.path for p in hostrun.places(env, tmp_path)}
    expected = {"t", "px", "cp", "cg/bin", "np", "gp/bin", "b"}
    assert {str(tmp_path / e) for e in expected} <= paths


def _plan_for(tmp_path: Path, presets: list[str], write: list[str]) -> object:
    for w in write:
        (tmp_path / w).mkdir(parents=True, exist_ok=True)
    policy = _build(tmp_path, presets, {}, write=[str(tmp_path / w) for w in write])
    return _plan_of(tmp_path, policy)


def _plan_of(tmp_path: Path, policy: object) -> object:
    host = HostFacts(
        parse_mountinfo(ROOT_ONLY), 7, 40, True, writable_dirs=frozenset({str(tmp_path / "proj")})
    )
    caller = CallerFacts(1001, 1001, str(tmp_path), {"HOME": str(tmp_path)}, str(tmp_path / "proj"))
    return _make_plan(policy, host, caller, scratch_id="abc")  # type: ignore[arg-type]


def test_an_explicit_write_of_a_host_run_place_is_allowed_with_one_warning_naming_it(tmp_path: Path) -> None:
    plan = _plan_for(tmp_path, ["python"], [".local/share/uv/tools", ".cache/node/corepack"])
    lines = [w for w in plan.warnings if "the host runs programs from" in w]  # type: ignore[attr-defined]
    tools, corepack = tmp_path / ".local/share/uv/tools", tmp_path / ".cache/node/corepack"
    assert len(lines) == 2 and "\n" not in "".join(lines)
    assert lines[0].startswith(f"--write {tools}: ") and "uv tool install's tools" in lines[0]
    assert "reaches the host" in lines[0]
    assert lines[1].startswith(f"--write {corepack}: ") and "corepack" in lines[1]
    # The granted tool directory is the tool's own again: not redirected into TMPDIR.
    assert "UV_TOOL_DIR" not in plan.env and plan.env["PIPX_HOME"].endswith("/pipx")  # type: ignore[attr-defined]


def test_a_write_holding_several_places_warns_once(tmp_path: Path) -> None:
    plan = _plan_for(tmp_path, [], [".local"])
    lines = [w for w in plan.warnings if "the host runs programs from" in w]  # type: ignore[attr-defined]
    assert (
        len(lines) == 1
        and "more" in lines[0]
        and str(tmp_path / ".local" / "share" / "uv" / "tools") in lines[0]
    )


def test_presets_alone_plan_no_host_run_warning_and_private_homes_in_tmpdir(tmp_path: Path) -> None:
    plan = _plan_for(tmp_path, ["python", "node", "rust", "golang"], [])
    assert not [w for w in plan.warnings if "the host runs programs from" in w]  # type: ignore[attr-defined]
    env = plan.env  # type: ignore[attr-defined]
    assert {env["UV_TOOL_DIR"], env["PIPX_HOME"], env["PRE_COMMIT_HOME"]} == {
        f"{env['TMPDIR']}/uv-tools",
        f"{env['TMPDIR']}/pipx",
        f"{env['TMPDIR']}/pre-commit",
    }


def test_an_explicit_env_wins_over_a_private_home(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir(exist_ok=True)
    spec = PolicySpec(workspace=str(tmp_path / "proj"), presets=["uv"], env={"UV_TOOL_DIR": "/elsewhere"})
    policy = build(spec, env={"HOME": str(tmp_path)}, home=tmp_path)
    assert _plan_of(tmp_path, policy).env["UV_TOOL_DIR"] == "/elsewhere"  # type: ignore[attr-defined]


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


def test_the_degraded_mode_plans_the_same_warning_and_private_homes(tmp_path: Path) -> None:
    tools = tmp_path / ".local/share/uv/tools"
    tools.mkdir(parents=True)
    policy = _build(tmp_path, ["python"], {}, write=[str(tools)])
    host = HostFacts(
        parse_mountinfo(ROOT_ONLY),
        7,
        40,
        True,
        namespaces=("denied", 1),
        writable_dirs=frozenset({str(tools)}),
    )
    caller = CallerFacts(1001, 1001, str(tmp_path), {"HOME": str(tmp_path)}, str(tmp_path / "proj"))
    plan = _make_plan(policy, host, caller, scratch_id="abc")  # type: ignore[arg-type]
    assert not plan.namespaces  # type: ignore[attr-defined]
    lines = [w for w in plan.warnings if "the host runs programs from" in w]
    assert len(lines) == 1 and lines[0].startswith(f"--write {tools}: ")
    assert "UV_TOOL_DIR" not in plan.env and plan.env["PIPX_HOME"] == f"{plan.env['TMPDIR']}/pipx"


def test_a_place_reached_through_a_symlink_is_warned_about(tmp_path: Path) -> None:
    (tmp_path / "mybin").mkdir()
    (tmp_path / ".local").mkdir()
    (tmp_path / ".local" / "bin").symlink_to(tmp_path / "mybin")
    plan = _plan_for(tmp_path, [], ["mybin"])
    lines = [w for w in plan.warnings if "the host runs programs from" in w]  # type: ignore[attr-defined]
    assert len(lines) == 1 and f"{tmp_path / 'mybin'} (programs on your PATH)" in lines[0], lines
