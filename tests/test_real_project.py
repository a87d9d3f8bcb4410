"""A real project's own test suite gives the same results inside warren as on the host.

attrs, from its sdist on the package index (fetched by ``scripts/setup`` into a local
wheelhouse with pytest and hypothesis, so the test itself needs no network): a venv
made in the project, its tests run once on the host and once in ``warren run`` —
the same tests pass, fail and skip. Differences would be warren's: a temp directory
a tool finds config beside, a rename that became a copy, a path it cannot write.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import run_cli

WHEELHOUSE = Path(os.environ.get("WARREN_WHEELHOUSE", "/opt/warren-wheelhouse"))
SDIST = "attrs-26.1.0.tar.gz"
TESTS = ["tests/test_funcs.py", "tests/test_converters.py", "tests/test_validators.py"]
PYTEST = ["-m", "pytest", "-q", "-rfEs", "-p", "no:cacheprovider", "--hypothesis-seed=1", *TESTS]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not (WHEELHOUSE / SDIST).exists():
        pytest.skip(f"{WHEELHOUSE / SDIST} is missing: scripts/setup fetches it (run the suite through it)")
    base = tmp_path_factory.mktemp("real")
    with tarfile.open(WHEELHOUSE / SDIST) as tar:
        tar.extractall(base)  # pinned by its sha256 in scripts/setup
    root = base / SDIST.removesuffix(".tar.gz")
    # The venv is made by uv (the setup is not what is compared, and pip's took most of
    # the test's time), with a cache of its own.
    uv = [os.path.join(os.path.dirname(sys.executable), "uv"), "--quiet", "--offline", "--no-config"]
    env = {**os.environ, "UV_CACHE_DIR": str(base / "uv-cache"), "UV_LINK_MODE": "copy"}
    subprocess.run([*uv, "venv", "--python", "/usr/bin/python3", str(root / ".venv")], check=True, env=env)
    install = ["pip", "install", "--python", str(root / ".venv/bin/python"), "--no-index", "--find-links"]
    subprocess.run([*uv, *install, str(WHEELHOUSE), "pytest", "hypothesis"], check=True, env=env)
    shutil.rmtree(base / "uv-cache", ignore_errors=True)
    return root


def outcome(out: str) -> tuple[str, list[str]]:
    """The summary counts and the sorted tests that did not pass, with how each ended.

    Only the test's id is compared, not the reason after it: pytest cuts summary lines to
    the terminal's width, which differs between a terminal and a pipe.
    """
    counts = [line for line in out.splitlines() if re.search(r"\d+ passed", line)]
    named = sorted(
        line.split(" - ", 1)[0] for line in out.splitlines() if re.match(r"(FAILED|ERROR|SKIPPED) ", line)
    )
    assert counts, out[-3000:]
    return re.sub(r" in [\d.]+s.*", "", counts[-1]).strip("= "), named


def test_attrs_own_tests_give_the_same_results_inside_as_on_the_host(project: Path) -> None:
    python = str(project / ".venv/bin/python")
    env = {**os.environ, "PYTHONPATH": "src", "COLUMNS": "400"}
    host = subprocess.run(
        [python, *PYTEST], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )
    shutil.rmtree(project / ".hypothesis", ignore_errors=True)
    inside = run_cli(
        ["run", "--env", "PYTHONPATH=src", "--env", "COLUMNS=400", "--", python, *PYTEST],
        cwd=project,
        timeout=600,
    )
    shutil.rmtree(project / ".hypothesis", ignore_errors=True)
    assert outcome(inside.stdout) == outcome(host.stdout), inside.stderr[-2000:]
    assert not [p.name for p in project.iterdir() if p.name.startswith(".warren")]
