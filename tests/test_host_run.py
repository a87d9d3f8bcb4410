"""Nothing the host runs later is writable by a preset: the attack, judged on the host.

A sandbox with the language presets tries to change programs the user's own shell runs
later (uv's tools and Pythons, pipx's venvs and run cache, corepack's package managers,
pre-commit's hook environments, ``~/.local/bin``): appending a line, and replacing the
file by a rename. The host then runs each program and reads its bytes. The control is
the same command in a sandbox given those directories with ``--write``: there the host
runs the planted line, and the plan warned once per directory, naming it.

The tools' homes are redirected (XDG_DATA_HOME, XDG_CACHE_HOME, XDG_BIN_HOME) to a
scratch directory under the caller's home, so the caller's own are never touched; it
runs as root and as uid 1001 alike (the home is each caller's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import module_state, run_cli

# (what, directory a --write grants in the control, the program under it), below the base.
TARGETS = (
    ("uv tool", "data/uv/tools", "data/uv/tools/victim/bin/victim"),
    ("uv python", "data/uv/python", "data/uv/python/cpython-3.12.0-linux-x86_64-gnu/bin/python3.12"),
    ("pipx venv", "data/pipx", "data/pipx/venvs/victim/bin/victim"),
    ("pipx run cache", "cache/pipx", "cache/pipx/0123abcd/bin/victim"),
    ("corepack", "cache/node/corepack", "cache/node/corepack/v1/pnpm/9.0.0/bin/pnpm"),
    ("pre-commit", "cache/pre-commit", "cache/pre-commit/repoabc/py_env-python3/bin/hook"),
    ("~/.local/bin", "bin", "bin/victim"),
)
PROGRAM = "#!/bin/sh\necho clean\n"
# Append, then replace through a rename of a sibling: either reaches the host's next run.
ATTACK = (
    'for f in "$@"; do echo "echo PLANTED" >> "$f"; '
    'printf "#!/bin/sh\\necho PLANTED\\n" > "$f.new" && chmod +x "$f.new" && mv -f "$f.new" "$f"; done; true'
)


@dataclass
class Outcome:
    base: Path
    stderr: str
    status: int

    def host_runs(self, rel: str) -> str:
        return subprocess.run([str(self.base / rel)], capture_output=True, text=True, timeout=30).stdout


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _attack(name: str, *flags_for: str) -> Iterator[Outcome]:
    base = Path(os.path.expanduser("~")) / f".warren-hostrun-{os.getpid()}-{name}"
    (base / "ws").mkdir(parents=True)
    for _, _, rel in TARGETS:
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PROGRAM)
        path.chmod(0o755)
    env = {
        "XDG_DATA_HOME": str(base / "data"),
        "XDG_CACHE_HOME": str(base / "cache"),
        "XDG_BIN_HOME": str(base / "bin"),
    }
    writes = [arg for _, grant, _ in TARGETS for arg in ("--write", str(base / grant))] if flags_for else []
    argv = ["run", "--preset", "python", "--preset", "node", *writes, "--", "sh", "-c", ATTACK, "sh"]
    r = run_cli([*argv, *(str(base / rel) for _, _, rel in TARGETS)], cwd=base / "ws", env=env, timeout=120)
    yield Outcome(base, r.stderr, r.returncode)
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def attacked() -> Iterator[Outcome]:
    yield from _attack("presets")


@pytest.fixture(scope="module")
def granted() -> Iterator[Outcome]:
    yield from _attack("granted", "--write")


@pytest.mark.parametrize(("what", "rel"), [(what, rel) for what, _, rel in TARGETS])
def test_a_preset_sandbox_cannot_change_what_the_host_runs_later(
    attacked: Outcome, what: str, rel: str
) -> None:
    assert attacked.status == 0, attacked.stderr
    assert (attacked.base / rel).read_text() == PROGRAM, what
    assert attacked.host_runs(rel) == "clean\n", what
    assert not (attacked.base / f"{rel}.new").exists()


def test_a_preset_sandbox_is_not_warned_about_host_run_places(attacked: Outcome) -> None:
    assert "the host runs programs from" not in attacked.stderr


@pytest.mark.parametrize(("what", "rel"), [(what, rel) for what, _, rel in TARGETS])
def test_control_the_same_attack_with_an_explicit_write_reaches_the_host(
    granted: Outcome, what: str, rel: str
) -> None:
    assert granted.status == 0, granted.stderr
    assert "PLANTED" in granted.host_runs(rel), what


def test_control_each_explicit_write_is_warned_once_in_one_line_naming_it(granted: Outcome) -> None:
    lines = [line for line in granted.stderr.splitlines() if "the host runs programs from" in line]
    for _, grant, _ in TARGETS:
        named = [
            line
            for line in lines
            if line.partition("WARNING: ")[2].startswith(f"--write {granted.base / grant}: ")
        ]
        assert len(named) == 1 and "reaches the host" in named[0], (grant, granted.stderr)
    assert len(lines) == len(TARGETS), granted.stderr


def test_warren_plan_shows_the_warning(tmp_path: Path) -> None:
    tools = Path(os.path.expanduser("~")) / f".warren-hostrun-{os.getpid()}-plan"
    tools.mkdir()
    try:
        env = {"UV_TOOL_DIR": str(tools)}
        r = run_cli(["plan", "--preset", "python", "--write", str(tools)], cwd=tmp_path, env=env)
        assert r.returncode == 0, r.stderr
        out = r.stdout + r.stderr
        assert f"--write {tools}: the host runs programs from {tools} (uv tool install's tools)" in out, out
        plain = run_cli(["plan", "--preset", "python"], cwd=tmp_path, env=env)
        assert plain.returncode == 0 and "the host runs programs from" not in plain.stdout + plain.stderr
        # Granted, the tool directory is uv's own again; without, a private one in TMPDIR.
        assert f"  UV_TOOL_DIR={tools}\n" in r.stdout, r.stdout
        private = [line for line in plain.stdout.splitlines() if line.startswith("  UV_TOOL_DIR=")]
        assert len(private) == 1 and private[0].endswith("/uv-tools"), plain.stdout
    finally:
        tools.rmdir()


def test_the_library_gets_the_same_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warren
    from warren.policy import PolicySpec

    tools = Path(os.path.expanduser("~")) / f".warren-hostrun-{os.getpid()}-library"
    tools.mkdir()
    try:
        monkeypatch.setenv("UV_TOOL_DIR", str(tools))
        spec = PolicySpec(workspace=str(tmp_path), presets=["uv"], write=[str(tools)])
        r = warren.run(["sh", "-c", f"echo x > {tools}/planted"], spec)
        assert r.exit_code == 0 and (tools / "planted").exists(), r.stderr
        assert [w for w in r.warnings if "the host runs programs from" in w] == [
            f"--write {tools}: the host runs programs from {tools} (uv tool install's tools) later; "
            "a sandbox that writes there reaches the host"
        ]
    finally:
        shutil.rmtree(tools)


def test_corepack_runs_a_package_manager_the_host_downloaded_without_writing_its_home(
    tmp_path: Path,
) -> None:
    """Fidelity beside the protection: corepack's home is read-only, and a package
    manager it downloaded on the host (here a stand-in in corepack's layout: no registry
    is reachable offline) still runs inside, as on the host."""
    if shutil.which("corepack") is None:
        pytest.skip("corepack is not installed on this machine")
    base = Path(os.path.expanduser("~")) / f".warren-hostrun-{os.getpid()}-corepack"
    installed = base / "cache" / "node" / "corepack" / "v1" / "pnpm" / "9.0.0"
    (installed / "bin").mkdir(parents=True)
    (base / "ws").mkdir()
    try:
        (installed / "bin" / "pnpm.cjs").write_text('console.log("pnpm stand-in 9.0.0")\n')
        locator = {"name": "pnpm", "reference": "9.0.0"}
        (installed / ".corepack").write_text(
            json.dumps({"locator": locator, "bin": {"pnpm": "./bin/pnpm.cjs"}, "hash": "x"})
        )
        (base / "ws" / "package.json").write_text('{"name": "p", "packageManager": "pnpm@9.0.0"}\n')
        home = base / "cache" / "node"
        before = sorted((p.relative_to(base), p.stat().st_mtime_ns) for p in home.rglob("*"))
        env = {"XDG_CACHE_HOME": str(base / "cache"), "COREPACK_ENABLE_NETWORK": "0"}
        argv = ["run", "--preset", "node", "--", "corepack", "pnpm", "--version"]
        r = run_cli(argv, cwd=base / "ws", env=env, timeout=60)
        assert r.returncode == 0 and r.stdout == "pnpm stand-in 9.0.0\n", r.stdout + r.stderr
        after = sorted((p.relative_to(base), p.stat().st_mtime_ns) for p in home.rglob("*"))
        assert after == before
    finally:
        shutil.rmtree(base)
