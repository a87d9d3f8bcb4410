"""The failure catalog (DESIGN.md F1-F4): what every peer breaks must work here."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import Layout, make_wheel
from warren.plan.mounts import WRITABLE_FRESH, within


def _apart(layout: Layout) -> bool:
    """W and C under /tmp: each is grafted alone into the sandbox's writable /tmp (on a
    read-only view of what is around them), so they cannot share a mount: a known limit
    that `warren plan` notes (docs/known-limits.md)."""
    return within(str(layout.root), WRITABLE_FRESH)


def test_files_and_dirs_created_inside_are_owned_by_the_caller(any_layout: Layout) -> None:
    r = any_layout.run(["sh", "-c", "echo hi > made.txt && mkdir made.d && id -u"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(os.getuid())
    for name in ("made.txt", "made.d"):
        st = (any_layout.workspace / name).stat()
        assert (st.st_uid, st.st_gid) == (os.getuid(), os.getgid())
    assert (any_layout.workspace / "made.txt").read_text() == "hi\n"


def test_hardlink_between_cache_and_workspace_works(any_layout: Layout) -> None:
    src = any_layout.cache / "f"
    src.write_text("payload")
    code = f"""
import os
os.makedirs('.venv', exist_ok=True)
os.link({str(src)!r}, '.venv/f')
"""
    r = any_layout.py(code)
    if _apart(any_layout):
        assert r.returncode != 0 and "Invalid cross-device link" in r.stderr, r.stderr
        assert src.stat().st_nlink == 1
        return
    assert r.returncode == 0, r.stderr
    linked = any_layout.workspace / ".venv" / "f"
    assert linked.stat().st_ino == src.stat().st_ino
    assert src.stat().st_nlink == 2


def test_renameat2_noreplace_of_new_dir_in_cache_and_rename_into_workspace(any_layout: Layout) -> None:
    c = any_layout.cache
    (c / "g").write_text("moved")
    code = f"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
os.makedirs({str(c / "archive-v0")!r}, exist_ok=True)
os.mkdir({str(c / ".tmpX")!r})
open({str(c / ".tmpX" / "inner")!r}, "w").write("x")
r = libc.syscall(316, -100, {str(c / ".tmpX").encode()!r}, -100, {str(c / "archive-v0" / "ID").encode()!r}, 1)
assert r == 0, os.strerror(ctypes.get_errno())
os.rename({str(c / "g")!r}, "g")
"""
    r = any_layout.py(code)
    if _apart(any_layout):
        # Within the cache a rename is one; from the cache into the workspace, EXDEV.
        assert r.returncode != 0 and "Invalid cross-device link" in r.stderr, r.stderr
        assert (c / "archive-v0" / "ID" / "inner").read_text() == "x"
        assert (c / "g").read_text() == "moved"
        return
    assert r.returncode == 0, r.stderr
    assert (c / "archive-v0" / "ID" / "inner").read_text() == "x"
    assert not (c / ".tmpX").exists()
    assert (any_layout.workspace / "g").read_text() == "moved"
    assert not (c / "g").exists()


def test_cache_marker_named_git_opens_for_writing(any_layout: Layout) -> None:
    marker_dir = any_layout.cache / "sdists-v9"
    marker_dir.mkdir()
    (marker_dir / ".git").write_text("")
    r = any_layout.py(f"open({str(marker_dir / '.git')!r}, 'w').write('gitdir-marker')")
    assert r.returncode == 0, r.stderr
    assert (marker_dir / ".git").read_text() == "gitdir-marker"


def _uv() -> str:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if not os.path.exists(uv):
        pytest.fail("uv is not installed next to this Python; scripts/test installs it")
    return uv


def test_uv_install_from_warm_cache_hardlinks_into_workspace_venv(any_layout: Layout) -> None:
    uv = _uv()
    wheels = any_layout.root / "wheels"
    make_wheel(wheels)
    env = {**os.environ, "UV_CACHE_DIR": str(any_layout.cache), "UV_NO_PROGRESS": "1"}
    # Warm the cache outside the sandbox, as a developer's earlier install would.
    warm = any_layout.root / "warm-venv"
    subprocess.run([uv, "venv", "-q", "--python", "/usr/bin/python3", str(warm)], env=env, check=True)
    subprocess.run(
        [
            uv,
            "pip",
            "install",
            "-q",
            "--python",
            str(warm / "bin" / "python"),
            "--offline",
            "--find-links",
            str(wheels),
            "warrendemo",
        ],
        env=env,
        check=True,
    )
    script = textwrap.dedent(
        f"""
        set -e
        {uv} venv -q --python /usr/bin/python3 .venv
        {uv} pip install --python .venv/bin/python --offline --find-links {wheels} warrendemo
        .venv/bin/python -c 'import warrendemo; print(warrendemo.VALUE)'
        """
    )
    r = any_layout.run(
        ["sh", "-c", script],
        "--env",
        f"UV_CACHE_DIR={any_layout.cache}",
        "--env",
        "UV_NO_PROGRESS=1",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().endswith("42")
    installed = next(any_layout.workspace.glob(".venv/lib/python3*/site-packages/warrendemo/data.py"))
    if _apart(any_layout):
        # uv says so and copies, as it does between two filesystems.
        assert "falling back" in r.stderr.lower(), r.stderr
        assert installed.stat().st_nlink == 1
        return
    assert "falling back" not in r.stderr.lower(), r.stderr
    assert installed.stat().st_nlink > 1, "installed file is a copy, not a hardlink from the cache"
    assert installed.stat().st_uid == os.getuid()


def test_git_init_commit_and_hooks_work_at_workspace_root(layout: Layout) -> None:
    script = """
set -e
git init -q .
git config user.email t@example.com
git config user.name tester
echo one > a.txt
git add a.txt
git commit -qm first
printf '#!/bin/sh\\necho hook-ran\\n' > .git/hooks/post-commit
chmod +x .git/hooks/post-commit
echo two >> a.txt
git commit -qam second
git worktree add -q wt HEAD
git log --oneline | wc -l
"""
    r = layout.run(["sh", "-c", script])
    assert r.returncode == 0, r.stderr
    assert "hook-ran" in r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "2"
    assert (layout.workspace / ".git" / "HEAD").exists()


def test_tmpdir_is_writable_and_private(layout: Layout, tmp_path: Path) -> None:
    marker = tmp_path / "host-tmp-marker"
    marker.write_text("host")
    r = layout.py(
        "import tempfile, os; f = tempfile.NamedTemporaryFile(delete=False); f.write(b'x'); "
        "print(os.path.dirname(f.name)); print(os.path.exists(" + repr(str(marker)) + "))"
    )
    assert r.returncode == 0, r.stderr
    tmpdir, seen = r.stdout.split()
    assert tmpdir.startswith("/tmp")
    assert seen == "False", "host /tmp content must not be visible"


def test_loopback_inside_the_sandbox_works(layout: Layout) -> None:
    code = """
import socket, threading
srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen()
threading.Thread(target=lambda: srv.accept()[0].sendall(b'pong'), daemon=True).start()
c = socket.create_connection(srv.getsockname(), timeout=5)
print(c.recv(4).decode())
"""
    r = layout.py(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "pong"
