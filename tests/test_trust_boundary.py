"""The trust boundary against an untrusted repository or agent: each hole is closed,
judged from the host side (a marker not created, a host file unchanged), and the
fidelity the fix could cost is kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import Layout
from warren.server.links import LinkScanner

# Runs inside the sandbox: try each operation, report the outcome (or errno name) as JSON.
ATTEMPT = r"""
import errno, json, os, sys
results = {}
def attempt(name, fn):
    try:
        out = fn()
        results[name] = out if isinstance(out, str) else "ALLOWED"
    except OSError as e:
        results[name] = errno.errorcode.get(e.errno, str(e.errno))
"""


def _attempts(layout: Layout, body: str, *flags: str) -> dict[str, str]:
    r = layout.py(ATTEMPT + body + "\nprint(json.dumps(results))", *flags)
    assert r.returncode == 0, r.stderr
    return dict(json.loads(r.stdout.strip().splitlines()[-1]))


@pytest.fixture(autouse=True, params=["run", "exec"])
def via(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each claim holds for a one-shot `warren run` and for `warren exec`."""
    monkeypatch.setattr(Layout, "via", request.param)
    return str(request.param)


# --- 6: pre-existing hard links to files outside the writable roots ------------------


def test_a_hardlink_to_an_outside_file_is_masked(layout: Layout) -> None:
    secret = layout.root / "secret.txt"
    secret.write_text("SECRET-VALUE\n")
    secret.chmod(0o600)
    public = layout.root / "public.txt"
    public.write_text("public\n")
    public.chmod(0o644)
    os.link(secret, layout.workspace / "sec-link")
    os.link(public, layout.workspace / "pub-link")
    # A file linked between two writable roots is explained: it stays writable.
    (layout.cache / "shared.txt").write_text("cache\n")
    os.link(layout.cache / "shared.txt", layout.workspace / "from-cache")
    res = _attempts(
        layout,
        """
attempt('read_secret', lambda: open('sec-link').read())
attempt('write_secret', lambda: open('sec-link', 'a').write('x'))
attempt('read_public', lambda: open('pub-link').read())
attempt('write_public', lambda: open('pub-link', 'a').write('x'))
attempt('write_cache_link', lambda: open('from-cache', 'a').write('inside\\n'))
""",
    )
    assert res["read_secret"] == "EACCES" and res["write_secret"] == "EACCES", res
    assert res["read_public"] == "public\n", res
    assert res["write_public"] in {"EROFS", "EACCES"}, res
    assert res["write_cache_link"] == "ALLOWED", res
    assert secret.read_text() == "SECRET-VALUE\n" and public.read_text() == "public\n"
    assert (layout.cache / "shared.txt").read_text() == "cache\ninside\n"


def test_the_link_scan_remembers_and_sees_new_links(tmp_path: Path, via: str) -> None:
    if via == "exec":
        pytest.skip("pure scanner test: one launch path is enough")
    ws, shared, out = tmp_path / "ws", tmp_path / "uv-cache", tmp_path / "elsewhere"
    for d in (ws / "sub", shared, out):
        d.mkdir(parents=True)
    (shared / "pkg.py").write_text("x")
    os.link(shared / "pkg.py", ws / "sub" / "pkg.py")
    os.link(shared / "pkg.py", out / "other-venv-pkg.py")  # another project's venv
    (out / "secret").write_text("s")
    os.link(out / "secret", ws / "sub" / "leak")
    scanner = LinkScanner()
    roots, shared_roots = [str(ws), str(shared)], [str(shared)]
    first = scanner.scan(roots, shared_roots)
    # The cache file is shared by design; the secret's link is not explained.
    assert [o.path for o in first] == [str(ws / "sub" / "leak")]
    assert scanner.scan(roots, shared_roots) == first  # warm: same answer
    (out / "late").write_text("l")
    os.link(out / "late", ws / "late")  # a new link into the workspace changes its directory
    assert [o.path for o in scanner.scan(roots, shared_roots)] == [str(ws / "late"), str(ws / "sub" / "leak")]
    saved = tmp_path / "links.cache"
    scanner.save(str(saved))
    again = LinkScanner()
    again.load(str(saved))
    assert again.dirs == scanner.dirs
    assert [o.path for o in again.scan(roots, shared_roots)] == [str(ws / "late"), str(ws / "sub" / "leak")]
    saved.write_bytes(b"garbage")
    broken = LinkScanner()
    broken.load(str(saved))  # an unreadable memory means a cold scan, not an error
    assert broken.dirs == {}
