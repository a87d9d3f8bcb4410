"""Following a writable root that was replaced on the host (``rm -rf ws && mkdir ws``,
``mv ws ws.old && mkdir ws``) while a long-lived sandbox holds it.

The supervisor notes each writable root's identity (device, inode) at launch and
checks it before every request it hands to the sandbox. When one changed, a helper
forked from the supervisor joins the sandbox's user and mount namespaces (the
supervisor's user owns them) and binds the new directory read-write where the sandbox
sees it; PID 1 then rebuilds its Landlock rules, which name inodes. Where the new
directory cannot be reached from inside (a root grafted into the sandbox's private
/tmp), the request fails saying exactly that.
"""

from __future__ import annotations

import errno
import os

from .._core import mounts
from ..errors import SandboxError
from ..plan.model import Plan
from . import joined

Identity = tuple[int, int]


def roots(plan: Plan) -> list[str]:
    return sorted({r for _at, group in plan.groups for r in group})


def identities(plan: Plan) -> dict[str, Identity]:
    out: dict[str, Identity] = {}
    for root in roots(plan):
        try:
            st = os.stat(root)
        except OSError:
            continue
        out[root] = (st.st_dev, st.st_ino)
    return out


def replaced(known: dict[str, Identity]) -> dict[str, Identity]:
    """Roots that name another directory on the host now (gone ones are not followed:
    there is nothing to follow; commands say so through their cwd warning)."""
    out: dict[str, Identity] = {}
    for root, ident in known.items():
        try:
            st = os.stat(root)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) != ident:
            out[root] = (st.st_dev, st.st_ino)
    return out


def rebind(ns: tuple[int, int] | None, name: str, changed: dict[str, Identity]) -> None:
    """Make the sandbox see (and write) the new directories; SandboxError if it can't."""

    def bind(_fds: list[int]) -> list[int]:
        for root, (dev, ino) in changed.items():
            st = os.stat(root)
            if (st.st_dev, st.st_ino) != (dev, ino):
                raise OSError(errno.ESTALE, "not the directory on the host", root)
            if os.statvfs(root).f_flag & os.ST_RDONLY:
                mounts.rebind_writable(root)
        return []

    try:
        if ns is None:
            raise OSError(errno.EINVAL, "no namespaces to join")
        joined.run(ns, bind, [])
    except OSError as e:
        where = e.filename if e.errno == errno.ESTALE and e.filename else ", ".join(changed)
        raise SandboxError(
            f"{where} was replaced on the host after sandbox {name} started, and the sandbox "
            "cannot reach the new directory",
            operation="follow",
            path=where,
            hint=f"recreate the sandbox (warren rm -f {name}, then warren create {name} with the same "
            "flags); a workspace outside /tmp is followed on its own",
        ) from None
