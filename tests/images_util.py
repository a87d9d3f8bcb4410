"""Helpers of the image tests: archives made by hand (hostile ones among them), archives
made by podman in a private storage, and a look at an image through a real overlay
mount (the kernel reads the layers, not our code)."""

from __future__ import annotations

import atexit
import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
from collections.abc import Iterable
from pathlib import Path

from conftest import need_tool

Entry = tuple[tarfile.TarInfo, bytes | None]


def entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"", **attrs: object) -> Entry:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    info.mtime = 1_700_000_000
    for key, value in attrs.items():
        setattr(info, key, value)
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def layer_tar(entries: Iterable[Entry]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for info, data in entries:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def docker_archive(
    path: Path, layers: list[bytes], *, diff_ids: list[str] | None = None, cmd: list[str] | None = None
) -> Path:
    """A docker-archive (as ``docker save`` writes one) of ``layers``, lowest first."""
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"],
            "Cmd": cmd or ["/bin/sh"],
            "WorkingDir": "/srv",
        },
        "rootfs": {"type": "layers", "diff_ids": diff_ids or [sha(layer) for layer in layers]},
    }
    blob = json.dumps(config).encode()
    names = [f"{hashlib.sha256(layer).hexdigest()}/layer.tar" for layer in layers]
    manifest = [
        {"Config": f"{hashlib.sha256(blob).hexdigest()}.json", "RepoTags": ["x:latest"], "Layers": names}
    ]
    with tarfile.open(path, "w") as tf:
        files = [("manifest.json", json.dumps(manifest).encode()), (manifest[0]["Config"], blob)]
        for name, data in files + list(zip(names, layers, strict=True)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


class Podman:
    """podman with a storage of its own under ``base`` (no registry, nothing shared)."""

    def __init__(self, base: Path) -> None:
        need_tool("podman", "the images these tests import are made by podman")
        self.base = base
        # podman refuses a runroot over 50 characters (an xdist worker's tmp_path is longer):
        # a short private one under /tmp, gone with the process that made it.
        runroot = tempfile.mkdtemp(prefix="wpod-", dir="/tmp")
        atexit.register(shutil.rmtree, runroot, True)
        self.argv = [
            "podman",
            "--root",
            str(base / "storage"),
            "--runroot",
            runroot,
            "--storage-driver",
            "vfs",
        ]

    def __call__(self, *args: str, stdin: bytes | None = None) -> str:
        env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(self.base / "xdg"),
            "XDG_CONFIG_HOME": str(self.base / "cfg"),
        }
        (self.base / "xdg").mkdir(mode=0o700, exist_ok=True)
        done = subprocess.run([*self.argv, *args], input=stdin, capture_output=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return done.stdout.decode()

    def import_root(self, root: Path, tag: str) -> None:
        """``tar -C root -c . | podman import - TAG``, owners as root's (inside its user namespace)."""
        tar = subprocess.run(
            ["tar", "-C", str(root), "--numeric-owner", "--owner=0", "--group=0", "-c", "."],
            capture_output=True,
            check=True,
        ).stdout
        self("import", "-", tag, stdin=tar)

    def close(self) -> None:
        shutil.rmtree(self.base / "storage", ignore_errors=True)
        shutil.rmtree(self.base / "run", ignore_errors=True)


def tree(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry beneath ``root``: kind, permission bits, and content digest or link target."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            st = p.lstat()
            rel = str(p.relative_to(root))
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            elif stat.S_ISREG(st.st_mode):
                out[rel] = ("file", stat.S_IMODE(st.st_mode), hashlib.sha256(p.read_bytes()).hexdigest())
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                out[rel] = ("other", stat.S_IFMT(st.st_mode), st.st_rdev)
    return out


def in_overlay(lowerdirs: Iterable[Path], script: str, base: Path) -> subprocess.CompletedProcess[str]:
    """``script`` (sh) run with $M the overlay of ``lowerdirs`` (topmost first) mounted
    read-only with ``userxattr`` in a user namespace: what the kernel shows of the image."""
    mnt, empty = base / "mnt", base / "empty-lower"
    mnt.mkdir(exist_ok=True)
    empty.mkdir(exist_ok=True)  # overlay wants two lower directories when it has no upper one
    lower = ":".join(str(d) for d in [*lowerdirs, empty])
    mount = f"mount -t overlay overlay -o ro,userxattr,lowerdir={lower} {mnt}"
    return subprocess.run(
        ["unshare", "-Urm", "sh", "-c", f"{mount} && M={mnt} && {script}"],
        capture_output=True,
        text=True,
        timeout=60,
    )


DEBIAN_NAME = "deb"
DEBIAN_PACKAGES = ("python3", "python3-venv", "git", "apt")


def mirror_reachable() -> bool:
    import socket

    try:
        socket.create_connection(("deb.debian.org", 80), timeout=5).close()
        return True
    except OSError:
        return False


def debian_image(tmp_path_factory: object) -> tuple[Path, dict[str, str]]:
    """A Debian bookworm image (mmdebstrap ``essential`` with python3, its venv and git)
    built once per test run with ``warren image build`` into a data directory of the
    run's own: the directory (``XDG_DATA_HOME``) and the environment naming it. The
    pytest-xdist workers of one run share it (a lock: the first builds)."""
    import fcntl
    import sys

    need_tool("mmdebstrap", "warren image build runs it")
    base = Path(tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    data = base / "debian-image" / "data"
    data.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "XDG_DATA_HOME": str(data)}
    with open(data.parent / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (data.parent / "built").exists():
            argv = [sys.executable, "-m", "warren", "image", "build", DEBIAN_NAME, "--debian", "bookworm"]
            argv += ["--variant", "essential", "--include", ",".join(DEBIAN_PACKAGES)]
            done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
            assert done.returncode == 0, done.stderr
            (data.parent / "built").touch()
    return data, env
