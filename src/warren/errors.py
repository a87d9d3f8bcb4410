"""The one exception hierarchy of warren, and its one wire form.

Every error names the operation that failed, the path or resource involved, the errno
where there is one, and a one-line hint a person or an agent can act on. The CLI
prints ``str(error)`` and exits with ``error.exit_code``. Errors cross process
boundaries (PID 1 -> supervisor -> client, and later HTTP) as a record built by
``to_record`` and turned back into the same class by ``from_record``: nowhere else.

Imported by the CLI's fast path: standard library only, nothing heavy.
"""

from __future__ import annotations

import errno as _errno
import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Self


class WarrenError(Exception):
    """Base of every error warren raises on purpose."""

    exit_code = 125

    def __init__(
        self,
        message: str,
        *,
        operation: str = "",
        path: str | None = None,
        errno: int | None = None,
        hint: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.operation = operation
        self.path = path
        self.errno = errno
        self.hint = hint

    @classmethod
    def from_os(
        cls, e: OSError, message: str, operation: str, path: str | None = None, hint: str = ""
    ) -> Self:
        """The error for a system call that failed with ``e``: its errno is ``e``'s."""
        return cls(message, operation=operation, path=path, errno=e.errno, hint=hint)

    def __str__(self) -> str:
        parts = [f"warren: {self.message}"]
        if self.errno is not None:
            name = _errno.errorcode.get(self.errno, str(self.errno))
            parts[0] += f" ({name}: {os.strerror(self.errno)})"
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        return "\n".join(parts)

    def to_record(self) -> dict[str, object]:
        return to_record(self)


class PolicyError(WarrenError):
    """The policy is invalid: caught before anything starts."""


class ConfigError(PolicyError):
    """A TOML config file is malformed or names an unknown key or profile."""


class HostError(WarrenError):
    """This host lacks something warren needs (kernel feature, architecture)."""


class SetupError(WarrenError):
    """The sandbox could not be set up (namespaces, mounts, Landlock, seccomp)."""


class CwdNotFound(SetupError):
    """The working directory asked for does not exist inside the sandbox."""


class ProtocolError(WarrenError):
    """A message between warren's processes was malformed, oversized, of an unknown
    kind or of another protocol version. The peer that sent it gets this back; nothing
    else is affected."""


class ExecError(WarrenError):
    """The command exists but could not be executed (permission, format)."""

    exit_code = 126


class CommandNotFound(ExecError):
    """The command was not found inside the sandbox."""

    exit_code = 127


class LimitReached(ExecError):
    """A command could not start because the sandbox is at one of its limits (no
    process can be forked at the pids limit)."""


class SandboxTimeout(WarrenError):
    """A command ran past its timeout and was killed with its whole process tree."""

    exit_code = 124


class SandboxError(WarrenError):
    """A long-lived sandbox could not be created, reached or managed."""


class SandboxNotFound(SandboxError):
    """No sandbox of that name is registered for this user."""


class SandboxExists(SandboxError):
    """A sandbox of that name is already registered."""


class SandboxDead(SandboxError):
    """The sandbox is no longer running (stopped, or its supervisor or PID 1 died)."""


class SandboxPaused(SandboxError):
    """The sandbox is paused (``warren pause``): nothing runs in it until it is resumed."""


class SnapshotNotFound(SandboxError):
    """No snapshot of that id (``warren snapshot ls``)."""


class SnapshotError(SandboxError):
    """A sandbox that cannot be snapshotted (not on an image), or a snapshot in use."""


class ReviewError(SandboxError):
    """A review sandbox's layer cannot be shown, applied or discarded (not a review
    sandbox, still running, a path that cannot be written safely)."""


class ReviewConflict(ReviewError):
    """``warren apply``: files the sandbox changed were changed on the host meanwhile
    (the message names them; ``--force`` applies anyway)."""


class CheckpointError(ReviewError):
    """A checkpoint that cannot be taken or rolled back to now (processes running, past
    the snapshot budget, no such checkpoint)."""


class ProcessNotFound(SandboxError):
    """No background process of that id (or pid) was started in the sandbox."""


class PortNotForwarded(SandboxError):
    """No host port forwards to that port of the sandbox (``unexpose``)."""


class PortUnavailable(SandboxError):
    """The host port asked for cannot be listened on (in use, or privileged)."""


class ProcessEnded(SandboxError):
    """The background process has ended: it takes no more input."""


class StdinError(SandboxError):
    """A background process's stdin cannot take this write."""


class StdinNotOpen(StdinError):
    """The process was started without ``stdin=True``: its stdin is /dev/null."""


class StdinClosed(StdinError):
    """The process's stdin was closed: by ``close_stdin`` (eof), or by the process."""


class StdinFull(StdinError):
    """The process is not reading its stdin, and what waits for it is at the bound."""


class SandboxFileError(WarrenError):
    """A files-API operation failed inside the sandbox (errno says why)."""

    exit_code = 125  # warren could not do what was asked: the CLI says so as for every failure of its own


class SandboxFileNotFound(SandboxFileError):
    """The path does not exist in the sandbox's view."""


class SandboxPermissionDenied(SandboxFileError):
    """The policy does not allow this access (EACCES, EPERM, EROFS)."""


class FileTooLarge(SandboxFileError):
    """A file read would return more than the caller's limit."""


class ImageError(WarrenError):
    """An image could not be found, built, imported or removed (a hostile or damaged
    archive is refused with this, before anything is written outside the store)."""


class ImageInUse(ImageError):
    """``warren image rm`` of an image whose layers a sandbox or a snapshot needs: the
    message names them (``--force`` forgets the name and keeps the layers for them)."""


_KINDS: dict[str, type[WarrenError]] = {
    cls.__name__: cls
    for cls in (
        WarrenError,
        PolicyError,
        ConfigError,
        HostError,
        SetupError,
        CwdNotFound,
        ProtocolError,
        ExecError,
        CommandNotFound,
        LimitReached,
        SnapshotNotFound,
        SnapshotError,
        CheckpointError,
        ReviewError,
        ReviewConflict,
        SandboxTimeout,
        SandboxError,
        SandboxNotFound,
        SandboxExists,
        SandboxDead,
        SandboxPaused,
        ProcessNotFound,
        PortNotForwarded,
        PortUnavailable,
        ProcessEnded,
        StdinError,
        StdinNotOpen,
        StdinClosed,
        StdinFull,
        SandboxFileError,
        SandboxFileNotFound,
        SandboxPermissionDenied,
        FileTooLarge,
        ImageError,
        ImageInUse,
    )
}


def to_record(error: WarrenError) -> dict[str, object]:
    """The wire form of an error (also the body of an HTTP error later)."""
    return {
        "kind": type(error).__name__,
        "message": error.message,
        "operation": error.operation,
        "path": error.path,
        "errno": error.errno,
        "hint": error.hint,
    }


def from_record(data: dict[str, object]) -> WarrenError:
    """Rebuild an error sent across a process boundary, as the same class."""
    cls = _KINDS.get(str(data.get("kind")), WarrenError)
    err = data.get("errno")
    path = data.get("path")
    return cls(
        str(data.get("message") or "unknown failure"),
        operation=str(data.get("operation") or ""),
        path=None if path is None else str(path),
        errno=err if isinstance(err, int) and not isinstance(err, bool) else None,
        hint=str(data.get("hint") or ""),
    )
