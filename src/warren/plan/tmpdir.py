"""Where the sandbox's TMPDIR lives: decided so that a rename from it into the
workspace behaves as it does on the host for that workspace. Pure.

On the host, ``rename($TMPDIR/x, workspace/x)`` is a rename when the caller's TMPDIR
(``/tmp`` by default) lies on the workspace's mount, and EXDEV otherwise (a tmpfs
``/tmp``), which pip's uninstall stash and atomic-write patterns notice: they copy.
The sandbox's own ``/tmp`` is a fresh tmpfs, private to it. So when the host's rename
works, the sandbox gets a private TMPDIR *inside the workspace* (the only place
certain to share the workspace's mount): a new directory made by warren before the
launch, which git ignores (it holds a ``.gitignore`` of ``*``), removed when the
sandbox ends. When the host's rename is EXDEV, the private tmpfs is the faithful
answer and stays; so it does for a workspace the caller cannot write on the host.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping

from .facts import HostFacts, mount_of

SCRATCH_PREFIX = ".warren-tmp-"


def host_tmpdir(caller_env: Mapping[str, str]) -> str:
    raw = caller_env.get("TMPDIR") or "/tmp"
    return posixpath.normpath(raw) if raw.startswith("/") else "/tmp"


def scratch_tmpdir(
    workspace: str,
    workspace_writable: bool,
    caller_env: Mapping[str, str],
    host: HostFacts,
    scratch_id: str | None,
) -> str | None:
    """The TMPDIR to make inside the workspace, or None to keep the private tmpfs."""
    if scratch_id is None or not workspace_writable or workspace not in host.writable_dirs:
        return None
    ws_mount = mount_of(workspace, host.mounts)
    tmp_mount = mount_of(host_tmpdir(caller_env), host.mounts)
    if ws_mount is None or tmp_mount is None or ws_mount.mount_id != tmp_mount.mount_id:
        return None
    return posixpath.join(workspace, SCRATCH_PREFIX + scratch_id)
