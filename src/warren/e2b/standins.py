"""What E2B's sandbox has and the host may not, given to E2B sandboxes not on an image:
``sudo`` (E2B's user has it without a password) first on PATH, and ``python`` (Python 3)
last, for a host that has only ``python3``. Both are shell scripts in ``e2b/bin``, read
from warren's own install; ``sudo`` runs the command as the sandbox's one user (no
privilege is gained: a warren sandbox has no new privileges, and nothing on the host is
setuid for it).

E2B's commands run as ``/bin/bash -l -c CMD``, and a login shell's /etc/profile sets
PATH afresh (Debian's does), so the directories are put on PATH both in the sandbox's
environment and, for such a command, at the head of its script, after the profile ran.
"""

from __future__ import annotations

import os

from ..plan.env import DEFAULT_PATH
from ..policy.spec import PolicySpec

BIN = os.path.join(os.path.dirname(__file__), "bin")
FIRST = os.path.join(BIN, "first")
LAST = os.path.join(BIN, "last")


def give(spec: PolicySpec) -> None:
    """The stand-ins in a sandbox's spec: their directory readable, and on PATH."""
    spec.read = [*spec.read, BIN]
    spec.env = {**spec.env, "PATH": f"{FIRST}:{os.environ.get('PATH') or DEFAULT_PATH}:{LAST}"}


def login_script(cmd: str, args: list[str]) -> list[str]:
    """``args`` of E2B's ``/bin/bash -l -c SCRIPT``, with PATH set again after the profile
    (on the script's first line, so bash's line numbers in messages stay the user's)."""
    if cmd != "/bin/bash" or len(args) != 3 or args[:2] != ["-l", "-c"]:
        return args
    return [*args[:2], f'PATH="{FIRST}:$PATH:{LAST}"; {args[2]}']
