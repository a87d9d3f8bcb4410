"""The contract's path rule, as text: a request path names something in the workspace.

A path is relative to the workspace, or absolute under it; ``..`` is resolved as text
first (``a/../b`` is ``b``) and may not climb out; an absolute path elsewhere is
refused. Links are the runtime's to check (``safepath.stays_beneath``): this module
touches no file system.
"""

from __future__ import annotations

import posixpath

from ..errors import SandboxPermissionDenied, WarrenError


class OutsideWorkspace(SandboxPermissionDenied):
    """A request path leads out of the workspace (the contract's 403 PERMISSION_DENIED)."""


class BadPath(WarrenError):
    """A request path that cannot name a file (a NUL byte)."""


def relative(root: str, raw: str, operation: str) -> str:
    """``raw`` as a path relative to ``root`` ("" for the root itself), or OutsideWorkspace."""
    if "\0" in raw:
        raise BadPath(f"{operation}: the path contains a NUL byte", operation=operation, hint="name a file")
    text = raw
    if text.startswith("/"):
        norm = posixpath.normpath(text)
        if norm == root:
            return ""
        if not norm.startswith(root.rstrip("/") + "/"):
            raise outside(raw, root, operation)
        text = norm[len(root.rstrip("/")) + 1 :]
    parts: list[str] = []
    for part in text.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise outside(raw, root, operation)
            parts.pop()
        else:
            parts.append(part)
    return "/".join(parts)


def outside(raw: str, root: str, operation: str) -> OutsideWorkspace:
    return OutsideWorkspace(
        f"{operation} {raw}: path traversal outside the workspace {root} is forbidden",
        operation=operation,
        path=raw,
        hint=f"name a path inside {root} (relative to it, or absolute under it); links must stay inside",
    )
