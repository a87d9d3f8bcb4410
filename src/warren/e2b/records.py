"""What an E2B sandbox has that a warren sandbox does not: its template, metadata,
environment, end time and workspace (and where those live); and the per-sandbox access
token.

A record is a small JSON file beside the sandbox's workspace (``ROOT/ID/record.json``;
the workspace is ``ROOT/ID/RANDOM``, named in the record), so a restarted ``warren
serve`` still knows when each sandbox ends and what it was created from. Nothing under
ROOT but its own home is in a sandbox's reach: no record, no other sandbox's home
(``root_of``).

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
# A sandbox's directory: its owner may enter it and make entries, never list it (an E2B
# sandbox's Landlock grants listing every directory beneath the ones it may list, so
# only this mode keeps another sandbox from learning the home's random name there;
# warren's sandboxes run without CAP_DAC_READ_SEARCH, a root caller's too).
UNLISTED = 0o300


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
    """Where this user's E2B sandboxes live: ``E2B/STATE`` beneath ``statedir.e2b_homes``
    (``~/.local/share/warren/e2b``; STATE: a digest of warren's state directory, so two
    services of one user never share it).

    On the filesystem of the user's home, as the tool caches are, so the uv or npm cache
    hard-links into a sandbox's home as into any workspace there. The whole directory is
    hidden in every sandbox; an E2B sandbox reaches its own home beneath it and nothing
    else there, homes made later included (``plan.make``), so no sandbox sees another's
    home, as in E2B."""
    digest = hashlib.sha256(statedir.location(env).encode()).hexdigest()[:12]
    return os.path.join(statedir.e2b_homes(env), digest)


def ensure_root(root: str) -> None:
    """Create ``root`` and the directory above it (mode 0700) or accept each only as this
    user's own private directory (another user or a link could have taken its place)."""
    for path in (os.path.dirname(root), root):
        with contextlib.suppress(FileExistsError):
            os.makedirs(path, 0o700)
        st = os.lstat(path)
        if not _stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise SetupError(
                f"{path} is not a private directory of this user",
                operation="e2b",
                path=path,
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
        """A fresh home ``ROOT/ID/RANDOM``: ``ROOT/ID`` is ``UNLISTED`` and the home's
        name random, so no other sandbox can name it, let alone read it (``root_of``)."""
        top = os.path.join(self.root, sandbox_id)
        with self._root_lock:
            ensure_root(self.root)
            os.mkdir(top, 0o700)
        workspace = os.path.join(top, secrets.token_hex(16))
        os.mkdir(workspace, 0o755)
        os.chmod(top, UNLISTED)
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
                # listable again to be removed: only this service writes in the root
                with contextlib.suppress(OSError):
                    os.chmod(sandbox_id, 0o700, dir_fd=root, follow_symlinks=False)
                safepath.remove_tree(root, sandbox_id)
            finally:
                os.close(root)
        with self._root_lock, contextlib.suppress(OSError):
            os.rmdir(self.root)  # the last one leaves no litter (not empty: kept)
