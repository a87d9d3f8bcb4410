"""envd's file metadata (0.6.2): user-defined ``key: value`` pairs kept on a file as
extended attributes ``user.e2b.KEY``, sent with an upload as ``X-Metadata-KEY`` headers
and shown in every entry (stat, listing, rename, watch events).

Only the parsing and the limits are here (pure): the attributes themselves are read and
written by warren's file operations inside the sandbox (``FileOp.xattrs``), so a file's
metadata is wherever the file is, and an attribute set from inside (``setfattr -n
user.e2b.author``) is metadata too, as on E2B.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from .core import E2BError

XATTR_PREFIX = "user.e2b."
HEADER_PREFIX = "x-metadata-"
# envd's limits: a key within the kernel's 255-byte attribute name less the prefix, and
# all of a file's metadata (each key with the prefix, and its value) within 4 KiB
MAX_KEY = 255 - len(XATTR_PREFIX)
MAX_TOTAL = 4096
_TOKEN = re.compile(r"\A[A-Za-z0-9!#$%&'*+\-.^_`|~]+\Z")  # an HTTP header name
_PRINTABLE = re.compile(r"\A[\x20-\x7e]*\Z")


def from_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The metadata an upload's ``X-Metadata-*`` headers carry: keys lowercased, the first
    of a repeated header kept; a key or value envd would refuse is a 400 naming it."""
    out: dict[str, str] = {}
    for name, value in headers:
        if not name.lower().startswith(HEADER_PREFIX):
            continue
        key = name[len(HEADER_PREFIX) :].lower()
        if not key or not _TOKEN.match(key) or len(key) > MAX_KEY:
            raise E2BError(
                400, f"metadata key {key[:60]!r} must be 1 to {MAX_KEY} characters of an HTTP header name"
            )
        if not _PRINTABLE.match(value):
            raise E2BError(400, f"metadata value of {key!r} must be printable US-ASCII")
        out.setdefault(key, value)
    total = sum(len(XATTR_PREFIX) + len(k) + len(v) for k, v in out.items())
    if total > MAX_TOTAL:
        raise E2BError(400, f"metadata of {total} bytes is over the limit of {MAX_TOTAL} per file")
    return out
