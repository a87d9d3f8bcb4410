"""One overlay layer made of several, without copying a byte of file data.

A review workspace's checkpoints are frozen upper directories, each one more lower
layer of the workspace's overlay (the kernel takes 500, and every lookup may walk them
all). ``merge`` builds a directory that is, as one lower layer, what a run of them is
together (``server.bases``): every file, link, whiteout (a character device 0/0) and
other non-directory is a hard link to the topmost layer's entry of that name; every
directory is made anew, with the topmost one's mode, owner, times and extended
attributes, and holds the union of the same directory in the layers down to the first
that hides what lies below it (an opaque directory, or a non-directory or whiteout of
that name beneath): the merged directory is then opaque too, as it hides the host's.

The layers are directories no one writes any more (frozen); they are read by
descriptor, no link followed, and the merged directory is made beneath a directory
descriptor under a name the caller chose. Hard links need the layers and the merged
directory on one filesystem (they are: the review layer's directory).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

OPAQUE = "user.overlay.opaque"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_DEPTH = 800  # below Python's recursion limit


def merge(layers: list[int], into: int, name: str) -> int:
    """Make ``name`` (beneath ``into``, absent) the merge of ``layers`` (directory
    descriptors, newest first); returns the number of entries it holds."""
    os.mkdir(name, 0o700, dir_fd=into)
    top = os.open(name, _DIR, dir_fd=into)
    try:
        count = _merge_dir(layers, top, 0, _opaque(layers[0]))
        _meta(layers[0], top)
        return count
    except RecursionError:
        raise OSError(errno.ELOOP, "directories nested too deep to merge", name) from None
    finally:
        os.close(top)


def _merge_dir(chain: list[int], dst: int, depth: int, opaque: bool) -> int:
    """Fill ``dst`` with the union of the directories ``chain`` (newest first, each
    one's entries hiding the same names below), then give it the times of the
    topmost (``opaque``: it was found to hide what lies below it)."""
    if depth > _MAX_DEPTH:
        raise OSError(errno.ELOOP, "layers nested too deep to merge")
    if opaque:
        os.setxattr(dst, OPAQUE, b"y")
    count = 0
    seen: set[str] = set()
    for i, src in enumerate(chain):
        for entry in sorted(os.listdir(src)):
            if entry in seen:
                continue
            seen.add(entry)
            st = os.stat(entry, dir_fd=src, follow_symlinks=False)
            count += 1
            if not stat.S_ISDIR(st.st_mode):
                os.link(entry, entry, src_dir_fd=src, dst_dir_fd=dst, follow_symlinks=False)
                continue
            below, hides = _chain_below(chain[i + 1 :], entry)
            sub = [os.open(entry, _DIR, dir_fd=src)]
            try:
                sub_opaque = _opaque(sub[0])
                if not sub_opaque:
                    sub.extend(below)
                    below = []
                    sub_opaque = hides
                    for k, fd in enumerate(sub[1:], start=1):
                        if _opaque(fd):
                            for rest in sub[k + 1 :]:
                                os.close(rest)
                            del sub[k + 1 :]
                            sub_opaque = True
                            break
                os.mkdir(entry, 0o700, dir_fd=dst)
                made = os.open(entry, _DIR, dir_fd=dst)
                try:
                    count += _merge_dir(sub, made, depth + 1, sub_opaque)
                    _meta(sub[0], made)
                finally:
                    os.close(made)
            finally:
                for fd in (*sub, *below):
                    os.close(fd)
    _times(chain[0], dst)
    return count


def _chain_below(lower: list[int], entry: str) -> tuple[list[int], bool]:
    """The directories named ``entry`` in ``lower`` (newest first) down to the first
    layer where that name is not a directory, open; and whether such a layer hides
    what lies below (the host's directory then shows through no more)."""
    out: list[int] = []
    try:
        for src in lower:
            try:
                st = os.stat(entry, dir_fd=src, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                return out, True
            out.append(os.open(entry, _DIR, dir_fd=src))
    except BaseException:
        for fd in out:
            os.close(fd)
        raise
    return out, False


def _opaque(fd: int) -> bool:
    try:
        return os.getxattr(fd, OPAQUE) == b"y"
    except OSError:
        return False


def _meta(src: int, dst: int) -> None:
    """Owner, mode and extended attributes of directory ``src`` on ``dst`` (its times
    are set once it is filled: ``_times``)."""
    st = os.fstat(src)
    if (st.st_uid, st.st_gid) != (os.getuid(), os.getgid()):
        with contextlib.suppress(OSError):
            os.fchown(dst, st.st_uid, st.st_gid)
    os.fchmod(dst, stat.S_IMODE(st.st_mode))
    for key in os.listxattr(src):
        if key == OPAQUE:
            continue  # said by the merge, not copied: the merge may hide more
        with contextlib.suppress(OSError):
            os.setxattr(dst, key, os.getxattr(src, key))


def _times(src: int, dst: int) -> None:
    st = os.fstat(src)
    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
