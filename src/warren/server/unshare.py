"""Give workspace names of files linked from outside an inode of their own.

A workspace file that is also a hard link to a file outside the writable roots
(``server.links`` finds them, the plan lists them in ``Plan.unshare``) is copied,
before the sandbox starts, to a fresh file beside it and the copy takes its place —
what ``git clone --no-hardlinks`` does. The outside file keeps its inode and content
and is no longer reachable from the workspace; the workspace file is then an
ordinary file: the sandbox may write, rename, replace or unlink it as on the host,
and ``git gc`` prunes it, because no mount sits on it. The names a file has inside
the workspace keep sharing one inode (the copy is linked to each).

The workspace is sandbox-writable, and a long-lived sandbox of it may be running
meanwhile, so every step goes through directory descriptors (``_core.safepath``:
nothing followed, no predictable name) and the replacement is an exchange, never a
blind rename: ``renameat2(RENAME_EXCHANGE)`` swaps the copy with the workspace name,
then the name swapped out is checked — if it was the outside file, its workspace name
is dropped; if anything else had taken that name meanwhile, it is swapped back. The
copy is made from a descriptor checked to be that very inode. Only content the user
could read already is copied: a file with a name under a denied path is never planned
here (the plan masks it instead).

Kept: content, mode (without set-id bits), times, and the owner when the supervisor
may set it (root). Not kept: extended attributes and ACLs, the inode number, and the
storage shared with the outside file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Sequence
from pathlib import PurePosixPath

from .._core import extents, safepath
from ..errors import SetupError

# A directory on the way that is no longer one (or became a link): the name is gone.
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EXDEV)


def own_inodes(workspace: str, files: Sequence[tuple[str, int, int]]) -> int:
    """Give each (path, dev, ino) of ``files`` (paths under ``workspace``) an inode of
    its own, one copy per outside file shared by its names here. Returns how many
    names were replaced; a name that is no longer that file is left as it is."""
    if not files:
        return 0
    try:
        root = safepath.open_dir(workspace)
    except OSError as e:
        raise _error(workspace, e) from None
    by_inode: dict[tuple[int, int], list[str]] = {}
    for path, dev, ino in files:
        rel = str(PurePosixPath(path).relative_to(workspace))
        by_inode.setdefault((dev, ino), []).append(rel)
    done = 0
    try:
        for key, rels in by_inode.items():
            done += _own(root, key, rels)
    finally:
        os.close(root)
    return done


def _own(root: int, key: tuple[int, int], rels: list[str]) -> int:
    copy = -1  # descriptor of the new inode, once made
    done = 0
    try:
        for rel in rels:
            try:
                copy, replaced = _replace(root, rel, key, copy)
            except OSError as e:
                raise _error(rel, e) from None
            done += replaced
    finally:
        if copy >= 0:
            os.close(copy)
    return done


def _replace(root: int, rel: str, key: tuple[int, int], copy: int) -> tuple[int, bool]:
    parent, name = safepath.split(rel)
    try:
        pfd = safepath.dir_beneath(root, parent)
    except OSError as e:
        if e.errno in _GONE:  # its directory moved or was replaced: not that file any more
            return copy, False
        raise
    try:
        try:
            st = os.stat(name, dir_fd=pfd, follow_symlinks=False)
        except FileNotFoundError:
            return copy, False
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != key:
            return copy, False  # no longer that file: what is there now is not ours to touch
        tmp = safepath.temp_name(name)
        if copy < 0:
            copy = _copy(pfd, name, tmp, key)
            if copy < 0:
                return copy, False
        else:
            os.link(f"/proc/self/fd/{copy}", tmp, dst_dir_fd=pfd, follow_symlinks=True)
        try:
            try:
                safepath.exchange(pfd, tmp, name)
            except FileNotFoundError:  # the name went away meanwhile
                return copy, False
            out = os.stat(tmp, dir_fd=pfd, follow_symlinks=False)
            replaced = (out.st_dev, out.st_ino) == key
            if not replaced:
                safepath.exchange(pfd, tmp, name)  # something else had taken the name: put it back
            return copy, replaced
        finally:
            # The outside file's workspace name (or the unused copy): dropped.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=pfd)
    finally:
        os.close(pfd)


def _copy(pfd: int, name: str, tmp: str, key: tuple[int, int]) -> int:
    """A fresh file ``tmp`` with the content, mode and times of ``name`` (checked to
    be the inode ``key`` through the descriptor it is read from); -1 if it is not."""
    # Never waiting in the open: a FIFO may have taken the name since the scan.
    src = safepath.open_beneath(pfd, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(src)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != key:
            return -1
        with safepath.new_file(pfd, tmp) as dst:
            # Its holes stay holes: a sparse file the sandbox made costs what it holds.
            extents.copy_data(src, dst, passes=2)
            if os.geteuid() == 0:
                with contextlib.suppress(OSError):
                    os.fchown(dst, st.st_uid, st.st_gid)
            os.fchmod(dst, stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID))
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        return dst
    finally:
        os.close(src)


def _error(path: str, e: OSError) -> SetupError:
    return SetupError.from_os(
        e,
        f"cannot give {path} an inode of its own (it is also a hard link to a file outside "
        f"the writable roots): {e.strerror or e}",
        "unshare",
        path,
        hint="replace the link yourself (cp --remove-destination, or git clone --no-hardlinks), "
        "or make the other name's directory writable with --write DIR",
    )
