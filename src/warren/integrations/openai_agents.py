"""warren as a sandbox backend of the OpenAI Agents SDK (``agents.sandbox``).

``WarrenSandboxClient`` creates, resumes and deletes sessions; each session is one
named warren sandbox living in warren's supervisor, so a session's state serialised
by one process is resumed by another (the sandbox, its processes and its private
/tmp are still there; when it has ended, a sandbox with the same name and policy
replaces it). ``WarrenSandboxClientOptions`` (``type="warren"``) carries warren's
policy keys, as in ``warren.toml``.

The manifest's root is the sandbox's workspace: the SDK's default root
(``/workspace``) means the policy's workspace (the current directory when none is
named), and the manifest is rewritten to that real path, so what the model is told,
the SDK's path checks and the commands all name one directory. A non-default root is
the workspace itself (created when missing, as the SDK's local backend does).

Everything runs inside the sandbox: commands, file reads and writes (warren's file
operations, resolved by the kernel there) and the workspace tar stream of
``persist_workspace``/``hydrate_workspace`` (GNU tar in the sandbox, so a symlink
planted in the workspace cannot make the host archive or overwrite its own files).
The SDK's "PTY" sessions (``exec_command`` that outlives its yield time, then
``write_stdin``) are warren background processes; ``tty=True`` gives the command a
terminal of its own in the sandbox, which ``write_stdin`` types into (without a
terminal a command has no stdin, as with the SDK's own backends). A session serves commands and
files right after ``client.create()``, as the SDK's local backend does: the sandbox is
made on first use. What warren cannot do raises the SDK's ``ConfigurationError`` with
warren's hint: manifest users and groups, path grants that map a host path elsewhere,
acting as another user.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import secrets
import signal
import tarfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

from agents.sandbox.errors import (
    ConfigurationError,
    ErrorCode,
    ExecTimeoutError,
    ExecTransportError,
    PtySessionNotFoundError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceRootNotFoundError,
    WorkspaceStartError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.materialization import MaterializationResult
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_types import (
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.runtime_helpers import RESOLVE_WORKSPACE_PATH_HELPER, RuntimeHelperScript
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, ExposedPortEndpoint, User
from agents.sandbox.util.token_truncation import formatted_truncate_text_with_token_count
from pydantic import Field, field_validator

from .. import wire
from ..client.sandbox import Process, Sandbox
from ..errors import (
    CwdNotFound,
    ProcessEnded,
    SandboxDead,
    SandboxFileNotFound,
    SandboxNotFound,
    WarrenError,
)
from ..policy import PolicySpec
from ..policy.spec import from_mapping
from . import _workspace_archive
from ._policy import PolicyKeys, in_terminal, keys_of, merged_stdout, spec_from, workspace_named
from ._workspace_archive import UnsafeTarMemberError

__all__ = [
    "WarrenSandboxClient",
    "WarrenSandboxClientOptions",
    "WarrenSandboxSession",
    "WarrenSandboxSessionState",
]

_DEFAULT_ROOT = cast(str, Manifest.model_fields["root"].default)
_T = TypeVar("_T")


class WarrenConfigurationError(ConfigurationError, ValueError):
    """What warren cannot do: the SDK's ``ConfigurationError`` and, as the SDK's own local
    backend raises for the same requests (users, a host path shown elsewhere), a
    ``ValueError``, so code written for either catches it."""


def _unsupported(what: str, hint: str) -> WarrenConfigurationError:
    return WarrenConfigurationError(
        message=f"warren does not support {what}",
        error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
        op="start",
        context={"backend": "warren", "hint": hint},
    )


def _no_accounts(manifest: Manifest) -> None:
    if manifest.users or manifest.groups:
        raise _unsupported(
            "manifest users or groups: a warren sandbox runs every command as the caller",
            "remove users/groups from the manifest",
        )


class WarrenSandboxClientOptions(BaseSandboxClientOptions):
    """Options of one warren session: ``policy`` holds warren.toml keys
    (``{"preset": ["python"], "network": "allow", "memory": "2G"}``), checked now."""

    type: Literal["warren"] = "warren"
    policy: dict[str, Any] = Field(default_factory=dict)
    name: str | None = None
    exposed_ports: tuple[int, ...] = ()

    @field_validator("policy")
    @classmethod
    def _known_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        from_mapping(value, "WarrenSandboxClientOptions.policy")  # raises warren's ConfigError
        return value


class WarrenSandboxSessionState(SandboxSessionState):
    """What resuming needs: the sandbox's name and the policy keys that made it."""

    type: Literal["warren"] = "warren"
    sandbox_name: str
    policy: dict[str, Any] = Field(default_factory=dict)


@dataclass
class _Background:
    """A command started by ``pty_exec_start``: its process and how much of its
    output was already returned."""

    process: Process
    stdin: bool
    offset: int = 0


class WarrenSandboxSession(BaseSandboxSession):
    """A session whose commands and files live in one warren sandbox."""

    state: WarrenSandboxSessionState

    def __init__(self, *, state: WarrenSandboxSessionState) -> None:
        self.state = state
        self._sandbox: Sandbox | None = None
        self._ports: dict[int, ExposedPortEndpoint] = {}
        self._background: dict[int, _Background] = {}

    @property
    def sandbox(self) -> Sandbox:
        """The warren sandbox (after ``start``)."""
        if self._sandbox is None:
            raise WorkspaceStartError(
                path=Path(self.state.manifest.root),
                context={"reason": "session not started", "hint": "await session.start() first"},
            )
        return self._sandbox

    async def _box(self) -> Sandbox:
        """The warren sandbox, attached (or created) on first use: the SDK's local
        backend serves commands and files right after ``client.create()``, before
        ``start()``."""
        if self._sandbox is None:
            await self._ensure_backend_started()
        return self.sandbox

    async def _call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        return await asyncio.to_thread(fn, *args, **kwargs)

    # --- lifecycle ------------------------------------------------------------------

    def _attach(self) -> None:
        """Reattach to the named sandbox, or create it (in place of one that ended)."""
        name = self.state.sandbox_name
        try:
            self._sandbox = Sandbox.get(name)
            return
        except SandboxNotFound:
            pass
        except SandboxDead:
            for info in Sandbox.list():
                if info.name == name:
                    Sandbox(info).remove()
        spec = from_mapping(self.state.policy, "session state")
        self._sandbox = Sandbox.create(spec, name)

    async def _ensure_backend_started(self) -> None:
        if self._sandbox is not None and await self._call(lambda: self.sandbox.alive):
            return
        try:
            await self._call(self._attach)
        except WarrenError as e:
            raise WorkspaceStartError(
                path=Path(self.state.manifest.root), context={"warren": str(e)}, cause=e
            ) from e

    async def _after_start_failed(self) -> None:
        """A start that failed (a snapshot that could not be restored) leaves no
        session running, as with the SDK's local backend: the sandbox's processes end,
        the workspace stays as it was."""
        if self._sandbox is not None:
            with contextlib.suppress(WarrenError):
                await self._call(self._sandbox.stop)

    async def running(self) -> bool:
        return self._sandbox is not None and await self._call(lambda: self.sandbox.alive)

    async def _shutdown_backend(self) -> None:
        """End the sandbox's processes; its record stays until ``client.delete``, and a
        later ``start`` or ``resume`` puts a sandbox of the same name in its place."""
        if self._sandbox is not None:
            sandbox = self._sandbox
            with contextlib.suppress(SandboxNotFound, SandboxDead):
                await self._call(sandbox.stop)
        self._ports.clear()

    async def remove(self) -> None:
        """Stop the sandbox and forget it (its workspace stays on disk)."""
        name = self.state.sandbox_name
        for info in await self._call(Sandbox.list):
            if info.name == name:
                with contextlib.suppress(SandboxNotFound):
                    await self._call(Sandbox(info).remove)
        self._sandbox = None
        self._ports.clear()

    # --- commands -------------------------------------------------------------------

    async def _exec_internal(self, *command: str | Path, timeout: float | None = None) -> ExecResult:
        argv = [str(part) for part in command]
        env = await self.state.manifest.environment.resolve()
        sandbox = await self._box()
        try:
            result = await self._call(
                sandbox.exec,
                argv,
                cwd=self.state.manifest.root,
                env=env or None,
                timeout=timeout,
                output_limit=wire.MAX_PAYLOAD,
            )
        except CwdNotFound as e:
            raise WorkspaceRootNotFoundError(path=Path(self.state.manifest.root), cause=e) from e
        except WarrenError as e:
            raise ExecTransportError(command=argv, context={"warren": str(e)}, cause=e) from e
        if result.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(stdout=result.stdout, stderr=result.stderr, exit_code=result.exit_code)

    # --- background commands (the SDK's "PTY" sessions, without a terminal) ------------

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        """Start a command in the background (warren's ``spawn``) and return what it
        printed within the yield time; a command still running keeps a session id for
        ``pty_write_stdin``. With ``tty`` the command gets a terminal of its own
        (a relay in the sandbox, ``_policy.in_terminal``), never the caller's, and
        ``pty_write_stdin`` types into it; without, it has no stdin, as with the SDK's
        local and docker backends. A command killed by signal N ends with -N, as on the
        SDK's local backend."""
        self._no_user(user)
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        argv = in_terminal(argv) if tty else merged_stdout(argv)
        env = await self.state.manifest.environment.resolve()
        try:
            process = await self._call(
                (await self._box()).spawn,
                argv,
                cwd=self.state.manifest.root,
                env=env or None,
                timeout=timeout,
                stdin=tty,
            )
        except CwdNotFound as e:
            raise WorkspaceRootNotFoundError(path=Path(self.state.manifest.root), cause=e) from e
        except WarrenError as e:
            raise ExecTransportError(command=argv, context={"warren": str(e)}, cause=e) from e
        session_id = allocate_pty_process_id(set(self._background))
        self._background[session_id] = _Background(process, stdin=tty)
        yield_ms = clamp_pty_yield_time_ms(10_000 if yield_time_s is None else int(yield_time_s * 1000))
        return await self._collect(session_id, yield_ms, max_output_tokens)

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        entry = self._background.get(session_id)
        if entry is None:
            raise PtySessionNotFoundError(session_id=session_id)
        if chars and not entry.stdin:
            raise RuntimeError("stdin is not available for this process")
        if chars:
            with contextlib.suppress(ProcessEnded):
                await self._call(entry.process.write, chars)
        yield_ms = resolve_pty_write_yield_time_ms(
            yield_time_ms=250 if yield_time_s is None else int(yield_time_s * 1000), input_empty=chars == ""
        )
        return await self._collect(session_id, yield_ms, max_output_tokens)

    async def _collect(self, session_id: int, yield_ms: int, max_output_tokens: int | None) -> PtyExecUpdate:
        """What the process printed since last asked, waiting until it ends or the
        yield time passes; an ended process gives its exit code and its id is freed."""
        entry = self._background[session_id]
        deadline = time.monotonic() + yield_ms / 1000
        while True:
            status = await self._call(lambda: entry.process.status)
            # The SDK's convention (its local backend's, Python's): -N for signal N.
            code = None if status is None else os.waitstatus_to_exitcode(status)
            if code is not None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        output = (await self._call(entry.process.output)).stdout
        fresh, entry.offset = output[entry.offset :], len(output)
        if code is not None:
            del self._background[session_id]
        text, tokens = formatted_truncate_text_with_token_count(
            fresh.decode(errors="replace"), max_output_tokens
        )
        return PtyExecUpdate(
            process_id=None if code is not None else session_id,
            output=text.encode(),
            exit_code=code,
            original_token_count=tokens,
        )

    async def pty_terminate_all(self) -> None:
        entries, self._background = list(self._background.values()), {}
        for entry in entries:
            with contextlib.suppress(WarrenError):
                await self._call(entry.process.kill, signal.SIGKILL)

    async def _resolve_exposed_port(self, port: int) -> ExposedPortEndpoint:
        """The host address forwarded to the sandbox's ``port``: the same port number on
        the host's loopback when it is free there (where the SDK's local backend serves
        it), else a free one (``Sandbox.expose``)."""
        if port not in self._ports:
            box = await self._box()
            try:
                address = await self._call(box.expose, port, port)
            except WarrenError:  # taken on the host (or below 1024 for a user)
                address = await self._call(box.expose, port)
            host, _, host_port = address.rpartition(":")
            self._ports[port] = ExposedPortEndpoint(host=host, port=int(host_port), tls=False)
        return self._ports[port]

    # --- files ----------------------------------------------------------------------

    def _runtime_helpers(self) -> tuple[RuntimeHelperScript, ...]:
        return (RESOLVE_WORKSPACE_PATH_HELPER,)

    def _current_runtime_helper_cache_key(self) -> object | None:
        # The helper lives in the sandbox's private /tmp: a replacement sandbox needs it again.
        return self._sandbox.id if self._sandbox is not None else None

    async def _apply_manifest(
        self, *, only_ephemeral: bool = False, provision_accounts: bool = True
    ) -> MaterializationResult:
        """The SDK's, but users and groups are refused when the manifest is applied (at
        start, as the SDK's local backend does), never made in the sandbox."""
        _no_accounts(self.state.manifest)
        return await super()._apply_manifest(
            only_ephemeral=only_ephemeral, provision_accounts=provision_accounts
        )

    async def provision_manifest_accounts(self) -> None:
        _no_accounts(self.state.manifest)

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        """The SDK's workspace scope, resolved inside the sandbox (a symlink in the
        workspace pointing out of it is refused, as by the SDK's own backends). warren's
        confinement, not this check, is what keeps the host safe."""
        return await self._validate_remote_path_access(path, for_write=for_write)

    def _no_user(self, user: str | User | None) -> None:
        if user is not None:
            raise _unsupported(
                "acting as another user",
                "a warren sandbox has one user, the caller; drop user=...",
            )

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        self._no_user(user)
        target = await self._validate_path_access(path)
        try:
            data = await self._call((await self._box()).files.read, target, max_bytes=wire.MAX_PAYLOAD)
        except SandboxFileNotFound as e:
            raise WorkspaceReadNotFoundError(path=path, cause=e) from e
        except WarrenError as e:
            raise WorkspaceArchiveReadError(path=path, context={"warren": str(e)}, cause=e) from e
        return io.BytesIO(data)

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._no_user(user)
        target = await self._validate_path_access(path, for_write=True)
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode()
        if not isinstance(raw, (bytes, bytearray)):
            raise WorkspaceArchiveWriteError(path=target, context={"reason": "data is not bytes or text"})
        try:
            await self._call((await self._box()).files.write, target, bytes(raw), parents=True)
        except WarrenError as e:
            raise WorkspaceArchiveWriteError(path=target, context={"warren": str(e)}, cause=e) from e

    # --- workspace archive --------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        root = self.state.manifest.root
        excludes = [f"--exclude=./{p.as_posix()}" for p in sorted(self._persist_workspace_skip_relpaths())]
        argv = ["tar", "-C", root, "--anchored", "--hard-dereference", *excludes, "-cf", "-", "."]
        try:
            result = await self._call((await self._box()).exec, argv, cwd="/", output_limit=wire.MAX_PAYLOAD)
        except WarrenError as e:
            raise WorkspaceArchiveReadError(path=Path(root), context={"warren": str(e)}, cause=e) from e
        if result.exit_code != 0 or result.stdout_truncated:
            reason = "workspace larger than one archive carries" if result.stdout_truncated else "tar failed"
            raise WorkspaceArchiveReadError(
                path=Path(root),
                context={"reason": reason, "stderr": result.stderr.decode(errors="replace")[-4096:]},
            )
        try:
            return io.BytesIO(_workspace_archive.portable(result.stdout))
        except tarfile.TarError as e:
            raise WorkspaceArchiveReadError(path=Path(root), cause=e) from e

    def _checked_archive(self, data: io.IOBase) -> bytes:
        """The archive's bytes, checked whole before anything is written."""
        read = data.read()
        raw = read.encode() if isinstance(read, str) else bytes(read)
        root = Path(self.state.manifest.root)
        try:
            _workspace_archive.validate(raw)
        except UnsafeTarMemberError as e:
            raise WorkspaceArchiveWriteError(
                path=root, context={"reason": e.reason, "member": e.member}, cause=e
            ) from e
        except (tarfile.TarError, OSError) as e:
            raise WorkspaceArchiveWriteError(path=root, cause=e) from e
        return raw

    async def _unpack(self, argv: list[str], raw: bytes) -> None:
        root = self.state.manifest.root
        try:
            result = await self._call((await self._box()).exec, argv, cwd="/", stdin=raw)
        except WarrenError as e:
            raise WorkspaceArchiveWriteError(path=Path(root), context={"warren": str(e)}, cause=e) from e
        if result.exit_code != 0:
            raise WorkspaceArchiveWriteError(
                path=Path(root),
                context={"reason": "tar failed", "stderr": result.stderr.decode(errors="replace")[-4096:]},
            )

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        """Unpack an archive over the workspace (the SDK's direct call: files it
        holds replace those of the same name, others stay)."""
        raw = self._checked_archive(data)
        # Entries get the archive's modes (umask 0; GNU tar's later fchmodat with
        # AT_SYMLINK_NOFOLLOW is refused by warren's metadata broker, so not -p) and the
        # time of extraction (-m: utimensat on a symlink is refused the same way).
        script = (
            'umask 0; mkdir -p -- "$1" && exec tar -C "$1" --no-same-owner --no-same-permissions -m -xf -'
        )
        await self._unpack(["sh", "-c", script, "sh", self.state.manifest.root], raw)

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        """Resume's restore: the SDK's default clears the workspace, then unpacks, so a
        snapshot that fails to unpack loses every file. Here the whole archive is
        checked first, unpacked beside the live files, then swapped in; a failure at any
        step leaves the workspace as it was."""
        archive = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            raw = self._checked_archive(archive)
        finally:
            with contextlib.suppress(Exception):
                archive.close()
        root = Path(self.state.manifest.root)
        keep = sorted({rel.parts[0] for rel in self._workspace_resume_mount_skip_relpaths() if rel.parts})
        token = secrets.token_hex(8)
        names = [f".warren-restore-{token}", f".warren-replaced-{token}"]
        await self._unpack(
            ["sh", "-c", _workspace_archive.REPLACE_SCRIPT, "sh", str(root), *names, *keep], raw
        )


class WarrenSandboxClient(BaseSandboxClient[WarrenSandboxClientOptions | None]):
    """Sessions in warren sandboxes. ``policy`` (warren.toml keys or a PolicySpec) is
    the default for every session; a session's options add to it."""

    backend_id = "warren"
    supports_default_options = True

    def __init__(
        self,
        policy: PolicyKeys = None,
        *,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self._dependencies = dependencies
        self._policy = spec_from(policy, "WarrenSandboxClient")
        self._workspace_named = workspace_named(policy)
        self._instrumentation = instrumentation if instrumentation is not None else Instrumentation()

    def _spec_for(self, manifest: Manifest, options: WarrenSandboxClientOptions) -> tuple[PolicySpec, str]:
        extra = from_mapping(options.policy, "WarrenSandboxClientOptions.policy")
        spec = self._policy.merged(extra)
        spec.workspace = os.path.abspath(spec.workspace or os.getcwd())
        for grant in manifest.extra_path_grants:
            if grant.host_path is not None and os.path.abspath(grant.host_path) != os.path.abspath(
                grant.path
            ):
                raise _unsupported(
                    f"sandbox path grant host_path: host path {grant.host_path} shown at {grant.path}",
                    "warren shows host paths where they are; grant the path itself (no host_path)",
                )
            (spec.read if grant.read_only else spec.write).append(grant.path)
        if manifest.root == _DEFAULT_ROOT:
            return spec, os.path.realpath(spec.workspace)
        root = os.path.abspath(manifest.root)
        if extra.workspace is not None or self._workspace_named:
            named = os.path.realpath(spec.workspace)
            if named != os.path.realpath(root):
                raise ConfigurationError(
                    message=f"the manifest's root {root} is not the policy's workspace {named}",
                    error_code=ErrorCode.SANDBOX_CONFIG_INVALID,
                    op="start",
                    context={"hint": "name the workspace once: in the manifest's root or in the policy"},
                )
        try:
            os.makedirs(root, exist_ok=True)
        except OSError as e:
            raise WorkspaceStartError(path=Path(root), cause=e) from e
        spec.workspace = root
        return spec, os.path.realpath(root)

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: WarrenSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options if options is not None else WarrenSandboxClientOptions()
        manifest = manifest if manifest is not None else Manifest()
        self._validate_manifest_for_create(manifest)
        spec, root = await asyncio.to_thread(self._spec_for, manifest, options)
        manifest = manifest.model_copy(update={"root": root}, deep=True)
        session_id = uuid.uuid4()
        state = WarrenSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            exposed_ports=tuple(dict.fromkeys(options.exposed_ports)),
            sandbox_name=options.name or f"agents-{session_id.hex[:12]}",
            policy=keys_of(spec),
        )
        return self._wrap_session(WarrenSandboxSession(state=state), instrumentation=self._instrumentation)

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, WarrenSandboxSessionState):
            raise TypeError("WarrenSandboxClient.resume expects a WarrenSandboxSessionState")
        state.assert_path_grants_rebound()
        inner = WarrenSandboxSession(state=state)
        # The workspace is a directory on the host: its files outlive any sandbox.
        inner._set_start_state_preserved(True)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if not isinstance(inner, WarrenSandboxSession):
            raise TypeError("WarrenSandboxClient.delete expects a WarrenSandboxSession")
        await inner.remove()
        return session

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, WarrenSandboxSessionState)
