"""A ``--write`` or ``--read`` path named inside the workspace that a link there leads
out of it is refused. The workspace is the sandbox's to write: a sandbox that leaves
``build -> ~/.local/bin`` (or ``-> ~/.ssh``) in it had the next ``warren run --write
build`` make that directory writable (or ``--read build`` readable) in the new sandbox,
the user none the wiser. A path that ends in the workspace, one named outright outside
it, and one reached through the caller's own links stay as they were. The same for the
user's config. Root and uid 1001.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from warren.errors import PolicyError
from warren.policy import PolicySpec, build, config


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """tmp_path/ws with ``out -> ../target`` (leading out) and ``in -> inner``."""
    (tmp_path / "ws" / "inner").mkdir(parents=True)
    (tmp_path / "target").mkdir()
    (tmp_path / "ws" / "out").symlink_to(tmp_path / "target")
    (tmp_path / "ws" / "in").symlink_to("inner")
    return tmp_path


def _build(place: Path, cwd: Path | None = None, **spec: list[str]) -> None:
    ws = place / "ws"
    build(PolicySpec(workspace=str(ws), **spec), cwd=cwd or ws, env={"HOME": str(place)})


@pytest.mark.parametrize("key", ["write", "read"])
def test_a_link_in_the_workspace_that_leads_out_is_refused(place: Path, key: str) -> None:
    for raw in ("out", "out/", "./out", "inner/../out", str(place / "ws" / "out"), "~/ws/out"):
        with pytest.raises(PolicyError) as got:
            _build(place, **{key: [raw]})
        message = str(got.value)
        assert f"--{key} {raw}: {place / 'ws' / 'out'} is a symbolic link inside the workspace" in message
        assert str(place / "target") in message and "a sandbox" in got.value.hint


def test_a_link_deeper_down_or_to_a_link_outside_is_refused_too(place: Path) -> None:
    ws = place / "ws"
    (place / "target" / "sub").mkdir()
    (ws / "inner" / "deep").symlink_to(place / "target")
    (place / "elsewhere").symlink_to(place / "target")
    (ws / "via").symlink_to(place / "elsewhere")  # out, then through a link that is not the workspace's
    for raw in ("inner/deep/sub", "via"):
        with pytest.raises(PolicyError, match="is a symbolic link inside the workspace"):
            _build(place, write=[raw])
    (place / "target" / "x").symlink_to("y")
    (place / "target" / "y").symlink_to("x")  # a loop out there: a clear error, not a traceback
    with pytest.raises(PolicyError, match="cannot follow its links"):
        _build(place, write=["out/x"])


def test_paths_that_stay_in_or_are_named_outside_are_taken(place: Path) -> None:
    ws = place / "ws"
    (place / "own").symlink_to(place / "target")  # the caller's own link, outside the workspace
    (place / "wslink").symlink_to(ws)  # the caller's way to the workspace
    _build(place, write=["in", "inner"], read=["in"])
    _build(place, write=[str(place / "target"), str(place / "own")], read=[str(place / "own")])
    _build(place, cwd=place / "wslink", write=["in"])
    with pytest.raises(PolicyError, match="is a symbolic link inside the workspace"):
        _build(place, cwd=place / "wslink", write=["out"])  # the caller's link first, then the workspace's


def test_the_users_config_is_held_to_it_too(place: Path) -> None:
    user = place / "config.toml"
    user.write_text('write = ["~/ws/out"]\n')
    with pytest.raises(PolicyError) as got:
        config.load_spec(place / "ws", None, env={}, home=place, user_config=user)
    assert f"{user}: write ~/ws/out" in str(got.value)
    user.write_text('read = ["~/ws/in", "~/target"]\n')
    assert config.load_spec(place / "ws", None, env={}, home=place, user_config=user).read == [
        str(place / "ws" / "inner"),
        str(place / "target"),
    ]


def test_a_presets_cache_kept_in_the_workspace_is_held_to_it_too(place: Path) -> None:
    """``UV_CACHE_DIR=$PWD/.uv-cache``: a sandbox that swapped the cache for a link to
    ``~/.ssh`` would have the next ``--preset uv`` make that writable (and, being
    writable, no longer hidden)."""
    ws = place / "ws"
    (place / ".ssh").mkdir()
    (ws / ".uv-cache").symlink_to(place / ".ssh")
    env = {"HOME": str(place), "UV_CACHE_DIR": str(ws / ".uv-cache")}
    with pytest.raises(PolicyError) as got:
        build(PolicySpec(workspace=str(ws), presets=["uv"]), cwd=ws, env=env)
    assert f"preset:uv {ws / '.uv-cache'}: {ws / '.uv-cache'} is a symbolic link inside the workspace" in str(
        got.value
    )
    assert "point the tool's cache elsewhere" in got.value.hint
    (ws / ".uv-cache").unlink()
    (ws / ".uv-cache").mkdir()  # a real directory there is the project's cache, as before
    policy = build(PolicySpec(workspace=str(ws), presets=["uv"]), cwd=ws, env=env)
    assert not any(str(r.path) == str(place / ".ssh") for r in policy.writable)


def test_a_link_a_sandbox_leaves_in_its_workspace_grants_nothing_later(
    tmp_path: Path, state_home: Path
) -> None:
    """Judged from the host: the directory the link names is not written."""
    ws, target = tmp_path / "ws", tmp_path / "bin"
    ws.mkdir()
    target.mkdir()
    r = run_cli(["run", "--", "ln", "-s", str(target), "build"], cwd=ws, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (ws / "build").is_symlink(), "the sandbox made its link (as it may)"
    r = run_cli(
        ["run", "--write", "build", "--", "sh", "-c", "echo planted > build/tool"], cwd=ws, timeout=60
    )
    assert r.returncode == 125, (r.returncode, r.stderr)
    assert "build is a symbolic link inside the workspace" in r.stderr and "hint:" in r.stderr
    assert list(target.iterdir()) == [], "nothing was written where the link led"
    r = run_cli(
        ["run", "--write", str(target), "--", "sh", "-c", "echo named > build/tool"], cwd=ws, timeout=60
    )
    assert r.returncode == 0 and (target / "tool").read_text() == "named\n", "named outright, it is granted"
