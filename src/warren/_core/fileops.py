"""The files API, inside the sandbox: one operation per hardened helper process.

The helper is forked from PID 1 (so it is in every namespace of the sandbox), confines
itself exactly like a command (``harden``), and then touches the path: the kernel
resolves ``..``, symlinks and swapped symlinks in the sandbox's view, with the
sandbox's rights. Relative paths start at the workspace. Reads are capped; writes
never follow the target into a device or a FIFO.

A write is all or nothing, whoever dies when: the data goes to a new file in the
target's directory under a random name (``safepath.temp_name``: ``.NAME.warren-<16
hex>``), is synced, given the old file's mode (a new file: the requested mode less the
umask), and renamed over the target. Any failure removes that file and leaves the old
one as it was; only a kill of the helper (a SIGKILL of the supervisor takes the
sandbox with it) can leave it behind, and the next write of that name removes it (the
writer holds an flock on its file, which dies with it: ``safepath.sweep``). (Not an
unnamed ``O_TMPFILE``: Landlock refuses to link one into a directory.) A file that
cannot be replaced by a rename — a file bound alone over another, or a writable file
in a directory the sandbox may not create in — is written in place, as before, and
that write is not atomic. Append writes in
place (whoever has the file open keeps it) and takes a failed append's bytes back off,
so a failure leaves the old content; only a kill in the middle of the append can leave
part of it.

A listing leaves out names that are not UTF-8: replies are JSON text, and such a name
could not be named back in a request.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat as _stat

from .. import names, protocol, wire
from ..errors import (
    FileTooLarge,
    SandboxFileError,
    SandboxFileNotFound,
    SandboxPermissionDenied,
    WarrenError,
)
from . import safepath

_DENIED_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)


def _file_error(op: str, path: str, e: OSError) -> WarrenError:
    code = e.errno or errno.EIO
    message = f"{op} {path}: {os.strerror(code)}"
    if code in (errno.ENOENT, errno.ENOTDIR):
        return SandboxFileNotFound(
            message,
            operation=op,
            path=path,
            errno=code,
            hint="paths are resolved inside the sandbox (relative ones from the workspace); "
            "list the parent directory to see what exists",
        )
    if code in _DENIED_ERRNOS:
        return SandboxPermissionDenied(
            message,
            operation=op,
            path=path,
            errno=code,
            hint="the sandbox's policy does not allow this: only writable roots can change, "
            "denied paths cannot be read",
        )
    return SandboxFileError(
        message, operation=op, path=path, errno=code, hint=f"{op} failed inside the sandbox"
    )


def _file_stat(st: os.stat_result, name: str = "") -> protocol.FileStat:
    mode = st.st_mode
    kind = (
        "dir"
        if _stat.S_ISDIR(mode)
        else "file"
        if _stat.S_ISREG(mode)
        else "symlink"
        if _stat.S_ISLNK(mode)
        else "other"
    )
    return protocol.FileStat(
        name=name,
        type=kind,
        size=st.st_size,
        mode=_stat.S_IMODE(mode),
        mtime=st.st_mtime,
        uid=st.st_uid,
        gid=st.st_gid,
    )


MAX_XATTR_VALUE = 64 * 1024  # the kernel's limit for one attribute's value


def _check_xattrs(req: protocol.FileRequest) -> None:
    """Only the ``user.`` namespace, and names and values the kernel can take."""
    prefix = req.xattrs or ""
    bad = (
        not prefix.startswith("user.")
        or len(prefix) > 64
        or any(
            not name or "\x00" in name or len(prefix + name) > 255 or len(value.encode()) > MAX_XATTR_VALUE
            for name, value in (req.set_xattrs or {}).items()
        )
    )
    if bad:
        raise OSError(errno.EINVAL, "extended attributes: a user. prefix and names of at most 255 bytes")


def _read_xattrs(target: str | int, prefix: str, follow: bool = True) -> dict[str, str]:
    """The attributes named ``prefix``..., prefix removed; none where the filesystem
    or the object (a link, a device) keeps none."""
    try:
        names = [n for n in os.listxattr(target, follow_symlinks=follow) if n.startswith(prefix)]
        return {
            n[len(prefix) :]: os.getxattr(target, n, follow_symlinks=follow).decode(errors="replace")
            for n in names
        }
    except OSError as e:
        if e.errno in (errno.ENOTSUP, errno.ENODATA, errno.EPERM, errno.EACCES):
            return {}
        raise


def _replace_xattrs(fd: int, prefix: str, attrs: dict[str, str]) -> None:
    """The file open at ``fd`` keeps exactly ``attrs`` under ``prefix``."""
    for name in os.listxattr(fd):
        if name.startswith(prefix) and name[len(prefix) :] not in attrs:
            os.removexattr(fd, name)
    for name, value in attrs.items():
        os.setxattr(fd, prefix + name, value.encode())


def _too_large(path: str, message: str, hint: str) -> FileTooLarge:
    return FileTooLarge(message, operation="read", path=path, errno=errno.EFBIG, hint=hint)


def _read_regular(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise OSError(
                errno.EISDIR if _stat.S_ISDIR(st.st_mode) else errno.EINVAL, "not a regular file", path
            )
        if st.st_size > limit:
            raise _too_large(
                path,
                f"{path} is {st.st_size} bytes, more than the limit of {limit}",
                "raise max_bytes, or read it with a command (sb.exec(['head', '-c', N, path]))",
            )
        parts, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:  # it grew while we read
                raise _too_large(
                    path,
                    f"{path} grew past the limit of {limit} bytes while being read",
                    "raise max_bytes, or read it when it stops changing",
                )
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)  # read it back: the helper is one thread
    os.umask(mask)
    return mask


# (prefix, attributes) a write leaves its file with; None leaves attributes alone
Attrs = tuple[str, dict[str, str]] | None


def _write_regular(
    path: str, data: bytes, append: bool, mode: int, parents: bool, attrs: Attrs = None
) -> None:
    if parents:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if os.path.islink(path):
        # The link stays a link: the file it points to (in the sandbox's view) is written.
        path = os.path.realpath(path)
    if append:
        _append(path, data, mode, attrs)
    else:
        _replace(path, data, mode, attrs)


def _check_regular(st: os.stat_result, path: str) -> None:
    if _stat.S_ISDIR(st.st_mode):
        raise OSError(errno.EISDIR, "is a directory", path)
    if not _stat.S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", path)


def _replace(path: str, data: bytes, mode: int, attrs: Attrs = None) -> None:
    directory, name = os.path.split(path)
    if not name:
        raise OSError(errno.EISDIR, "is a directory", path)
    dfd = os.open(directory or "/", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            old = os.stat(name, dir_fd=dfd)
        except FileNotFoundError:
            old = None
        if old is not None:
            _check_regular(old, path)
        keep = _stat.S_IMODE(old.st_mode) & 0o1777 if old is not None else mode & ~_umask() & 0o1777
        try:
            fd, tmp = _temp_file(dfd, name)
        except PermissionError:
            if old is None:
                raise
            _overwrite(path, data, attrs)  # a writable file in a directory we may not create in
            return
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fchmod(fd, keep)
                if attrs is not None:
                    _replace_xattrs(fd, *attrs)  # on the new file: they come with the rename
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except OSError as e:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            if e.errno in (errno.EBUSY, errno.EXDEV) and old is not None:
                _overwrite(path, data, attrs)  # the target is a mount point: only its content can change
                return
            raise
        with contextlib.suppress(OSError):
            os.fsync(dfd)
    finally:
        os.close(dfd)


def _temp_file(dfd: int, name: str) -> tuple[int, str]:
    """A new, empty file under a random name in the directory ``dfd``, claimed, after
    removing what killed writers of ``name`` left there (``safepath.sweep``). (Not an
    unnamed ``O_TMPFILE``: Landlock refuses to link one into a directory, EXDEV.)"""
    read = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
    safepath.sweep(dfd, name, lambda entry: os.open(entry, read, dir_fd=dfd))
    tmp = safepath.temp_name(name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=dfd)
    safepath.claim(fd)
    return fd, tmp


class _PartlyWritten(OSError):
    """An in-place write failed after it had begun to change the file."""


def _overwrite(path: str, data: bytes, attrs: Attrs = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        _check_regular(os.fstat(fd), path)
        try:
            os.ftruncate(fd, 0)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if attrs is not None:
                _replace_xattrs(fd, *attrs)
            os.fsync(fd)
        except OSError as e:
            raise _PartlyWritten(e.errno, e.strerror, path) from None
    finally:
        os.close(fd)


def _append(path: str, data: bytes, mode: int, attrs: Attrs = None) -> None:
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    try:
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, mode), True
    except FileExistsError:
        fd, created = os.open(path, flags), False
    try:
        before = os.fstat(fd)
        _check_regular(before, path)
        written = 0
        try:
            while written < len(data):
                written += os.write(fd, memoryview(data)[written:])
            if attrs is not None:
                _replace_xattrs(fd, *attrs)
            os.fsync(fd)
        except OSError:
            # Take our bytes back off, unless someone else appended after them.
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_size == before.st_size + written:
                    os.ftruncate(fd, before.st_size)
                if created:
                    os.unlink(path)
            raise
    finally:
        os.close(fd)


def handle(conn: socket.socket, req: protocol.FileRequest, payload: bytes, workspace: str) -> None:
    def inside(raw: str) -> str:
        return raw if raw.startswith("/") else os.path.join(workspace, raw)

    op, path = req.op, inside(req.path)
    reply = protocol.FileReply()
    out = b""
    prefix = req.xattrs
    try:
        if prefix is not None:
            _check_xattrs(req)
        if op == "read":
            out = _read_regular(path, min(req.max_bytes, wire.MAX_PAYLOAD))
        elif op == "write":
            attrs = (prefix, dict(req.set_xattrs or {})) if prefix is not None else None
            mode = 0o644 if req.mode is None else req.mode
            _write_regular(path, payload, req.append, mode, req.parents, attrs)
        elif op == "list":
            entries = []
            with os.scandir(path) as it:
                for entry in it:
                    if not names.is_utf8(entry.name):
                        continue  # messages carry text: such a name cannot be named back
                    try:
                        entries.append(_file_stat(entry.stat(follow_symlinks=False), entry.name))
                        if prefix is not None and (found := _read_xattrs(entry.path, prefix, False)):
                            reply.xattrs.append(protocol.FileXattrs(name=entry.name, attrs=found))
                    except OSError:
                        continue
            reply.entries = sorted(entries, key=lambda e: e.name)
        elif op == "stat":
            reply.stat = _file_stat(os.stat(path, follow_symlinks=req.follow), os.path.basename(req.path))
            if prefix is not None and (found := _read_xattrs(path, prefix, req.follow)):
                reply.xattrs.append(protocol.FileXattrs(name="", attrs=found))
        elif op == "exists":
            reply.exists = os.path.exists(path)
        elif op == "mkdir":
            mode = 0o755 if req.mode is None else req.mode
            if req.parents:
                os.makedirs(path, mode=mode, exist_ok=req.exist_ok)
            else:
                try:
                    os.mkdir(path, mode)
                except FileExistsError:
                    if not (req.exist_ok and os.path.isdir(path)):
                        raise
        elif op == "remove":
            if os.path.isdir(path) and not os.path.islink(path):
                if req.recursive:
                    shutil.rmtree(path)
                else:
                    os.rmdir(path)
            else:
                os.unlink(path)
        elif op == "rename":
            os.rename(path, inside(req.dst or ""))
        else:
            raise SandboxFileError(
                f"unknown file operation {op!r}",
                operation=op,
                hint="one of: read, write, list, stat, exists, mkdir, remove, rename",
            )
    except OSError as e:
        error = _file_error(op, req.path, e)
        if op == "write":
            error.hint += (
                f"; {req.path} was being written in place (it cannot be replaced by a rename) "
                "and may be partly written"
                if isinstance(e, _PartlyWritten)
                else f"; nothing was changed: {req.path} is as it was"
            )
        wire.send(conn, protocol.error_message(error))
        return
    except WarrenError as e:
        wire.send(conn, protocol.error_message(e))
        return
    wire.send(conn, reply, out)
