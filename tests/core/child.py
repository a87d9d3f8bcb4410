"""Running a piece of ``_core`` in a forked child, optionally inside fresh user and
mount namespaces, so what it does to the process (a Landlock domain, dropped
capabilities, mounts) never reaches the test runner.

The child reports what it saw as JSON through a pipe; the test judges that and,
wherever it can, the host side (files made or not made).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import traceback
from collections.abc import Callable

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

_libc = ctypes.CDLL(None, use_errno=True)


def _enter_namespaces() -> None:
    """Become root of a new user namespace (mapped to the caller) with a private
    mount namespace."""
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")
    for path, data in (
        ("/proc/self/uid_map", f"0 {uid} 1"),
        ("/proc/self/setgroups", "deny"),
        ("/proc/self/gid_map", f"0 {gid} 1"),
    ):
        with open(path, "w") as f:
            f.write(data)
    if _libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount --make-rprivate /: {os.strerror(err)}")


def in_child(fn: Callable[[], object], namespaces: bool = False) -> object:
    """``fn()``'s result (JSON-able) as computed in a forked child; an exception in the
    child is raised here as an AssertionError carrying its traceback."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            if namespaces:
                _enter_namespaces()
            out = json.dumps({"ok": fn()})
        except BaseException:
            out = json.dumps({"error": traceback.format_exc()})
            code = 1
        try:
            os.write(w, out.encode())
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    got = json.loads(data or b'{"error": "the child wrote nothing"}')
    if "error" in got:
        raise AssertionError(f"in the child:\n{got['error']}")
    return got["ok"]


def attempt(fn: Callable[[], object]) -> str:
    """'ok', or the name of the errno an OSError carried: what a test compares."""
    try:
        fn()
    except OSError as e:
        return errno.errorcode.get(e.errno or 0, repr(e))
    return "ok"
