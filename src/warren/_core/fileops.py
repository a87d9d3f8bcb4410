"""The files API, inside the sandbox: one operation per hardened helper process.

The helper is forked from PID 1 (so it is in every namespace of the sandbox), confines
itself exactly like a command (``harden``), and then touches the path: the kernel
resolves ``..``, symlinks and swapped symlinks in the sandbox's view, with the
sandbox's rights. Relative paths start at the workspace. Reads are capped; writes
never follow the target into a device or a FIFO.
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import stat as _stat

from .. import protocol, wire
from ..errors import (
    FileTooLarge,
    SandboxFileError,
    SandboxFileNotFound,
    SandboxPermissionDenied,
    WarrenError,
)

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


def _read_regular(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        st = os.fstat(fd)
        if not _stat.S_ISREG(st.st_mode):
            raise OSError(
                errno.EISDIR if _stat.S_ISDIR(st.st_mode) else errno.EINVAL, "not a regular file", path
            )
        if st.st_size > limit:
            raise FileTooLarge(
                f"{path} is {st.st_size} bytes, more than the limit of {limit}",
                operation="read",
                path=path,
                errno=errno.EFBIG,
                hint="raise max_bytes, or read it with a command (sb.exec(['head', '-c', N, path]))",
            )
        parts, size = [], 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:  # it grew while we read
                raise FileTooLarge(
                    f"{path} grew past the limit of {limit} bytes while being read",
                    operation="read",
                    path=path,
                    errno=errno.EFBIG,
                    hint="raise max_bytes, or read it when it stops changing",
                )
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _write_regular(path: str, data: bytes, append: bool, mode: int, parents: bool) -> None:
    if parents:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
    flags |= os.O_APPEND if append else 0
    fd = os.open(path, flags, mode)
    try:
        if not _stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        if not append:
            os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def handle(conn: socket.socket, req: protocol.FileRequest, payload: bytes, workspace: str) -> None:
    def inside(raw: str) -> str:
        return raw if raw.startswith("/") else os.path.join(workspace, raw)

    op, path = req.op, inside(req.path)
    reply = protocol.FileReply()
    out = b""
    try:
        if op == "read":
            out = _read_regular(path, min(req.max_bytes, wire.MAX_PAYLOAD))
        elif op == "write":
            _write_regular(path, payload, req.append, 0o644 if req.mode is None else req.mode, req.parents)
        elif op == "list":
            entries = []
            with os.scandir(path) as it:
                for entry in it:
                    try:
                        entries.append(_file_stat(entry.stat(follow_symlinks=False), entry.name))
                    except OSError:
                        continue
            reply.entries = sorted(entries, key=lambda e: e.name)
        elif op == "stat":
            reply.stat = _file_stat(os.stat(path, follow_symlinks=req.follow), os.path.basename(req.path))
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
        wire.send(conn, protocol.error_message(_file_error(op, req.path, e)))
        return
    except WarrenError as e:
        wire.send(conn, protocol.error_message(e))
        return
    wire.send(conn, reply, out)
