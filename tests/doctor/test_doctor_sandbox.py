"""`warren doctor --sandbox`: the same probes inside a warren sandbox built from a policy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

WARREN = [sys.executable, "-m", "warren"]


@pytest.fixture
def home_workspace() -> Iterator[Path]:
    """A workspace under $HOME, on the filesystem of the real tool caches (~/.cache)."""
    ws = Path(os.path.expanduser("~")) / f".warren-doctor-test-{os.getpid()}"
    ws.mkdir()
    yield ws
    shutil.rmtree(ws, ignore_errors=True)


@pytest.fixture
def home_state() -> Iterator[dict[str, str]]:
    """warren's state (and so XDG_STATE_HOME, where pipx keeps its logs) under $HOME, as
    for a user who never moved it: every writable root of the preset then lies on one
    filesystem. Its own supervisor is stopped afterwards."""
    state = Path(os.path.expanduser("~")) / f".warren-doctor-state-{os.getpid()}"
    env = {**os.environ, "XDG_STATE_HOME": str(state)}
    yield env
    subprocess.run([*WARREN, "shutdown"], env=env, capture_output=True, timeout=60)
    shutil.rmtree(state, ignore_errors=True)


def test_preset_python_sandbox_passes_every_probe(home_workspace: Path, home_state: dict[str, str]) -> None:
    r = subprocess.run(
        [*WARREN, "doctor", "--sandbox", "--preset", "python", "--json", "-w", str(home_workspace)],
        capture_output=True,
        text=True,
        cwd=home_workspace,
        env=home_state,
        timeout=120,
    )
    report = json.loads(r.stdout)
    failed = [p for p in report["probes"] if p["status"] in ("fail", "error")]
    assert failed == [], failed
    assert r.returncode == 0 and report["ok"]
    # Inside: a sandboxed process (user namespace, no_new_privs, seccomp filter).
    assert report["process"]["no_new_privs"] and report["process"]["seccomp"] == "filter"
    roles = {loc["role"] for loc in report["locations"]}
    assert {"workspace", "tmpdir"} <= roles and any(r.startswith("cache") for r in roles)
    passed = {(p["location"], p["id"]) for p in report["probes"] if p["status"] == "pass"}
    assert any(loc.endswith("->workspace") and pid == "hardlink_into_workspace" for loc, pid in passed)
    # TMPDIR behaves as the host's does for this workspace: a rename from it into the
    # workspace works exactly when it works on the host.
    tmp = next(loc for loc in report["locations"] if loc["role"] == "tmpdir")
    ws = next(loc for loc in report["locations"] if loc["role"] == "workspace")
    host_tmp = os.environ.get("TMPDIR") or "/tmp"
    if os.stat(host_tmp).st_dev == os.stat(home_workspace).st_dev:
        # Outside the workspace (nothing new appears in it), on the same mount.
        assert not tmp["path"].startswith(f"{home_workspace}/"), tmp
        assert tmp["mount_id"] == ws["mount_id"]
        assert [p for p in report["probes"] if p["status"] == "warn"] == []
    else:
        for p in report["probes"]:
            if p["status"] == "warn":
                assert p["location"].startswith("tmpdir") and p["cause"]["id"] == "cross_device", p
    assert not [p.name for p in home_workspace.iterdir()], "the sandbox's TMPDIR was removed"


def test_sandbox_doctor_reports_a_tmpdir_on_another_filesystem_as_the_host_has_it(
    home_workspace: Path,
) -> None:
    if not os.access("/dev/shm", os.W_OK) or os.stat("/dev/shm").st_dev == os.stat(home_workspace).st_dev:
        pytest.skip("/dev/shm is not a writable filesystem of its own here")
    r = subprocess.run(
        [*WARREN, "doctor", "--sandbox", "--json", "-w", str(home_workspace)],
        capture_output=True,
        text=True,
        cwd=home_workspace,
        env={**os.environ, "TMPDIR": "/dev/shm"},
        timeout=120,
    )
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stderr
    tmp = next(loc for loc in report["locations"] if loc["role"] == "tmpdir")
    assert tmp["path"] == "/tmp" and tmp["fstype"] == "tmpfs"
    warned = [(p["location"], p["id"], p["cause"]["id"]) for p in report["probes"] if p["status"] == "warn"]
    assert warned == [("tmpdir->workspace", "rename_into_workspace", "cross_device")]


@pytest.mark.parametrize("where", ["tmp", "denied"])
def test_sandbox_doctor_works_from_an_install_the_sandbox_cannot_see(
    where: str, home_workspace: Path, tmp_path: Path
) -> None:
    """An editable install or checkout under /tmp (the sandbox's /tmp is its own), or in
    a directory the policy denies: the doctor's sources travel in its command line."""
    base = tmp_path if where == "tmp" else home_workspace.with_name(home_workspace.name + "-hidden")
    src = base / "src"
    shutil.copytree(Path(__file__).resolve().parents[2] / "src" / "warren", src / "warren")
    env = {**os.environ, "PYTHONPATH": str(src)}
    flags = ["--deny", str(base)] if where == "denied" else []
    try:
        which = subprocess.run(
            [sys.executable, "-c", "import warren; print(warren.__file__)"],
            env=env,
            capture_output=True,
            text=True,
        )
        assert which.stdout.startswith(str(src)), which  # this run's warren is the hidden copy
        r = subprocess.run(
            [*WARREN, "doctor", "--sandbox", *flags, "--json", "-w", str(home_workspace)],
            capture_output=True,
            text=True,
            cwd=home_workspace,
            env=env,
            timeout=120,
        )
    finally:
        if where == "denied":
            shutil.rmtree(base, ignore_errors=True)
    assert "Traceback" not in r.stderr and "ModuleNotFoundError" not in r.stderr, r.stderr
    report = json.loads(r.stdout)
    assert r.returncode == 0 and report["ok"], r.stderr
    assert report["process"]["no_new_privs"]


def test_sandbox_doctor_names_the_split_when_workspace_is_under_tmp(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    cache = Path(os.path.expanduser("~")) / f".warren-doctor-cache-{os.getpid()}"
    cache.mkdir()
    try:
        r = subprocess.run(
            [*WARREN, "doctor", "--sandbox", "--write", str(cache), "--json", "-w", str(ws)],
            capture_output=True,
            text=True,
            cwd=ws,
            timeout=120,
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and not report["ok"]
    causes = {c["id"] for c in report["causes"]}
    assert "separate_bind_mounts" in causes
    # warren said so before running, in one line that says what to do
    said = [line for line in r.stderr.splitlines() if "cannot work inside" in line]
    assert len(said) == 1 and "move it out of /tmp" in said[0], r.stderr
    # Nothing granted outside /tmp: nothing to say (it said "links and renames to  cannot").
    alone = subprocess.run(
        [*WARREN, "run", "-w", str(ws), "--", "true"], capture_output=True, text=True, cwd=ws, timeout=120
    )
    assert alone.returncode == 0 and "cannot work inside" not in alone.stderr, alone.stderr


def test_sandbox_doctor_names_an_interpreter_the_sandbox_cannot_see(home_workspace: Path) -> None:
    """A Python in a denied directory (a copy of this one): one line naming it, no traceback."""
    hidden = home_workspace.with_name(home_workspace.name + "-python")
    (hidden / "bin").mkdir(parents=True)
    python = hidden / "bin" / "python3"
    shutil.copy2(os.path.realpath(sys.executable), python)
    src = str(Path(__file__).resolve().parents[2] / "src")
    paths = [src, *(p for p in sys.path if p.endswith("site-packages"))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    try:
        r = subprocess.run(
            [
                str(python),
                "-m",
                "warren",
                "doctor",
                "--sandbox",
                "--deny",
                str(hidden),
                "-w",
                str(home_workspace),
            ],
            capture_output=True,
            text=True,
            cwd=home_workspace,
            env=env,
            timeout=120,
        )
    finally:
        shutil.rmtree(hidden, ignore_errors=True)
    assert r.returncode == 125, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 2 and f"the Python running warren ({python})" in lines[0], r.stderr
    assert lines[1].strip().startswith("hint:") and "--read" in lines[1]


def test_sandbox_doctor_shows_an_interpreter_under_tmp(home_workspace: Path, tmp_path: Path) -> None:
    """A Python under /tmp (the sandbox's /tmp is its own) is shown to it read-only."""
    python = tmp_path / "bin" / "python3"
    python.parent.mkdir()
    shutil.copy2(os.path.realpath(sys.executable), python)
    src = str(Path(__file__).resolve().parents[2] / "src")
    paths = [src, *(p for p in sys.path if p.endswith("site-packages"))]
    r = subprocess.run(
        [str(python), "-m", "warren", "doctor", "--sandbox", "--json", "-w", str(home_workspace)],
        capture_output=True,
        text=True,
        cwd=home_workspace,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        timeout=120,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["ok"], r.stderr
