"""Where warren keeps its state, the checks made before trusting it, and how a client
finds the supervisor there.

``$XDG_STATE_HOME/warren`` (default ``~/.local/state/warren``): the registry, the
supervisor's lock and address, logs of background processes and network decisions.
It must belong to the user and be closed to everyone else (mode 0700, not a symlink):
checked every time before use. Every sandbox gets it hidden, and no policy may make
it — or a directory above it — writable (``plan.make``), so no sandbox can move it
aside or plant another.

The supervisor's control socket is abstract (``wire.abstract_name``): it exists only
in the host's network namespace, which no sandbox shares. Its random name is in
``supervisor.addr`` here, so another user can neither find nor squat it.

Shared by the client (to find or start the supervisor), the CLI and the service;
what only the supervisor does there (publishing its address, a sandbox's own
directory) is ``server.statedir``. Imported by the CLI's fast path: standard library
only.
"""

from __future__ import annotations

import os
import stat

from . import xdg
from .errors import SetupError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

ADDRESS_FILE = "supervisor.addr"
TOKEN_FILE = "serve.token"  # `warren serve`'s bearer token by default
SECRET_FILES = "secret-files"  # files warren holds secret elsewhere (a --token-file): denied in sandboxes
MAX_SECRET_FILES = 64
LOG_FILE = "supervisor.log"
SANDBOXES = "sandboxes"


def _xdg(env: Mapping[str, str], name: str) -> str:
    """warren's directory in the XDG base directory ``name`` (``xdg.base``)."""
    return os.path.join(xdg.base(env, name, env.get("HOME") or os.path.expanduser("~")), "warren")


def location(env: Mapping[str, str]) -> str:
    return _xdg(env, "XDG_STATE_HOME")


def data_home(env: Mapping[str, str]) -> str:
    """warren's data directory: ``$XDG_DATA_HOME/warren`` (default
    ``~/.local/share/warren``), where its image store, E2B homes and repositories' git
    directories are."""
    return _xdg(env, "XDG_DATA_HOME")


def e2b_homes(env: Mapping[str, str]) -> str:
    """Where ``warren serve``'s E2B sandboxes keep their homes: ``$XDG_DATA_HOME/warren/e2b``
    (default ``~/.local/share/warren/e2b``), on the filesystem of the user's home, so a
    home and the tool caches share a mount inside (links and renames between them work).
    Hidden in every sandbox; an E2B sandbox reaches only its own home beneath it
    (``plan.make``)."""
    return os.path.join(data_home(env), "e2b")


def _state_error(path: str, message: str, hint: str, err: int | None = None) -> SetupError:
    return SetupError(message, operation="state dir", path=path, errno=err, hint=hint)


def _refuse(path: str, why: str, hint: str) -> SetupError:
    return _state_error(path, f"warren's state directory {path} {why}", hint)


def prepare(path: str) -> str:
    """Create the state directory if needed and verify it: a real directory of this
    user, closed to others. Returns ``path``."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        st = os.lstat(path)
    except OSError as e:
        raise _state_error(
            path,
            f"cannot create warren's state directory {path}",
            "check that its parent is writable, or set XDG_STATE_HOME to a directory you own",
            e.errno,
        ) from None
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise _refuse(
            path, "is not a directory (a symlink?)", "remove it; warren recreates it on the next run"
        )
    if st.st_uid != os.geteuid():
        raise _refuse(
            path,
            f"belongs to uid {st.st_uid}, not to you (uid {os.geteuid()})",
            "someone else created it: remove it, or set XDG_STATE_HOME to a directory you own",
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, 0o700)  # ours: closing it to others is always safe
    for sub in (SANDBOXES,):
        sub_path = os.path.join(path, sub)
        try:
            os.mkdir(sub_path, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(sub_path).st_mode):
                raise _refuse(sub_path, "is not a directory", "remove it") from None
    return path


def read_address(path: str) -> tuple[str, int] | None:
    """The supervisor's abstract socket token and its pid, if published by this user."""
    try:
        fd = os.open(os.path.join(path, ADDRESS_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            return None
        fields = os.read(fd, 256).decode(errors="replace").split()
    finally:
        os.close(fd)
    if len(fields) != 2 or not fields[0].isalnum() or len(fields[0]) < 16 or not fields[1].isdigit():
        return None
    return fields[0], int(fields[1])


def record_secret_file(path: str, secret: str) -> None:
    """Note ``secret`` (an absolute path outside ``path``, the state directory) as a
    file every sandbox started from now on must not read (``secret_files``)."""
    if secret in secret_files(path):
        return
    fd = os.open(
        os.path.join(path, SECRET_FILES),
        os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        os.write(fd, (secret + "\n").encode())
    finally:
        os.close(fd)


def secret_files(path: str) -> tuple[str, ...]:
    """The files ``record_secret_file`` noted (the newest ``MAX_SECRET_FILES``)."""
    try:
        fd = os.open(os.path.join(path, SECRET_FILES), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ()
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            return ()
        text = os.read(fd, 256 * 1024).decode(errors="replace")
    finally:
        os.close(fd)
    names = [line for line in text.splitlines() if line.startswith("/") and "\0" not in line]
    return tuple(dict.fromkeys(names))[-MAX_SECRET_FILES:]
