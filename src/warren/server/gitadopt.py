"""Adopting repositories made inside a sandbox, once no sandbox can write them.

A repository made inside (``git init``, ``cargo new``, a submodule, a bare-shaped
directory) is the sandbox's while it lives. Afterwards its config moves into a store
(``gitstore.location``) and the host's copy keeps only the ``SYNCED`` keys; hooks,
``commondir`` and ``config.worktree`` move into the store; a worktree entry's
``commondir`` pointing elsewhere goes. From then on it is protected like any other.
Everything through directory descriptors (``safepath``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from .._core import safepath
from .gitstore import MAX_CONFIG, applied, copy_file, open_store, save_json, synced, values_of


def adopt(root_fd: int, root: str, rel: str, env: Mapping[str, str]) -> list[str]:
    """A git directory made inside a sandbox, once no sandbox can write it: its config
    and hooks become a store's (the host keeps the ``SYNCED`` keys), ``commondir`` and
    ``config.worktree`` go, and so does what its worktrees hold of that kind. Returns
    what was done."""
    done = []
    path = os.path.normpath(os.path.join(root, rel))
    gfd = safepath.dir_beneath(root_fd, rel) if rel else os.dup(root_fd)
    try:
        _store, sfd, tfd = open_store(path, env)
        try:
            done += _adopt_config(gfd, sfd, tfd, path)
            done += _adopt_hooks(gfd, tfd, path)
            for name in ("commondir", "config.worktree"):
                if _move_into(gfd, tfd, name):
                    done.append(f"{path}/{name}: moved into warren's store")
            done += _adopt_worktrees(gfd, path)
        finally:
            os.close(tfd)
            os.close(sfd)
    finally:
        os.close(gfd)
    return done


def _adopt_config(gfd: int, sfd: int, tfd: int, path: str) -> list[str]:
    try:
        data = safepath.read_file(gfd, "config", MAX_CONFIG)
    except FileNotFoundError:
        return []
    mine = values_of(sfd, data, lenient=True)
    kept = {k: v for k, v in mine.items() if synced(k)}
    if kept == mine:
        return []
    safepath.write_atomic(tfd, "config", data, mode=0o644)
    reduced = applied(sfd, b"", kept)
    safepath.write_atomic(gfd, "config", reduced)
    save_json(sfd, "base.json", {"values": kept, "stamps": {}})
    gone = sorted(set(mine) - set(kept))
    return [f"{path}/config: {', '.join(gone)} moved into warren's store"]


def _adopt_hooks(gfd: int, tfd: int, path: str) -> list[str]:
    try:
        hfd = safepath.dir_beneath(gfd, "hooks")
    except OSError:
        st = safepath.lstat_beneath(gfd, "hooks")
        if st is not None:  # a link or a file where hooks/ should be
            safepath.remove_tree(gfd, "hooks")
            return [f"{path}/hooks: removed (not a directory)"]
        return []
    moved = []
    try:
        th = safepath.dir_beneath(tfd, "hooks")
        try:
            with os.scandir(hfd) as it:
                names = [e.name for e in it if not e.name.endswith(".sample")]
            for name in names:
                st = os.stat(name, dir_fd=hfd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    copy_file(hfd, th, name)
                safepath.remove_tree(hfd, name)
                moved.append(name)
        finally:
            os.close(th)
    finally:
        os.close(hfd)
    return [f"{path}/hooks/{', '.join(moved)}: moved into warren's store"] if moved else []


def _move_into(gfd: int, tfd: int, name: str) -> bool:
    st = safepath.lstat_beneath(gfd, name)
    if st is None:
        return False
    if stat.S_ISREG(st.st_mode):
        copy_file(gfd, tfd, name)
    safepath.remove_tree(gfd, name)
    return True


def _adopt_worktrees(gfd: int, path: str) -> list[str]:
    done: list[str] = []
    try:
        wfd = safepath.dir_beneath(gfd, "worktrees")
    except OSError:
        return done
    try:
        with os.scandir(wfd) as it:
            names = [e.name for e in it]
        for name in names:
            try:
                efd = safepath.dir_beneath(wfd, name)
            except OSError:
                safepath.remove_tree(wfd, name)
                continue
            try:
                if safepath.lstat_beneath(efd, "config.worktree") is not None:
                    safepath.remove_tree(efd, "config.worktree")
                    done.append(f"{path}/worktrees/{name}/config.worktree: removed")
                try:
                    common = safepath.read_file(efd, "commondir", 4096).strip()
                except OSError:
                    common = b"../.."
                if common != b"../..":
                    safepath.remove_tree(efd, "commondir")
                    done.append(f"{path}/worktrees/{name}/commondir: removed (pointed elsewhere)")
            finally:
                os.close(efd)
    finally:
        os.close(wfd)
    return done
