"""The state directory's record of each git lease: what a sandbox's writable roots held
when it started, kept until it has ended and what it made there is adopted.

Adoption (``gitadopt``) happens when a sandbox ends, in the supervisor that launched
it. A supervisor killed or crashed never sees that end (its sandboxes die with it), and
the next one, with no memory of them, would take a repository one of them made for the
host's own: its config, which the sandbox wrote (``core.fsmonitor``, hooks), left as
it is, and named by the host's index once a new sandbox had warren's store of it. So
each lease is written here at launch and removed once released; the next supervisor
adopts what the records it finds name as made since, before it serves anything
(``GitKeeper.recover``).

A record holds the roots, the git directories known in each, and the two variables
that say where warren's stores are (``gitstore.location``); nothing else of the
caller's environment. Files in the state directory (the user's own, mode 0700) are
written atomically through its descriptor, without fsync: a record only has to outlive
the supervisor's process, not the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from .._core import safepath

DIRECTORY = "git-leases"  # in the state directory
SUFFIX = ".json"
MAX_RECORD = 4 << 20
# What ``gitstore.location`` reads of the caller's environment: all a record keeps.
ENV_KEYS = ("HOME", "XDG_DATA_HOME")


@dataclass
class Record:
    name: str  # its file in ``DIRECTORY``
    known: dict[str, set[str]]  # root -> relative git directories when it started
    env: dict[str, str]


def open_directory(state: str) -> int:
    """The records' directory in the state directory ``state`` (made on first use)."""
    sfd = safepath.open_dir(state)
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(DIRECTORY, 0o700, dir_fd=sfd)
        return safepath.dir_beneath(sfd, DIRECTORY)
    finally:
        os.close(sfd)


def write(dfd: int, known: Mapping[str, set[str]], env: Mapping[str, str]) -> str:
    """A new record of a lease; returns its name."""
    name = secrets.token_hex(8) + SUFFIX
    data = {
        "known": {root: sorted(rels) for root, rels in known.items()},
        "env": {k: env[k] for k in ENV_KEYS if k in env},
    }
    safepath.write_atomic(dfd, name, json.dumps(data).encode(), mode=0o600, fsync=False)
    return name


def remove(dfd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        safepath.unlink(dfd, name)


def read_all(dfd: int) -> Iterator[Record | str]:
    """Every record left (a name in place of one that cannot be read: the caller says
    so and removes it)."""
    for name in sorted(os.listdir(dfd)):
        if not name.endswith(SUFFIX) or name.startswith("."):
            continue
        try:
            raw = json.loads(safepath.read_file(dfd, name, MAX_RECORD))
            known = {str(root): {str(r) for r in rels} for root, rels in raw["known"].items()}
            env = {str(k): str(v) for k, v in raw["env"].items() if k in ENV_KEYS}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            yield name
            continue
        yield Record(name, known, env)
