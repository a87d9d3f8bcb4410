"""Where the sandbox's TMPDIR lives: outside the workspace, yet so that a rename from
it into the workspace behaves as it does on the host for that workspace. Pure.

On the host, ``rename($TMPDIR/x, workspace/x)`` is a rename when the caller's TMPDIR
(``/tmp`` by default) lies on the workspace's mount, and EXDEV otherwise (a tmpfs
``/tmp``), which pip's uninstall stash and atomic-write patterns notice: they copy.
The sandbox's own ``/tmp`` is a fresh tmpfs, private to it. So when the host's rename
works, the sandbox gets a private TMPDIR of its own on the workspace's filesystem but
*outside* the workspace (nothing appears there; a tool that searches upward from its
temporary directory finds nothing of the project's), made a writable root: it then
joins the workspace's one shared mount (``mounts``), and a rename between them is a
rename. Where it goes, the first that shares that mount:

1. beneath the caller's own TMPDIR (``$TMPDIR/.warren-tmp-<random>``), when that is
   not ``/tmp`` (which the sandbox gets fresh) and close enough to the workspace;
2. the caller's cache, ``$XDG_CACHE_HOME/warren/tmp/<random>`` (``~/.cache``, made
   when missing);
3. the deepest directory above the workspace that the caller may write
   (``.warren-tmp-<random>`` beside the workspace, or higher).

"Shares the mount" means: the same host mount, not under ``/tmp`` (roots under the
sandbox's fresh ``/tmp`` are never shared: see ``mounts``), and a common ancestor with
the workspace that is not a directory the whole system shares (``NEVER_SHARED``).
When none does (a workspace under ``/tmp``, or directly in ``/var/tmp``; Landlock
below ABI 2, where every root is a mount of its own), the private tmpfs is the
TMPDIR, and the rename is EXDEV where the host's is not: ``limit`` says so. When the
host's rename is EXDEV, the private tmpfs is the faithful answer; so it is for a
workspace the caller cannot write on the host.

The directory is made by warren before the launch (mode 0700, a random name nobody
can plant in advance) and removed after the sandbox ends (``server.launch``).
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass

from .. import xdg
from .facts import HostFacts, mount_of
from .mounts import NEVER_SHARED, SCRATCH_PREFIX, overlaid_base, within

CACHE_PARTS = ("warren", "tmp")


@dataclass(frozen=True)
class Scratch:
    """The sandbox's TMPDIR on the host: ``rel`` (one or more components) made beneath
    ``base``, an existing directory of the caller's."""

    base: str
    rel: str

    @property
    def path(self) -> str:
        return posixpath.join(self.base, self.rel)


def host_tmpdir(caller_env: Mapping[str, str]) -> str:
    raw = caller_env.get("TMPDIR") or "/tmp"
    return posixpath.normpath(raw) if raw.startswith("/") else "/tmp"


def cache_home(caller_env: Mapping[str, str], home: str) -> str:
    return xdg.base(caller_env, "XDG_CACHE_HOME", home)


def _ancestors(path: str) -> list[str]:
    """The directories above ``path``, deepest first."""
    out = []
    while path != "/":
        path = posixpath.dirname(path)
        out.append(path)
    return out


def candidates(workspace: str, caller_env: Mapping[str, str], home: str) -> list[str]:
    """The directories whose kind and writability the decision depends on (the
    supervisor gathers them as host facts)."""
    cache = cache_home(caller_env, home)
    return [host_tmpdir(caller_env), cache, posixpath.dirname(cache), *_ancestors(workspace)]


def _shares(path: str, workspace: str, host: HostFacts) -> bool:
    """Would a writable root at ``path`` share the workspace's mount in the sandbox?"""
    ws_mount, mount = mount_of(workspace, host.mounts), mount_of(path, host.mounts)
    if ws_mount is None or mount is None or ws_mount.mount_id != mount.mount_id:
        return False
    if overlaid_base(path) is not None or within(path, workspace) or within(workspace, path):
        return False
    return posixpath.commonpath([path, workspace]) not in NEVER_SHARED


def scratch_tmpdir(
    workspace: str,
    workspace_writable: bool,
    caller_env: Mapping[str, str],
    home: str,
    host: HostFacts,
    scratch_id: str | None,
    shared: bool = True,
) -> Scratch | None:
    """The TMPDIR to make outside the workspace, or None to keep the private tmpfs."""
    if scratch_id is None or not shared or not workspace_writable or workspace not in host.writable_dirs:
        return None
    if not renames_on_host(workspace, caller_env, host) or overlaid_base(workspace) is not None:
        return None

    def usable(base: str) -> bool:
        return host.kind(base) == "dir" and base in host.writable_dirs

    name = SCRATCH_PREFIX + scratch_id
    tmp = host_tmpdir(caller_env)
    if usable(tmp) and _shares(posixpath.join(tmp, name), workspace, host):
        return Scratch(tmp, name)
    cache = cache_home(caller_env, home)
    rel = posixpath.join(*CACHE_PARTS, scratch_id)
    if usable(cache) and _shares(posixpath.join(cache, rel), workspace, host):
        return Scratch(cache, rel)
    # No cache directory yet (a new account): made, as any tool that caches would,
    # rather than a directory beside the workspace that the user sees in its parent.
    above, rel = posixpath.dirname(cache), posixpath.join(posixpath.basename(cache), rel)
    missing = host.kind(cache) == "missing"
    if missing and usable(above) and _shares(posixpath.join(above, rel), workspace, host):
        return Scratch(above, rel)
    for base in _ancestors(workspace):
        if usable(base) and _shares(posixpath.join(base, name), workspace, host):
            return Scratch(base, name)
    return None


def renames_on_host(workspace: str, caller_env: Mapping[str, str], host: HostFacts) -> bool:
    """Is ``rename($TMPDIR/x, workspace/x)`` a rename on the host (one mount)?"""
    ws_mount = mount_of(workspace, host.mounts)
    tmp_mount = mount_of(host_tmpdir(caller_env), host.mounts)
    return ws_mount is not None and tmp_mount is not None and ws_mount.mount_id == tmp_mount.mount_id


def limit(
    workspace: str, caller_env: Mapping[str, str], host: HostFacts, scratch: Scratch | None
) -> str | None:
    """A note when the sandbox's TMPDIR cannot be a rename away from the workspace
    although the host's is; None when it behaves as the host's."""
    if scratch is not None or not renames_on_host(workspace, caller_env, host):
        return None
    if overlaid_base(workspace) is not None:
        why = (
            "the workspace is under /tmp, which the sandbox gets fresh and writable: a host directory "
            "shared there would be writable too"
        )
    else:
        why = "no directory you can write shares the workspace's mount outside it"
    return (
        f"TMPDIR is the private /tmp: a rename from it into {workspace} fails with EXDEV here although "
        f"the host's TMPDIR is on the workspace's filesystem ({why}); tools that rename from TMPDIR "
        "copy instead"
    )
