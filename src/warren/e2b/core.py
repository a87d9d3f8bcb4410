"""What the E2B control plane and envd share: the transport, the records, the calls
into worker threads, and the mapping of warren's errors onto E2B's answers.

Every sandbox operation goes through the same ``Transport`` the SDK, ``/v1`` and MCP use,
so an E2B sandbox is an ordinary warren sandbox (``warren ls`` shows it). Nothing here
speaks HTTP; routes live in ``control`` and ``envd``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import anyio
import anyio.to_thread

from ..client.transport import Transport
from ..errors import SandboxNotFound, WarrenError
from ..models import SandboxInfo
from ..service.status import status_of as warren_status
from .records import Record, Records
from .snapshots import Snapshots
from .templates import Templates

T = TypeVar("T")

# envd features the SDK gates on this version, all offered: stdin for commands (0.3.0), a
# default user (0.4.0), closing stdin (0.5.2), octet-stream uploads (0.5.7), file metadata
# (0.6.2), entry info in watch events (0.6.3), watching network mounts when asked (0.6.4).
ENVD_VERSION = "0.6.4"
DEFAULT_TIMEOUT = 300
HOME = "/home/user"  # E2B's home and working directory
MAX_TIMEOUT = 24 * 3600
REAP_EVERY = 1.0
FILES_ONLY_ROUNDS = 20


class E2BError(Exception):
    """A request E2B's API refuses: ``status`` and a message for ``{"code", "message"}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def status_of(error: BaseException) -> int:
    if isinstance(error, E2BError):
        return error.status
    if isinstance(error, WarrenError):
        return warren_status(error)
    return 500


def message_of(error: BaseException) -> str:
    if isinstance(error, E2BError):
        return error.message
    if isinstance(error, WarrenError):
        return f"{error.message}" + (f" (hint: {error.hint})" if error.hint else "")
    return f"internal error: {type(error).__name__}: {error}"


UPLOADS_KEPT = 4096


class Core:
    def __init__(self, transport: Transport, records: Records, threads: int = 128) -> None:
        self.transport = transport
        self.records = records
        self.snapshots = Snapshots(records.root)
        self.templates = Templates(records.root)
        self.limiter = anyio.CapacityLimiter(threads)
        self._reaper: threading.Thread | None = None
        self._lock = threading.Lock()
        self._waking = threading.Lock()
        self._creating: set[str] = set()  # ids between their workspace and warren's create
        self._stopping = threading.Event()
        # Files written through the files API, by sandbox, with when: envd's upload
        # changes a file's owner after writing it, which its watchers report as a CHMOD
        # (``uploaded_since``). At most UPLOADS_KEPT per sandbox, the oldest dropped.
        self._uploads: dict[str, dict[str, float]] = {}

    def note_upload(self, sandbox_id: str, path: str) -> None:
        with self._lock:
            kept = self._uploads.setdefault(sandbox_id, {})
            kept.pop(path, None)
            kept[path] = time.time()
            while len(kept) > UPLOADS_KEPT:
                del kept[next(iter(kept))]

    def uploaded_since(self, sandbox_id: str, path: str, since: float) -> bool:
        """Whether ``path`` was written through the files API at ``since`` or later."""
        with self._lock:
            return self._uploads.get(sandbox_id, {}).get(path, 0.0) >= since

    def forget_uploads(self, sandbox_id: str) -> None:
        with self._lock:
            self._uploads.pop(sandbox_id, None)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        context = contextvars.copy_context()  # the caller (``client.origin``) goes with it
        return await anyio.to_thread.run_sync(lambda: context.run(fn, *args, **kwargs), limiter=self.limiter)

    def record(self, sandbox_id: str) -> Record:
        """The record of an E2B sandbox, or a 404 naming it."""
        record = self.records.get(sandbox_id)
        if record is None:
            raise E2BError(404, f"sandbox {sandbox_id!r} not found")
        return record

    def record_of(self, info: SandboxInfo) -> Record:
        """The E2B record, or one made up for a sandbox created another way (``warren
        create``, ``/v1``): it has no end time and its workspace is its own."""
        record = self.records.get(info.name)
        if record is not None:
            return record
        return Record(
            sandbox_id=info.name,
            template="warren",
            started_at=info.created,
            end_at=float("inf"),
            workspace=info.workspace,
        )

    def running(self, sandbox_id: str) -> bool:
        """Whether the sandbox is running and within its time (the reaper ends it soon after)."""
        try:
            info = self.transport.get(sandbox_id)
        except SandboxNotFound:
            return False
        record = self.records.get(sandbox_id)
        return info.state == "running" and (record is None or record.end_at > time.time())

    def resolve(self, record: Record, path: str) -> str:
        """A path as E2B means it: absolute, or relative to the sandbox's home (its
        workspace). ``..`` and symlinks are resolved by the kernel inside the sandbox."""
        if not path:
            raise E2BError(400, "path is empty")
        if "\x00" in path:
            raise E2BError(400, "path contains a NUL byte")
        return path if path.startswith("/") else os.path.join(record.inside, path)

    # --- end of life ---------------------------------------------------------------------------

    def start_reaper(self) -> None:
        """A thread that ends sandboxes whose time is up (pause them when created with
        auto-pause), like E2B's timeout; idempotent."""
        if self._reaper is not None:
            return
        self._reaper = threading.Thread(target=self._reap, name="e2b-reaper", daemon=True)
        self._reaper.start()

    def _reap(self) -> None:
        while not self._stopping.wait(REAP_EVERY):
            if self.records.any():
                self.reap_once()

    def reap_once(self) -> None:
        """End the sandboxes whose time is up, and sweep the workspaces of those warren
        no longer has. What may be swept is taken before the listing: a sandbox whose
        create finished after the listing is not in it, and must not be swept."""
        candidates = self.unclaimed()
        try:
            items = self.transport.list()
        except WarrenError:
            return
        now = time.time()
        for info in items:
            record = self.records.get(info.name)
            if record is None or record.end_at > now or info.state != "running":
                continue
            try:
                self.expire(record)
            except WarrenError:
                continue
        self.sweep({info.name for info in items}, candidates)

    @contextlib.contextmanager
    def creating(self, sandbox_id: str) -> Iterator[None]:
        """While a sandbox is being made: ``sweep`` leaves its workspace alone."""
        with self._lock:
            self._creating.add(sandbox_id)
        try:
            yield
        finally:
            with self._lock:
                self._creating.discard(sandbox_id)

    def unclaimed(self) -> set[str]:
        """The records no create is making now: those ``sweep`` may consider."""
        with self._lock:
            creating = set(self._creating)
        return {sandbox_id for sandbox_id in self.records.ids() if sandbox_id not in creating}

    def sweep(self, known: set[str], candidates: set[str] | None = None) -> None:
        """Delete the workspace of every E2B sandbox warren no longer has (removed with
        ``warren rm`` or ``/v1``): of ``candidates`` (taken before ``known`` was listed;
        by default all records no create is making now), those not ``known``."""
        for sandbox_id in self.unclaimed() if candidates is None else candidates:
            if sandbox_id not in known:
                self.records.drop(sandbox_id)

    def expire(self, record: Record) -> None:
        """Time is up: pause (``autoPause``; filesystem-only unless it keeps memory) or
        kill. A paused sandbox waits for a connect (or, with ``autoResume``, a request)."""
        if record.auto_pause:
            self.pause(record.sandbox_id, keep_memory=record.keep_memory)
        else:
            self.kill(record.sandbox_id)

    def pause(self, sandbox_id: str, *, keep_memory: bool) -> None:
        """Freeze the sandbox's processes; a filesystem-only pause (not ``keep_memory``)
        ends them first (SIGKILL, as a cold boot loses them), keeping only its files
        (its home, its /tmp, whatever it wrote) for the resume."""
        if not keep_memory:
            for _ in range(FILES_ONLY_ROUNDS):  # a process may fork while its siblings end
                killed = 0
                for proc in self.transport.processes(sandbox_id):
                    # warren's own (PID 1, its helpers) are refused by the signal itself
                    with contextlib.suppress(WarrenError):
                        self.transport.signal(sandbox_id, proc.pid, signal.SIGKILL)
                        killed += 1
                if not killed:
                    break
                time.sleep(0.05)
        self.transport.pause(sandbox_id, True)

    def wake(self, sandbox_id: str) -> bool:
        """Resume a paused sandbox created with ``autoResume`` because a request came for
        it, with the timeout it was created with; whether it is running now."""
        record = self.records.get(sandbox_id)
        if record is None or not record.auto_resume:
            return False
        with self._waking:  # requests arriving together resume it once
            try:
                info = self.transport.get(sandbox_id)
            except SandboxNotFound:
                return False
            if info.state == "paused":
                self.transport.pause(sandbox_id, False)
                record.end_at = max(record.end_at, time.time() + record.timeout)
                self.records.save(record)
            elif info.state != "running":
                return False
        return True

    def kill(self, sandbox_id: str) -> None:
        """Stop and remove the sandbox, then its record and workspace (kept when the
        stop failed: the sandbox may still be using them)."""
        with contextlib.suppress(SandboxNotFound):
            self.transport.stop(sandbox_id, remove=True)
        self.records.drop(sandbox_id)
        self.forget_uploads(sandbox_id)
