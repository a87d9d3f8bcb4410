"""The host end of ``warren cp``: a path the user typed, reached without a link that a
sandbox could have planted.

Part of a host path may lie in directories a sandbox can write (its workspace, a
cache), where it can plant a symlink to ``~/.ssh`` long before the copy, or swap an
entry for one while the copy runs. So the path is walked one component at a time from
a directory descriptor, each opened with ``openat2(RESOLVE_NO_SYMLINKS)``
(``safepath``): the kernel refuses a link it meets, whenever it appears. A link on the
way is followed only when the directory holding it is one the caller could not have
changed — neither theirs (an owner can always make a directory writable again) nor
writable to them — since every sandbox runs as the caller: a system link such as
``/var/run`` or ``/home -> /var/home``. Any other link is an error naming it. For root
every directory counts as writable, so no link is followed.

Owns: that walk (``resolve``) and the errors naming a refused link. The copy itself
is ``copy``.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass

from .._core import safepath
from ..errors import WarrenError

MAX_LINKS = 40  # as the kernel's own path walk
_DIR = os.O_PATH | os.O_DIRECTORY


@dataclass
class Where:
    """The entry ``name`` in the directory ``dirfd`` (``name`` empty: that directory
    itself, as for ``/``, ``.`` or a path ending in ``..``)."""

    dirfd: int
    name: str
    path: str  # as the user typed it, for messages

    def lstat(self) -> os.stat_result | None:
        """The entry itself (a link is not followed); None when it does not exist."""
        try:
            return os.stat(self.name or ".", dir_fd=self.dirfd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def open_dir(self) -> int:
        """A descriptor of the entry, which must be a directory (never through a link)."""
        return safepath.dir_beneath(self.dirfd, self.name or ".")

    def close(self) -> None:
        os.close(self.dirfd)


def cp_error(message: str, path: str, hint: str, err: int | None = None) -> WarrenError:
    """An error of ``warren cp`` about ``path`` (as the user typed it)."""
    return WarrenError(message, operation="cp", path=path, errno=err, hint=hint)


def error(what: str, path: str, e: OSError) -> WarrenError:
    return cp_error(
        f"cannot {what} {path} on the host", path, "check the path exists and you may read/write it", e.errno
    )


def refused_link(path: str, link: str) -> WarrenError:
    on_the_way = "" if link.rstrip("/") == path.rstrip("/") else f" (on the way to {path})"
    return cp_error(
        f"{link} is a symbolic link in a directory a sandbox could write{on_the_way}; "
        "warren cp does not follow it on the host",
        path,
        f"see where it points (ls -l {link}) and, if you trust it, give that path instead",
        errno.ELOOP,
    )


def _changeable(dirfd: int) -> bool:
    """Could the caller — and so a sandbox of theirs — change this directory?"""
    if os.fstat(dirfd).st_uid == os.geteuid():
        return True
    return os.access(".", os.W_OK, dir_fd=dirfd, effective_ids=True)


def resolve(path: str) -> Where:
    """Where ``path`` leads on the host: its last entry (which may not exist) and a
    descriptor of the directory holding it. Links are followed only as the module says;
    the last entry is never a link on return."""
    if not path or "\0" in path:
        raise WarrenError(f"invalid host path {path!r}", operation="cp", hint="name a file or directory")
    try:
        fd = os.open("/" if path.startswith("/") else ".", _DIR | os.O_CLOEXEC)
    except OSError as e:
        raise error("reach", path, e) from None
    todo = [p for p in reversed(path.split("/")) if p not in ("", ".")]
    links = 0
    seen = [""] if path.startswith("/") else []  # the way walked, for messages
    try:
        while todo:
            part = todo.pop()
            seen.append(part)
            if part == "..":
                fd = _step(fd, os.open("..", _DIR | os.O_CLOEXEC, dir_fd=fd))
                continue
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                if todo:
                    raise
                return Where(fd, part, path)
            if stat.S_ISLNK(st.st_mode):
                if _changeable(fd):
                    raise refused_link(path, "/".join(seen))
                links += 1
                if links > MAX_LINKS:
                    raise OSError(errno.ELOOP, "too many levels of symbolic links", path)
                target = os.readlink(part, dir_fd=fd)
                seen.pop()
                if target.startswith("/"):
                    fd = _step(fd, os.open("/", _DIR | os.O_CLOEXEC))
                    seen = [""]
                todo.extend(p for p in reversed(target.split("/")) if p not in ("", "."))
                continue
            if not todo:
                return Where(fd, part, path)
            try:
                fd = _step(fd, safepath.open_beneath(fd, part, _DIR))
            except OSError as e:
                if e.errno == errno.ELOOP:  # it became a link since the stat above
                    raise refused_link(path, "/".join(seen)) from None
                raise
        return Where(fd, "", path)
    except OSError as e:
        os.close(fd)
        raise error("reach", path, e) from None
    except BaseException:
        os.close(fd)
        raise


def _step(old: int, new: int) -> int:
    os.close(old)
    return new
