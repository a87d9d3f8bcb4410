"""The command line's contract and the defects the single launch path fixed, each
pinned: exit codes, arguments after NAME, names, rm -f, --json, cp of directories,
preset caches created on create, the plan's cwd, the ancestor guard for long-lived
sandboxes, the fallback when no supervisor can run, API parity."""

from __future__ import annotations

import inspect
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import warren
from conftest import Layout, module_state, run_cli
from warren.client.aio import AsyncSandbox
from warren.client.sandbox import Sandbox
from warren.policy import PolicySpec


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One private supervisor for the module's tests, as a user's serves all of theirs."""
    yield from module_state(tmp_path_factory)


pytestmark = pytest.mark.usefixtures("no_sandbox_left")


def cli(ws: Path, *args: str, stdin: str | None = None) -> tuple[int, str, str]:
    r = run_cli(list(args), cwd=ws, stdin=stdin)
    return r.returncode, r.stdout, r.stderr


def test_missing_sandbox_is_125_with_a_hint_for_every_command(layout: Layout) -> None:
    ws = layout.workspace
    for args in (
        ["exec", "ghost", "true"],
        ["stop", "ghost"],
        ["rm", "ghost"],
        ["port", "ghost", "80"],
        ["ps", "ghost"],
        ["logs", "--net", "ghost"],
        ["cp", "x", "ghost:y"],
    ):
        code, _, err = cli(ws, *args)
        assert code == 125, (args, err)
        assert "no sandbox named ghost" in err and "warren ls" in err and "Traceback" not in err


def test_everything_after_name_is_the_command(layout: Layout) -> None:
    ws = layout.workspace
    (ws / "f.txt").write_text("x")
    assert cli(ws, "create", "box")[0] == 0
    code, out, err = cli(ws, "exec", "box", "ls", "-la", "--color=never")
    assert code == 0 and "f.txt" in out, err
    assert cli(ws, "exec", "box", "--", "sh", "-c", "exit 7")[0] == 7
    assert cli(ws, "exec", "--env", "A=1", "box", "sh", "-c", "echo $A")[1] == "1\n"


def test_invalid_names_are_refused(layout: Layout) -> None:
    for name in ("", "-x", "a/b", "x" * 64, "ünï"):
        code, _, err = (
            cli(layout.workspace, "create", "--", name)
            if name.startswith("-")
            else cli(layout.workspace, "create", name)
        )
        assert code == 125 and "invalid sandbox name" in err, (name, err)
    assert Sandbox.list() == []


def test_rm_needs_force_for_a_running_sandbox_and_says_when_there_is_none(layout: Layout) -> None:
    ws = layout.workspace
    assert cli(ws, "create", "rmme")[0] == 0
    code, _, err = cli(ws, "rm", "rmme")
    assert code == 125 and "is running" in err and "rm -f rmme" in err
    assert cli(ws, "exec", "rmme", "true")[0] == 0  # untouched
    assert cli(ws, "rm", "-f", "rmme")[0] == 0
    code, _, err = cli(ws, "rm", "rmme")
    assert code == 125 and "no sandbox named rmme" in err


def test_ls_and_ps_speak_json(layout: Layout) -> None:
    ws = layout.workspace
    assert cli(ws, "create", "js")[0] == 0
    assert cli(ws, "exec", "js", "sh", "-c", "sleep 300 >/dev/null 2>&1 &")[0] == 0
    code, out, _ = cli(ws, "ls", "--json")
    [entry] = json.loads(out)
    assert (
        code == 0 and entry["name"] == "js" and entry["state"] == "running" and entry["workspace"] == str(ws)
    )
    keys = [
        "name",
        "id",
        "state",
        "reason",
        "workspace",
        "created",
        "warnings",
        "idle_timeout",
        "last_active",
    ]
    assert list(entry) == keys
    code, out, _ = cli(ws, "ps", "--json", "js")
    procs = json.loads(out)
    assert code == 0 and any(p["argv"][:2] == ["sleep", "300"] for p in procs)
    keys = ["pid", "ppid", "state", "argv", "spawn_id", "warren", "exit_code", "timed_out"]
    assert all(list(p) == keys for p in procs)


def test_cp_copies_directories_and_honours_a_trailing_slash(layout: Layout, tmp_path: Path) -> None:
    ws = layout.workspace
    assert cli(ws, "create", "cpbox")[0] == 0
    src = tmp_path / "tree"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.sh").write_text("#!/bin/sh\n")
    (src / "sub" / "b.sh").chmod(0o755)
    (ws / "dest").mkdir()
    (tmp_path / "one.txt").write_text("one")
    # The documented form (docs/usage/sandboxes.md): a file into a directory given with a trailing slash.
    assert cli(ws, "cp", str(tmp_path / "one.txt"), f"cpbox:{ws}/dest/")[0] == 0
    assert (ws / "dest" / "one.txt").read_text() == "one"
    code, _, err = cli(ws, "cp", str(src), "cpbox:dest/")
    assert code == 125 and "copy directories with -r" in err
    assert cli(ws, "cp", "-r", str(src), "cpbox:dest/")[0] == 0
    assert (ws / "dest" / "tree" / "sub" / "b.sh").stat().st_mode & 0o777 == 0o755
    back = tmp_path / "back"
    back.mkdir()
    assert cli(ws, "cp", "-r", "cpbox:dest/tree", f"{back}/")[0] == 0
    assert (back / "tree" / "a.txt").read_text() == "A"
    assert (back / "tree" / "sub" / "b.sh").read_text() == "#!/bin/sh\n"


def test_cp_out_never_follows_a_link_the_sandbox_planted(layout: Layout, tmp_path: Path) -> None:
    ws = layout.workspace
    victim = tmp_path / "victim.txt"
    victim.write_text("host data\n")
    assert cli(ws, "create", "linkbox")[0] == 0
    cli(ws, "exec", "linkbox", "sh", "-c", f"mkdir -p d && echo evil > d/x && ln -s {victim} d/victim.txt")
    out = tmp_path / "out"
    out.mkdir()
    assert cli(ws, "cp", "-r", "linkbox:d", f"{out}/")[0] == 0
    assert victim.read_text() == "host data\n"
    assert not (out / "d" / "victim.txt").exists() or (out / "d" / "victim.txt").is_symlink() is False
    # And a link already at the destination on the host is not followed either.
    (out / "trap").symlink_to(victim)
    code, _, _err = cli(ws, "cp", "linkbox:d/x", str(out / "trap"))
    assert code != 0 and victim.read_text() == "host data\n"


def test_create_with_a_preset_creates_its_missing_cache(layout: Layout, tmp_path: Path) -> None:
    cache = tmp_path / "not-yet" / "uv"
    r = run_cli(["create", "--preset", "uv", "uvbox"], cwd=layout.workspace, env={"UV_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    assert cache.is_dir()
    r = run_cli(["exec", "uvbox", "touch", f"{cache}/made-inside"], cwd=layout.workspace)
    assert r.returncode == 0 and (cache / "made-inside").exists()


def test_a_missing_preset_cache_gives_no_false_warning(layout: Layout, tmp_path: Path) -> None:
    home_like = tmp_path / "h"
    (home_like / "proj").mkdir(parents=True)
    r = run_cli(
        ["run", "--preset", "uv", "--", "true"],
        cwd=home_like / "proj",
        # uv's tool and Python dirs too: all of uv's places beside the workspace.
        env={"UV_CACHE_DIR": str(home_like / ".cache" / "uv"), "XDG_DATA_HOME": str(home_like / "data")},
    )
    assert r.returncode == 0 and "WARNING" not in r.stderr, r.stderr


def test_the_plan_is_where_the_command_runs(layout: Layout) -> None:
    spec = PolicySpec(workspace=str(layout.workspace))
    assert warren.run(["pwd"], spec, cwd="/usr").stdout == b"/usr\n"
    (layout.workspace / "sub").mkdir()
    assert warren.run(["pwd"], spec, cwd="sub").stdout == f"{layout.workspace}/sub\n".encode()
    code, out, _ = cli(layout.workspace / "sub", "plan", "--json", "-w", str(layout.workspace))
    assert code == 0 and json.loads(out)["cwd"] == f"{layout.workspace}/sub"


def test_the_ancestor_guard_covers_long_lived_sandboxes(any_layout: Layout) -> None:
    parent = any_layout.root
    before = stat.S_IMODE(parent.stat().st_mode)
    ws = any_layout.workspace
    assert run_cli(["create", "--write", str(any_layout.cache), "guarded"], cwd=ws).returncode == 0
    r = run_cli(["exec", "guarded", "chmod", "0700", str(parent)], cwd=ws)
    # Refused by PID 1's broker (EPERM), or under /tmp by the read-only view the roots
    # are grafted on (EROFS).
    assert r.returncode != 0 and ("not permitted" in r.stderr or "Read-only file system" in r.stderr)
    r = run_cli(["rm", "-f", "guarded"], cwd=ws)
    assert r.returncode == 0
    assert stat.S_IMODE(parent.stat().st_mode) == before


@pytest.fixture
def home_dir() -> Iterator[Path]:
    """A directory of its own in the caller's home: on the home's mount, so a sandbox
    whose workspace is in it guards it (its metadata is snapshotted and restored)."""
    base = Path.home() / f".warren-test-{os.getpid()}-guard"
    (base / "W").mkdir(parents=True)
    try:
        yield base
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


def test_the_hosts_own_change_in_a_guarded_home_is_not_undone(home_dir: Path, tmp_path: Path) -> None:
    """``git config --global`` on the host while a sandbox lives renames a lock file over
    ``~/.gitconfig``: the home's entries are the same and its modification time is new.
    That is the host's doing: ``rm`` must neither say the sandbox did it nor set the
    time back. A time *set* on the directory (what a utimes() slipping past the filter
    would do) is still undone and said, the control."""
    ws, env = home_dir / "W", {"XDG_STATE_HOME": str(tmp_path / "state")}
    (home_dir / ".gitconfig").write_text("[user]\n\tname = before\n")
    plan = json.loads(run_cli(["plan", "--json"], cwd=ws, env=env).stdout)
    assert str(home_dir) in plan["guarded"]
    try:
        assert run_cli(["create", "g1"], cwd=ws, env=env).returncode == 0
        git = subprocess.run(
            ["git", "config", "--global", "user.name", "after"],
            env={**os.environ, "HOME": str(home_dir)},
            capture_output=True,
            text=True,
        )
        assert git.returncode == 0, git.stderr
        hosts = home_dir.stat().st_mtime_ns
        removed = run_cli(["rm", "-f", "g1"], cwd=ws, env=env)
        assert removed.returncode == 0 and "changed the times" not in removed.stderr, removed.stderr
        assert home_dir.stat().st_mtime_ns == hosts  # the host's time stays
        assert "name = after" in (home_dir / ".gitconfig").read_text()

        assert run_cli(["create", "g2"], cwd=ws, env=env).returncode == 0
        kept = home_dir.stat().st_mtime_ns
        os.utime(home_dir, ns=(kept, kept - 86_400 * 10**9))  # set a day back, as a utimes() would
        removed = run_cli(["rm", "-f", "g2"], cwd=ws, env=env)
        assert f"the sandbox changed the times of {home_dir}; restored" in removed.stderr, removed.stderr
        assert home_dir.stat().st_mtime_ns == kept
    finally:
        run_cli(["rm", "-f", "--all"], cwd=ws, env=env)
        run_cli(["shutdown"], cwd=ws, env=env)


def test_one_shot_runs_work_where_no_supervisor_can(layout: Layout, tmp_path: Path) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the state directory would go")
    env = {"XDG_STATE_HOME": str(blocked)}
    r = run_cli(["run", "--", "sh", "-c", "echo inline; pwd"], cwd=layout.workspace, env=env)
    assert r.returncode == 0 and r.stdout == f"inline\n{layout.workspace}\n", r.stderr
    r = run_cli(["create", "box"], cwd=layout.workspace, env=env)
    assert r.returncode == 125 and "state directory" in r.stderr and "hint:" in r.stderr


def test_a_failure_without_network_says_so(layout: Layout) -> None:
    r = run_cli(
        [
            "run",
            "--",
            "python3",
            "-m",
            "pip",
            "download",
            "--retries",
            "0",
            "--no-deps",
            "-d",
            ".",
            "warren-nope",
        ],
        cwd=layout.workspace,
        timeout=120,
    )
    assert r.returncode != 0
    assert "the sandbox has no network (--network none" in r.stderr


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


def test_async_sandbox_has_exactly_the_methods_and_parameters_of_sandbox() -> None:
    sync, aio = _public(Sandbox), _public(AsyncSandbox)
    assert set(sync) == set(aio)
    for name, sig in sync.items():
        assert list(sig.parameters) == list(aio[name].parameters), name
        for p in sig.parameters.values():
            assert p.default == aio[name].parameters[p.name].default, (name, p.name)
    props = {n for n, v in inspect.getmembers(Sandbox) if isinstance(v, property)}
    assert props <= {n for n, v in inspect.getmembers(AsyncSandbox) if isinstance(v, property)}


def test_the_api_returns_warrens_own_types(layout: Layout) -> None:
    with Sandbox.create(PolicySpec(workspace=str(layout.workspace)), name="typed") as sb:
        [info] = Sandbox.list()
        assert isinstance(info, warren.SandboxInfo) and info.name == "typed" and info.alive
        assert sb.alive and sb.id == info.id and sb.workspace == str(layout.workspace)
        p = sb.spawn(["sh", "-c", "echo out; echo err >&2"])
        assert p.wait(10) == 0
        assert sb.process(p.id).output().stdout == b"out\n"
        assert os.fspath(layout.workspace) == sb.info.workspace
