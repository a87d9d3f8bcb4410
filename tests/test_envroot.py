"""Sandboxes on an image (--image): a copy-on-write root of the sandbox's own, renames
of the image's directories that are renames, a writable layer that fills up inside.

The image is a small root made once per module from the host's own binaries (dash,
coreutils and their libraries, copied, so the caller owns every file as an image
store's layers are) plus a static ``ren`` that calls rename(2) and prints the errno:
``mv`` would hide an EXDEV by copying. Every test runs as root and as uid 1001.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import module_state, run_cli
from test_tool_fidelity import Index, index  # noqa: F401 (the loopback index, a fixture)
from warren import PolicySpec, Sandbox
from warren import run as warren_run
from warren.images.ref import ImageConfig, ImageRef

TOOLS = [
    "sh",
    "mv",
    "ls",
    "cat",
    "mkdir",
    "ln",
    "stat",
    "dd",
    "rm",
    "touch",
    "id",
    "env",
    "chmod",
    "git",
    "git-upload-pack",  # a local clone runs it
    "dirname",
    "readlink",
    "realpath",
]
REN = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <errno.h>
#include <string.h>
int main(int c, char **v) {
    if (rename(v[1], v[2]) == 0) { puts("ok"); return 0; }
    printf("%s\n", strerrorname_np(errno)); return 1;
}
"""


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield from module_state(tmp_path_factory)


def _libs(binary: str) -> set[str]:
    out = subprocess.run(["ldd", binary], capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        for p in parts:
            if p.startswith("/"):
                found.add(p)
    return found


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("image") / "root"
    for d in ("usr/bin", "etc", "root", "tmp", "opt/tree/a/b", "opt/tree/c", "var/cache/tool"):
        (root / d).mkdir(parents=True)
    (root / "bin").symlink_to("usr/bin")
    needed: set[str] = set()
    for tool in TOOLS:
        path = shutil.which(tool)
        assert path, tool
        real = os.path.realpath(path)
        shutil.copy2(real, root / "usr/bin" / tool)
        needed |= _libs(real)
    for lib in needed:
        dest = root / lib.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(lib), dest)
    src = root.parent / "ren.c"
    src.write_text(REN)
    subprocess.run(["gcc", "-static", "-O1", "-o", str(root / "usr/bin/ren"), str(src)], check=True)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/marker").write_text("from the image\n")
    (root / "opt/tree/a/b/f").write_text("deep file\n")
    (root / "opt/tree/c/g").write_text("second\n")
    (root / "var/cache/tool/blob").write_text("cached\n")
    return root


def _copy_with_libs(root: Path, files: list[str]) -> None:
    needed: set[str] = set()
    for f in files:
        dest = root / f.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath(f), dest)
        needed |= _libs(f)
    for lib in needed:
        dest = root / lib.lstrip("/")
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(os.path.realpath(lib), dest)


@pytest.fixture(scope="module")
def pyimage(image: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small image plus the host's Python 3.11 (its standard library) and uv."""
    root = tmp_path_factory.mktemp("pyimage") / "root"
    shutil.copytree(image, root, symlinks=True)
    stdlib = "/usr/lib/python3.11"
    shutil.copytree(
        stdlib,
        root / stdlib.lstrip("/"),
        ignore=shutil.ignore_patterns("test", "__pycache__", "idlelib", "tkinter", "ensurepip"),
        symlinks=True,
    )
    dynload = [str(p) for p in Path(stdlib, "lib-dynload").glob("*.so")]
    _copy_with_libs(root, ["/usr/bin/python3.11", *dynload])
    uv = os.path.join(os.path.dirname(sys.executable), "uv")
    _copy_with_libs(root, [uv])
    os.rename(root / uv.lstrip("/"), root / "usr/bin/uv")
    (root / "usr/bin/python3").symlink_to("python3.11")
    return root


def _digest(root: Path) -> str:
    """Every name, mode and content of the layer: unchanged means unchanged."""
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames + dirnames):
            p = Path(dirpath) / name
            st = p.lstat()
            h.update(f"{p.relative_to(root)} {st.st_mode} {st.st_size}".encode())
            if p.is_file() and not p.is_symlink():
                h.update(p.read_bytes())
    return h.hexdigest()


def _spec(image: Path, workspace: Path | None, **extra: object) -> PolicySpec:
    return PolicySpec(image=str(image), workspace=str(workspace) if workspace else "none", **extra)  # type: ignore[arg-type]


def _sh(script: str, spec: PolicySpec, timeout: float = 60) -> tuple[int, str, str]:
    r = warren_run(["sh", "-c", textwrap.dedent(script)], spec, timeout=timeout)
    return r.exit_code, r.stdout.decode(), r.stderr.decode()


def test_image_is_the_root_copy_on_write_and_the_host_root_is_not_visible(
    image: Path, tmp_path: Path, planted_secret: Path
) -> None:
    before = _digest(image)
    spec = _spec(image, tmp_path)
    code, out, err = _sh(
        f"""
        cat /etc/marker; id -u; pwd
        echo changed > /etc/marker; rm /opt/tree/c/g; echo new > /etc/new
        cat /etc/marker; ls /etc
        test -e {planted_secret} && echo SECRET-VISIBLE; test -e /usr/lib/python3 && echo HOST-USR
        touch /workspace/made
        """,
        spec,
    )
    assert code == 0, err
    lines = out.split()
    assert lines[:3] == ["from", "the", "image"] and lines[3] == "0" and lines[4] == "/workspace"
    assert "changed" in out and "new" in out
    assert "SECRET-VISIBLE" not in out and "HOST-USR" not in out
    # The image's layer is never written; a file made in the host workspace is the caller's.
    assert _digest(image) == before
    made = (tmp_path / "made").stat()
    assert (made.st_uid, made.st_gid) == (os.getuid(), os.getgid())
    # A second sandbox starts from the image, not from the first one's changes.
    code, out, err = _sh("cat /etc/marker; test -e /etc/new && echo LEAKED; ls /opt/tree/c", spec)
    assert code == 0, err
    assert out.split() == ["from", "the", "image", "g"]


def test_sandboxes_on_one_image_do_not_see_each_others_changes(image: Path) -> None:
    spec = _spec(image, None)
    with Sandbox.create(spec) as a, Sandbox.create(spec) as b:
        assert a.exec(["sh", "-c", "echo a > /etc/only-a; echo a > /workspace/w"]).exit_code == 0
        seen = b.exec(["sh", "-c", "cat /etc/only-a /workspace/w 2>&1; echo done"]).stdout.decode()
        assert "No such file" in seen and "a\n" not in seen
        assert a.exec(["cat", "/etc/only-a"]).stdout == b"a\n"


def _kernel_alone_says_exdev(image: Path, tmp_path: Path) -> str:
    """The control: the same rename in an overlay mounted in a user namespace by hand,
    with nobody taking it over."""
    script = textwrap.dedent(
        f"""
        import os, subprocess, sys
        up, work, mnt = sys.argv[1:4]
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={image},upperdir={{up}},workdir={{work}},userxattr", mnt], check=True)
        try:
            os.rename(mnt + "/opt/tree", mnt + "/opt/moved")
            print("ok")
        except OSError as e:
            print(os.strerror(e.errno))
        """
    )
    dirs = [tmp_path / n for n in ("up", "work", "mnt")]
    for d in dirs:
        d.mkdir()
    r = subprocess.run(
        ["unshare", "-Urm", "python3", "-c", script, *map(str, dirs)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return r.stdout.strip() + r.stderr.strip()


def test_renaming_a_directory_of_the_image_is_a_rename(image: Path, tmp_path: Path) -> None:
    assert _kernel_alone_says_exdev(image, tmp_path) == os.strerror(18)  # EXDEV: the control
    _code, out, err = _sh(
        """
        ren /opt/tree /opt/moved
        cat /opt/moved/a/b/f /opt/moved/c/g; test -e /opt/tree && echo SOURCE-LEFT
        ren /opt/moved/a /opt/a2 && cat /opt/a2/b/f
        mkdir /opt/empty; ren /opt/moved /opt/empty && ls /opt
        ren /opt/a2 /opt/a2/b/inside
        ren /var/cache/tool /var/cache/blob-dir; cat /var/cache/blob-dir/blob
        mkdir /opt/full; touch /opt/full/x; ren /opt/empty /opt/full
        """,
        _spec(image, None),
    )
    assert out.splitlines() == [
        "ok",
        "deep file",
        "second",
        "ok",
        "deep file",
        "ok",
        "a2",
        "empty",
        "EINVAL",
        "ok",
        "cached",
        "ENOTEMPTY",
    ], err


def test_hardlinks_between_a_cache_and_the_workspace_in_the_layer(image: Path) -> None:
    code, out, err = _sh(
        "ln /var/cache/tool/blob /workspace/blob && stat -c %h /workspace/blob && cat /workspace/blob",
        _spec(image, None),
    )
    assert (code, out) == (0, "2\ncached\n"), err


def test_a_full_layer_is_enospc_inside_and_the_host_disk_is_unchanged(image: Path, tmp_path: Path) -> None:
    layer_fs = os.statvfs(image)
    free_before = layer_fs.f_bavail * layer_fs.f_frsize
    _code, out, err = _sh(
        "dd if=/dev/zero of=/root/fill bs=1M count=200 2>&1; echo rc=$?; echo more > /etc/more; echo rc2=$?",
        _spec(image, tmp_path, disk="64M"),
        timeout=60,
    )
    assert "No space left on device" in out and "rc=1" in out and "rc2=1" in out, (out, err)
    after = os.statvfs(image)
    # The 200 MiB did not go to the host's disk (had they, free space would drop by 200 MiB;
    # other work on this machine writes a little meanwhile).
    assert free_before - after.f_bavail * after.f_frsize < 150 << 20
    # The sandbox's layer was the tmpfs: an unlimited disk run writes the same file fine.
    _code, out, err = _sh(
        "dd if=/dev/zero of=/root/fill bs=1M count=100 2>&1; echo rc=$?", _spec(image, None)
    )
    assert "rc=0" in out, out


def test_git_in_a_host_workspace_commits_but_never_plants_a_hook_for_host_git(
    image: Path, tmp_path: Path
) -> None:
    ws = tmp_path / "repo"
    ws.mkdir()
    git = ["git", "-C", str(ws), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (ws / "f").write_text("one\n")
    config = (ws / ".git/config").read_bytes()
    _code, out, err = _sh(
        """
        cd /workspace && git add f && git -c user.email=i@i -c user.name=i commit -qm inside
        echo ok-commit
        hook=.git/hooks/post-checkout
        printf '#!/bin/sh\ntouch /workspace/HOOK-RAN\n' > $hook && chmod +x $hook
        echo '[core]' >> .git/config && echo '  fsmonitor = touch /workspace/FSMON-RAN' >> .git/config
        test -x .git/hooks/post-checkout && echo planted-inside
        """,
        _spec(image, ws),
    )
    assert "ok-commit" in out and "planted-inside" in out, (out, err)
    log = subprocess.run([*git, "log", "--format=%s"], capture_output=True, text=True, check=True).stdout
    assert log == "inside\n"  # the commit is the host's (objects and refs shared)
    assert not (ws / ".git/hooks/post-checkout").exists()
    assert (ws / ".git/config").read_bytes() == config
    subprocess.run([*git, "checkout", "-q", "-b", "other"], check=True)
    subprocess.run([*git, "status", "--short"], check=True, capture_output=True)
    assert not (ws / "HOOK-RAN").exists() and not (ws / "FSMON-RAN").exists()


def test_the_seeds_uv_tool_run_and_cache_hardlinks_work_on_an_image(pyimage: Path, index: Index) -> None:  # noqa: F811
    """OpenShell's first command (`uv tool run cowsay`: EXDEV on its overlay root) from a
    private index on loopback; then uv's cache in the image's home hardlinks into
    /workspace (both in the sandbox's layer), as on the host."""
    script = """
        uv tool run --from cowsay-w cowsay-w
        uv venv -q /workspace/.venv && uv pip install -q --python /workspace/.venv/bin/python warrenidx
        stat -c %h /workspace/.venv/lib/python3.11/site-packages/warrenidx/__init__.py
    """
    spec = PolicySpec(
        image=str(pyimage),
        workspace="none",
        network="allow",
        allow_hosts=[f"index.test:{index.port}", f"127.0.0.2:{index.port}"],
        resolve={"index.test": "127.0.0.2"},
        env={"UV_INDEX_URL": index.url, "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"},
    )
    code, out, err = _sh(script, spec, timeout=120)
    lines = out.split()
    assert code == 0 and lines[:3] == ["moo", "from", "warren"] and int(lines[-1]) >= 2, (out, err)


def test_bad_image_input_is_a_typed_error(tmp_path: Path) -> None:
    from warren.errors import PolicyError, SetupError, SnapshotNotFound

    with pytest.raises(PolicyError, match="No such file"):
        warren_run(["true"], _spec(tmp_path / "missing", None))
    with pytest.raises(PolicyError, match="16M"):
        warren_run(["true"], _spec(tmp_path, None, disk="1K"))
    with pytest.raises(SnapshotNotFound):
        warren_run(["true"], PolicySpec(from_snapshot="abc123", workspace="none"))
    # A link where the sandbox mounts would lead out of the image: refused, not followed.
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "workspace").symlink_to(str(tmp_path))
    with pytest.raises(SetupError, match="ELOOP"):
        warren_run(["true"], _spec(linked, tmp_path / "linked"))


def test_the_plan_applies_the_images_config() -> None:
    from warren.plan import CallerFacts, make_plan
    from warren.plan.facts import HostFacts
    from warren.policy import build

    ref = ImageRef(
        name="demo",
        id="sha256:" + "0" * 64,
        layers=(Path("/"),),
        config=ImageConfig(
            env=(("PATH", "/opt/x/bin:/usr/bin"), ("LANG", "C.UTF-8")), user="1000", workdir="/src"
        ),
    )
    policy = build(PolicySpec(image="demo", workspace="none"), cwd=Path("/"))
    host = HostFacts(mounts=(), landlock_abi=7, cap_last_cap=40, machine_supported=True)
    plan = make_plan(policy, host, CallerFacts.here(cwd="/"), image=ref)
    assert plan.env["PATH"] == "/opt/x/bin:/usr/bin" and plan.env["LANG"] == "C.UTF-8"
    assert plan.uid_map == f"1000 {os.getuid()} 1"
    assert plan.cwd == "/src" and plan.renames
    assert plan.mounts[0].layers == ("/",)


def test_snapshot_restore_and_fork_carry_the_layer_and_stay_independent(image: Path) -> None:
    from warren.errors import SandboxError, SnapshotNotFound

    spec = _spec(image, None)
    with Sandbox.create(spec) as a:
        setup = (
            "echo before > /etc/state; echo w > /workspace/w; rm /opt/tree/c/g; "
            "echo x > /root/one; ln /root/one /root/two"
        )
        assert a.exec(["sh", "-c", setup]).exit_code == 0
        snap = a.snapshot()
        assert snap.workspace == "included" and snap.size > 0
        assert a.exec(["sh", "-c", "echo after > /etc/state"]).exit_code == 0
        with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
            got = b.exec(["sh", "-c", "cat /etc/state /workspace/w; ls -A /opt/tree/c; stat -c %h /root/two"])
            assert got.stdout.decode().split() == ["before", "w", "2"], got.stderr
            # In use: not removable.
            with pytest.raises(SandboxError, match="in use"):
                Sandbox.remove_snapshot(snap.id)
            assert b.exec(["sh", "-c", "echo b > /etc/state"]).exit_code == 0
        with a.fork() as c:
            assert c.exec(["cat", "/etc/state"]).stdout == b"after\n"
            assert c.exec(["sh", "-c", "echo c > /etc/state"]).exit_code == 0
            assert a.exec(["cat", "/etc/state"]).stdout == b"after\n"
        assert snap.id in [s.id for s in Sandbox.snapshots()]
    Sandbox.remove_snapshot(snap.id)
    with pytest.raises(SnapshotNotFound):
        Sandbox.remove_snapshot(snap.id)


def test_a_snapshot_names_a_host_workspace_as_not_included(image: Path, tmp_path: Path) -> None:
    with Sandbox.create(_spec(image, tmp_path)) as a:
        assert a.exec(["sh", "-c", "echo host > /workspace/h"]).exit_code == 0
        snap = a.snapshot()
    assert snap.workspace == f"not included: host directory {tmp_path}"
    Sandbox.remove_snapshot(snap.id)


@pytest.fixture
def host_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A workspace and uv's host directories side by side in a scratch directory under
    $HOME (outside /tmp, so they share one host mount as a user's home and project do)."""
    base = Path.home() / f".warren-envroot-{os.getpid()}"
    (base / "ws").mkdir(parents=True)
    for var, sub in (("UV_CACHE_DIR", "cache/uv"), ("UV_TOOL_DIR", "tools"), ("UV_PYTHON_INSTALL_DIR", "py")):
        monkeypatch.setenv(var, str(base / sub))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _uv_spec(pyimage: Path, ws: Path, index: Index) -> PolicySpec:  # noqa: F811
    return PolicySpec(
        image=str(pyimage),
        workspace=str(ws),
        presets=["uv"],
        network="allow",
        allow_hosts=[f"index.test:{index.port}", f"127.0.0.2:{index.port}"],
        resolve={"index.test": "127.0.0.2"},
        env={"UV_INDEX_URL": index.url, "UV_NO_PROGRESS": "1", "UV_PYTHON_DOWNLOADS": "never"},
    )


def test_uv_hardlinks_from_the_hosts_cache_into_a_venv_in_a_host_workspace(
    pyimage: Path,
    index: Index,  # noqa: F811
    host_home: Path,
) -> None:
    """uv's host cache is bound where $UV_CACHE_DIR says, on one mount with the host
    workspace: `uv pip install` hardlinks (the inode is the cache's, judged on the host);
    the control installs with --link-mode copy and sees a file of its own."""
    ws, cache = host_home / "ws", host_home / "cache/uv"
    script = """
        cd /workspace && pwd -P
        uv venv -q .venv && uv pip install -q --python .venv/bin/python warrenidx
        uv venv -q copied && uv pip install -q --link-mode copy --python copied/bin/python warrenidx
        mkdir moved && mv moved "$UV_CACHE_DIR/moved-from-ws" && echo renamed
    """
    code, out, err = _sh(script, _uv_spec(pyimage, ws, index), timeout=120)
    assert code == 0 and out.split() == [str(ws), "renamed"], (out, err)
    assert "Failed to hardlink" not in err, err
    site = "lib/python3.11/site-packages/warrenidx/data.py"
    linked, copied = (ws / ".venv" / site).stat(), (ws / "copied" / site).stat()
    assert linked.st_nlink >= 2 and copied.st_nlink == 1
    assert any(p.stat().st_ino == linked.st_ino for p in cache.rglob("data.py"))
    assert linked.st_uid == os.getuid() and (cache / "moved-from-ws").is_dir()


def test_a_shared_cache_mount_lets_the_sandbox_write_only_its_roots(
    pyimage: Path,
    index: Index,  # noqa: F811
    host_home: Path,
    outside: Path,
) -> None:
    """The bind that puts the workspace and the caches on one mount shows the directory
    above them: nothing new there, nothing of it moved or changed (judged on the host).
    The cache itself cannot be swapped for a link (warren would bind what it names next
    time); links planted in it lead to the image's paths (the host's directory outside
    every root is not there) or to the guarded directory above the roots."""
    ws, cache = host_home / "ws", host_home / "cache/uv"
    cache.mkdir(parents=True)
    (host_home / "sibling").write_text("host\n")
    away = Path(f"{host_home}-away")
    away.mkdir()
    (cache / "to-above").symlink_to(str(host_home))
    (cache / "to-away").symlink_to(str(away))
    script = f"""
        base={host_home}
        touch $base/new 2>/dev/null && echo MADE-ABOVE
        echo x > $base/sibling 2>/dev/null && echo WROTE-SIBLING
        mv $base/ws $base/ws2 2>/dev/null && echo MOVED-WS
        mkdir $base/ws/d && echo made-in-ws
        rm -rf "$UV_CACHE_DIR" 2>/dev/null; ln -s / "$UV_CACHE_DIR" 2>/dev/null && echo SWAPPED-CACHE
        mv "$UV_CACHE_DIR" "$UV_CACHE_DIR.old" 2>/dev/null && echo MOVED-CACHE
        echo x > "$UV_CACHE_DIR/to-above/via-link" 2>/dev/null && echo VIA-LINK-ABOVE
        echo x > "$UV_CACHE_DIR/to-away/via-link" 2>/dev/null && echo VIA-LINK-AWAY
        touch "$UV_CACHE_DIR/made" && echo made-in-cache
    """
    _code, out, err = _sh(script, _uv_spec(pyimage, ws, index))
    through_link = list(away.iterdir())
    shutil.rmtree(away)
    assert through_link == []
    assert out.split() == ["made-in-ws", "made-in-cache"], (out, err)
    # The control: what the sandbox wrote to its roots is there on the host.
    assert (ws / "d").is_dir() and (cache / "made").exists() and not cache.is_symlink()
    # uv's tool and Python directories are no preset's (the host runs what they hold).
    assert sorted(p.name for p in host_home.iterdir()) == ["cache", "sibling", "ws"]
    assert (host_home / "sibling").read_text() == "host\n" and outside.read_text() == "keep me\n"
    assert not (host_home / "via-link").exists()


@pytest.mark.parametrize("kind", ["empty", "full", "file"])
def test_an_image_with_its_own_workspace_starts_with_the_host_workspace_on_a_shared_mount(
    image: Path, tmp_path: Path, kind: str
) -> None:
    """An image that already has /workspace (a directory, as images made for agents
    do; or a file) and a host workspace sharing one mount with a cache: /workspace is
    the link to the host path, the image's own /workspace hidden, the image unchanged."""
    img = tmp_path / "img"
    shutil.copytree(image, img, symlinks=True)
    if kind == "file":
        (img / "workspace").write_text("the image's\n")
    else:
        (img / "workspace").mkdir()
        if kind == "full":
            (img / "workspace" / "sub").mkdir()
            (img / "workspace" / "sub" / "from-image").write_text("the image's\n")
    before = _digest(img)
    base = Path.home() / f".warren-envroot-ws-{os.getpid()}"
    ws, cache = base / "ws", base / "cache"
    ws.mkdir(parents=True)
    cache.mkdir()
    (cache / "blob").write_text("cached\n")
    try:
        spec = _spec(img, ws, write=[str(cache)])
        code, out, err = _sh(
            f"""
            pwd -P; ls -A /workspace; test -e /workspace/sub && echo IMAGE-WS-VISIBLE
            ln {cache}/blob /workspace/linked && stat -c %h /workspace/linked
            """,
            spec,
        )
        assert code == 0, err
        assert out.split() == [str(ws), "2"], (out, err)
        assert (ws / "linked").stat().st_ino == (cache / "blob").stat().st_ino
        assert _digest(img) == before
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_an_image_in_use_by_a_sandbox_or_a_snapshot_is_not_taken_from_under_them(
    image: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`warren image rm` names who needs the image and refuses; --force forgets the
    name, and the layers stay for the sandbox, the snapshot and what is made from it
    until the last of them is gone (judged in the store on the host)."""
    from warren.errors import ImageInUse, SandboxError
    from warren.images.store import ImageStore

    data = tmp_path / "data"
    monkeypatch.setenv("XDG_DATA_HOME", str(data))
    store = ImageStore(data / "warren" / "images")
    layers = store.import_root("small", image).layers
    name = f"held{os.getpid()}"
    with Sandbox.create(PolicySpec(image="small", workspace="none"), name=name) as a:
        with pytest.raises(ImageInUse, match=f"in use by sandbox {name}"):
            store.remove("small")
        assert a.exec(["sh", "-c", "echo mine > /etc/mine"]).exit_code == 0
        snap = a.snapshot()
    with pytest.raises(ImageInUse, match=f"in use by snapshot {snap.id}") as refused:
        store.remove("small")
    assert "warren snapshot rm" in refused.value.hint
    r = run_cli(["image", "rm", "small"], cwd=tmp_path, env={"XDG_DATA_HOME": str(data)})
    assert r.returncode == 125 and f"snapshot {snap.id}" in r.stderr, r.stderr
    assert run_cli(["image", "rm", "--force", "small"], cwd=tmp_path).returncode == 0
    assert "small" not in store.names() and all(p.is_dir() for p in layers)
    assert store.gc() == []
    with Sandbox.create(PolicySpec(from_snapshot=snap.id, workspace="none")) as b:
        got = b.exec(["sh", "-c", "cat /etc/mine /etc/marker"])
        assert got.stdout == b"mine\nfrom the image\n", got.stderr
        with pytest.raises(SandboxError, match="in use"):
            Sandbox.remove_snapshot(snap.id)
        assert store.gc() == [] and all(p.is_dir() for p in layers)
    Sandbox.remove_snapshot(snap.id)  # the last holder: its layers go with it
    assert not any(p.exists() for p in layers)
    assert list((data / "warren" / "images" / "layers").iterdir()) == []
