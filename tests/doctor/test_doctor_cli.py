"""The doctor's entry points, and its promise to need nothing but the standard library."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import warren.doctor
from warren.cli import entrypoint

from .helpers import PYTHON, Place

PACKAGE = Path(warren.doctor.__file__).parent
SRC = PACKAGE.parent.parent


def test_doctor_package_imports_only_the_standard_library() -> None:
    for module in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text(), str(module))):
            if isinstance(node, ast.ImportFrom) and node.level > 0:
                assert node.level == 1, f"{module.name} reaches outside the doctor package"
                continue
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top == "__future__", f"{module.name}: {name}"


def test_probe_main_runs_on_a_bare_interpreter_without_site_packages(place: Place) -> None:
    # -S: no site-packages at all; warren's sources come from PYTHONPATH only.
    bare = shutil.which("python3", path="/usr/bin:/bin") or PYTHON
    cmd = [bare, "-S", "-m", "warren.doctor.probe_main", "--workspace", str(place.ws)]
    cmd += ["--cache", str(place.cache), "--json"]
    p = subprocess.run(
        cmd, env={**place.env, "PYTHONPATH": str(SRC)}, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0, p.stderr
    report = json.loads(p.stdout)
    assert report["schema"] == "warren-doctor/1" and report["ok"] is True
    assert {loc["role"] for loc in report["locations"]} >= {"workspace", "cache", "tmpdir"}


def test_warren_doctor_subcommand_prints_json_and_exits_zero_when_all_pass(
    place: Place, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in place.env.items():
        monkeypatch.setenv(key, value)
    for key in ("XDG_CACHE_HOME", "UV_CACHE_DIR", "PIP_CACHE_DIR", "npm_config_cache", "CARGO_HOME"):
        monkeypatch.delenv(key, raising=False)
    code = entrypoint(["doctor", "--workspace", str(place.ws), "--cache", str(place.cache), "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert json.loads(out)["ok"] is True


def test_warren_doctor_with_a_missing_workspace_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert entrypoint(["doctor", "--workspace", str(tmp_path / "nope")]) == 125
    err = capsys.readouterr().err
    assert "is not a directory" in err and "Traceback" not in err


def test_python_m_warren_doctor_usage_error_exits_2(tmp_path: Path) -> None:
    p = subprocess.run(
        [PYTHON, "-m", "warren.doctor", "--workspace", str(tmp_path / "nope")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "is not a directory" in p.stderr and "Traceback" not in p.stderr
