"""Stack a sandbox's root again, above its own layer frozen where it is: a snapshot
without a copy. Runs in a process that joined the sandbox's user and mount namespaces
(``server.restack``), while PID 1 is the sandbox's only process.

The root is an overlay: the image's layers below, the sandbox's layer (the ``upper``
directory on its layer tmpfs) on top. Here that layer stops being written: a new
overlay is made with it as the topmost lower layer and a fresh upper directory on the
same tmpfs above it (so ``--disk`` still counts everything), every mount of the old
root is moved onto the new one, and ``pivot_root`` puts the new one in its place. The
kernel moves every process whose root was the old root's (PID 1, its broker thread)
along. Layers are named by descriptor (detached mounts the supervisor holds since
``Ready``), never by a path the sandbox could have changed. Nothing is changed
before every check passed: a mount point the new root lacks, or has as another kind,
is refused (the caller copies instead).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from . import _sys

_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_CLONE = _sys.OPEN_TREE_CLONE | _sys.OPEN_TREE_CLOEXEC


def restack(
    tmpfs: int, lowers: list[int], upper: str, new: str, children: list[str], freeze: bool = True
) -> tuple[int, int]:
    """Freeze ``upper`` (a directory of the layer tmpfs ``tmpfs``) and stack the root
    again above it and ``lowers`` (top first), with ``new`` (made here) as the fresh
    upper directory. ``children``: the mount points of the mounts directly on the root,
    in the order they were made (``server.restack.root_children``). Returns the frozen
    layer (a detached mount) and the new upper directory (for the supervisor's
    snapshots). Not ``freeze`` (a rollback): ``upper`` is dropped, not frozen, the root
    stands on ``lowers`` alone (-1 for the frozen layer)."""
    work = new.replace("upper", "work", 1)
    for name in (new, work):
        with contextlib.suppress(FileNotFoundError):
            os.rmdir(name, dir_fd=tmpfs)  # left empty by an attempt that was refused
        os.mkdir(name, 0o755, dir_fd=tmpfs)
    st = os.stat(upper, dir_fd=tmpfs, follow_symlinks=False)
    # The overlay's root takes its owner, mode and times from the upper directory.
    os.chown(new, st.st_uid, st.st_gid, dir_fd=tmpfs, follow_symlinks=False)
    os.chmod(new, stat.S_IMODE(st.st_mode), dir_fd=tmpfs)
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=tmpfs, follow_symlinks=False)
    frozen = -1
    if freeze:
        held = os.open(upper, _PATH_DIR, dir_fd=tmpfs)
        try:
            frozen = _read_only(_sys.open_tree("", _CLONE | _sys.AT_EMPTY_PATH, held))
        finally:
            os.close(held)
    new_fd = up = wk = mnt = -1
    try:
        up = os.open(new, _PATH_DIR, dir_fd=tmpfs)
        wk = os.open(work, _PATH_DIR, dir_fd=tmpfs)
        mnt = _sys.overlay_from_fds([frozen, *lowers] if freeze else lowers, up, wk)
        old = os.open("/", _PATH_DIR)
        try:
            _check_points(old, mnt, children)
            point = f"/dev/.warren-restack-{secrets.token_hex(6)}"
            os.mkdir(point, 0o700)
            try:
                _sys.move_mount(mnt, point)
                new_fd = os.open(point, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                os.fchdir(new_fd)
                _sys.pivot_root(".", ".")
                try:
                    for child in children:
                        rel = child.lstrip("/")
                        _sys.move_mount_at(old, rel, new_fd, rel)
                    _sys.umount2(".", _sys.MNT_DETACH)  # the old root, on top of the new
                    os.chdir("/")
                except OSError as e:
                    raise OSError(errno.ENOTRECOVERABLE, e.strerror, f"{e.filename}: {e.strerror}") from None
            finally:
                with contextlib.suppress(OSError):
                    os.rmdir(point)
        finally:
            os.close(old)
        return frozen, os.open(new, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=tmpfs)
    except BaseException:
        if frozen >= 0:
            os.close(frozen)
        raise
    finally:
        for fd in (new_fd, up, wk, mnt):
            if fd >= 0:
                os.close(fd)


def _check_points(old: int, mnt: int, children: list[str]) -> None:
    """Every mount point of the old root is there, of the same kind, in the new one."""
    for child in children:
        rel = child.lstrip("/")
        if not rel:
            raise OSError(errno.EINVAL, "a mount at the root itself", child)
        was = os.stat(rel, dir_fd=old, follow_symlinks=False)
        try:
            now = os.stat(rel, dir_fd=mnt, follow_symlinks=False)
        except FileNotFoundError:
            raise OSError(errno.ENOENT, "a mount point missing from the new root", child) from None
        if stat.S_ISDIR(was.st_mode) != stat.S_ISDIR(now.st_mode):
            raise OSError(errno.ENOTDIR, "a mount point of another kind in the new root", child)


def _read_only(fd: int) -> int:
    """A layer's detached mount, read-only: an overlay never writes a lower layer, and
    nothing else may."""
    try:
        _sys.mount_setattr(fd, _sys.MOUNT_ATTR_RDONLY)
    except BaseException:
        os.close(fd)
        raise
    return fd


def clone_layers(fds: list[int]) -> list[int]:
    """Fresh detached copies of layers held as detached mounts (a detached mount can be
    attached once; each new sandbox needs its own), made in their namespaces."""
    out: list[int] = []
    try:
        for fd in fds:
            out.append(_read_only(_sys.open_tree("", _CLONE | _sys.AT_EMPTY_PATH, fd)))
    except BaseException:
        for fd in out:
            os.close(fd)
        raise
    return out


def restack_dir(
    target: str, lowers: list[int], upper: int, work: int, children: list[str], mirror: str | None = None
) -> int:
    """Stack the overlay mounted at ``target`` (a review workspace) again: ``lowers``
    (layers by descriptor, top first: frozen upper directories, then the host's
    directory as a detached mount), ``upper`` and ``work`` fresh directories. The
    mounts directly on the old overlay (``children``, relative to ``target``, in the
    order they were made) move onto the new one, the old one is detached and the new
    one takes its place. ``mirror``: where the sandbox also sees the workspace
    (``workspace_at``: a copy of ``target`` with every mount beneath it, made at
    launch); the copy of the old overlay there is replaced by a copy of the new one.
    Nothing is changed before every check passed; a failure after the old overlay was
    moved is ENOTRECOVERABLE (the workspace is not there).

    Returns the old overlay, detached: the close of its last reference ends it, which
    syncs its upper directory's filesystem (the whole of it: seconds when much is
    dirty), so the caller closes it off the command's path."""
    mnt = _sys.overlay_from_fds(lowers, upper, work)
    new_fd = old = -1
    try:
        old = os.open(target, _PATH_DIR)
        _check_points(old, mnt, children)
        point = f"/dev/.warren-restack-{secrets.token_hex(6)}"
        os.mkdir(point, 0o700)
        try:
            _sys.move_mount(mnt, point)
            new_fd = os.open(point, _PATH_DIR)
            try:
                for child in children:
                    rel = child.strip("/")
                    _sys.move_mount_at(old, rel, new_fd, rel)
                _sys.umount2(target, _sys.MNT_DETACH)  # the old overlay, its children gone
                _sys.move_mount(new_fd, target)
                if mirror is not None:
                    copy = _sys.open_tree(target, _CLONE | _sys.AT_RECURSIVE)
                    try:
                        _sys.umount2(mirror, _sys.MNT_DETACH)  # the old copy, with its mounts
                        _sys.move_mount(copy, mirror)
                    finally:
                        os.close(copy)
            except OSError as e:
                raise OSError(errno.ENOTRECOVERABLE, e.strerror, f"{e.filename}: {e.strerror}") from None
        finally:
            with contextlib.suppress(OSError):
                os.rmdir(point)
        old, gone = -1, old
        return gone
    finally:
        for fd in (new_fd, old, mnt):
            if fd >= 0:
                os.close(fd)
