"""What an E2B sandbox has that a warren sandbox does not: its template, metadata,
environment, end time and workspace (and where those live); and the per-sandbox access
token.

A record is a small JSON file beside the sandbox's workspace (``ROOT/ID/record.json``,
the workspace is ``ROOT/ID/home``), so a restarted ``warren serve`` still knows when each
sandbox ends and what it was created from. The directory above the workspace is outside
every writable root: a sandbox can read its own record (its environment, which it has
anyway) but cannot change it, and sees no other sandbox's (``root_of``).

The access token is derived, not stored: ``HMAC(key, sandbox id)`` with a key derived
from the service token, so it survives a restart with the same token, differs for every
sandbox, and one sandbox's token says nothing about another's. No I/O on sandboxes here.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import stat as _stat
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .. import statedir
from .._core import safepath
from ..errors import SetupError

RECORD = "record.json"
WORKSPACE = "home"


@dataclass
class Record:
    sandbox_id: str
    template: str
    started_at: float
    end_at: float
    workspace: str
    metadata: dict[str, str] = field(default_factory=dict)
    envs: dict[str, str] = field(default_factory=dict)
    auto_pause: bool = False
    home: str = ""  # the workspace as the sandbox sees it, when not at its host path (an image's)
    internet: bool | None = None  # allow_internet_access as asked (what it made: ``network``)
    network: str | None = None  # its network mode as E2B's rules made it (None: the template's)
    allow_out: list[str] = field(default_factory=list)  # warren's rules for E2B's allowOut
    auto_resume: bool = False  # a request to a paused sandbox resumes it
    keep_memory: bool = True  # False: its timeout's pause is filesystem-only (processes end)
    timeout: int = 300  # seconds asked at create: what an auto-resume gives it again

    @property
    def inside(self) -> str:
        """The sandbox's home (E2B's ``/home/user``): where commands start and relative
        paths lead."""
        return self.home or self.workspace

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)


@dataclass(frozen=True)
class Lifecycle:
    """What happens at a sandbox's timeout and after: pause instead of kill, resume on
    the next request, keep the processes (a memory pause) or only the files."""

    auto_pause: bool = False
    auto_resume: bool = False
    keep_memory: bool = True


def root_of(env: Mapping[str, str]) -> str:
    """Where this user's E2B sandboxes live: ``/tmp/warren-e2b-UID-STATE`` (STATE: a digest
    of warren's state directory, so two services of one user never share it).

    Under ``/tmp`` because every sandbox gets a private ``/tmp``: there no sandbox sees
    another's workspace, as in E2B (anywhere else on the host, the read-only view of the
    host would show them). warren's state directory cannot hold them: it is hidden in
    every sandbox, and a workspace inside a hidden path is refused."""
    digest = hashlib.sha256(statedir.location(env).encode()).hexdigest()[:12]
    return f"/tmp/warren-e2b-{os.geteuid()}-{digest}"


def ensure_root(root: str) -> None:
    """Create ``root`` (mode 0700) or accept it only as this user's own private directory:
    in a shared /tmp another user could have made it first, or planted a link."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(root, 0o700)
    st = os.lstat(root)
    if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise SetupError(
            f"{root} is not a private directory of this user",
            operation="e2b",
            path=root,
            hint="remove it (another user or a link may have taken its place), then retry",
        )


class Records:
    """The records under one root, cached in memory; safe to use from worker threads."""

    def __init__(self, root: str, token: str | None) -> None:
        self.root = root
        seed = token.encode() if token is not None else secrets.token_bytes(32)
        self._key = hashlib.sha256(b"warren-e2b-access-token\0" + seed).digest()
        self._lock = threading.Lock()
        self._root_lock = threading.Lock()  # creating in the root vs removing it when empty
        self._cache: dict[str, Record] = {}

    def access_token(self, sandbox_id: str) -> str:
        return hmac.new(self._key, sandbox_id.encode(), hashlib.sha256).hexdigest()

    def token_matches(self, sandbox_id: str, given: str) -> bool:
        return hmac.compare_digest(self.access_token(sandbox_id).encode(), given.encode())

    def new_workspace(self, sandbox_id: str) -> str:
        top = os.path.join(self.root, sandbox_id)
        with self._root_lock:
            ensure_root(self.root)
            os.mkdir(top, 0o700)
        workspace = os.path.join(top, WORKSPACE)
        os.mkdir(workspace, 0o755)
        return workspace

    def save(self, record: Record) -> None:
        path = os.path.join(self.root, record.sandbox_id, RECORD)
        tmp = f"{path}.{secrets.token_hex(4)}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(record.to_json())
        os.replace(tmp, path)
        with self._lock:
            self._cache[record.sandbox_id] = record

    def get(self, sandbox_id: str) -> Record | None:
        with self._lock:
            if sandbox_id in self._cache:
                return self._cache[sandbox_id]
        record = self._load(sandbox_id)
        if record is not None:
            with self._lock:
                self._cache[sandbox_id] = record
        return record

    def _load(self, sandbox_id: str) -> Record | None:
        if "/" in sandbox_id or sandbox_id in ("", ".", ".."):
            return None
        try:
            with open(os.path.join(self.root, sandbox_id, RECORD), encoding="utf-8") as f:
                data: dict[str, Any] = json.load(f)
            return Record(**data)
        except (OSError, ValueError, TypeError):
            return None

    def any(self) -> bool:
        """Whether some E2B sandbox may exist (its directory does): a cheap local look,
        so an idle service does not wake (or start) the supervisor to find none."""
        try:
            return bool(os.listdir(self.root))
        except OSError:
            return False

    def ids(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except OSError:
            return []

    def drop(self, sandbox_id: str) -> None:
        """Forget a sandbox and delete its workspace (only ever one this root made)."""
        with self._lock:
            self._cache.pop(sandbox_id, None)
        if "/" in sandbox_id or sandbox_id in ("", ".", ".."):
            return
        # Beneath the root's descriptor, never through a link the sandbox may have left
        # in its workspace (the project's one way to remove a tree a sandbox could write).
        with contextlib.suppress(FileNotFoundError):
            root = safepath.open_dir(self.root)
            try:
                safepath.remove_tree(root, sandbox_id)
            finally:
                os.close(root)
        with self._root_lock, contextlib.suppress(OSError):
            os.rmdir(self.root)  # the last one leaves no litter in /tmp (not empty: kept)
