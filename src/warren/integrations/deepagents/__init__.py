"""warren as a Deep Agents sandbox backend: ``WarrenSandbox``.

A ``deepagents.backends.sandbox.BaseSandbox`` whose ``execute`` runs each shell
command in one long-lived warren sandbox (for the current directory under warren's
default policy unless given warren's policy keys), and whose uploads and downloads
are warren's file operations, resolved by the kernel inside the sandbox. Deep Agents
builds its ls/read/write/edit/grep/glob tools on these, so they are confined alike.

Output follows Deep Agents' own local shell backend: stdout, then stderr lines
prefixed ``[stderr]``, ``Exit code: N`` when not zero, 124 and a message on timeout.
The Deep Agents Code provider (``dcode --sandbox warren``) is in ``.provider``: it
needs the separate ``deepagents-code`` package, this module does not.
"""

from __future__ import annotations

import errno
import threading
import uuid

from deepagents.backends.local_shell import DEFAULT_EXECUTE_TIMEOUT
from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    ExecuteResponse,
    FileDownloadResponse,
    FileUploadResponse,
)
from deepagents.backends.sandbox import BaseSandbox

from ... import wire
from ...client.sandbox import Sandbox
from ...errors import SandboxFileNotFound, SandboxPermissionDenied, WarrenError
from .._policy import PolicyKeys, spec_from

__all__ = ["WarrenSandbox"]

DEFAULT_MAX_OUTPUT_BYTES = 100_000


class WarrenSandbox(BaseSandbox):
    """A Deep Agents backend running in a warren sandbox, created on first use (or
    ``sandbox=`` an existing one). ``close()`` removes a sandbox it created."""

    def __init__(
        self,
        policy: PolicyKeys = None,
        *,
        sandbox: Sandbox | None = None,
        name: str | None = None,
        timeout: float = DEFAULT_EXECUTE_TIMEOUT,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
    ) -> None:
        self._spec = spec_from(policy, "WarrenSandbox")
        self._sandbox = sandbox
        self._name = sandbox.name if sandbox is not None else (name or f"deepagents-{uuid.uuid4().hex[:12]}")
        self._owned = sandbox is None
        self._lock = threading.Lock()
        self._timeout = timeout
        self._max_output_bytes = max_output_bytes

    @property
    def id(self) -> str:
        return self._name

    @property
    def workspace(self) -> str:
        """Where commands start: the sandbox's workspace."""
        return self._sandbox.workspace if self._sandbox is not None else str(self._spec.workspace)

    @property
    def sandbox(self) -> Sandbox:
        """The warren sandbox, created on first use."""
        with self._lock:
            if self._sandbox is None:
                self._sandbox = Sandbox.create(self._spec, self._name)
            return self._sandbox

    def close(self) -> None:
        """Remove the sandbox if this backend created it (its workspace stays)."""
        with self._lock:
            if self._sandbox is not None and self._owned:
                self._sandbox.remove()
                self._sandbox = None

    def execute(self, command: str, *, timeout: int | None = None) -> ExecuteResponse:
        if not command or not isinstance(command, str):
            return ExecuteResponse(output="Error: Command must be a non-empty string.", exit_code=1)
        limit = float(timeout) if timeout is not None else self._timeout
        try:
            result = self.sandbox.exec(
                ["sh", "-c", command], timeout=limit, output_limit=self._max_output_bytes
            )
        except WarrenError as e:
            return ExecuteResponse(output=f"Error: {e}", exit_code=e.exit_code)
        if result.timed_out:
            return ExecuteResponse(
                output=f"Error: Command timed out after {limit:g} seconds (killed with its process tree). "
                "For long-running commands, re-run with a larger timeout.",
                exit_code=124,
            )
        parts = [result.stdout.decode(errors="replace")] if result.stdout else []
        if result.stderr:
            lines = result.stderr.decode(errors="replace").strip().split("\n")
            parts.extend(f"[stderr] {line}" for line in lines)
        output = "\n".join(parts) if parts else "<no output>"
        if result.exit_code != 0:
            output = f"{output.rstrip()}\n\nExit code: {result.exit_code}"
        return ExecuteResponse(
            output=output,
            exit_code=result.exit_code,
            truncated=result.stdout_truncated or result.stderr_truncated,
        )

    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            try:
                self.sandbox.files.write(path, content, parents=True)
                responses.append(FileUploadResponse(path=path))
            except WarrenError as e:
                responses.append(FileUploadResponse(path=path, error=_file_error(e)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            try:
                data = self.sandbox.files.read(path, max_bytes=wire.MAX_PAYLOAD)
                responses.append(FileDownloadResponse(path=path, content=data))
            except WarrenError as e:
                responses.append(FileDownloadResponse(path=path, error=_file_error(e)))
        return responses


def _file_error(e: WarrenError) -> str:
    """Deep Agents' error literal for what a model can act on, else warren's message."""
    if isinstance(e, SandboxFileNotFound) or e.errno == errno.ENOENT:
        return FILE_NOT_FOUND
    if isinstance(e, SandboxPermissionDenied) or e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return PERMISSION_DENIED
    if e.errno == errno.EISDIR:
        return IS_DIRECTORY
    if e.errno in (errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP):
        return INVALID_PATH
    return str(e)
