"""warren installed the way a newcomer installs it: the wheel built from this tree, put in
place by ``pip`` (a fresh venv), ``uv tool install`` and ``pipx install`` by an unprivileged
user, each in a home of its own, then ``warren --version`` and a first ``warren run`` with
nothing done as root in between; and what the wheel carries: the native `warren` with the
Python CLI beside it, or, without a C compiler, the Python CLI as `warren`.

Offline: the wheel is built with the hatchling already installed (the ``dev`` extra), and
the dependencies come from ``$WARREN_WHEELHOUSE``, which scripts/setup fills. As root the
installs run as uid 1001 through runuser; as anyone else, as that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# The installer is uid 1001 in both halves of scripts/test (root's runs it by runuser), and
# the wheel is the same: the root half leaves these to the uid-1001 half.
pytestmark = pytest.mark.caller_independent

SOURCE = Path(__file__).resolve().parents[1]
WHEELHOUSE = Path(os.environ.get("WARREN_WHEELHOUSE", "/opt/warren-wheelhouse"))
VERSION = tomllib.loads((SOURCE / "pyproject.toml").read_text())["project"]["version"]
BIN = Path(sys.executable).parent
BASE_PYTHON = os.path.realpath(sys.executable)


def _installer() -> pwd.struct_passwd:
    """Who installs: uid 1001 when the suite runs as root, else the user running it."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.getuid())
    try:
        return pwd.getpwuid(1001)
    except KeyError:
        pytest.skip("no user with uid 1001 to install as (scripts/setup creates one)")


@dataclass
class Installer:
    """A private home for uid 1001 under ``top``: every tool's directories point into it."""

    top: Path
    prefix: list[str]
    uid: int

    @property
    def env(self) -> dict[str, str]:
        t = self.top
        return {
            "PATH": f"{BIN}:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": str(t / "home"),
            "XDG_CONFIG_HOME": str(t / "home/.config"),
            "XDG_CACHE_HOME": str(t / "home/.cache"),
            "XDG_DATA_HOME": str(t / "home/.local/share"),
            "XDG_STATE_HOME": str(t / "home/.local/state"),
            "XDG_BIN_HOME": str(t / "home/.local/bin"),
            "PIP_CONFIG_FILE": os.devnull,  # this machine's pip.conf must not add indexes
            "UV_TOOL_DIR": str(t / "home/.local/share/uv/tools"),
            "UV_TOOL_BIN_DIR": str(t / "home/.local/bin"),
            "UV_CACHE_DIR": str(t / "home/.cache/uv"),
            "UV_PYTHON_DOWNLOADS": "never",
            "PIPX_HOME": str(t / "home/.local/share/pipx"),
            "PIPX_BIN_DIR": str(t / "home/.local/bin"),
            "PYTHONDONTWRITEBYTECODE": "1",
        }

    def run(self, *argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = [f"{k}={v}" for k, v in self.env.items()]
        return subprocess.run(
            [*self.prefix, "env", "-i", *env, *map(str, argv)],
            cwd=cwd or self.top / "home",
            capture_output=True,
            text=True,
            timeout=600,
        )


def _remove(top: Path) -> None:
    """uv marks its cache read-only: make the tree writable again, then remove it."""
    for where, dirs, _ in os.walk(top):
        for d in dirs:
            path = os.path.join(where, d)
            if not os.path.islink(path):
                os.chmod(path, stat.S_IRWXU)
    shutil.rmtree(top)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel of this tree, built offline with the installed hatchling."""
    pytest.importorskip("hatchling", reason="the dev extra's hatchling builds the wheel offline")
    out = tmp_path_factory.mktemp("wheel")
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run(
        [*build, "-w", str(out), str(SOURCE)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull},
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    (found,) = out.glob("warren_sandbox-*.whl")
    return found


@pytest.fixture
def installer(wheel: Path) -> Iterator[Installer]:
    user = _installer()
    if not (WHEELHOUSE / "warren-deps.txt").is_file():
        pytest.skip(f"warren's dependencies are not in {WHEELHOUSE} (scripts/setup fetches them there)")
    top = Path(tempfile.mkdtemp(prefix="warren-install-"))
    top.chmod(0o755)
    (top / "home/proj").mkdir(parents=True)
    shutil.copy(wheel, top)
    prefix: list[str] = []
    if os.geteuid() == 0:
        for path in (top, top / "home", top / "home/proj", top / wheel.name):
            os.chown(path, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", user.pw_name, "--"]
    inst = Installer(top, prefix, user.pw_uid)
    try:
        yield inst
    finally:
        _remove(top)


def _first_use(inst: Installer, warren: Path) -> None:
    """What a newcomer types first, straight after installing."""
    for flag in ("--version", "-V"):
        shown = inst.run(warren, flag)
        assert (shown.returncode, shown.stdout) == (0, f"warren {VERSION}\n"), shown.stderr
    first = inst.run(warren, "run", "--", "sh", "-c", "echo hello from $(id -u)", cwd=inst.top / "home/proj")
    try:
        assert first.returncode == 0, first.stderr
        assert first.stdout == f"hello from {inst.uid}\n"
        assert first.stderr == ""
        again = inst.run(warren, "run", "--", "true", cwd=inst.top / "home/proj")
        assert again.returncode == 0, again.stderr
    finally:
        inst.run(warren, "shutdown")


def _offline() -> list[str]:
    return ["--no-index", "--find-links", str(WHEELHOUSE)]


def test_pip_install_into_a_fresh_venv_gives_a_working_warren(installer: Installer, wheel: Path) -> None:
    venv = installer.top / "home/venv"
    made = installer.run(BASE_PYTHON, "-m", "venv", venv)
    assert made.returncode == 0, made.stderr
    got = installer.run(venv / "bin/pip", "install", "-q", *_offline(), installer.top / wheel.name)
    assert got.returncode == 0, got.stderr
    _first_use(installer, venv / "bin/warren")


def test_uv_tool_install_gives_a_warren_command(installer: Installer, wheel: Path) -> None:
    got = installer.run(
        BIN / "uv", "tool", "install", "--offline", "--python", BASE_PYTHON, *_offline(),
        installer.top / wheel.name,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    _first_use(installer, installer.top / "home/.local/bin/warren")


def test_pipx_install_gives_a_warren_command(installer: Installer, wheel: Path) -> None:
    got = installer.run(
        BIN / "pipx", "install", "--python", BASE_PYTHON, "--pip-args", " ".join(_offline()),
        installer.top / wheel.name,
    )  # fmt: skip
    assert got.returncode == 0, got.stderr
    _first_use(installer, installer.top / "home/.local/bin/warren")


def test_a_wheel_built_by_uv_build_installs_and_runs(installer: Installer, tmp_path: Path) -> None:
    """``uv build`` (offline, with the installed hatchling) makes the same wheel as ``pip
    wheel``: the native front end and the exec stub compiled in where a C compiler is, the
    Python CLI as ``warren`` where none is; it installs into a fresh venv and runs."""
    pytest.importorskip("hatchling", reason="the dev extra's hatchling builds the wheel offline")
    built = subprocess.run(
        [BIN / "uv", "build", "--wheel", "--offline", "--no-build-isolation", "--python", sys.executable,
         "--out-dir", tmp_path, SOURCE],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "UV_CACHE_DIR": str(tmp_path / "cache"), "UV_PYTHON_DOWNLOADS": "never"},
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (found,) = tmp_path.glob("warren_sandbox-*.whl")
    with zipfile.ZipFile(found) as whl:
        scripts = {Path(n).name: whl.read(n) for n in whl.namelist() if ".data/scripts/" in n}
    if shutil.which(os.environ.get("CC", "cc")):
        assert scripts["warren"].startswith(b"\x7fELF") and scripts["warren-exec-stub"].startswith(b"\x7fELF")
        assert scripts["warren-credsend"].startswith(b"\x7fELF")
        assert scripts["warren-continuer.so"].startswith(b"\x7fELF")
        assert scripts["warren-python"].startswith(b"#!python") and "linux_" in found.name
    else:
        assert list(scripts) == ["warren"] and found.name.endswith("-py3-none-any.whl")
    shutil.copy(found, installer.top)
    os.chown(installer.top / found.name, installer.uid, -1)
    venv = installer.top / "home/venv"
    assert installer.run(BASE_PYTHON, "-m", "venv", venv).returncode == 0
    got = installer.run(venv / "bin/pip", "install", "-q", *_offline(), installer.top / found.name)
    assert got.returncode == 0, got.stderr
    _first_use(installer, venv / "bin/warren")


def test_the_wheel_carries_the_native_warren_and_the_python_cli_beside_it(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        scripts = {Path(n).name: whl.read(n) for n in whl.namelist() if ".data/scripts/" in n}
    if "warren-python" not in scripts:
        pytest.skip("no C compiler here: the wheel is the pure-Python CLI (the next test)")
    assert scripts["warren"].startswith(b"\x7fELF")
    assert scripts["warren-python"].startswith(b"#!python")
    assert not wheel.name.endswith("-py3-none-any.whl")  # a binary inside: specific to its platform


def test_without_a_c_compiler_the_wheel_is_the_pure_python_cli(tmp_path: Path) -> None:
    pytest.importorskip("hatchling", reason="the dev extra's hatchling builds the wheel offline")
    build = [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index"]
    built = subprocess.run(
        [*build, "-w", str(tmp_path), str(SOURCE)],
        capture_output=True,
        text=True,
        env={**os.environ, "PIP_CONFIG_FILE": os.devnull, "CC": "no-such-cc"},
        timeout=600,
    )
    assert built.returncode == 0, built.stderr
    assert "the native front end was not built (no C compiler ('no-such-cc' not found))" in (
        built.stdout + built.stderr
    )
    (found,) = tmp_path.glob("warren_sandbox-*.whl")
    assert found.name.endswith("-py3-none-any.whl")
    with zipfile.ZipFile(found) as whl:
        scripts = {Path(n).name: whl.read(n) for n in whl.namelist() if ".data/scripts/" in n}
    assert list(scripts) == ["warren"] and scripts["warren"].startswith(b"#!python")
