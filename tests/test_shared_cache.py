"""What a sandbox can do to a tool cache it shares with the host, judged on the host.

A preset's cache is shared read-write on purpose (uv hardlinks from it into the
workspace's venv; ``npm ci`` and ``cargo build`` reuse it): so a sandbox can change an
entry the host installs from later, and since uv's venv files *are* its cache entries
(hard links), writing a venv file in the workspace writes the entry and every venv of
the host installed from it. docs/security.md ("What a sandbox can do to a shared
cache") says so; these tests keep it true, and show the way out it names: the cache
variable set for the sandbox (``--env UV_CACHE_DIR=...``) moves the grant, and the
host's cache is then out of reach while uv still hardlinks.

Everything lives in a scratch directory under the caller's home (not /tmp, so the
workspace and the caches share one host filesystem as a user's do); root and uid 1001
alike. uv works offline from a wheel built here (``--find-links``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import make_wheel, run_cli

pytestmark = pytest.mark.usefixtures("state_home")

UV = os.path.join(os.path.dirname(sys.executable), "uv")
SITE = "lib/python3.11/site-packages/warrenidx/__init__.py"
ORIGINAL = "VALUE = 42\n"


@pytest.fixture
def base(request: pytest.FixtureRequest) -> Iterator[Path]:
    path = Path(os.path.expanduser("~")) / f".warren-cache-{os.getpid()}-{request.node.name[-30:]}"
    (path / "ws").mkdir(parents=True)
    make_wheel(path / "wheels", "warrenidx", "3.0")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(base: Path, **extra: str) -> dict[str, str]:
    return {
        "UV_CACHE_DIR": str(base / "cache"),
        "UV_NO_PROGRESS": "1",
        "UV_OFFLINE": "1",
        "UV_PYTHON_DOWNLOADS": "never",
        **extra,
    }


def _host_install(base: Path, venv: str) -> Path:
    """The host's own uv: a venv and the package in it, from the shared cache."""
    env = {**os.environ, **_env(base)}
    python, wheels = str(base / venv / "bin/python"), str(base / "wheels")
    for argv in (
        [UV, "venv", "-q", "--python", "/usr/bin/python3", str(base / venv)],
        [UV, "pip", "install", "-q", "--python", python, "--no-index", "--find-links", wheels, "warrenidx"],
    ):
        subprocess.run(argv, env=env, check=True, capture_output=True, timeout=60)
    return base / venv / SITE


def _run(base: Path, script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    argv = ["run", "--preset", "uv", *flags, "--", "sh", "-c", script]
    return run_cli(argv, cwd=base / "ws", env=_env(base), timeout=120)


def _need_python311() -> None:
    if not os.path.exists("/usr/bin/python3.11"):
        pytest.skip("the venv paths here are written for the system's Python 3.11")


def test_a_sandbox_can_change_a_cache_entry_the_hosts_venvs_and_next_install_use(base: Path) -> None:
    _need_python311()
    installed = _host_install(base, "host-venv")
    assert installed.read_text() == ORIGINAL
    script = 'f=$(find "$UV_CACHE_DIR" -path "*/warrenidx/__init__.py" | head -1); echo "PLANTED = 1" >> "$f"'
    r = _run(base, script)
    assert r.returncode == 0, r.stderr
    # The host's venv is hardlinked from the entry: it changed with it; so does the next.
    assert installed.read_text() == ORIGINAL + "PLANTED = 1\n"
    assert _host_install(base, "next-venv").read_text() == ORIGINAL + "PLANTED = 1\n"


def test_writing_a_workspace_venv_file_writes_the_cache_entry_it_is_linked_from(base: Path) -> None:
    _need_python311()
    installed = _host_install(base, "host-venv")
    script = (
        "set -e; uv venv -q --python /usr/bin/python3 .venv; "
        f"uv pip install -q --python .venv/bin/python --no-index --find-links {base / 'wheels'} warrenidx; "
        f'echo "PLANTED = 1" >> .venv/{SITE}'
    )
    r = _run(base, script)
    assert r.returncode == 0 and "Failed to hardlink" not in r.stderr, r.stderr
    ours = base / "ws" / ".venv" / SITE
    assert ours.stat().st_ino == installed.stat().st_ino  # one inode: the cache entry
    assert installed.read_text() == ORIGINAL + "PLANTED = 1\n"


def test_a_cache_private_to_the_project_keeps_the_hosts_out_of_reach_and_still_hardlinks(base: Path) -> None:
    _need_python311()
    installed = _host_install(base, "host-venv")
    host_entry = next((base / "cache").rglob("warrenidx/__init__.py"))
    private = base / "ws" / ".uv-cache"
    script = (
        "set -e; uv venv -q --python /usr/bin/python3 .venv; "
        f"uv pip install -q --python .venv/bin/python --no-index --find-links {base / 'wheels'} warrenidx; "
        f'echo "PLANTED = 1" >> .venv/{SITE}; '
        f'echo "PLANTED = 1" >> {host_entry} 2>/dev/null && echo HOST-CACHE-WRITTEN; true'
    )
    r = _run(base, script, "--env", f"UV_CACHE_DIR={private}")
    assert r.returncode == 0 and "Failed to hardlink" not in r.stderr, r.stderr
    assert "HOST-CACHE-WRITTEN" not in r.stdout
    # Hardlinked from the project's own cache, not the host's.
    ours = (base / "ws" / ".venv" / SITE).stat()
    assert ours.st_nlink >= 2 and any(p.stat().st_ino == ours.st_ino for p in private.rglob("__init__.py"))
    assert host_entry.read_text() == ORIGINAL and installed.read_text() == ORIGINAL
    # Control: the same line written to the host's entry from a sandbox with the preset's
    # own cache reaches it (the detector above sees a write).
    r = _run(base, f'echo "PLANTED = 1" >> {host_entry}')
    assert r.returncode == 0 and installed.read_text() == ORIGINAL + "PLANTED = 1\n", r.stderr
