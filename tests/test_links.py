"""Workspace files that are hard links to files outside the writable roots: the outside
file's content and secrecy are protected, and the workspace file behaves as any file
(git gc, repack, rm, mv, a local clone), judged from the host; no stale answer between
runs in either direction."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import Layout, _make_layout, make_wheel, module_state, run_cli
from warren._core import treewalk
from warren.errors import SetupError
from warren.server import links, unshare
from warren.server.links import LinkScanner

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


@pytest.fixture(scope="module", params=["native", "python"], autouse=True)
def walk(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every claim holds with the workspace walked by ``warren-walk`` and by the Python
    fallback (the supervisor of each is its own: it reads the switch when it starts)."""
    if request.param == "python" and os.environ.get("WARREN_TEST_PAIRED") == "user":
        # Time: the fallback's answers equal the native walk's for this caller too
        # (tests/test_treewalk.py, both halves, on hostile trees); its launches run here
        # in the root half.
        pytest.skip("the Python walk's launches run in the root half (scripts/test)")
    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setenv("WARREN_NATIVE_WALK", "0")
        else:  # every tree natively, however small (by default, only larger ones)
            mp.setenv("WARREN_NATIVE_WALK", "1")
            assert treewalk.program() is not None, "warren-walk is not installed (run scripts/setup)"
        yield str(request.param)


@pytest.fixture(scope="module")
def state_home(walk: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


@pytest.fixture(params=["run", "exec"])
def via(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, state_home: Path) -> str:
    """Each claim holds for a one-shot `warren run` and for a long-lived sandbox."""
    monkeypatch.setattr(Layout, "via", request.param)
    return str(request.param)


def _git(cwd: Path, *args: str) -> str:
    r = subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env={**os.environ, **GIT_ENV}, timeout=60
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def _sh(
    layout: Layout, script: str, *flags: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return layout.run(["sh", "-c", script], *flags, env={**GIT_ENV, **(env or {})})


def _outside_repo(base: Path) -> Path:
    """A repository outside the workspace with loose objects, one of them unreachable."""
    repo = base / "outside" / "repo"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    for i in range(3):
        (repo / f"f{i}").write_text(f"content {i}\n")
        _git(repo, "add", f"f{i}")
        _git(repo, "commit", "-qm", f"c{i}")
    for name in ("junk", "junk2"):
        oid = subprocess.run(
            ["git", "hash-object", "-w", "--stdin"],
            cwd=repo,
            input=f"{name}\n",
            capture_output=True,
            text=True,
        ).stdout.strip()
        (repo / f".{name}").write_text(oid)
    return repo


def _objects(repo: Path) -> dict[str, tuple[int, str]]:
    """Every file under the repository's objects (a bare one's too): (inode, sha256 of its
    content)."""
    out = {}
    objects = repo / ".git" / "objects" if (repo / ".git").is_dir() else repo / "objects"
    assert objects.is_dir(), f"{repo} has no objects"
    for p in sorted(objects.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(repo))] = (p.stat().st_ino, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def _loose(repo: Path, oid: str) -> Path:
    return repo / ".git" / "objects" / oid[:2] / oid[2:]


def test_a_workspace_cloned_from_an_outside_repository_gcs_repacks_and_removes_as_on_the_host(
    layout: Layout, via: str
) -> None:
    repo = _outside_repo(layout.root)
    junk, junk2 = (repo / ".junk").read_text(), (repo / ".junk2").read_text()
    ws = layout.workspace / "clone"
    _git(layout.workspace, "clone", "-q", str(repo), str(ws))
    # Control: the clone really shares the outside repository's objects.
    assert _loose(ws, junk).stat().st_ino == _loose(repo, junk).stat().st_ino
    before = _objects(repo)
    head = _git(ws, "rev-parse", "HEAD").strip()
    obj = f".git/objects/{head[:2]}/{head[2:]}"
    # The sandbox uses the workspace names first: mv (away and back), rm, an append;
    # then git's own clean-up.
    script = (
        f"mv {obj} moved && mv moved {obj} && rm {_loose(Path(), junk2)} "
        f"&& chmod u+w {_loose(Path(), junk)} && echo tampered >> {_loose(Path(), junk)} "
        "&& git gc --prune=now -q && git repack -adq && git fsck --no-progress && echo OK"
    )
    r = _sh(layout, f"cd clone && {script}")
    assert r.returncode == 0 and r.stdout.strip().endswith("OK"), (r.stdout, r.stderr)
    assert "Device or resource busy" not in r.stderr and "unable to unlink" not in r.stderr, r.stderr
    # Judged on the host: the unreachable object is gone, no loose object is left.
    assert not _loose(ws, junk).exists() and not _loose(ws, junk2).exists()
    assert not [p for p in (ws / ".git" / "objects").glob("??/*")], "loose objects left after gc"
    # The outside repository is exactly as it was (same inodes, same content) and sound.
    assert _objects(repo) == before
    _git(repo, "fsck", "--no-progress")


def test_writing_through_the_workspace_name_never_changes_the_outside_file(layout: Layout, via: str) -> None:
    outside = layout.root / "elsewhere"
    outside.mkdir()
    target = outside / "config.txt"
    target.write_text("outside\n")
    target.chmod(0o640)
    os.utime(target, ns=(1_000_000_000, 1_000_000_000))
    os.link(target, layout.workspace / "config.txt")
    script = (
        "cat config.txt && echo inside >> config.txt && "
        "python3 -c \"f=open('config.txt','r+'); f.write('X'); f.close()\" && cat config.txt"
    )
    r = _sh(layout, script)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "outside\nXutside\ninside\n", r.stdout  # an ordinary file inside
    assert target.read_text() == "outside\n"
    assert target.stat().st_nlink == 1
    mine = layout.workspace / "config.txt"
    assert mine.read_text() == "Xutside\ninside\n"
    assert mine.stat().st_mode & 0o777 == 0o640  # the copy kept the mode
    # Control: with the outside directory granted, the same write reaches it (the test
    # sees a write through a shared inode when there is one).
    os.link(target, layout.workspace / "granted.txt")
    r = _sh(layout, "echo inside >> granted.txt", "--write", str(outside))
    assert r.returncode == 0, r.stderr
    assert target.read_text() == "outside\ninside\n"


def test_the_copy_keeps_the_mtime_and_the_inside_links_of_the_file(layout: Layout, via: str) -> None:
    outside = layout.root / "elsewhere"
    outside.mkdir()
    target = outside / "data.bin"
    target.write_bytes(b"\x00data" * 1000)
    os.utime(target, ns=(1_000_000_000, 2_000_000_000))
    (layout.workspace / "sub").mkdir()
    os.link(target, layout.workspace / "a.bin")
    os.link(target, layout.workspace / "sub" / "b.bin")
    r = _sh(layout, "echo more >> a.bin")
    assert r.returncode == 0, r.stderr
    a, b = layout.workspace / "a.bin", layout.workspace / "sub" / "b.bin"
    assert a.stat().st_ino == b.stat().st_ino != target.stat().st_ino
    assert a.stat().st_nlink == 2 and target.stat().st_nlink == 1
    assert b.read_bytes() == b"\x00data" * 1000 + b"more\n"
    assert target.read_bytes() == b"\x00data" * 1000


def test_a_link_added_from_outside_to_a_file_of_an_unchanged_directory_is_seen(
    layout: Layout, via: str, walk: str
) -> None:
    """Judged on the host: the file outside is never written. With the walk before the
    command (a workspace walked in Python) the command writes a copy of its own. Where
    the walk goes beside the command (every tree walked natively after launch here, as a
    workspace past ``treewalk.SMALL`` entries is; its directories watched, its last walk
    clean) the link raised no event to expect it: the command may be stopped before its
    write, the file given an inode of its own, and told to run again, which then writes."""
    sub = layout.workspace / "sub"
    sub.mkdir()
    (sub / "f.txt").write_text("mine\n")
    assert _sh(layout, "cat sub/f.txt").returncode == 0  # the supervisor has seen it all
    mtime = sub.stat().st_mtime_ns
    outside = layout.root / "elsewhere"
    outside.mkdir()
    os.link(sub / "f.txt", outside / "g.txt")
    assert sub.stat().st_mtime_ns == mtime  # control: the directory did not change
    r = _sh(layout, "echo inside >> sub/f.txt")
    assert (outside / "g.txt").read_text() == "mine\n", ("written through the link", r.stderr)
    if r.returncode != 0 and walk == "native":
        told = "is linked from outside the workspace" in r.stderr and "run the command again" in r.stderr
        assert told, r.stderr
        assert (sub / "f.txt").stat().st_nlink == 1, ("no inode of its own", r.stderr)
        r = _sh(layout, "echo inside >> sub/f.txt")
    assert r.returncode == 0, r.stderr
    assert (sub / "f.txt").read_text() == "mine\ninside\n"


# Every way a command changes a file through one of its names, each on its own file
# linked from outside: (what the command does, the name it writes through).
_WRITES = {
    "truncating open": "python3 -c \"open('trunc.txt', 'w').write('T')\"",
    "truncate(2)": "truncate -s 2 shrink.txt",
    "reopen of a read-only fd": "exec 3<reopen.txt && echo R >> /proc/self/fd/3 && exec 3<&-",
    "shared mmap": (
        "python3 -c \"import mmap; f=open('mapped.bin','r+b'); m=mmap.mmap(f.fileno(), 0); "
        "m[0:1]=b'M'; m.flush(); m.close()\""
    ),
    "chmod": "chmod 0600 mode.txt",
    "utimensat": "touch -m -d @7 times.txt",
}
_WRITTEN = ("trunc.txt", "shrink.txt", "reopen.txt", "mapped.bin", "mode.txt", "times.txt")


def _linked_from(outside: Path, workspace: Path) -> dict[str, tuple[bytes, int, int]]:
    """The files of ``_WRITTEN``, made in ``outside`` and linked into ``workspace``:
    each one's content, mode and mtime."""
    outside.mkdir(exist_ok=True)
    was = {}
    for name in _WRITTEN:
        f = outside / name
        f.write_bytes(b"outside " + name.encode() + b"\n")
        f.chmod(0o644)
        os.utime(f, ns=(1_000_000_000, 1_000_000_000))
        os.link(f, workspace / name)
        st = f.stat()
        was[name] = (f.read_bytes(), st.st_mode & 0o7777, st.st_mtime_ns)
    return was


def _now(outside: Path) -> dict[str, tuple[bytes, int, int]]:
    return {
        n: (
            (outside / n).read_bytes(),
            (outside / n).stat().st_mode & 0o7777,
            (outside / n).stat().st_mtime_ns,
        )
        for n in _WRITTEN
    }


def test_no_way_of_writing_through_a_workspace_name_changes_the_outside_file(
    layout: Layout, via: str
) -> None:
    """Content (a truncating open, truncate(2), a read-only fd reopened for writing, a
    shared mapping) and metadata (mode, times), each through a workspace name of a file
    linked from outside, judged on the host: the outside file as it was, the workspace
    name changed."""
    outside = layout.root / "elsewhere"
    was = _linked_from(outside, layout.workspace)
    r = _sh(layout, " && ".join(_WRITES.values()) + " && echo done")
    assert r.returncode == 0 and r.stdout == "done\n", (r.stdout, r.stderr)
    assert _now(outside) == was
    assert all((outside / n).stat().st_nlink == 1 for n in _WRITTEN)
    ws = layout.workspace
    assert (ws / "trunc.txt").read_bytes() == b"T"
    assert (ws / "shrink.txt").read_bytes() == b"ou"
    assert (ws / "reopen.txt").read_bytes() == b"outside reopen.txt\nR\n"
    assert (ws / "mapped.bin").read_bytes().startswith(b"Mutside")
    assert (ws / "mode.txt").stat().st_mode & 0o777 == 0o600
    assert (ws / "times.txt").stat().st_mtime_ns == 7_000_000_000
    # Control: with the outside directory granted (a shared root: its files are the
    # sandbox's to change), the same commands change the outside files, each of them.
    for name in _WRITTEN:
        (ws / name).unlink()
    was = _linked_from(outside, ws)
    r = _sh(layout, " && ".join(_WRITES.values()) + " && echo done", "--write", str(outside))
    assert r.returncode == 0 and r.stdout == "done\n", (r.stdout, r.stderr)
    now = _now(outside)
    assert [n for n in _WRITTEN if now[n] == was[n]] == []


def test_an_edit_of_a_venv_file_hardlinked_from_a_uv_cache_outside_never_changes_the_cache(
    layout: Layout, via: str
) -> None:
    """uv installs a venv by hard links from its cache; with the cache outside the
    sandbox's writable roots (no uv preset), an edit of an installed file inside changes
    the venv's file and never the cache's (judged on the host), and the venv still
    imports it. Control: the same edit on the host changes the cache."""
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    if not os.path.exists(uv):
        pytest.fail("uv is not installed next to this Python; scripts/test installs it")
    wheels, cache = layout.root / "wheels", layout.root / "uv-cache-outside"
    make_wheel(wheels)
    env = {**os.environ, "UV_CACHE_DIR": str(cache), "UV_NO_PROGRESS": "1", "UV_LINK_MODE": "hardlink"}
    venv = layout.workspace / ".venv"
    subprocess.run([uv, "venv", "-q", "--python", "/usr/bin/python3", str(venv)], env=env, check=True)
    install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--offline"]
    subprocess.run([*install, "--find-links", str(wheels), "warrendemo"], env=env, check=True)
    init = next(venv.glob("lib/python3*/site-packages/warrendemo/__init__.py"))
    in_cache = {p.stat().st_ino: p for p in cache.rglob("*.py") if p.is_file()}
    assert init.stat().st_ino in in_cache, "uv copied, not linked"
    cached_init = in_cache[init.stat().st_ino]
    rel = init.relative_to(layout.workspace)
    r = _sh(
        layout,
        f"echo 'VALUE = 7' >> {rel} && .venv/bin/python -c 'import warrendemo; print(warrendemo.VALUE)'",
    )
    assert r.returncode == 0 and r.stdout == "7\n", (r.stdout, r.stderr)
    assert cached_init.read_text() == "VALUE = 42\n"
    assert init.read_text() == "VALUE = 42\nVALUE = 7\n"
    # Control: the same edit on the host, in a venv installed the same way, reaches the cache.
    mirror = layout.root / "host-venv"
    subprocess.run([uv, "venv", "-q", "--python", "/usr/bin/python3", str(mirror)], env=env, check=True)
    install[5] = str(mirror / "bin" / "python")
    subprocess.run([*install, "--find-links", str(wheels), "warrendemo"], env=env, check=True)
    host_init = next(mirror.glob("lib/python3*/site-packages/warrendemo/__init__.py"))
    assert host_init.stat().st_ino == cached_init.stat().st_ino
    with open(host_init, "a") as f:
        f.write("VALUE = 7\n")
    assert cached_init.read_text() == "VALUE = 42\nVALUE = 7\n"


def test_a_file_whose_outside_link_is_gone_is_a_plain_file_in_the_next_run(layout: Layout, via: str) -> None:
    denied = layout.root / "private"
    denied.mkdir()
    (denied / "key").write_text("KEY-MATERIAL\n")
    (layout.workspace / "sub").mkdir()
    os.link(denied / "key", layout.workspace / "sub" / "key")
    os.link(denied / "key", layout.workspace / "sub" / "key2")
    first = _sh(layout, "cat sub/key", "--deny", str(denied))
    assert "KEY-MATERIAL" not in first.stdout and first.returncode != 0
    os.unlink(denied / "key")  # the outside name goes; the workspace's directory is unchanged
    ino = (layout.workspace / "sub" / "key").stat().st_ino
    r = _sh(layout, "cat sub/key && mv sub/key sub/moved && rm sub/key2 && echo done", "--deny", str(denied))
    assert r.returncode == 0, r.stderr
    assert r.stdout == "KEY-MATERIAL\ndone\n"
    # Nothing was copied: only inside links, so the file kept its inode.
    assert (layout.workspace / "sub" / "moved").stat().st_ino == ino


def test_a_denied_file_linked_into_the_workspace_is_not_readable_inside(layout: Layout, via: str) -> None:
    denied = layout.root / "private"
    denied.mkdir()
    secret = denied / "token"
    secret.write_text("TOPSECRET\n")
    secret.chmod(0o644)  # world-readable: the policy, not the mode, decides
    os.link(secret, layout.workspace / "token")
    script = "cat token; cp token copy 2>/dev/null; cat copy 2>/dev/null; echo end"
    r = _sh(layout, script, "--deny", str(denied))
    assert "TOPSECRET" not in r.stdout + r.stderr, r.stdout
    assert r.stdout.endswith("end\n"), (r.stdout, r.stderr)
    # Host: nothing in the workspace holds the secret but its own name, which warren
    # left as it was (never copied).
    assert (layout.workspace / "token").stat().st_ino == secret.stat().st_ino
    for p in layout.workspace.rglob("*"):
        if p.is_file() and p.name != "token":
            assert b"TOPSECRET" not in p.read_bytes(), p
    assert secret.read_text() == "TOPSECRET\n"
    # Control: without the deny, the same command prints it.
    r = _sh(layout, "cat token")
    assert r.stdout == "TOPSECRET\n", (r.stdout, r.stderr)


@pytest.fixture
def var_layout(request: pytest.FixtureRequest) -> Iterator[Layout]:
    """W and C under /var/tmp: a read-only workspace under /tmp is not in the sandbox's
    fresh /tmp at all."""
    base = Path(tempfile.mkdtemp(prefix="warren-links-", dir="/var/tmp"))
    yield _make_layout(base / "proj")
    shutil.rmtree(base, ignore_errors=True)


def test_a_denied_file_linked_into_a_read_only_workspace_is_not_readable_inside(
    var_layout: Layout, via: str
) -> None:
    layout = var_layout
    denied = layout.root / "private"
    denied.mkdir()
    (denied / "token").write_text("TOPSECRET\n")
    (layout.root / "plain").write_text("plain\n")
    os.link(denied / "token", layout.workspace / "token")
    os.link(layout.root / "plain", layout.workspace / "plain")
    ino = (layout.workspace / "plain").stat().st_ino
    r = _sh(layout, "cat token; cat plain; echo end", "--read-only-workspace", "--deny", str(denied))
    assert "TOPSECRET" not in r.stdout and r.stdout.endswith("plain\nend\n"), (r.stdout, r.stderr)
    assert (layout.workspace / "plain").stat().st_ino == ino  # read-only: nothing to copy
    # Control: without the deny, the same command prints it.
    r = _sh(layout, "cat token", "--read-only-workspace")
    assert r.stdout == "TOPSECRET\n", (r.stdout, r.stderr)


def test_a_file_linked_from_the_default_deny_list_is_not_readable_inside(layout: Layout, via: str) -> None:
    home = layout.root / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_test"
    key.write_text("PRIVATE-KEY\n")
    key.chmod(0o644)
    os.link(key, layout.workspace / "id_test")
    r = _sh(layout, "cat id_test; echo end", env={"HOME": str(home)})
    assert "PRIVATE-KEY" not in r.stdout and r.stdout.endswith("end\n"), (r.stdout, r.stderr)
    # Control: with the default deny list off, it is readable.
    r = _sh(layout, "cat id_test", "--no-default-deny", env={"HOME": str(home)})
    assert r.stdout == "PRIVATE-KEY\n", (r.stdout, r.stderr)


def test_a_local_clone_inside_the_workspace_hardlinks_its_objects(layout: Layout, via: str) -> None:
    repo = _outside_repo(layout.root)
    _git(layout.workspace, "clone", "-q", str(repo), "src")  # objects hardlinked from outside
    r = _sh(layout, "git clone -q src c && git -C c fsck --no-progress --no-dangling && echo OK")
    assert r.returncode == 0 and r.stdout == "OK\n", (r.stdout, r.stderr)
    src, c = _objects(layout.workspace / "src"), _objects(layout.workspace / "c")
    shared = [k for k in c if k in src and c[k][0] == src[k][0]]
    assert len(shared) >= 10 and len(shared) == len(src), (len(shared), len(src))
    # ... and none of them is the outside repository's inode.
    outside = {ino for ino, _sha in _objects(repo).values()}
    assert not outside & {ino for ino, _sha in c.values()}


def test_a_local_clone_of_the_workspace_repository_hardlinks_its_objects(layout: Layout, via: str) -> None:
    _git(layout.workspace, "init", "-q")
    (layout.workspace / "f").write_text("x\n")
    _git(layout.workspace, "add", "f")
    _git(layout.workspace, "commit", "-qm", "c")
    r = _sh(layout, "git clone -q --bare . bare.git && echo OK")
    assert r.returncode == 0, r.stderr
    here, bare = _objects(layout.workspace), _objects(layout.workspace / "bare.git")
    assert any(ino in {i for i, _s in here.values()} for ino, _s in bare.values()), "objects were copied"


# --- the scan and the copy, directly -----------------------------------------------


def test_the_scan_answers_from_the_files_not_from_memory(tmp_path: Path) -> None:
    ws, shared, out, denied = (
        tmp_path / "ws",
        tmp_path / "uv-cache",
        tmp_path / "elsewhere",
        tmp_path / "deny",
    )
    for d in (ws / "sub", shared, out, denied):
        d.mkdir(parents=True)
    (shared / "pkg.py").write_text("x")
    os.link(shared / "pkg.py", ws / "sub" / "pkg.py")
    os.link(shared / "pkg.py", out / "other-venv-pkg.py")  # another project's venv
    (out / "plain").write_text("s")
    os.link(out / "plain", ws / "sub" / "plain")
    (denied / "secret").write_text("s")
    os.link(denied / "secret", ws / "secret")
    (ws / "sub" / "mine").write_text("m")
    scanner = LinkScanner()
    roots, shared_roots = [str(ws), str(shared)], [str(shared)]

    def scan() -> list[tuple[str, bool]]:
        return [(o.path, o.secret) for o in scanner.scan(roots, shared_roots, [str(denied)])]

    # The cache file is shared by design; the others are not explained.
    assert scan() == [(str(ws / "secret"), True), (str(ws / "sub" / "plain"), False)]
    assert scan() == [(str(ws / "secret"), True), (str(ws / "sub" / "plain"), False)]  # warm
    mtime = (ws / "sub").stat().st_mtime_ns
    os.link(ws / "sub" / "mine", out / "mine-too")  # a link from outside: sub does not change
    os.unlink(out / "plain")  # and one goes away
    assert (ws / "sub").stat().st_mtime_ns == mtime
    assert scan() == [(str(ws / "secret"), True), (str(ws / "sub" / "mine"), False)]
    saved = tmp_path / "links.cache"
    scanner.save(str(saved))
    again = LinkScanner()
    again.load(str(saved))
    assert again.dirs == scanner.dirs
    saved.write_bytes(b"garbage")
    broken = LinkScanner()
    broken.load(str(saved))  # an unreadable memory means a cold scan, not an error
    assert broken.dirs == {}


def test_a_cache_directory_changed_in_the_same_tick_is_read_again(tmp_path: Path) -> None:
    ws, cache = tmp_path / "ws", tmp_path / "cache"
    ws.mkdir()
    cache.mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "f").write_text("x")
    os.link(tmp_path / "out" / "f", ws / "f")
    scanner = LinkScanner()
    assert [o.path for o in scanner.scan([str(ws), str(cache)], [str(cache)])] == [str(ws / "f")]
    # The cache gains a name of it, and its directory's time is set back to what the
    # scanner saw: a memory keyed on fresh timestamps alone would miss it.
    st = cache.stat()
    os.link(ws / "f", cache / "f")
    os.utime(cache, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert scanner.scan([str(ws), str(cache)], [str(cache)]) == []


def test_the_copy_never_replaces_a_name_that_is_no_longer_that_file(tmp_path: Path) -> None:
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    (out / "f").write_text("outside\n")
    os.link(out / "f", ws / "f")
    st = (ws / "f").stat()
    # Since the scan, the sandbox replaced the name by its own file, and a directory
    # by a link to the outside.
    os.unlink(ws / "f")
    (ws / "f").write_text("sandbox's\n")
    (ws / "d").symlink_to(out)
    planned = [(str(ws / "f"), st.st_dev, st.st_ino), (str(ws / "d" / "f"), st.st_dev, st.st_ino)]
    assert unshare.own_inodes(str(ws), planned) == 0
    assert (ws / "f").read_text() == "sandbox's\n"
    assert (out / "f").read_text() == "outside\n" and (out / "f").stat().st_ino == st.st_ino
    assert sorted(p.name for p in ws.iterdir()) == ["d", "f"]  # no temporary file left
    with pytest.raises(SetupError):
        unshare.own_inodes(str(tmp_path / "missing"), planned)


def test_a_name_replaced_while_the_copy_is_made_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sandbox wins the race between the check and the swap: what it put there is
    swapped back, the copy dropped, the outside file untouched."""
    ws, out = tmp_path / "ws", tmp_path / "out"
    ws.mkdir()
    out.mkdir()
    (out / "f").write_text("outside\n")
    os.link(out / "f", ws / "f")
    st = (ws / "f").stat()
    real_copy = unshare._copy

    def racing_copy(pfd: int, name: str, tmp: str, key: tuple[int, int]) -> int:
        fd = real_copy(pfd, name, tmp, key)
        os.unlink(ws / "f")
        (ws / "f").write_text("sandbox's\n")  # between the copy and the swap
        return fd

    monkeypatch.setattr(unshare, "_copy", racing_copy)
    assert unshare.own_inodes(str(ws), [(str(ws / "f"), st.st_dev, st.st_ino)]) == 0
    assert (ws / "f").read_text() == "sandbox's\n"
    assert [p.name for p in ws.iterdir()] == ["f"]
    assert (out / "f").read_text() == "outside\n" and (out / "f").stat().st_nlink == 1


def test_plan_shows_own_inodes_and_denied_links(layout: Layout, state_home: Path) -> None:
    (layout.root / "d").mkdir()
    (layout.root / "d" / "s").write_text("s")
    (layout.root / "p").write_text("p")
    os.link(layout.root / "d" / "s", layout.workspace / "s")
    os.link(layout.root / "p", layout.workspace / "p")
    ino = (layout.workspace / "p").stat().st_ino
    r = run_cli(["plan", "--deny", str(layout.root / "d")], cwd=layout.workspace)
    assert r.returncode == 0, r.stderr
    assert f"own inode {layout.workspace}/p" in r.stdout, r.stdout
    assert f"deny      {layout.workspace}/s" in r.stdout, r.stdout
    assert (layout.workspace / "p").stat().st_ino == ino  # planning changes nothing


def test_a_running_sandbox_writes_its_own_copy_once_a_later_launch_has_made_it(
    layout: Layout, state_home: Path
) -> None:
    """A link made from outside while a sandbox runs reaches that sandbox (a known limit:
    docs/known-limits.md); the next launch on the workspace gives the name its own inode, and from
    then on the running sandbox's writes through the name stay in the workspace."""
    name = f"live{os.getpid()}"
    made = run_cli(["create", name], cwd=layout.workspace)
    assert made.returncode == 0, made.stderr
    try:
        # Its first command starts once the launch's walk (after launch here: every tree
        # counts as large) has ended: the link below comes after that walk.
        first = run_cli(["exec", name, "true"], cwd=layout.workspace)
        assert first.returncode == 0, first.stderr
        (layout.workspace / "f.txt").write_text("mine\n")
        outside = layout.root / "elsewhere"
        outside.mkdir()
        os.link(layout.workspace / "f.txt", outside / "g.txt")
        # Control: until then the running sandbox writes the outside file through it.
        r = run_cli(["exec", name, "sh", "-c", "echo before >> f.txt"], cwd=layout.workspace)
        assert r.returncode == 0, r.stderr
        assert (outside / "g.txt").read_text() == "mine\nbefore\n"
        later = run_cli(["run", "--", "true"], cwd=layout.workspace)
        assert later.returncode == 0, later.stderr
        r = run_cli(["exec", name, "sh", "-c", "echo inside >> f.txt"], cwd=layout.workspace)
        assert r.returncode == 0, r.stderr
    finally:
        run_cli(["rm", "-f", name], cwd=layout.workspace)
    assert (outside / "g.txt").read_text() == "mine\nbefore\n"
    assert (layout.workspace / "f.txt").read_text() == "mine\nbefore\ninside\n"


def test_a_local_clone_of_a_repository_made_inside_hardlinks_its_objects(layout: Layout, via: str) -> None:
    script = (
        "export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@x GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@x; set -e;"
        "git init -q made; echo x > made/f; git -C made add f; git -C made commit -qm c;"
        "git clone -q --bare made bare.git; git clone -q bare.git c; echo OK"
    )
    r = _sh(layout, script)
    assert r.returncode == 0 and r.stdout.endswith("OK\n"), (r.stdout, r.stderr)

    def inodes(objects: Path) -> set[int]:
        return {p.stat().st_ino for p in objects.rglob("*") if p.is_file() and len(p.parent.name) == 2}

    bare, c = (
        inodes(layout.workspace / "bare.git" / "objects"),
        inodes(layout.workspace / "c" / ".git" / "objects"),
    )
    assert c and c <= bare, "objects were copied"


def test_a_link_out_of_git_data_never_reaches_a_masked_file_or_a_place_the_sandbox_cannot_write(
    var_layout: Layout, via: str
) -> None:
    """PID 1's broker makes hard links out of a repository's bound git data on the
    writable root's own mount (a local clone hardlinks, above): that must not give a
    name to a file the sandbox sees masked, nor make one outside the writable roots —
    their parent (outside.txt's directory) lies on that very mount (not under /tmp)."""
    layout = var_layout
    ws = layout.workspace
    _git(ws, "init", "-q")
    (ws / "f").write_text("x\n")
    _git(ws, "add", "f")
    _git(ws, "commit", "-qm", "c")
    [obj] = [p for p in (ws / ".git" / "objects").rglob("*") if p.is_file() and p.parent.name != "info"][:1]
    rel = obj.relative_to(ws)
    # A key of the user's (denied by default) with a second name inside the git data.
    home = layout.root / "home"
    (home / ".ssh").mkdir(parents=True)
    key = home / ".ssh" / "id_test"
    key.write_text("PRIVATE-KEY\n")
    key.chmod(0o644)
    (ws / ".git" / "objects" / "ab").mkdir(exist_ok=True)
    os.link(key, ws / ".git" / "objects" / "ab" / "planted")
    ro = layout.root / "ro"
    ro.mkdir()
    # link(2) itself, as git's local clone calls it (ln calls linkat(2), which is not brokered).
    ln = "python3 -c 'import ctypes, sys; sys.exit(ctypes.CDLL(None).link(*map(str.encode, sys.argv[1:])) != 0)'"  # noqa: E501
    script = (
        f"{ln} .git/objects/ab/planted stolen; echo stolen=$?; cat stolen; "
        f"{ln} {rel} {ro}/x; echo ro=$?; {ln} {rel} {layout.outside.parent}/y; echo outside=$?; "
        f"{ln} {rel} kept; echo kept=$?"
    )
    r = _sh(layout, script, "--read", str(ro), env={"HOME": str(home)})
    assert "PRIVATE-KEY" not in r.stdout, (r.stdout, r.stderr)
    assert "stolen=0" not in r.stdout and "ro=0" not in r.stdout and "outside=0" not in r.stdout, r.stdout
    # Judged on the host: the key has no new name, nothing appeared where it may not.
    assert key.stat().st_nlink == 2 and not (ws / "stolen").exists()
    assert not (ro / "x").exists() and not (layout.outside.parent / "y").exists()
    # Control: an object of the repository is linked (the same inode), as on the host.
    assert "kept=0" in r.stdout and (ws / "kept").stat().st_ino == obj.stat().st_ino, r.stdout


def test_a_roots_size_is_counted_once_per_keep_time_and_per_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LinkScanner.large``: whether a workspace is past ``treewalk.SMALL`` entries
    (where its hard-link walk goes beside the first command) is counted once per
    ``SIZE_KEEP`` seconds, not at every planning; a directory made anew at the same
    path is counted afresh; and the memory is bounded."""
    from warren.server import links

    counted: list[int] = []
    real = treewalk.large

    def counting(fd: int) -> bool:
        counted.append(fd)
        return real(fd)

    monkeypatch.setattr(treewalk, "large", counting)
    monkeypatch.delenv("WARREN_NATIVE_WALK", raising=False)
    clock = [1000.0]
    monkeypatch.setattr(links.time, "monotonic", lambda: clock[0])
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    for i in range(treewalk.SMALL + 5):
        (ws / "d" / str(i)).touch()
    scanner = LinkScanner()

    def large() -> bool:
        fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            return scanner.large(fd)
        finally:
            os.close(fd)

    assert large() and large()
    assert len(counted) == 1, "counted once"
    shutil.rmtree(ws / "d")
    clock[0] += links.SIZE_KEEP - 1
    assert large(), "as counted, within the keep time"
    assert len(counted) == 1
    clock[0] += 2
    assert not large(), "counted again once the keep time is over"
    assert len(counted) == 2
    os.rename(ws, tmp_path / "old")  # (kept meanwhile: its inode number is not reused)
    ws.mkdir()
    for i in range(treewalk.SMALL + 5):
        (ws / str(i)).touch()
    assert large(), "another directory at the same path: counted afresh"
    assert len(counted) == 3
    for i in range(links._SIZES_KEPT + 10):
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            scanner.sizes[(-1, i)] = (False, clock[0])
            scanner.large(fd)
        finally:
            os.close(fd)
    assert len(scanner.sizes) <= links._SIZES_KEPT


def test_a_denied_path_beneath_another_is_found_by_its_ancestors() -> None:
    """``_beneath_any`` (which denied paths are walked with one that holds them) gives
    what looking up each ancestor with ``os.path.dirname`` gives, "/" included, on
    random absolute paths of the form it is given (``_norm``)."""
    import random

    def by_dirname(path: str, tops: set[str]) -> bool:
        while path != "/":
            path = os.path.dirname(path)
            if path in tops:
                return True
        return False

    rng = random.Random(36)
    names = ["a", "b", ".ssh", "x y", "ab"]

    def some() -> str:
        return "/" + "/".join(rng.choice(names) for _ in range(rng.randint(0, 4)))

    for _ in range(20000):
        tops = {some() for _ in range(rng.randint(1, 6))}
        path = some()
        assert links._beneath_any(path, tops) == by_dirname(path, tops), (path, tops)
