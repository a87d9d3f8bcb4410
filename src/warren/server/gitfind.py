"""Finding git repositories beneath a writable root, without following links.

What host git would take for a repository: a ``.git`` directory (and the git
directories of its submodules under ``modules/``), a ``.git`` file that names one
(``gitdir: PATH``; an empty marker such as uv's is not one), and a directory shaped
like a bare repository (``HEAD``, ``objects``, ``refs``), which git run there uses.
The walk goes from the root's descriptor through ``safepath``: a link is never
followed, a directory swapped for one is skipped.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from .._core import safepath, treewalk


@dataclass
class Found:
    gitdirs: list[str] = field(default_factory=list)  # relative to the root ("" is the root itself)
    gitfiles: list[str] = field(default_factory=list)  # ``.git`` files, relative to the root


# Per directory (by path): (inode, ctime, what is there for git, subdirectories). The
# change time, not the modification time: a sandbox may set a directory's mtime back
# (utimensat) after making a ``.git`` in it; nothing sets the ctime but the kernel.
Memory = dict[str, tuple[int, int, str, tuple[str, ...]]]
RACY_NS = 50_000_000  # a directory changed this recently may change again within one tick


def find(root_fd: int, memory: Memory | None = None, tree: treewalk.Tree | None = None) -> Found:
    """Every git directory and ``.git`` file beneath a root, walked from its descriptor
    without following links: ``.git`` directories (and their ``modules/*``), and
    directories shaped like a bare repository (``HEAD``, ``objects``, ``refs``), which
    host git run there would take for one.

    With ``memory`` a directory whose inode and change time are as remembered
    is not listed again (its entries are the same; a change deeper changes a
    subdirectory, which is visited anyway) — unless it changed in the last moments,
    when a second change could keep the same time — and such a directory without
    subdirectories is not even opened: a ``.git`` made in it, or a subdirectory,
    changes its change time.

    With ``tree`` (the native walk of the root, ``_core.treewalk``) the directories are
    not walked here: its findings are taken in the order this walk would find them (a
    directory before what it holds, names in order), their submodules added here."""
    if tree is not None:
        return from_kinds(root_fd, tree.git)
    found = Found()
    _walk(root_fd, "", found, 0, memory, time.time_ns() - RACY_NS)
    return found


def from_kinds(root_fd: int, kinds: Iterable[tuple[str, str]]) -> Found:
    """What a walk that found these directories (relative path, ``kind``) reports: in
    the order the walk here finds them (a directory before what it holds, names in
    order), with the submodules of each git directory. A ``dotfile`` is one git
    follows (its content checked by the caller)."""
    found = Found()
    for rel, kind in sorted(kinds, key=lambda g: g[0].split("/") if g[0] else []):
        if kind == "dotfile":
            found.gitfiles.append(_join(rel, ".git"))
            continue
        try:
            fd = safepath.dir_beneath(root_fd, rel) if rel else os.dup(root_fd)
        except OSError:  # gone since: what the walk saw is reported, without submodules
            found.gitdirs.append(rel if kind == "bare" else _join(rel, ".git"))
            continue
        try:
            if kind == "bare":
                found.gitdirs.extend(_with_modules(fd, rel))
            else:
                found.gitdirs.extend(_with_modules(fd, _join(rel, ".git"), sub=".git"))
        finally:
            os.close(fd)
    return found


def _walk(fd: int, rel: str, found: Found, depth: int, memory: Memory | None, settled: int) -> None:
    if depth > 64:
        return
    try:
        st = os.fstat(fd)
    except OSError:
        return
    known = memory.get(rel) if memory is not None else None
    if known is not None and known[:2] == (st.st_ino, st.st_ctime_ns):
        kind, subdirs = known[2], known[3]
    else:
        try:
            with os.scandir(fd) as it:
                entries = {e.name: e for e in it}
        except OSError:
            return
        kind, subdirs = (
            kind_of(entries),
            tuple(sorted(n for n, e in entries.items() if n != ".git" and is_dir(e))),
        )
        if memory is not None and st.st_ctime_ns < settled:
            memory[rel] = (st.st_ino, st.st_ctime_ns, kind, subdirs)
    if kind == "bare":
        found.gitdirs.extend(_with_modules(fd, rel))
        return
    if kind == "dotgit":
        found.gitdirs.extend(_with_modules(fd, _join(rel, ".git"), sub=".git"))
    elif kind == "dotfile" and is_gitfile(fd, ".git"):
        found.gitfiles.append(_join(rel, ".git"))
    for name in subdirs:
        sub = _join(rel, name)
        if memory is not None and _unchanged_leaf(fd, name, memory.get(sub)):
            continue
        try:
            child = safepath.dir_beneath(fd, name)
        except OSError:
            continue
        try:
            _walk(child, sub, found, depth + 1, memory, settled)
        finally:
            os.close(child)


def _unchanged_leaf(parent_fd: int, name: str, known: tuple[int, int, str, tuple[str, ...]] | None) -> bool:
    """A directory remembered with nothing for git and no subdirectories, as it was:
    nothing to find there, so not opened (most directories of a large tree are such
    leaves: one stat of the name in its parent instead of an open, a stat and a close).
    The name is looked at without following a link, as opening it beneath its parent
    would be."""
    if known is None or known[2] or known[3]:
        return False
    try:
        st = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and (st.st_ino, st.st_ctime_ns) == known[:2]


def kind_of(entries: dict[str, os.DirEntry[str]]) -> str:
    """What a directory with these entries is for git: ``bare`` (shaped like a bare
    repository), ``dotgit`` (holds a ``.git`` directory), ``dotfile`` (a ``.git``
    file, which may or may not name a git directory), or nothing."""
    names = set(entries)
    if {"HEAD", "objects", "refs"} <= names and is_dir(entries["objects"]) and is_dir(entries["refs"]):
        return "bare"
    git = entries.get(".git")
    if git is None:
        return ""
    if is_dir(git):
        return "dotgit"
    return "dotfile" if git.is_file(follow_symlinks=False) else ""


def _with_modules(parent_fd: int, rel: str, sub: str = "") -> list[str]:
    """``rel`` (a git directory) and its submodules' git directories, nested."""
    out = [rel]
    try:
        gfd = safepath.dir_beneath(parent_fd, sub) if sub else os.dup(parent_fd)
    except OSError:
        return out
    try:
        try:
            mfd = safepath.dir_beneath(gfd, "modules")
        except OSError:
            return out
        try:
            out.extend(_modules(mfd, _join(rel, "modules")))
        finally:
            os.close(mfd)
    finally:
        os.close(gfd)
    return out


def _modules(mfd: int, rel: str) -> list[str]:
    # Submodule names may hold slashes: modules/a/b is a git directory or a level.
    out: list[str] = []
    try:
        with os.scandir(mfd) as it:
            dirs = sorted(e.name for e in it if is_dir(e))
    except OSError:
        return out
    for name in dirs:
        try:
            cfd = safepath.dir_beneath(mfd, name)
        except OSError:
            continue
        try:
            with os.scandir(cfd) as it:
                names = {e.name for e in it}
            if {"HEAD", "objects"} <= names or {"HEAD", "commondir"} <= names:
                out.extend(_with_modules(cfd, _join(rel, name)))
            else:
                out.extend(_modules(cfd, _join(rel, name)))
        finally:
            os.close(cfd)
    return out


def is_gitfile(fd: int, name: str) -> bool:
    """A ``.git`` file git follows (``gitdir: PATH``), not a marker such as uv's empty one."""
    try:
        return safepath.read_file(fd, name, 4096).startswith(b"gitdir: ")
    except OSError:
        return False


def is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name
