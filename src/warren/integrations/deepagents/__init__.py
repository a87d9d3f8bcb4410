"""warren as a Deep Agents sandbox backend: ``WarrenSandbox``.

A ``deepagents.backends.sandbox.BaseSandbox`` whose ``execute`` runs each shell
command in one long-lived warren sandbox (for the current directory under warren's
default policy unless given warren's policy keys), and whose uploads and downloads
are warren's file operations, resolved by the kernel inside the sandbox. Deep Agents
builds its ls/read/write/edit/grep/glob tools on these, so they are confined alike.

``execute`` returns what the command printed, raw and complete, as Deep Agents' own
sandbox backend (LangSmith's) does: stdout, then stderr after a newline, nothing
added (no output is ``""``), no cap but the protocol's own (``truncated`` says when it
cut). Deep Agents parses that output for its read, grep, glob and edit tools, so a
decoration or a cap there broke them. A timeout answers 124 and a message.

Large output of the agent's own commands is offloaded by Deep Agents to a file in the
sandbox (``enable_capture_offload``: the model gets a preview and the file's path)
where the sandbox may write that file's directory; elsewhere (Deep Agents' default
``/large_tool_results`` on warren's read-only root) the command runs unwrapped and the
whole output comes back, since the wrapper would lose what it could not store.
The Deep Agents Code provider (``dcode --sandbox warren``) is in ``.provider``: it
needs the separate ``deepagents-code`` package, this module does not.
"""

from __future__ import annotations

import asyncio
import errno
import posixpath
import shlex
import threading
import uuid

from deepagents.backends.local_shell import DEFAULT_EXECUTE_TIMEOUT
from deepagents.backends.protocol import (
    FILE_NOT_FOUND,
    INVALID_PATH,
    IS_DIRECTORY,
    PERMISSION_DENIED,
    ExecuteOffloadResult,
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


class WarrenSandbox(BaseSandbox):
    """A Deep Agents backend running in a warren sandbox, created on first use (or
    ``sandbox=`` an existing one). ``close()`` removes a sandbox it created."""

    # The capture wrapper needs sh, head, tail and wc in the sandbox: the host's own
    # tools in warren's default root.
    enable_capture_offload = True

    def __init__(
        self,
        policy: PolicyKeys = None,
        *,
        sandbox: Sandbox | None = None,
        name: str | None = None,
        timeout: float = DEFAULT_EXECUTE_TIMEOUT,
    ) -> None:
        self._spec = spec_from(policy, "WarrenSandbox")
        self._sandbox = sandbox
        self._name = sandbox.name if sandbox is not None else (name or f"deepagents-{uuid.uuid4().hex[:12]}")
        self._owned = sandbox is None
        self._lock = threading.Lock()
        self._timeout = timeout
        self._capture_dirs: dict[str, bool] = {}

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
            result = self.sandbox.exec(["sh", "-c", command], timeout=limit, output_limit=wire.MAX_PAYLOAD)
        except WarrenError as e:
            return ExecuteResponse(output=f"Error: {e}", exit_code=e.exit_code)
        if result.timed_out:
            return ExecuteResponse(
                output=f"Error: Command timed out after {limit:g} seconds (killed with its process tree). "
                "For long-running commands, re-run with a larger timeout.",
                exit_code=124,
            )
        stdout, stderr = result.stdout.decode(errors="replace"), result.stderr.decode(errors="replace")
        output = f"{stdout}\n{stderr}" if stdout and stderr else stdout or stderr
        return ExecuteResponse(
            output=output,
            exit_code=result.exit_code,
            truncated=result.stdout_truncated or result.stderr_truncated,
        )

    def _can_capture_at(self, capture_path: str) -> bool:
        """Whether the capture wrapper can store its file at ``capture_path`` (its
        directory made if missing and writable in the sandbox); asked once per
        directory."""
        directory = posixpath.dirname(capture_path) or "/"
        if directory not in self._capture_dirs:
            probe = self.execute(f"mkdir -p -- {shlex.quote(directory)} && test -w {shlex.quote(directory)}")
            self._capture_dirs[directory] = probe.exit_code == 0
        return self._capture_dirs[directory]

    def execute_with_offload(
        self,
        command: str,
        capture_path: str,
        *,
        max_inline_bytes: int,
        max_capture_bytes: int | None = None,
        timeout: int | None = None,
    ) -> ExecuteOffloadResult:
        if not self._can_capture_at(capture_path):
            return ExecuteOffloadResult(offloaded=False, response=self.execute(command, timeout=timeout))
        return super().execute_with_offload(
            command,
            capture_path,
            max_inline_bytes=max_inline_bytes,
            max_capture_bytes=max_capture_bytes,
            timeout=timeout,
        )

    async def aexecute_with_offload(
        self,
        command: str,
        capture_path: str,
        *,
        max_inline_bytes: int,
        max_capture_bytes: int | None = None,
        timeout: int | None = None,
    ) -> ExecuteOffloadResult:
        return await asyncio.to_thread(
            self.execute_with_offload,
            command,
            capture_path,
            max_inline_bytes=max_inline_bytes,
            max_capture_bytes=max_capture_bytes,
            timeout=timeout,
        )

    # Paths are absolute in Deep Agents' protocol; a relative one is ``invalid_path``
    # (warren would take it beneath the workspace), as its standard tests require.
    def upload_files(self, files: list[tuple[str, bytes]]) -> list[FileUploadResponse]:
        responses = []
        for path, content in files:
            if not posixpath.isabs(path):
                responses.append(FileUploadResponse(path=path, error=INVALID_PATH))
                continue
            try:
                self.sandbox.files.write(path, content, parents=True)
                responses.append(FileUploadResponse(path=path))
            except WarrenError as e:
                responses.append(FileUploadResponse(path=path, error=_file_error(e)))
        return responses

    def download_files(self, paths: list[str]) -> list[FileDownloadResponse]:
        responses = []
        for path in paths:
            if not posixpath.isabs(path):
                responses.append(FileDownloadResponse(path=path, error=INVALID_PATH))
                continue
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
