"""Pure stages: policy validation, config layering and the planner (no sandbox runs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from warren.errors import ConfigError, HostError, PolicyError
from warren.plan import CallerFacts, HostFacts, Plan
from warren.plan import make_plan as _make_plan
from warren.plan.facts import MountEntry, parse_mountinfo
from warren.plan.landlock import REFER as LL_REFER
from warren.policy import Policy, PolicySpec, Root, build, config

MOUNTINFO = """\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
23 22 0:21 / /proc rw - proc proc rw
24 22 0:40 / /data rw - xfs /dev/vdb rw
25 22 0:41 / /home/u/mnt\\040space rw - tmpfs tmpfs rw
"""


CALLER = CallerFacts(
    uid=1001,
    gid=1001,
    home="/home/u",
    env={"PATH": "/usr/bin:/bin", "HOME": "/home/u", "SECRET_TOKEN": "x", "LC_ALL": "C"},
    cwd="/home/u/proj",
)


def make_plan(p: Policy, host: HostFacts, env: dict[str, str] | None = None) -> Plan:
    caller = CALLER if env is None else CallerFacts(1001, 1001, "/home/u", env, "/home/u/proj")
    return _make_plan(p, host, caller)


def facts(**over: object) -> HostFacts:
    base: dict[str, object] = dict(
        mounts=parse_mountinfo(MOUNTINFO),
        landlock_abi=7,
        cap_last_cap=40,
        machine_supported=True,
        path_kinds={"/run": "dir", "/var/run": "symlink", "/dev/null": "other", "/home/u/.ssh": "dir"},
    )
    base.update(over)
    return HostFacts(**base)  # type: ignore[arg-type]


def policy(tmp_path: Path, writable: list[str], **kw: object) -> Policy:
    """A policy over real directories under tmp_path, named as if under /home/u."""
    ws = tmp_path / "proj"
    ws.mkdir(exist_ok=True)
    return Policy(
        workspace=ws,
        writable=tuple(Root(Path(p), "--write", create=True) for p in writable),
        **kw,  # type: ignore[arg-type]
    )


def test_mountinfo_parsing_unescapes_spaces() -> None:
    entries = parse_mountinfo(MOUNTINFO)
    assert entries[-1].mount_point == "/home/u/mnt space"
    assert isinstance(entries[0], MountEntry) and entries[0].fstype == "ext4"


def test_roots_on_one_host_mount_share_one_bind(tmp_path: Path) -> None:
    p = policy(tmp_path, ["/home/u/proj", "/home/u/.cache/uv"])
    plan = make_plan(p, facts())
    binds = [op for op in plan.mounts if op.kind.value == "bind_rw"]
    assert [b.target for b in binds] == ["/home/u"]
    masks = {op.target: op.keep for op in plan.mounts if op.kind.value == "mask"}
    assert masks == {"/home/u": (".cache", "proj"), "/home/u/.cache": ("uv",)}
    rules = {r.path: r.access for r in plan.landlock.rules} if plan.landlock else {}
    assert rules["/home/u/proj"] & LL_REFER and rules["/home/u/.cache/uv"] & LL_REFER
    assert "/home/u" not in rules


def test_roots_on_different_mounts_get_separate_binds(tmp_path: Path) -> None:
    p = policy(tmp_path, ["/home/u/proj", "/data/cache"])
    plan = make_plan(p, facts())
    assert sorted(op.target for op in plan.mounts if op.kind.value == "bind_rw") == [
        "/data/cache",
        "/home/u/proj",
    ]


def test_roots_that_share_only_a_system_directory_are_split_and_said_so(tmp_path: Path) -> None:
    """A workspace in /srv and a cache in the home: one filesystem, but the directory
    they share is /, never bound writable, so they are two mounts inside (EXDEV between
    them): the warning says so at launch. Beside the caches, nothing is said."""
    p = policy(tmp_path, ["/srv/proj", "/home/u/.cache/uv"])
    plan = make_plan(p, facts())
    assert sorted(op.target for op in plan.mounts if op.kind.value == "bind_rw") == [
        "/home/u/.cache/uv",
        "/srv/proj",
    ]
    (warning,) = [w for w in plan.warnings if "EXDEV" in w]
    assert "/srv/proj" in warning and "/home/u/.cache/uv" in warning and "below / " in warning
    together = make_plan(policy(tmp_path, ["/home/u/proj", "/home/u/.cache/uv"]), facts())
    assert not any("EXDEV" in w for w in together.warnings)
    apart = make_plan(policy(tmp_path, ["/home/u/proj", "/data/cache"]), facts())
    assert not any("EXDEV" in w for w in apart.warnings)  # two filesystems: EXDEV on the host too


def test_the_split_warning_names_the_users_directories_not_warrens_scratch(tmp_path: Path) -> None:
    """warren's scratch directory (``.warren-tmp-*``) is a writable root like any other,
    but naming it in the warning confuses: only the user's directories are named, and a
    split that only separates the scratch from the workspace says nothing."""
    scratch = "/srv/.warren-tmp-0123abcd"
    plan = make_plan(policy(tmp_path, ["/srv/proj", "/home/u/.cache/uv", scratch]), facts())
    (warning,) = [w for w in plan.warnings if "EXDEV" in w]
    assert "/srv/proj" in warning and "/home/u/.cache/uv" in warning and ".warren-tmp" not in warning
    assert warning.count("\n") == 0 and len(warning) < 240, warning
    alone = make_plan(policy(tmp_path, ["/srv/proj", scratch]), facts())
    assert sorted(op.target for op in alone.mounts if op.kind.value == "bind_rw") == [scratch, "/srv/proj"]
    assert not any("EXDEV" in w for w in alone.warnings), alone.warnings


def test_nested_roots_collapse_into_the_outer_one(tmp_path: Path) -> None:
    p = policy(tmp_path, ["/home/u/proj", "/home/u/proj/sub"])
    plan = make_plan(p, facts())
    assert [op.target for op in plan.mounts if op.kind.value == "bind_rw"] == ["/home/u/proj"]
    assert not [op for op in plan.mounts if op.kind.value == "mask"]


def test_roots_under_tmp_are_grafted_one_by_one_and_tmp_stays_writable(tmp_path: Path) -> None:
    p = policy(tmp_path, ["/tmp/x/ws", "/tmp/x/cache"])
    plan = make_plan(p, facts())
    kinds = [(op.kind.value, op.target) for op in plan.mounts]
    # Each root is its own graft: no host directory (/tmp/x) lies between a bind and its
    # root, so the Landlock rule that keeps /tmp writable covers nothing of the host's.
    assert kinds.index(("tmpfs", "/tmp")) < kinds.index(("bind_rw", "/tmp/x/cache"))
    assert ("bind_rw", "/tmp/x") not in kinds and ("bind_rw", "/tmp/x/ws") in kinds
    assert not [op for op in plan.mounts if op.kind.value == "mask"]
    assert plan.landlock is not None
    assert "/tmp" in [r.path for r in plan.landlock.rules]
    assert plan.env["TMPDIR"] == "/tmp"
    assert any("EXDEV" in n and "/tmp/x/ws" in n for n in plan.notes), plan.notes
    assert not any("EXDEV" in w for w in plan.warnings)  # noted in the plan, not at every run


def test_single_root_under_tmp_keeps_tmp_writable(tmp_path: Path) -> None:
    plan = make_plan(policy(tmp_path, ["/tmp/ws"]), facts())
    assert plan.landlock is not None
    assert "/tmp" in [r.path for r in plan.landlock.rules]
    assert plan.env["TMPDIR"] == "/tmp"


def test_landlock_below_abi_2_falls_back_with_a_warning(tmp_path: Path) -> None:
    p = policy(tmp_path, ["/home/u/proj", "/home/u/.cache/uv"])
    plan = make_plan(p, facts(landlock_abi=1))
    assert plan.landlock is None
    assert sorted(op.target for op in plan.mounts if op.kind.value == "bind_rw") == [
        "/home/u/.cache/uv",
        "/home/u/proj",
    ]
    assert any("EXDEV" in w for w in plan.warnings)


def test_hidden_dirs_env_and_identity(tmp_path: Path) -> None:
    plan = make_plan(
        policy(tmp_path, []),
        facts(),
        env={"XDG_RUNTIME_DIR": "/run/user/1001", "SECRET_TOKEN": "x", "LC_ALL": "C"},
    )
    hidden = [op.target for op in plan.mounts if op.kind.value == "tmpfs" and op.readonly]
    assert hidden == ["/run"]  # /var/run is a symlink to it; XDG_RUNTIME_DIR lies below it
    assert "SECRET_TOKEN" not in plan.env and plan.env["LC_ALL"] == "C"
    assert plan.uid_map == "1001 1001 1"


def test_denied_dir_and_file_get_masks(tmp_path: Path) -> None:
    ws = tmp_path / "proj"
    ws.mkdir()
    p = Policy(workspace=ws, denied=(Root(Path("/home/u/.ssh"), "default"),))
    plan = make_plan(p, facts())
    deny = [op for op in plan.mounts if op.target == "/home/u/.ssh"]
    assert deny and deny[0].kind.value == "tmpfs" and deny[0].readonly


def test_unsupported_machine_is_a_host_error(tmp_path: Path) -> None:
    with pytest.raises(HostError):
        make_plan(policy(tmp_path, []), facts(machine_supported=False))


def test_policy_rejects_missing_and_relative_paths(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="does not exist"):
        build(PolicySpec(workspace=str(tmp_path), write=[str(tmp_path / "nope")]))
    with pytest.raises(PolicyError, match="workspace does not exist"):
        build(PolicySpec(workspace=str(tmp_path / "missing")))
    with pytest.raises(PolicyError, match="must be absolute"):
        Policy(workspace=tmp_path, writable=(Root(Path("rel"), "--write"),))


def test_a_policy_made_by_hand_is_refused_by_name_not_ignored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Policy made by hand, not by ``build``, has no spec for the supervisor to resolve:
    a sandbox made from it used to start on the caller's directory, its workspace dropped.
    It is refused before any supervisor is asked (none runs here: a state directory of
    its own, empty), and a workspace given as a string is taken as a path."""
    from warren import Sandbox, run

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    ws = tmp_path / "proj"
    ws.mkdir()
    made = Policy(workspace=str(ws))  # type: ignore[arg-type]
    assert made.workspace == ws
    for start in (lambda: Sandbox.create(made), lambda: run(["true"], made)):
        with pytest.raises(PolicyError, match="made by hand") as e:
            start()
        assert e.value.path == str(ws) and "PolicySpec(workspace=" in (e.value.hint or "")
    assert not (tmp_path / "state").exists()
    # One built from a spec carries the spec it came from.
    built = build(PolicySpec(workspace=str(ws)))
    from warren.client.checks import spec_of

    assert spec_of(built).workspace == str(ws)
    with pytest.raises(PolicyError, match="workspace must be a path, not int"):
        Policy(workspace=3)  # type: ignore[arg-type]
    with pytest.raises(PolicyError, match=r"writable entries must be Root\(path, source\), not str") as e:
        Policy(workspace=ws, writable=("/tmp",))  # type: ignore[arg-type]
    assert "PolicySpec(write=" in (e.value.hint or "")


def test_writable_inside_denied_is_rejected(tmp_path: Path) -> None:
    (tmp_path / "d" / "inner").mkdir(parents=True)
    with pytest.raises(PolicyError, match="inside denied path"):
        build(
            PolicySpec(
                workspace=str(tmp_path), deny=[str(tmp_path / "d")], write=[str(tmp_path / "d" / "inner")]
            )
        )


def test_writable_in_proc_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot be writable"):
        build(PolicySpec(workspace=str(tmp_path), write=["/proc/self"]))


def test_preset_python_adds_uv_and_pip_caches(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uvc")}
    (tmp_path / "proj").mkdir()
    p = build(PolicySpec(workspace=str(tmp_path / "proj"), presets=["python"]), env=env, home=tmp_path)
    sources = {str(r.path): r.source for r in p.writable}
    assert sources[str(tmp_path / "uvc")] == "preset:uv"
    assert sources[str(tmp_path / ".cache" / "pip")] == "preset:pip"
    assert p.passes_env("UV_CACHE_DIR")


def test_unknown_preset_is_named(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="unknown preset 'ruby'"):
        build(PolicySpec(workspace=str(tmp_path), presets=["ruby"]))


def test_cargo_preset_never_makes_cargo_bin_writable(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    p = build(
        PolicySpec(workspace=str(tmp_path / "proj"), presets=["cargo"]),
        env={"HOME": str(tmp_path)},
        home=tmp_path,
    )
    paths = {str(r.path) for r in p.writable}
    assert str(tmp_path / ".cargo" / "registry") in paths
    assert not any(path.endswith("/.cargo") or "/bin" in path for path in paths)


def test_config_layers_and_profiles(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "build").mkdir(parents=True)
    user = tmp_path / "user.toml"
    user.write_text(
        f'preset = ["git"]\nwrite = ["{ws}/build"]\n[env]\nA = "user"\n[profile.ci]\nenv_pass = ["CI"]\n'
    )
    (ws / "warren.toml").write_text('deny = ["build/secret"]\n[profile.ci]\nenv = { A = "ci" }\n')
    (ws / "build" / "secret").write_text("x")
    spec = config.load_spec(ws, "ci", env={}, home=tmp_path, user_config=user)
    assert spec.presets == ["git"] and spec.env == {"A": "ci"} and spec.env_pass == ["CI"]
    assert spec.write == [str(ws / "build")] and spec.deny == [str(ws / "build" / "secret")]


def test_config_unknown_key_and_missing_profile(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text('writeable = ["/x"]\n')
    with pytest.raises(ConfigError, match="unknown key 'writeable'"):
        config.load_spec(tmp_path, None, env={}, home=tmp_path, user_config=user)
    user.write_text("")
    with pytest.raises(ConfigError, match="profile 'nope' is not defined"):
        config.load_spec(tmp_path, "nope", env={}, home=tmp_path, user_config=user)


def test_the_snapshot_budget_is_read_from_the_users_config_and_is_no_sandbox_policy(tmp_path: Path) -> None:
    user = tmp_path / "warren" / "config.toml"
    user.parent.mkdir()
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert config.snapshot_budget(1 << 30, env, tmp_path) == (
        256 << 20,
        "snapshot_budget = '25%' (the default): 256M of this disk",
    )
    user.write_text('snapshot_budget = "2G"\npreset = ["git"]\n')
    assert config.snapshot_budget(1 << 30, env, tmp_path)[0] == 2 << 30
    assert config.load_spec(tmp_path, None, env=env, home=tmp_path).presets == ["git"]
    user.write_text('snapshot_budget = "none"\n')
    assert config.snapshot_budget(1 << 30, env, tmp_path)[0] is None
    user.write_text('[profile.p]\nsnapshot_budget = "1G"\n')  # not a sandbox's: no profile has it
    with pytest.raises(ConfigError, match="unknown key 'snapshot_budget'"):
        config.load_spec(tmp_path, "p", env=env, home=tmp_path)
    (tmp_path / "warren.toml").write_text('snapshot_budget = "none"\n')  # nor the repository's
    with pytest.raises(ConfigError, match=r"warren\.toml: unknown key 'snapshot_budget'"):
        config.load_spec(tmp_path, None, env={}, home=tmp_path, user_config=tmp_path / "u.toml")


def test_config_relative_path_is_an_error(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text('write = ["cache"]\n')
    with pytest.raises(PolicyError, match=r"user\.toml: write: path must be absolute"):
        config.load_spec(tmp_path, None, env={}, home=tmp_path, user_config=user)


def test_workspace_file_cannot_widen_beyond_the_workspace(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "warren.toml").write_text('read = ["~/"]\n')
    with pytest.raises(ConfigError, match="outside the workspace"):
        config.load_spec(ws, None, env={}, home=tmp_path, user_config=tmp_path / "none.toml")


WIDENING = {
    "write": '["sub"]',
    "preset": '["python"]',
    "env_pass": '["GITHUB_TOKEN"]',
    "network": '"allow"',
    "allow_host": '["pypi.org"]',
    "resolve": '{ "a.test" = "127.0.0.1" }',
    "default_deny": "false",
    "workspace_writable": "true",
    "allow_nested": "true",
    "allow_broad_workspace": "true",
    "workspace": '"/"',
    "read": '["/etc"]',
}


@pytest.mark.parametrize("key", sorted(WIDENING))
@pytest.mark.parametrize("in_profile", [False, True])
def test_a_workspace_file_may_only_narrow(tmp_path: Path, key: str, in_profile: bool) -> None:
    ws = tmp_path / "ws"
    (ws / "sub").mkdir(parents=True)
    line = f"{key} = {WIDENING[key]}\n"
    (ws / "warren.toml").write_text(f"[profile.p]\n{line}" if in_profile else line)
    with pytest.raises(ConfigError) as info:
        config.load_spec(
            ws, "p" if in_profile else None, env={}, home=tmp_path, user_config=tmp_path / "u.toml"
        )
    err = info.value
    assert str(ws / "warren.toml") in err.message and f"{key} =" in err.message
    assert "~/.config/warren/config.toml" in err.hint and err.exit_code == 125


def test_a_workspace_file_may_narrow(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "secrets").mkdir(parents=True)
    (ws / "warren.toml").write_text(
        'deny = ["secrets"]\nread = ["docs"]\nnetwork = "none"\ndefault_deny = true\n'
        'workspace_writable = false\nallow_nested = false\n[env]\nCI = "1"\n'
    )
    (ws / "docs").mkdir()
    spec = config.load_spec(ws, None, env={}, home=tmp_path, user_config=tmp_path / "u.toml")
    assert spec.deny == [str(ws / "secrets")] and spec.read == [str(ws / "docs")]
    assert spec.workspace_writable is False and spec.env == {"CI": "1"}


def test_the_python_spec_takes_the_keys_the_cli_config_and_http_take_and_a_string_for_one_value() -> None:
    """``PolicySpec(preset=[...])`` was a TypeError while the CLI, config and HTTP say
    ``preset``; ``PolicySpec(presets="python")`` was "unknown preset 'p'"."""

    assert PolicySpec(preset="python").presets == ["python"]
    assert PolicySpec(presets="python").presets == ["python"]
    assert PolicySpec(preset=["uv", "npm"], presets=["go"]).presets == ["go", "uv", "npm"]
    assert PolicySpec(allow_host="pypi.org", write="/tmp/x").allow_hosts == ["pypi.org"]
    assert PolicySpec(write="/tmp/x").write == ["/tmp/x"]
    assert PolicySpec(read=("/a", "/b")).read == ["/a", "/b"]  # a tuple is a list too
    with pytest.raises(ConfigError, match="'write' must be a string or a list of strings"):
        PolicySpec(write=3)  # type: ignore[arg-type]


def test_a_root_callers_writable_root_owned_by_another_uid_is_warned_about(tmp_path: Path) -> None:
    """Root's override of permissions does not cross into a sandbox (no capabilities):
    a workspace owned by uid 501 (an sdist unpacked by root) is said at launch, with the
    fix; the caller's own, or any caller's but root's, says nothing."""
    p = policy(tmp_path, ["/home/u/proj"])
    root = CallerFacts(0, 0, "/root", {"PATH": "/usr/bin:/bin", "HOME": "/root"}, "/home/u/proj")
    warned = _make_plan(p, facts(owners={"/home/u/proj": 501}), root)
    (warning,) = [w for w in warned.warnings if "uid 501" in w]
    assert "chown -R 0:0 /home/u/proj" in warning
    assert not [w for w in _make_plan(p, facts(owners={"/home/u/proj": 0}), root).warnings if "owned by" in w]
    assert not [w for w in make_plan(p, facts(owners={"/home/u/proj": 501})).warnings if "owned by" in w]


E2B = "/home/u/.local/share/warren/e2b"


def test_warren_s_e2b_homes_are_hidden_by_a_mount_from_every_other_sandbox(tmp_path: Path) -> None:
    p = policy(tmp_path, ["/home/u/proj", "/home/u/.cache/uv"])
    plan = make_plan(p, facts(e2b_homes=E2B, path_kinds={E2B: "dir"}))
    hidden = [op for op in plan.mounts if op.target == E2B]
    assert [(op.kind.value, op.mode, op.readonly) for op in hidden] == [("tmpfs", 0, True)]


def test_an_e2b_sandbox_reaches_its_own_home_on_the_caches_mount_and_nothing_else_there(
    tmp_path: Path,
) -> None:
    home = f"{E2B}/digest/e2b-1/0123abcd"
    p = policy(tmp_path, [home, "/home/u/.cache/uv"])
    # as the E2B service asks for it (the home named as if under /home/u: the policy's own
    # check that a workspace exists is not what this is about)
    for key, value in (("workspace", Path(home)), ("workspace_at", "/home/user"), ("workspace_link", True)):
        object.__setattr__(p, key, value)
    kinds = {"/home": "dir", E2B: "dir", home: "dir"}
    plan = make_plan(p, facts(e2b_homes=E2B, path_kinds=kinds))
    # one writable bind holds the home and the cache (links between them work) ...
    assert [op.target for op in plan.mounts if op.kind.value == "bind_rw"] == ["/home/u"]
    # ... no mount over the homes' directory (it would hide the home too) ...
    assert not [op for op in plan.mounts if op.target == E2B and op.kind.value == "tmpfs"]
    # ... every directory on the way down hides what else it holds; above it, read-only
    masks = {op.target: (op.keep, op.mode) for op in plan.mounts if op.kind.value == "mask"}
    assert masks[E2B] == (("digest",), 0) and masks[f"{E2B}/digest/e2b-1"] == (("0123abcd",), 0)
    assert masks["/home/u/.local/share/warren"][1] is None
    # ... Landlock grants nothing beneath it but the home (whatever is made there later)
    assert plan.landlock is not None
    read_all = plan.landlock.rules[0]
    assert read_all.path == "/" and E2B in read_all.excluding
    assert [r.path for r in plan.landlock.rules if r.path.startswith(E2B)] == [home]
    # /home/user is a link to the home, made in a shadow of /home (no mirror mount)
    shadow = [op for op in plan.mounts if op.kind.value == "shadow"]
    assert [(op.target, op.keep, op.source) for op in shadow] == [("/home", ("user",), home)]
    assert not [op for op in plan.mounts if op.kind.value == "mirror"]
    assert plan.workspace == home


def test_an_e2b_home_needs_landlock_abi_2(tmp_path: Path) -> None:
    home = f"{E2B}/digest/e2b-1/0123abcd"
    p = policy(tmp_path, [home])
    with pytest.raises(PolicyError, match="Landlock ABI >= 2"):
        make_plan(p, facts(e2b_homes=E2B, path_kinds={E2B: "dir"}, landlock_abi=1))


def test_the_default_deny_lists_system_paths_resolve_as_any_path_does(tmp_path: Path) -> None:
    """The default deny list's absolute paths take a shorter way than ``absolute`` (no
    Path built to check them, the same Path object for the same text): what it gives is
    what ``absolute`` gives, a symlink resolved, and a path it cannot take as it is (not
    normalized, too long) goes to ``absolute``."""
    from warren.policy import resolve

    real = tmp_path / "real"
    real.mkdir()
    (real / "key").write_text("k\n")
    (tmp_path / "via").symlink_to(real)
    names = (
        "/etc/shadow",
        "/etc/ssh/ssh_host_*_key",
        str(tmp_path / "via" / "key"),
        str(tmp_path / "via"),
        str(tmp_path / "missing" / "x"),
        str(tmp_path / "via" / ".." / "via" / "key"),
    )
    for raw in resolve.system_denied(names):
        parents: dict[str, str] = {}
        plain = resolve.absolute(raw, "default deny", None, tmp_path, None)
        if resolve._plain_absolute(raw):
            assert resolve.as_path(resolve.realpath(raw, parents)) == plain, raw
        else:
            assert raw.endswith("/via/key") and ".." in raw
    policy = build(PolicySpec(workspace=str(tmp_path / "real")), cwd=tmp_path, env={"HOME": str(tmp_path)})
    denied = {str(r.path) for r in policy.denied if r.source == "default"}
    assert "/etc/shadow" in denied
    assert resolve.as_path("/etc/shadow") is resolve.as_path("/etc/shadow")
    assert not resolve._plain_absolute("/a/" + "x" * 256) and not resolve._plain_absolute("//etc/x")
