"""Fixtures of the doctor tests: a scratch place to probe, and the tools environments need."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import Place


@pytest.fixture
def place(tmp_path: Path) -> Place:
    dirs = {name: tmp_path / name for name in ("ws", "cache", "home", "tmp")}
    for d in dirs.values():
        d.mkdir()
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(dirs["home"]),
        "TMPDIR": str(dirs["tmp"]),
        "LANG": "C.UTF-8",
    }
    return Place(tmp_path, dirs["ws"], dirs["cache"], dirs["home"], dirs["tmp"], env)


def _works(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0
    except OSError:
        return False


@pytest.fixture(scope="session")
def userns() -> None:
    if not shutil.which("unshare") or not _works(["unshare", "-rm", "true"]):
        pytest.skip("unprivileged user namespaces (unshare -rm) are not available")


@pytest.fixture(scope="session")
def bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None or not _works([path, "--dev-bind", "/", "/", "true"]):
        pytest.skip("bubblewrap (bwrap) is not installed or cannot create a sandbox here")
    return path
