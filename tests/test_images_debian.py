"""A Debian image built here (``warren image build``: mmdebstrap from deb.debian.org),
and the same root imported from a docker-archive podman made of it: the two are the
same tree, and the kernel runs Debian's own tools from it through an overlay.

One build per run (the slow part: a minute or more), shared with the fidelity battery
on an image (``test_image_fidelity``); the ``essential`` variant, the smallest root dpkg
and a shell work in, with python3 and git. Skipped, saying so, only where the Debian
mirror cannot be reached."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from images_util import Podman, debian_image, in_overlay, mirror_reachable, tree
from warren.images.store import ImageStore

pytestmark = pytest.mark.skipif(not mirror_reachable(), reason="deb.debian.org is not reachable from here")


def _cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "warren", "image", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ImageStore, dict[str, str], Path]]:
    base = tmp_path_factory.mktemp("debian")
    data, env = debian_image(tmp_path_factory)
    yield ImageStore(data / "warren" / "images"), env, base


def test_a_debian_image_built_here_runs_debian_tools_through_an_overlay(
    built: tuple[ImageStore, dict[str, str], Path],
) -> None:
    store, env, base = built
    ref = store.resolve("deb")
    assert len(ref.layers) == 1 and ref.config.cmd == ("bash",)
    info = json.loads(_cli(env, "inspect", "--json", "deb").stdout)[0]
    assert info["source"].startswith("debian bookworm") and info["size"] > 10 << 20
    shown = in_overlay(
        ref.lowerdirs,
        "/usr/sbin/chroot $M /bin/sh -c \"cat /etc/debian_version; dpkg-query -W -f='\\${Status}\\n' dpkg\"",
        base,
    )
    assert shown.returncode == 0, shown.stderr
    version, status = shown.stdout.split("\n")[:2]
    assert version.startswith("12.") and status == "install ok installed"
    # every file is the caller's (the sandbox maps its root to the caller)
    assert (ref.layers[0] / "etc" / "debian_version").stat().st_uid == os.getuid()


# A whole Debian root through podman's archive and back: the format's fidelity, the same
# whoever imports (podman's archives as each caller, rootless podman among them, are
# tests/test_images.py's, in both halves). Half a minute of a half.
@pytest.mark.caller_independent(half="root")
def test_the_same_root_imported_from_a_podman_docker_archive_is_the_same_tree(
    built: tuple[ImageStore, dict[str, str], Path],
) -> None:
    store, env, base = built
    ref = store.resolve("deb")
    podman = Podman(base / "podman")
    (base / "podman").mkdir(exist_ok=True)
    try:
        podman.import_root(ref.layers[0], "localhost/deb")
        podman("save", "--format", "docker-archive", "-o", str(base / "deb.tar"), "localhost/deb")
    finally:
        podman.close()
    done = _cli(env, "import", "deb-podman", str(base / "deb.tar"), timeout=300)
    assert done.returncode == 0, done.stderr
    imported = store.resolve("deb-podman")
    assert imported.layers != ref.layers  # podman's tar is another blob: its own layer
    assert tree(imported.layers[0]) == tree(ref.layers[0])
    assert _cli(env, "rm", "deb-podman").returncode == 0
    assert not imported.layers[0].exists() and ref.layers[0].is_dir()
