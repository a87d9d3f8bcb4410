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


def test_preset_python_sandbox_passes_every_probe(home_workspace: Path) -> None:
    r = subprocess.run(
        [*WARREN, "doctor", "--sandbox", "--preset", "python", "--json", "-w", str(home_workspace)],
        capture_output=True,
        text=True,
        cwd=home_workspace,
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
    # The one known difference from the host: the sandbox's /tmp is its own tmpfs.
    for p in report["probes"]:
        if p["status"] == "warn":
            assert p["location"].startswith("tmpdir") and p["cause"]["id"] == "cross_device", p


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
    assert "cannot share a mount" in r.stderr  # warren said so before running
