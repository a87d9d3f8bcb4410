"""Building an image from Debian's packages with mmdebstrap.

Owns the mmdebstrap command line and checking what goes into it. mmdebstrap writes
the root as a tar (``--mode=unshare``: it needs no root, only the caller's subordinate
ids in ``/etc/subuid``), and the store imports that tar like any other layer, so a
built image passes the same unpacker and gets a digest like an imported one.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ..errors import ImageError
from . import unpack
from .config import DEFAULT_PATH
from .ref import ImageConfig, ImageRef
from .store import ImageStore, Progress

VARIANTS = ("essential", "minbase", "apt", "required", "important", "standard")
_SUITE = re.compile(r"[a-z][a-z0-9.-]{0,39}")
_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]{0,127}")
_MIRROR = re.compile(r"(https?|file)://[^\s]+")
_TAIL = 20  # lines of mmdebstrap's output shown when it fails


def _check(value: str, pattern: re.Pattern[str], what: str, hint: str) -> str:
    if not pattern.fullmatch(value):
        raise ImageError(f"invalid {what} {value!r}", operation="image build", hint=hint)
    return value


def command(
    suite: str, out: Path, *, include: Sequence[str] = (), mirror: str | None = None, variant: str = "minbase"
) -> list[str]:
    """The mmdebstrap command that writes Debian ``suite`` as a tar to ``out``. The
    request is checked first: bad input is named as such whether or not mmdebstrap is
    there."""
    _check(suite, _SUITE, "Debian suite", "name a suite such as bookworm, trixie or stable")
    if variant not in VARIANTS:
        raise ImageError(
            f"invalid variant {variant!r}", operation="image build", hint=f"one of {', '.join(VARIANTS)}"
        )
    for pkg in include:
        _check(
            pkg, _PACKAGE, "package name", "Debian package names: lower-case letters, digits, '+', '-', '.'"
        )
    if mirror is not None:
        _check(mirror, _MIRROR, "mirror", "a URL such as http://deb.debian.org/debian")
    exe = shutil.which("mmdebstrap")
    if exe is None:
        raise ImageError(
            "mmdebstrap is not installed",
            operation="image build",
            hint="install it (apt install mmdebstrap), or import an image made elsewhere",
        )
    # force-unsafe-io: dpkg skips its fsyncs. The tree is a throwaway that mmdebstrap
    # turns into a tar and that is imported from there (a failed build is built again),
    # so the fsyncs bought nothing and took half of a build's time.
    argv = [exe, f"--variant={variant}", "--mode=unshare", "--format=tar", "--dpkgopt=force-unsafe-io"]
    if include:
        argv.append("--include=" + ",".join(include))
    argv += [suite, str(out)]
    if mirror is not None:
        argv.append(mirror)
    return argv


def debian(
    store: ImageStore,
    name: str,
    suite: str,
    *,
    include: Sequence[str] = (),
    mirror: str | None = None,
    variant: str = "minbase",
    max_size: int = unpack.DEFAULT_MAX_SIZE,
    show_output: bool = False,
    progress: Progress | None = None,
    warn: Callable[[str], None] | None = None,
) -> ImageRef:
    """Build Debian ``suite`` with mmdebstrap and add it to ``store`` as ``name``.
    ``show_output`` lets mmdebstrap write its progress to our stderr (a terminal)."""
    from .store import check_name

    check_name(name)
    store.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=store.root))
    try:
        out = work / "root.tar"
        argv = command(suite, out, include=include, mirror=mirror, variant=variant)
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=None if show_output else subprocess.PIPE,
            stderr=None if show_output else subprocess.STDOUT,
            cwd="/",
            check=False,
        )
        if done.returncode != 0:
            tail = (done.stdout or b"").decode(errors="replace").strip().splitlines()[-_TAIL:]
            raise ImageError(
                f"mmdebstrap failed (exit status {done.returncode})"
                + ("".join(f"\n  | {line}" for line in tail) if tail else ""),
                operation="image build",
                hint="check the suite, the package names and the mirror; a user other than root "
                "needs subordinate ids in /etc/subuid and /etc/subgid",
            )
        return store.import_root(
            name,
            out,
            config=ImageConfig(env=(("PATH", DEFAULT_PATH),), cmd=("bash",)),
            source=f"debian {suite} ({variant}{', ' + ','.join(include) if include else ''})",
            max_size=max_size,
            progress=progress,
            warn=warn,
        )
    finally:
        with contextlib.suppress(OSError):
            fd = os.open(store.root, os.O_RDONLY | os.O_DIRECTORY)
            try:
                unpack.remove_tree(fd, work.name)
            finally:
                os.close(fd)
