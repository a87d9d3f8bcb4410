"""The probe catalogue and the runner: which probes run where, each in a scratch
directory of its own.

Every location gets a scratch directory (named ``.warren-doctor-XXXXXXXX``, created and
removed here); the probes themselves live in ``file_probes`` (files, links, locks within
one location and between two) and ``workspace_probes`` (sockets, FIFOs, inotify, git),
written with the helpers of ``probe_base``. Probes never touch anything they did not
create, and they decide nothing about causes: that is ``diagnose.py``'s job.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from .evidence import Evidence, Location
from .file_probes import (
    chmod_utimes,
    create_dir,
    create_file,
    dir_rename,
    dir_rename_across_dirs,
    fcntl_lock,
    flock,
    fsync,
    hardlink_across_dirs,
    hardlink_between,
    hardlink_same_dir,
    long_path,
    mmap_shared,
    non_ascii_name,
    o_tmpfile,
    rename_across_dirs,
    rename_between,
    rename_same_dir,
    renameat2_exchange,
    renameat2_noreplace,
    sparse_file,
    symlink,
    xattr_user,
)
from .probe_base import ProbeResult, _mkdirs, _op, _result, describe, j
from .workspace_probes import _cwd, fifo, git_commit, inotify, unix_socket

# ProbeResult is re-exported: the report and the diagnosis take it from here.
__all__ = ["SCRATCH_PREFIX", "ProbeResult", "run_probes"]

SCRATCH_PREFIX = ".warren-doctor-"


# --- the catalogue ----------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    id: str
    title: str
    required: bool
    fn: Callable[[str], str]


FILE_PROBES: tuple[Probe, ...] = (
    Probe("create_file", "create, write and read a file", True, create_file),
    Probe("create_dir", "create and remove a directory", True, create_dir),
    Probe("o_tmpfile", "O_TMPFILE, then link it into place", False, o_tmpfile),
    Probe("rename_same_dir", "rename a file within one directory", True, rename_same_dir),
    Probe("rename_across_dirs", "rename a file into another directory", True, rename_across_dirs),
    Probe("renameat2_noreplace", "renameat2(RENAME_NOREPLACE)", False, renameat2_noreplace),
    Probe("renameat2_exchange", "renameat2(RENAME_EXCHANGE)", False, renameat2_exchange),
    Probe("dir_rename", "rename a directory within its parent", True, dir_rename),
    Probe("dir_rename_across_dirs", "move a directory into another directory", True, dir_rename_across_dirs),
    Probe("hardlink_same_dir", "hardlink within one directory", True, hardlink_same_dir),
    Probe("hardlink_across_dirs", "hardlink into another directory", True, hardlink_across_dirs),
    Probe("symlink", "create and follow a symlink", True, symlink),
    Probe("fsync", "fsync a file and its directory", True, fsync),
    Probe("flock", "flock, enforced between open files", True, flock),
    Probe("fcntl_lock", "fcntl POSIX and OFD locks", True, fcntl_lock),
    Probe("mmap_shared", "shared writable mmap", True, mmap_shared),
    Probe("xattr_user", "user.* extended attributes", False, xattr_user),
    Probe("chmod_utimes", "chmod and utimes", True, chmod_utimes),
    Probe("sparse_file", "sparse file", False, sparse_file),
    Probe("long_path", "path longer than 1,024 bytes", True, long_path),
    Probe("non_ascii_name", "non-ASCII file names", True, non_ascii_name),
)
WORKSPACE_PROBES: tuple[Probe, ...] = (
    Probe("unix_socket", "unix socket: bind, connect, send", True, unix_socket),
    Probe("fifo", "FIFO: mkfifo, open, write, read", True, fifo),
    Probe("inotify", "inotify sees a new file", False, inotify),
    Probe("git_commit", "git init, add, commit in a scratch repo", True, git_commit),
)
WRITABLE_PROBES: tuple[Probe, ...] = (FILE_PROBES[0], FILE_PROBES[1])


@dataclass(frozen=True)
class Between:
    """A probe of a step from one location into another (a file moved or linked)."""

    id: str
    title: str
    required: bool
    fn: Callable[[str, str], str]


CACHE_INTO_WORKSPACE: tuple[Between, ...] = (
    Between("hardlink_into_workspace", "hardlink a cached file into the workspace", True, hardlink_between),
    Between("rename_into_workspace", "rename a cached file into the workspace", True, rename_between),
)
TEMP_INTO_WORKSPACE = Between(
    "rename_into_workspace", "rename a temp file into the workspace", False, rename_between
)
TEMP_INTO_CACHE = Between("rename_into_cache", "rename a temp file into the cache", False, rename_between)


# --- the runner -------------------------------------------------------------------


def _probe_in_subdir(probe: Probe, scratch: str, n: int) -> Callable[[], str]:
    def run() -> str:
        d = j(scratch, f"{n:02d}-{probe.id}")
        _op("mkdir", os.mkdir, d)
        return probe.fn(d)

    return run


def _between(probe: Between, src: tuple[str, str], dst: tuple[str, str], n: int) -> ProbeResult:
    """Run ``probe`` from the scratch directory of ``src`` into that of ``dst`` (each a
    role and its scratch directory)."""

    def run() -> str:
        s, t = j(src[1], f"{n:02d}-src"), j(dst[1], f"{n:02d}-dst")
        _mkdirs(s, t)
        return probe.fn(s, t)

    where = f"{src[0]}->{dst[0]}"
    return _result(probe.id, probe.title, where, probe.required, run, src=src[0], dst=dst[0])


def _dir_into_root(scratch: str, root: str) -> Callable[[], str]:
    """Move a new directory into the workspace root itself, as tools do when they
    unpack into a temporary directory and move it into place. On overlayfs the root is
    often a directory of a lower (image) layer, and overlay must mark the moved directory
    opaque with an xattr, which it cannot do without xattr support (userxattr)."""

    def run() -> str:
        src = j(scratch, "dir-into-root")
        _mkdirs(src, j(src, "sub"))
        target = j(root, os.path.basename(scratch) + "-moved")
        _op("rename", os.rename, j(src, "sub"), target, kind="dir")
        _op("rmdir", os.rmdir, target)
        return ""

    return run


def _skip_all(probes: tuple[Probe, ...], role: str, why: str) -> list[ProbeResult]:
    return [ProbeResult(p.id, p.title, role, "skip", p.required, message=why) for p in probes]


def run_probes(evidence: Evidence, *, full_suite_roles: frozenset[str]) -> list[ProbeResult]:
    """Run every probe for every location of ``evidence``; return one result each.

    Locations in ``full_suite_roles`` get every file probe; the workspace also gets
    sockets, FIFOs, inotify and git; tool caches only whether they are writable; and
    every cache gets hardlink and rename into the workspace.
    """
    results: list[ProbeResult] = [_result("cwd", "the working directory exists", "process", True, _cwd)]
    scratch: dict[str, str] = {}
    counter = iter(range(10_000))
    for loc in evidence.locations:
        if loc.role == "workspace":
            probes = FILE_PROBES + WORKSPACE_PROBES
        elif loc.role in full_suite_roles:
            probes = FILE_PROBES
        else:
            probes = WRITABLE_PROBES
        made = _make_scratch(loc)
        if isinstance(made, ProbeResult):
            results.append(made)
            rest = tuple(p for p in probes if p.id != "create_dir")
            results.extend(_skip_all(rest, loc.role, "no scratch directory could be created"))
            continue
        scratch[loc.role] = made
        for probe in probes:
            results.append(
                _result(
                    probe.id,
                    probe.title,
                    loc.role,
                    probe.required,
                    _probe_in_subdir(probe, made, next(counter)),
                )
            )
        if loc.role == "workspace":
            results.append(
                _result(
                    "dir_rename_into_root",
                    "move a new directory into the workspace root",
                    "workspace",
                    True,
                    _dir_into_root(made, loc.path),
                )
            )
    ws = scratch.get("workspace")
    for loc in evidence.locations:
        if loc.role == "workspace" or loc.role not in scratch:
            continue
        src = (loc.role, scratch[loc.role])
        into_workspace = (TEMP_INTO_WORKSPACE,) if loc.role == "tmpdir" else CACHE_INTO_WORKSPACE
        if ws is None:
            why = "the workspace could not be probed"
            where = f"{loc.role}->workspace"
            for p in into_workspace:
                results.append(ProbeResult(p.id, p.id.replace("_", " "), where, "skip", True, message=why))
            continue
        results.extend(_between(p, src, ("workspace", ws), next(counter)) for p in into_workspace)
        if loc.role == "tmpdir":
            for other in evidence.locations:
                if other.role.startswith(("cache", "tool-cache")) and other.role in scratch:
                    cache = (other.role, scratch[other.role])
                    results.append(_between(TEMP_INTO_CACHE, src, cache, next(counter)))
    for role, path in scratch.items():
        results.extend(_cleanup(role, path))
    return results


def _make_scratch(loc: Location) -> str | ProbeResult:
    title = "create the scratch directory"
    try:
        return tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=loc.probe_dir)
    except OSError as e:
        return ProbeResult("create_dir", title, loc.role, "fail", True, "mkdir", e.errno, describe(e), "dir")


def _cleanup(role: str, path: str) -> list[ProbeResult]:
    errors: list[str] = []
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda _f, p, e: errors.append(f"{p}: {e}"))
    else:
        shutil.rmtree(path, onerror=lambda _f, p, ei: errors.append(f"{p}: {ei[1]}"))
    if os.path.lexists(path) or errors:
        msg = "; ".join(errors[:3]) or "the scratch directory is still there"
        title = "remove the scratch directory"
        return [ProbeResult("cleanup", title, role, "error", True, message=f"left {path}: {msg}")]
    return []
