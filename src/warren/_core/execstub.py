"""The exec stub (``native/exec-stub.c``, compiled at install as ``warren-exec-stub``):
what a command's process, forked ahead of time and already confined, becomes while it
waits, so that starting the command is an execve from a process of a few pages rather
than from a copy of the helper's Python (tearing that copy down cost about a
millisecond per command).

Loaded once, before any sandbox, into a sealed memfd (``load``): every PID 1 inherits
that descriptor (close-on-exec: no command ever holds it), and a launcher execs it with
``execveat`` — Landlock allows executing a memfd, so it works in image sandboxes,
where the install's own files are not there. Without the program (no C compiler at
install, or ``WARREN_EXEC_STUB=0``) the launcher stays Python, as before.

The stub confines itself (``confinement``: what the Python path's ``harden.harden``
and ``shim.limit_resources`` do, in the same order) when its environment says to, so
that the process forked ahead runs no Python but the execve; ``WARREN_STUB_CONFINES=0``
keeps confining in Python before the exec.

Owns: finding and loading the program, and its wire format (``request``, ``reply``).
"""

from __future__ import annotations

import errno
import struct
import sys

from . import programs

NAME = "warren-exec-stub"
MEMFD_NAME = f"/memfd:{NAME} (deleted)"  # its /proc/PID/exe while it waits
COMM = "warren-stub"  # its name (/proc/PID/comm) while it waits, set by itself
SOCK = 3  # the helper's socket, where the stub expects it
# A launcher's first byte: what it is. READY is also the version of the stub's wire
# format (``request``) and says the stub is confined: a stub built from other sources
# (one that would not confine itself) says another byte, and is not spoken to (the
# command fails with a typed error: install again). FAILED: confining failed at a step
# (``CONFINE_STEPS``), its errno beside.
READY, HARDENED, PYTHON, FAILED = b"C", b"H", b"P", b"F"
CONFINE_STEPS = {
    1: "the confinement asked for",
    2: "rlimit",
    3: "no_new_privs",
    4: "landlock_restrict_self",
    5: "drop capabilities",
    6: "install seccomp filter",
}

# The stub's steps, as it reports a failed one.
PROTOCOL, CHDIR, CTTY, STDIO, EXECVE, SEARCH = 1, 2, 3, 4, 5, 6


def program() -> str | None:
    """Where the compiled stub is (``programs.find``); None with ``WARREN_EXEC_STUB=0``."""
    return programs.find(NAME, "WARREN_EXEC_STUB")


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


def load() -> int | None:
    """The stub in a sealed memfd (made once per process tree), or None when there is
    none to load."""
    return programs.load(NAME, program)


def loaded() -> int | None:
    return programs.loaded(NAME)


def request(
    cwd: str,
    path: str,
    ctty: int,
    argv: list[str],
    env: dict[str, str],
    *,
    walk: bool = False,
    scratch: str = "",
    search: bool = False,
    nulls: str = "000",
) -> bytes:
    """The launch request as the stub reads it: a length, then NUL-terminated strings.
    A NUL inside one would cut it short: the caller has refused those already (as
    execve itself does). ``walk``: enter the nearest ancestor of ``cwd`` that can be;
    ``scratch``: a directory to make first if missing; ``search``: ``path`` is a name
    for a PATH search; ``nulls``: which of stdin, stdout, stderr is /dev/null (the
    passed descriptors fill the others, in order)."""
    strings = [
        cwd,
        "1" if walk else "0",
        scratch,
        path,
        "1" if search else "0",
        nulls,
        str(ctty),
        str(len(argv)),
        *argv,
        *(f"{k}={v}" for k, v in env.items()),
    ]
    # One encoding of the whole (as os.fsencode encodes each): a request is made on
    # every exec's path, in the supervisor, and the environment is most of it.
    body = ("\0".join(strings) + "\0").encode(_FS_ENCODING, _FS_ERRORS)
    return struct.pack("!I", len(body)) + body


def confinement(signals: tuple[int, ...], oom: bool, rlimits: list[tuple[int, int]], seccomp: str) -> str:
    """What the stub confines itself to (``native/exec-stub.c``), but for the two
    descriptors WARREN_CONFINE names first (its channel, the Landlock ruleset: where
    they are in the process that execs it): the signals a command starts with at their
    default, whether to make it the OOM killer's first pick, the rlimits (resource,
    value: soft and hard) and the seccomp filter (``_sys.SeccompProgram.hex``)."""
    limits = ",".join(f"{res}:{value}" for res, value in rlimits)
    return ";".join([",".join(map(str, signals)), "1" if oom else "0", limits, seccomp])


def sendable(argv: list[str], env: dict[str, str], *paths: str) -> bool:
    """Whether the stub can be asked for this at all: execve takes no NUL in a string
    and no '=' in an environment name."""
    strings = [*paths, *argv, *env, *env.values()]
    return not any("\0" in s for s in strings) and not any("=" in k for k in env)


def reply(data: bytes) -> tuple[int, int]:
    """(step, errno) from the stub's report of a failed step."""
    if len(data) != 9 or data[:1] != b"E":
        return PROTOCOL, errno.EPROTO
    step, err = struct.unpack("!II", data[1:])
    return step, err
