"""Where a sandboxed process may act: the writable roots and the sandbox's own tmpfs.

Owns the one judgment the metadata and socket concerns share, made on an fd the
broker opened itself (an ``O_PATH`` fd of the resolved object), never on a path that
could be swapped after the check.
"""

from __future__ import annotations

import contextlib
import errno
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..credsend import Sender


class Places:
    def __init__(
        self,
        roots: list[str],
        private: set[int],
        sealed: set[tuple[int, int]],
        abstract: bool = True,
        inet: frozenset[tuple[str, int]] | None = None,
        loopback: bool = True,
    ) -> None:
        self.roots = [r.rstrip("/") or "/" for r in roots]  # writable roots, as seen inside
        self.private = private  # st_dev of the sandbox's own tmpfs (/tmp, /dev/shm)
        self.sealed = sealed  # objects whose metadata nobody may change
        # Abstract unix addresses may be reached: in the sandbox's own network namespace
        # they are only its own. Not in the degraded mode (the host's namespace), where
        # PID 1 — in no Landlock domain — would reach the host's for the command.
        self.abstract = abstract
        # The only (address, port) an IP socket may reach, in the degraded mode (the
        # host's network namespace): its proxy under network allow, nothing under none.
        # None: any (a namespace of its own, or network open).
        self.inet = inet
        # The host's loopback (and the unspecified address, which reaches it) may be
        # reached: not by the degraded mode's network open, where it is the host's
        # services (warren serve, databases, agents) and not the sandbox's own.
        self.loopback = loopback
        # Who makes a unix send naming its caller as the sender (``_core.credsend``);
        # None: PID 1 makes it, and receivers are told PID 1's pid.
        self.sender: Sender | None = None

    def inside(self, fd: int) -> bool:
        """Is the object of ``fd`` in a writable root or on the sandbox's own tmpfs?"""
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) in self.sealed:
            return False  # a denied file's stand-in
        if st.st_dev in self.private:
            return True
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(" (deleted)"):
            path = path[: -len(" (deleted)")]
        return any(path == r or path.startswith(r + "/") or r == "/" for r in self.roots)

    @staticmethod
    def refusal(fd: int) -> int:
        with contextlib.suppress(OSError):
            if os.fstatvfs(fd).f_flag & os.ST_RDONLY:
                return -errno.EROFS
        return -errno.EPERM
