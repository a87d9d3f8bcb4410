"""The peer battery (``test_fidelity``, ``test_tool_fidelity``) in a sandbox on a real
Debian image: the image's own python3, venv, pip and git, uv bound in, a host workspace
and a tool cache beside it under $HOME (one host filesystem, so they share a mount and
/workspace is a link to the workspace's host path), or a workspace in the sandbox's
layer. Judged on the host: inodes, owners, files.

The image (bookworm ``essential`` + python3, python3-venv, git, apt: ``images_util``) is built
once per test run and shared with ``test_images_debian``. npm is not in it (Debian's
npm is hundreds of packages): its cases stay with the host-root battery.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import RENAME_FROM_TMPDIR, make_wheel, module_state, run_cli
from images_util import DEBIAN_NAME, debian_image, mirror_reachable

pytestmark = pytest.mark.skipif(not mirror_reachable(), reason="deb.debian.org is not reachable from here")

UV = os.path.join(os.path.dirname(sys.executable), "uv")


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(scope="module")
def data_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return debian_image(tmp_path_factory)[0]


@dataclass
class Box:
    """A host workspace and a cache beside it, and ``warren run --image`` over them."""

    base: Path
    data: Path

    @property
    def ws(self) -> Path:
        return self.base / "ws"

    @property
    def cache(self) -> Path:
        return self.base / "cache"

    def run(
        self, script: str, *flags: str, workspace: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = ["run", "--image", DEBIAN_NAME, "-w", workspace or str(self.ws), "--write", str(self.cache)]
        argv += ["--read", UV, *flags, "--", "sh", "-c", textwrap.dedent(script)]
        full = {"XDG_DATA_HOME": str(self.data), **(env or {})}
        return run_cli(argv, cwd=self.ws, env=full, timeout=120)


@pytest.fixture
def box(data_home: Path, request: pytest.FixtureRequest) -> Iterator[Box]:
    base = Path.home() / f".warren-imgfid-{os.getpid()}-{request.node.name[-30:]}"
    (base / "ws").mkdir(parents=True)
    (base / "cache").mkdir()
    yield Box(base, data_home)
    shutil.rmtree(base, ignore_errors=True)


def test_files_made_in_the_host_workspace_are_the_callers_and_the_root_is_debians(box: Box) -> None:
    r = box.run("cat /etc/debian_version; echo hi > made.txt && mkdir made.d && id -u; pwd -P")
    assert r.returncode == 0, r.stderr
    version, uid, where = r.stdout.split()
    assert version.startswith("12.") and uid == "0" and where == str(box.ws)
    for name in ("made.txt", "made.d"):
        st = (box.ws / name).stat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())


def test_hardlink_and_renameat2_between_the_cache_and_the_workspace(box: Box) -> None:
    c = box.cache
    (c / "f").write_text("payload")
    (c / "g").write_text("moved")
    code = f"""
import ctypes, os
os.makedirs('.venv', exist_ok=True)
os.link({str(c / "f")!r}, '.venv/f')
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs({str(c / "archive-v0")!r}, exist_ok=True)
os.mkdir({str(c / ".tmpX")!r})
open({str(c / ".tmpX" / "inner")!r}, "w").write("x")
r = libc.syscall(316, -100, {str(c / ".tmpX").encode()!r}, -100, {str(c / "archive-v0" / "ID").encode()!r}, 1)
assert r == 0, os.strerror(ctypes.get_errno())
os.rename({str(c / "g")!r}, "g")
os.makedirs({str(c / "sdists-v9")!r}); open({str(c / "sdists-v9" / ".git")!r}, "w").write("marker")
"""
    r = box.run(f"python3 -c {shlex.quote(code)}")
    assert r.returncode == 0, r.stderr
    assert (box.ws / ".venv" / "f").stat().st_ino == (c / "f").stat().st_ino
    assert (c / "archive-v0" / "ID" / "inner").read_text() == "x" and not (c / ".tmpX").exists()
    assert (box.ws / "g").read_text() == "moved" and not (c / "g").exists()
    assert (c / "sdists-v9" / ".git").read_text() == "marker"


def test_uv_install_from_a_warm_cache_hardlinks_into_a_venv_of_the_images_python(box: Box) -> None:
    wheels = box.base / "wheels"
    make_wheel(wheels)
    env = {**os.environ, "UV_CACHE_DIR": str(box.cache / "uv"), "UV_NO_PROGRESS": "1"}
    warm = box.base / "warm-venv"
    subprocess.run([UV, "venv", "-q", "--python", "/usr/bin/python3", str(warm)], env=env, check=True)
    install = ["pip", "install", "-q", "--python", str(warm / "bin/python"), "--offline"]
    subprocess.run([UV, *install, "--find-links", str(wheels), "warrendemo"], env=env, check=True)
    script = f"""
        set -e
        {UV} venv -q --python /usr/bin/python3 .venv
        {UV} pip install --python .venv/bin/python --offline --find-links {wheels} warrendemo
        .venv/bin/python -c 'import sys, warrendemo; print(sys.version_info[:2] == (3, 11), warrendemo.VALUE)'
    """
    r = box.run(
        script,
        "--read",
        str(wheels),
        "--env",
        f"UV_CACHE_DIR={box.cache / 'uv'}",
        "--env",
        "UV_NO_PROGRESS=1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[-2:] == ["True", "42"] and "falling back" not in r.stderr.lower(), r.stderr
    installed = next(box.ws.glob(".venv/lib/python3*/site-packages/warrendemo/data.py"))
    assert installed.stat().st_nlink > 1, "a copy, not a hardlink from the cache"
    assert installed.stat().st_uid == os.getuid()


def test_pip_in_a_venv_installs_and_upgrades_a_package_through_its_stash(box: Box) -> None:
    """The image's `python3 -m venv` (ensurepip) and its pip: install, then replace a
    package (pip moves the old one aside into a temporary directory and back out)."""
    wheels = box.base / "wheels"
    make_wheel(wheels, "warrendemo", "1.0")
    make_wheel(wheels, "warrendemo", "2.0")
    flags = "--no-index --disable-pip-version-check -q --find-links"
    script = f"""
        set -e
        python3 -m venv .venv
        .venv/bin/pip install {flags} {wheels} warrendemo==1.0
        .venv/bin/pip install {flags} {wheels} --upgrade warrendemo
        .venv/bin/pip show warrendemo | grep ^Version
    """
    r = box.run(script, "--read", str(wheels))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["Version:", "2.0"], (r.stdout, r.stderr)
    assert len(list(box.ws.glob(".venv/lib/python3*/site-packages/warrendemo-*.dist-info"))) == 1


def test_the_images_git_inits_commits_runs_hooks_and_adds_a_worktree_at_the_workspace_root(box: Box) -> None:
    script = """
        set -e
        git init -q .
        git config user.email t@example.com
        git config user.name tester
        echo one > a.txt && git add a.txt && git commit -qm first
        printf '#!/bin/sh\\necho hook-ran\\n' > .git/hooks/post-commit && chmod +x .git/hooks/post-commit
        echo two >> a.txt && git commit -qam second
        git worktree add -q wt HEAD
        git log --oneline | wc -l
    """
    r = box.run(script)
    assert r.returncode == 0, r.stderr
    assert "hook-ran" in r.stdout + r.stderr and r.stdout.strip().splitlines()[-1] == "2"
    log = subprocess.run(["git", "-C", str(box.ws), "log", "--format=%s"], capture_output=True, text=True)
    assert log.stdout.split() == ["second", "first"]
    # Hooks made inside never run for host git.
    assert not (box.ws / ".git" / "hooks" / "post-commit").exists()


@pytest.mark.parametrize("where", ["layer", "host"])
def test_a_rename_from_tmpdir_into_the_workspace(box: Box, where: str) -> None:
    """From the sandbox's TMPDIR into /workspace: a rename where the workspace lives in
    the sandbox's layer. A host workspace is another mount than the image's /tmp: EXDEV,
    as for a container with a bound workspace (tools copy then; pip's stash above)."""
    r = box.run(
        f"cd /workspace && python3 -c {shlex.quote(RENAME_FROM_TMPDIR)} && cat renamed",
        workspace="none" if where == "layer" else None,
    )
    assert r.returncode == (0 if where == "layer" else 1), r.stderr
    tmpdir, outcome = r.stdout.split("\n")[:2]
    assert tmpdir == "/tmp"
    assert outcome == ("renamed" if where == "layer" else os.strerror(18)), r.stdout


def test_renaming_directories_of_the_image_and_of_its_python_is_a_rename(box: Box) -> None:
    code = """
import os, json
os.rename("/usr/share/doc", "/usr/share/doc2")
os.rename("/usr/lib/python3.11/json", "/usr/lib/python3.11/json-moved")
os.rename("/usr/lib/python3.11/json-moved", "/usr/lib/python3.11/json")
import importlib; importlib.invalidate_caches()
print(sorted(os.listdir("/usr/share/doc2"))[:1] != [], json.dumps([1]))
"""
    r = box.run(f"python3 -c {shlex.quote(code)}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "[1]"]


def test_tmpdir_is_private_and_loopback_works(box: Box) -> None:
    code = """
import socket, tempfile, threading, os
f = tempfile.NamedTemporaryFile(delete=False); f.write(b'x'); print(os.path.dirname(f.name))
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
threading.Thread(target=lambda: srv.accept()[0].sendall(b'pong'), daemon=True).start()
print(socket.create_connection(srv.getsockname(), timeout=5).recv(4).decode())
"""
    marker = Path("/tmp") / f"warren-imgfid-host-{os.getpid()}"
    marker.write_text("host")
    try:
        r = box.run(f"python3 -c {shlex.quote(code)}; test -e {marker} && echo HOST-TMP-VISIBLE")
    finally:
        marker.unlink()
    assert r.returncode != 0 or "HOST-TMP-VISIBLE" not in r.stdout
    assert r.stdout.split()[:2] == ["/tmp", "pong"], r.stderr


def test_apt_installs_a_package_with_its_maintainer_scripts_as_root_inside(box: Box) -> None:
    """What E2B, Daytona and Modal users do first: ``apt-get update && apt-get install``,
    as root inside, through the allowlist (Debian's mirror is a registry this machine
    reaches, as the image's build does). apt's download methods switch to ``_apt`` with
    setgroups, which a sandbox mapping one id refuses: the image's root downloads
    (``plan.envroot.APT_SANDBOX``), and every file of the image is root's inside."""
    hosts = ("--network", "allow", "--allow-host", "deb.debian.org", "--allow-host", "security.debian.org")
    r = box.run(
        """
        set -e
        apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q curl
        dpkg -s curl | grep '^Status'
        curl --version | head -1
        """,
        *hosts,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Status: install ok installed" in r.stdout and r.stdout.splitlines()[-1].startswith("curl ")
    assert "setgroups" not in r.stdout + r.stderr
