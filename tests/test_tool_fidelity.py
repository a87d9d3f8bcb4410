"""The seeds' own commands, literally: uv's tools and Pythons, private indexes, TMPDIR.

Each test runs the real tool inside ``warren run`` against an index the test serves on
loopback (a PyPI-like simple index of wheels built here), and checks what the host
would show: exit status, files, hardlinks from uv's cache. Every tool's state lives in
a scratch directory under $HOME (XDG_CACHE_HOME, XDG_DATA_HOME, XDG_BIN_HOME point
there), so the caller's own caches are never touched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import make_wheel, module_state, need_tool, run_cli


@pytest.fixture(scope="module", autouse=True)
def state_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One supervisor serves the module's one-shot runs, as a user's serves all of theirs
    (each test's tools have homes of their own)."""
    yield from module_state(tmp_path_factory)


UV = os.path.join(os.path.dirname(sys.executable), "uv")


@dataclass
class Index:
    """A simple index (PEP 503) served on 127.0.0.2, named index.test in the sandbox."""

    root: Path
    port: int = 0
    hits: list[tuple[str, str]] = field(default_factory=list)  # (path, Authorization header)

    @property
    def url(self) -> str:
        return f"http://index.test:{self.port}/simple/"

    @property
    def flags(self) -> list[str]:
        return [
            "--allow-host",
            f"index.test:{self.port}",
            "--allow-host",
            f"127.0.0.2:{self.port}",
            "--resolve",
            "index.test=127.0.0.2",
        ]

    def add(self, wheel: Path, project: str) -> None:
        files = self.root / "files"
        files.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel, files / wheel.name)
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        page = self.root / "simple" / project / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        page.write_text(f'<a href="../../files/{wheel.name}#sha256={digest}">{wheel.name}</a>\n')


def tool_wheel(dest: Path, name: str = "cowsay-w", version: str = "1.0") -> Path:
    """A wheel with a console script (``cowsay-w`` prints a line), built by hand."""
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}/__init__.py": "def main():\n    print('moo from warren')\n",
        f"{module}/data.py": "BLOB = " + repr("x" * 4096) + "\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: warren-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
        f"{dist}/entry_points.txt": f"[console_scripts]\n{name} = {module}:main\n",
    }
    files[f"{dist}/RECORD"] = "".join(f"{p},,\n" for p in files) + f"{dist}/RECORD,,\n"
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


@pytest.fixture
def index(tmp_path: Path) -> Iterator[Index]:
    idx = Index(tmp_path / "index")
    idx.add(tool_wheel(tmp_path / "built"), "cowsay-w")
    idx.add(make_wheel(tmp_path / "built", "warrenidx", "3.0"), "warrenidx")
    hits = idx.hits

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, directory=str(idx.root), **kw)  # type: ignore[arg-type]

        def do_GET(self) -> None:
            hits.append((self.path, self.headers.get("Authorization") or ""))
            super().do_GET()

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    idx.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield idx
    server.shutdown()
    server.server_close()


@dataclass
class Home:
    """A workspace and the XDG homes of the tools, in a scratch directory under $HOME."""

    base: Path
    ws: Path

    @property
    def data(self) -> Path:
        return self.base / "data"

    @property
    def cache(self) -> Path:
        return self.base / "cache"

    @property
    def bin(self) -> Path:
        return self.base / "bin"

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "XDG_DATA_HOME": str(self.data),
            "XDG_CACHE_HOME": str(self.cache),
            "XDG_BIN_HOME": str(self.bin),
            "UV_NO_PROGRESS": "1",
            "PIP_CONFIG_FILE": os.devnull,
            **extra,
        }

    def run(
        self, argv: list[str], *flags: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_cli(["run", *flags, "--", *argv], cwd=self.ws, env=env or self.env(), timeout=120)


@pytest.fixture
def home(request: pytest.FixtureRequest) -> Iterator[Home]:
    base = Path(os.path.expanduser("~")) / f".warren-tools-{os.getpid()}-{request.node.name[-40:]}"
    (base / "ws").mkdir(parents=True)
    yield Home(base, base / "ws")
    shutil.rmtree(base, ignore_errors=True)


def _hit_wheel(index: Index, name: str) -> bool:
    return any(path.endswith(".whl") and name in path for path, _ in index.hits)


def test_uvx_and_uv_tool_run_a_tool_from_a_private_index(home: Home, index: Index) -> None:
    """OpenShell's first command, `uv tool run cowsay`, with the index the user configured."""
    script = "set -e; uvx --from cowsay-w cowsay-w; uv tool run --from cowsay-w cowsay-w"
    r = home.run(
        ["sh", "-c", script], "--preset", "python", *index.flags, env=home.env(UV_INDEX_URL=index.url)
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["moo from warren", "moo from warren"]
    assert _hit_wheel(index, "cowsay_w"), index.hits
    # uvx locks and marks its tool directory: the sandbox's is private, the host's (whose
    # tools the host runs) is never made.
    assert not (home.data / "uv").exists()
    assert not list(home.ws.iterdir()), "nothing left in the workspace (TMPDIR removed)"


def test_uv_tool_install_hardlinks_from_the_cache_when_its_dirs_are_granted_with_a_warning(
    home: Home, index: Index
) -> None:
    env = home.env(UV_DEFAULT_INDEX=index.url)
    tools = home.data / "uv" / "tools"
    for d in (home.bin, tools):
        d.mkdir(parents=True)
    r = home.run(
        [UV, "tool", "install", "cowsay-w"],
        "--preset",
        "python",
        "--write",
        str(home.bin),
        "--write",
        str(tools),
        *index.flags,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    warned = [line for line in r.stderr.splitlines() if "the host runs programs from" in line]
    assert len(warned) == 2 and str(tools) in warned[1] and "reaches the host" in warned[1], r.stderr
    assert "Failed to hardlink" not in r.stderr, r.stderr  # uv: "...; falling back to full copy"
    installed = next(
        (home.data / "uv" / "tools" / "cowsay-w").glob("lib/python3*/site-packages/cowsay_w/data.py")
    )
    assert installed.stat().st_nlink > 1, "installed file is a copy, not a hardlink from uv's cache"
    in_cache = [
        p for p in (home.cache / "uv").rglob("cowsay_w/data.py") if p.stat().st_ino == installed.stat().st_ino
    ]
    assert in_cache, "no file in uv's cache shares the installed file's inode"
    assert installed.stat().st_uid == os.getuid()
    # The program runs on the host afterwards, as after a host install.
    ran = subprocess.run([str(home.bin / "cowsay-w")], capture_output=True, text=True, timeout=30)
    assert ran.stdout.strip() == "moo from warren", ran.stderr


def test_uv_tool_install_without_its_bin_dir_fails_with_a_one_line_reason(home: Home, index: Index) -> None:
    r = home.run(
        [UV, "tool", "install", "cowsay-w"],
        "--preset",
        "python",
        *index.flags,
        env=home.env(UV_DEFAULT_INDEX=index.url),
    )
    assert r.returncode != 0
    assert str(home.bin) in r.stderr  # uv names the directory it could not create
    hints = [line for line in r.stderr.splitlines() if "writes programs to" in line]
    assert len(hints) == 1 and "--write" in hints[0], r.stderr
    assert not home.bin.exists()


def python_mirror(base: Path) -> Path:
    """A local mirror with one interpreter archive in python-build-standalone's layout,
    listed in a downloads file of uv's format (``UV_PYTHON_DOWNLOADS_JSON_URL``).

    No real CPython archive can be had offline on this machine, so the "interpreter"
    is a wrapper around the system's Python 3; everything uv does with the archive
    (fetch, verify the sha256, unpack, patch sysconfig, link, register) is real."""
    tree = base / "archive" / "python"
    (tree / "bin").mkdir(parents=True)
    (tree / "lib" / "python3.12").mkdir(parents=True)
    launcher = tree / "bin" / "python3.12"
    launcher.write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    launcher.chmod(0o755)
    for alias in ("python3", "python"):
        (tree / "bin" / alias).symlink_to("python3.12")
    (tree / "lib" / "python3.12" / "_sysconfigdata__linux_x86_64-linux-gnu.py").write_text(
        "# system configuration generated and used by the sysconfig module\n"
        "build_time_vars = {'prefix': '/install'}\n"
    )
    archive = base / "mirror" / "cpython-3.12.99-install_only.tar.gz"
    archive.parent.mkdir()
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(tree, arcname="python")
    entry = {
        "name": "cpython",
        "arch": {"family": "x86_64", "variant": None},
        "os": "linux",
        "libc": "gnu",
        "major": 3,
        "minor": 12,
        "patch": 99,
        "prerelease": "",
        "url": archive.as_uri(),
        "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(),
        "variant": None,
        "build": "20990101",
    }
    listing = base / "downloads.json"
    listing.write_text(json.dumps({"cpython-3.12.99-linux-x86_64-gnu": entry}))
    return listing


def test_uv_python_install_from_a_local_mirror(home: Home) -> None:
    if platform.machine() != "x86_64" or not os.path.exists("/usr/bin/python3"):
        pytest.skip("the stand-in interpreter archive is built for x86_64 Linux with /usr/bin/python3")
    env = home.env(UV_PYTHON_DOWNLOADS_JSON_URL=str(python_mirror(home.base)))
    pythons = home.data / "uv" / "python"
    for d in (home.bin, pythons):
        d.mkdir(parents=True)
    # The host runs uv's Pythons: the preset leaves their directory read-only, and the
    # install fails there as on a read-only disk, with warren's hint.
    r = home.run([UV, "python", "install", "3.12.99"], "--preset", "python", env=env)
    assert r.returncode != 0 and not list(pythons.iterdir()), r.stderr
    hints = [line for line in r.stderr.splitlines() if "writes programs to ~/.local/share/uv/python" in line]
    assert len(hints) == 1 and "--write" in hints[0], r.stderr
    # Granted explicitly (with a warning), the install works as on the host.
    script = "set -e; uv python install 3.12.99; uv python list --only-installed --managed-python"
    r = home.run(["sh", "-c", script], "--preset", "python", "--write", str(pythons), env=env)
    assert r.returncode == 0, r.stderr
    assert any(
        "the host runs programs from" in line and str(pythons) in line for line in r.stderr.splitlines()
    )
    installed = pythons / "cpython-3.12.99-linux-x86_64-gnu"
    # uv finds it where it keeps its Pythons (it asks the stand-in, which answers 3.11).
    assert f"{home.data}/uv/python/cpython-3.12" in r.stdout, r.stdout
    assert (installed / "bin" / "python3.12").exists()
    # uv links python3.12 into the bin directory, which no preset makes writable: uv
    # says so and carries on (as on a host with a read-only ~/.local/bin).
    assert "Failed to install executable" in r.stderr and str(home.bin) in r.stderr, r.stderr
    assert not (home.bin / "python3.12").exists()
    # An installed Python is used read-only by the preset alone.
    r = home.run(
        [UV, "python", "list", "--only-installed", "--managed-python"], "--preset", "python", env=env
    )
    assert r.returncode == 0 and f"{home.data}/uv/python/cpython-3.12" in r.stdout, r.stdout + r.stderr
    r = home.run(
        [UV, "python", "install", "--reinstall", "3.12.99"],
        "--preset",
        "python",
        "--write",
        str(home.bin),
        "--write",
        str(pythons),
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert (home.bin / "python3.12").resolve() == (installed / "bin" / "python3.12").resolve()


def test_pip_uses_the_private_index_and_find_links_the_user_configured(home: Home, index: Index) -> None:
    wheels = home.base / "wheels"
    make_wheel(wheels, "warrenlocal", "1.5")
    script = (
        f"set -e; {sys.executable} -m pip install -q --no-deps --target by-index warrenidx; "
        f"PIP_NO_INDEX=1 {sys.executable} -m pip install -q --no-deps --target by-links warrenlocal"
    )
    env = home.env(PIP_INDEX_URL=index.url, PIP_TRUSTED_HOST="index.test", PIP_FIND_LINKS=str(wheels))
    r = home.run(["sh", "-c", script], "--preset", "python", *index.flags, env=env)
    assert r.returncode == 0, r.stderr
    assert (home.ws / "by-index" / "warrenidx" / "__init__.py").exists()
    assert (home.ws / "by-links" / "warrenlocal" / "__init__.py").exists()
    assert _hit_wheel(index, "warrenidx"), index.hits


def test_index_url_credentials_stay_out_unless_passed_explicitly(home: Home, index: Index) -> None:
    url = index.url.replace("http://", "http://agent:s3cret@")
    script = f'{sys.executable} -m pip download -q --no-deps -d dl warrenidx; echo "url=$PIP_INDEX_URL"'
    env = home.env(
        PIP_INDEX_URL=url, PIP_TRUSTED_HOST="index.test", NPM_TOKEN="npm-secret", UV_INDEX_CORP_PASSWORD="pw"
    )
    r = home.run(
        ["sh", "-c", script + '; echo "tok=$NPM_TOKEN pw=$UV_INDEX_CORP_PASSWORD"'],
        "--preset",
        "python",
        "--preset",
        "node",
        *index.flags,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert f"url={index.url}" in r.stdout and "s3cret" not in r.stdout
    assert "tok= pw=" in r.stdout
    assert "PIP_INDEX_URL" in r.stderr and "--pass-env" in r.stderr  # warren said what it left out
    assert index.hits and all(auth == "" for _, auth in index.hits), index.hits
    index.hits.clear()
    kept = home.run(
        ["sh", "-c", script], "--preset", "python", "--pass-env", "PIP_INDEX_URL", *index.flags, env=env
    )
    assert kept.returncode == 0, kept.stderr
    assert f"url={url}" in kept.stdout
    assert any(auth.startswith("Basic ") for _, auth in index.hits), index.hits


RENAME = """
import os, sys, tempfile
fd, name = tempfile.mkstemp()
os.write(fd, b"x"); os.close(fd)
print(os.environ["TMPDIR"])
print(os.stat(name).st_dev == os.stat(".").st_dev)
try:
    os.rename(name, "renamed")
    print("renamed")
except OSError as e:
    print(os.strerror(e.errno))
"""


def _host_rename(src_dir: str, dst_dir: Path) -> str:
    fd, name = __import__("tempfile").mkstemp(dir=src_dir)
    os.close(fd)
    try:
        os.rename(name, dst_dir / "host-renamed")
        os.unlink(dst_dir / "host-renamed")
        return "renamed"
    except OSError as e:
        os.unlink(name)
        return os.strerror(e.errno or 0)


def test_tmpdir_renames_into_the_workspace_as_on_the_host(home: Home) -> None:
    host = _host_rename(os.environ.get("TMPDIR") or "/tmp", home.ws)
    r = home.run(["python3", "-c", RENAME])
    assert r.returncode == 0, r.stderr
    tmpdir, same_dev, outcome = r.stdout.split("\n")[:3]
    assert outcome == host, (tmpdir, outcome, host)
    if host == "renamed":  # a directory of its own beside the workspace, on its filesystem
        assert not tmpdir.startswith(f"{home.ws}/") and same_dev == "True"
    assert (home.ws / "renamed").read_text() == "x"
    assert [p.name for p in home.ws.iterdir()] == ["renamed"], "nothing else in the workspace"
    assert tmpdir == "/tmp" or not os.path.lexists(tmpdir), "the sandbox's TMPDIR is removed"


def test_tmpdir_a_command_filled_is_removed_with_what_it_holds(home: Home) -> None:
    if _host_rename(os.environ.get("TMPDIR") or "/tmp", home.ws) != "renamed":
        pytest.skip("the host's TMPDIR is on another filesystem than the workspace: no TMPDIR is made there")
    fill = 'mkdir "$TMPDIR/d" && echo x > "$TMPDIR/d/f" && echo y > "$TMPDIR/g" && echo "$TMPDIR"'
    r = home.run(["sh", "-c", fill])
    assert r.returncode == 0, r.stderr
    tmpdir = r.stdout.strip()
    assert not tmpdir.startswith(f"{home.ws}/") and os.path.isabs(tmpdir)
    assert not os.path.lexists(tmpdir), "the sandbox's TMPDIR is removed, whatever it holds"
    assert [p.name for p in home.ws.iterdir()] == []


def test_tmpdir_on_another_filesystem_stays_a_private_tmpfs(home: Home) -> None:
    if not os.access("/dev/shm", os.W_OK) or os.stat("/dev/shm").st_dev == os.stat(home.ws).st_dev:
        pytest.skip("/dev/shm is not a writable filesystem of its own here")
    host = _host_rename("/dev/shm", home.ws)
    assert host == os.strerror(errno.EXDEV)
    r = home.run(["python3", "-c", RENAME], env=home.env(TMPDIR="/dev/shm"))
    assert r.returncode == 0, r.stderr
    tmpdir, same_dev, outcome = r.stdout.split("\n")[:3]
    assert tmpdir == "/tmp" and same_dev == "False" and outcome == host


def test_tmpdir_of_a_long_lived_sandbox_lives_until_it_is_removed(home: Home) -> None:
    if _host_rename(os.environ.get("TMPDIR") or "/tmp", home.ws) != "renamed":
        pytest.skip("the host's TMPDIR is on another filesystem than the workspace: no TMPDIR is made there")
    name = f"tmp{os.getpid()}"
    assert run_cli(["create", name], cwd=home.ws, env=home.env()).returncode == 0
    try:
        r = run_cli(
            ["exec", name, "sh", "-c", "echo x > $TMPDIR/kept; echo $TMPDIR"], cwd=home.ws, env=home.env()
        )
        assert r.returncode == 0, r.stderr
        tmpdir = Path(r.stdout.strip())
        assert (tmpdir / "kept").read_text() == "x\n"
        status = subprocess.run(
            ["git", "status", "--porcelain", "--ignored=no"], cwd=home.ws, capture_output=True, text=True
        )
        if status.returncode == 0:
            assert ".warren-tmp" not in status.stdout
    finally:
        assert run_cli(["rm", "-f", name], cwd=home.ws, env=home.env()).returncode == 0
    assert not tmpdir.exists()


# --- node: npx / npm exec from npm's offline cache, npm install -g --------------------------


@pytest.fixture
def npm_package(home: Home) -> Path:
    need_tool("npm", "the npm tests run it")
    pkg = home.base / "pkg"
    pkg.mkdir()
    (pkg / "package.json").write_text(
        '{"name": "warren-hello", "version": "1.0.0", "bin": {"warren-hello": "bin.js"}}\n'
    )
    (pkg / "bin.js").write_text('#!/usr/bin/env node\nconsole.log("hello from npx")\n')
    (pkg / "bin.js").chmod(0o755)
    cache = home.base / "npm-cache"
    subprocess.run(
        ["npm", "pack", "-q", "--pack-destination", str(home.base), "--cache", str(cache)],
        cwd=pkg,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return home.base / "warren-hello-1.0.0.tgz"


def test_npx_and_npm_exec_run_a_package_through_npms_cache(home: Home, npm_package: Path) -> None:
    cache = home.base / "npm-cache"
    script = (
        f"set -e; npx --yes --offline --package={npm_package} warren-hello; "
        f"npm exec --yes --offline --package={npm_package} -- warren-hello"
    )
    r = home.run(["sh", "-c", script], "--preset", "node", env=home.env(npm_config_cache=str(cache)))
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["hello from npx", "hello from npx"]
    assert any((cache / "_npx").iterdir()), "npx installs into npm's cache, which the preset makes writable"


def test_npm_install_global_needs_its_prefix_granted(home: Home, npm_package: Path) -> None:
    prefix = home.base / "prefix"
    env = home.env(npm_config_cache=str(home.base / "npm-cache"), npm_config_prefix=str(prefix))
    argv = ["npm", "install", "-g", "--offline", str(npm_package)]
    r = home.run(argv, "--preset", "node", env=env)
    assert r.returncode != 0 and not prefix.exists()
    assert any("writes programs to" in line and "--write" in line for line in r.stderr.splitlines()), r.stderr
    prefix.mkdir()
    r = home.run(argv, "--preset", "node", "--write", str(prefix), env=env)
    assert r.returncode == 0, r.stderr
    ran = subprocess.run([str(prefix / "bin" / "warren-hello")], capture_output=True, text=True, timeout=30)
    assert ran.stdout.strip() == "hello from npx"


# --- rust: cargo install, rustup's offline parts ------------------------------------------------


def _cargo() -> str:
    cargo = shutil.which("cargo")
    if cargo is None or subprocess.run([cargo, "--version"], capture_output=True).returncode != 0:
        pytest.skip(f"cargo is not installed for uid {os.getuid()} on this machine (root's ~/.cargo only)")
    return cargo


def test_cargo_install_goes_to_the_workspace_and_not_to_cargo_bin(home: Home) -> None:
    _cargo()
    crate = home.ws / "hello"
    (crate / "src").mkdir(parents=True)
    (crate / "Cargo.toml").write_text(
        '[package]\nname = "warren-hello"\nversion = "0.1.0"\nedition = "2021"\n'
    )
    (crate / "src" / "main.rs").write_text('fn main() { println!("hello from cargo"); }\n')
    env = home.env(CARGO_HOME=str(home.base / "cargo"))
    r = home.run(["cargo", "install", "--offline", "--path", "hello"], "--preset", "rust", env=env)
    assert r.returncode != 0 and not (home.base / "cargo" / "bin").exists()
    assert any("writes programs to ~/.cargo/bin" in line for line in r.stderr.splitlines()), r.stderr
    script = "set -e; cargo install -q --offline --root inst --path hello; ./inst/bin/warren-hello"
    r = home.run(["sh", "-c", script], "--preset", "rust", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "hello from cargo"
    assert (home.base / "cargo" / "registry").is_dir()  # the preset's cache, made for cargo


def test_rustup_answers_offline_questions(home: Home) -> None:
    _cargo()
    host = subprocess.run(["rustup", "show", "active-toolchain"], capture_output=True, text=True, timeout=60)
    r = home.run(["rustup", "show", "active-toolchain"], "--preset", "rust")
    assert r.returncode == host.returncode == 0, r.stderr
    assert r.stdout == host.stdout


def test_tmpdir_emptied_by_a_command_is_there_for_the_next_exec(home: Home) -> None:
    if _host_rename(os.environ.get("TMPDIR") or "/tmp", home.ws) != "renamed":
        pytest.skip("the host's TMPDIR is on another filesystem than the workspace: no TMPDIR is made there")
    name = f"clean{os.getpid()}"
    assert run_cli(["create", name], cwd=home.ws, env=home.env()).returncode == 0
    try:
        # git clean in the workspace never reaches it (it is not there); rm -rf empties
        # it but cannot remove it (its parent is not writable).
        script = (
            'git init -q . && echo x > "$TMPDIR/f" && git clean -qfdx && cat "$TMPDIR/f"; rm -rf "$TMPDIR"'
        )
        gone = run_cli(["exec", name, "sh", "-c", script], cwd=home.ws, env=home.env())
        assert gone.stdout == "x\n", gone.stderr
        again = run_cli(
            ["exec", name, "python3", "-c", "import tempfile; print(tempfile.mkstemp()[1])"], cwd=home.ws
        )
        assert again.returncode == 0, again.stderr
        made = again.stdout.strip()
        assert os.path.exists(made) and not made.startswith(f"{home.ws}/"), made
    finally:
        assert run_cli(["rm", "-f", name], cwd=home.ws, env=home.env()).returncode == 0
    assert not os.path.lexists(made)
    assert sorted(p.name for p in home.ws.iterdir()) == [".git"]


# --- pre-commit: its hook environments live in its own home -----------------------------------


def test_pre_commit_runs_hooks_with_its_home_from_the_preset(home: Home) -> None:
    pre_commit = shutil.which("pre-commit") or os.path.join(os.path.dirname(sys.executable), "pre-commit")
    if not os.path.exists(pre_commit):
        pytest.skip(
            "pre-commit is not installed on this machine (it is not one of warren's dev dependencies)"
        )
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q", str(home.ws)], check=True)
    (home.ws / ".pre-commit-config.yaml").write_text(
        "repos:\n- repo: local\n  hooks:\n  - id: echo\n    name: echo\n"
        "    entry: sh -c 'echo checked \"$@\"' --\n    language: system\n    files: \\.txt$\n"
    )
    (home.ws / "a.txt").write_text("hi\n")
    subprocess.run([*git, "-C", str(home.ws), "add", "-A"], check=True)
    r = home.run([pre_commit, "run", "--all-files"], "--preset", "python")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Passed" in r.stdout
    # Its hook environments (which the host's git hooks run) live in a private home.
    assert not (home.cache / "pre-commit").exists()


# --- pipx run: like uvx, through pipx's own home -------------------------------------------------


def test_pipx_run_runs_a_tool_from_a_private_index(home: Home, index: Index) -> None:
    pipx = shutil.which("pipx") or os.path.join(os.path.dirname(sys.executable), "pipx")
    if not os.path.exists(pipx):
        pytest.skip("pipx is not installed on this machine (it is not one of warren's dev dependencies)")
    # pipx makes its bin and man directories on start: they exist on a host where it is used.
    man = home.data / "man"
    for d in (home.bin, man):
        d.mkdir(parents=True)
    env = home.env(
        PIPX_BIN_DIR=str(home.bin),
        PIPX_MAN_DIR=str(man),
        PIP_INDEX_URL=index.url,
        PIP_TRUSTED_HOST="index.test",
        UV_DEFAULT_INDEX=index.url,
    )
    r = home.run([pipx, "run", "--spec", "cowsay-w", "cowsay-w"], "--preset", "python", *index.flags, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().endswith("moo from warren")
    assert _hit_wheel(index, "cowsay_w"), index.hits
    assert not list(home.bin.iterdir()), "pipx run installs nothing for PATH"
    # Its venvs (which the host's pipx runs) live in a private home.
    assert not (home.data / "pipx").exists() and not (home.cache / "pipx").exists()
