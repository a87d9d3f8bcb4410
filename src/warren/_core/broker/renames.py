"""Renames of directories in a sandbox on an image: never EXDEV within its own layer.

An overlay mounted in a user namespace (``userxattr``) cannot record a redirect, so
renaming a directory that comes from a lower layer (the image) is ``EXDEV``: tools
that do it (pip replacing a package, uv, ``mv`` of a directory of the image) fail or
fall back. Where the kernel would say ``EXDEV`` for two names on the sandbox's own
root (one mount), the broker makes the rename a move of the tree instead: a new
directory under a fresh random name beside the destination, every entry renamed into
it (files are copied up by the overlay; lower directories again moved this way), the
old directory's mode, times and user attributes carried over, then that directory
renamed onto the destination in one step and the emptied source removed. The result
is the rename's; what is not is atomicity for a concurrent observer of the source
(its entries leave one by one) and the cost (a copy-up of every file from the image).

Only directories on the sandbox's root are handled here: any other rename is let go
on ("continue") and runs in the caller under its own Landlock domain. The broker acts
with PID 1's credentials, which are the caller's (no capability either holds), on
descriptors it opened itself, and only on the layer, which the caller may write
everywhere; a rename between mounts stays ``EXDEV``, as on the host.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from .. import _sys
from .call import AT_FDCWD, Call, Outcome
from .places import Places

RENAME_NOREPLACE = 1
RENAME_EXCHANGE = 2
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _names(call: Call, olddir: int, oldptr: int, newdir: int, newptr: int, flags: int) -> Outcome:
    old, new = call.string(oldptr), call.string(newptr)
    if old is None or new is None:
        return -errno.EFAULT
    layer = _layer_dev()
    src = call.parent(olddir, old)
    if src is None:
        return None  # ".", "..", "" and the like: the kernel's own answer
    dst = call.parent(newdir, new)
    if dst is None:
        os.close(src[0])
        return None
    try:
        return _rename(src, dst, flags, layer)
    finally:
        os.close(src[0])
        os.close(dst[0])


def _layer_dev() -> int:
    return os.stat("/").st_dev  # the broker's root is the sandbox's: the overlay


def _rename(src: tuple[int, bytes], dst: tuple[int, bytes], flags: int, layer: int) -> Outcome:
    (sfd, sname), (dfd, dname) = src, dst
    try:
        st = os.stat(sname, dir_fd=sfd, follow_symlinks=False)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_dev != layer or os.fstat(dfd).st_dev != layer:
        return None  # not a directory of the layer: the caller's own call, under Landlock
    try:
        _sys.renameat2(sfd, os.fsdecode(sname), dfd, os.fsdecode(dname), flags)
        return 0
    except OSError as e:
        if e.errno != errno.EXDEV or flags & RENAME_EXCHANGE:
            return -(e.errno or errno.EIO)
    try:
        _replaceable(dfd, dname, flags)
        _move_tree(sfd, sname, dfd, dname)
        return 0
    except OSError as e:
        return -(e.errno or errno.EIO)


def _replaceable(dfd: int, dname: bytes, flags: int) -> None:
    """What rename(2) would say of the destination: a directory may replace only an
    empty directory (checked again by the last, atomic step)."""
    try:
        st = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if flags & RENAME_NOREPLACE:
        raise OSError(errno.EEXIST, "exists")
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory")
    fd = os.open(dname, _DIR, dir_fd=dfd)
    try:
        if os.listdir(fd):
            raise OSError(errno.ENOTEMPTY, "not empty")
    finally:
        os.close(fd)


def _move_tree(sfd: int, sname: bytes, dfd: int, dname: bytes) -> None:
    temp = f".warren-move-{secrets.token_hex(8)}".encode()
    _copy_dir(sfd, sname, dfd, temp)
    try:
        os.rename(temp, dname, src_dir_fd=dfd, dst_dir_fd=dfd)
    except OSError:
        # Put the entries back where they were: the caller sees its rename fail whole.
        with contextlib.suppress(OSError):
            _copy_dir(dfd, temp, sfd, sname, back=True)
            os.rmdir(temp, dir_fd=dfd)
        raise
    os.rmdir(sname, dir_fd=sfd)


def _copy_dir(sfd: int, sname: bytes, dfd: int, dname: bytes, back: bool = False) -> None:
    """Make ``dname`` in ``dfd`` like ``sname`` and rename every entry into it
    (directories that cannot be renamed: the same, recursively)."""
    old = os.open(sname, _DIR, dir_fd=sfd)
    try:
        st = os.fstat(old)
        if not back:
            os.mkdir(dname, 0o700, dir_fd=dfd)
        new = os.open(dname, _DIR, dir_fd=dfd)
        try:
            for name in os.listdir(old):
                entry = os.fsencode(name)
                try:
                    os.rename(entry, entry, src_dir_fd=old, dst_dir_fd=new)
                except OSError as e:
                    if e.errno != errno.EXDEV:
                        raise
                    _copy_dir(old, entry, new, entry)
                    os.rmdir(entry, dir_fd=old)
            _carry_metadata(old, new, st)
        finally:
            os.close(new)
    finally:
        os.close(old)


def _carry_metadata(old: int, new: int, st: os.stat_result) -> None:
    for name in os.listxattr(old):
        if name.startswith("user.") and not name.startswith("user.overlay."):
            with contextlib.suppress(OSError):
                os.setxattr(new, name, os.getxattr(old, name))
    with contextlib.suppress(OSError):
        os.chown(new, st.st_uid, st.st_gid)
    os.chmod(new, stat.S_IMODE(st.st_mode))
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))


def rename(places: Places, call: Call) -> Outcome:
    return _names(call, AT_FDCWD, call.args[0], AT_FDCWD, call.args[1], 0)


def renameat(places: Places, call: Call) -> Outcome:
    a = call.args
    return _names(call, a[0], a[1], a[2], a[3], 0)


def renameat2(places: Places, call: Call) -> Outcome:
    a = call.args
    return _names(call, a[0], a[1], a[2], a[3], a[4] & 0xFFFFFFFF)


HANDLERS = {"rename": rename, "renameat": renameat, "renameat2": renameat2}
