"""Landlock: the access rights (include/uapi/linux/landlock.h) and the ruleset a plan
asks for. Pure: building the ruleset in the kernel is ``_core.harden``'s job.

Writes (with REFER, so renames and links across writable roots work) are granted
only beneath the writable roots, the private temporary directories and the
terminal devices; everything else the mounts show is read and execute.
"""

from __future__ import annotations

from dataclasses import dataclass

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13
TRUNCATE = 1 << 14
IOCTL_DEV = 1 << 15
NET_BIND_TCP = 1 << 0  # handled_access_net, from ABI 4
NET_CONNECT_TCP = 1 << 1
SCOPE_ABSTRACT_UNIX = 1 << 0
SCOPE_SIGNAL = 1 << 1

_ABI_FS = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
READ = EXECUTE | READ_FILE | READ_DIR
WRITE_TREE = (
    WRITE_FILE
    | REMOVE_DIR
    | REMOVE_FILE
    | MAKE_DIR
    | MAKE_REG
    | MAKE_SOCK
    | MAKE_FIFO
    | MAKE_SYM
    | REFER
    | TRUNCATE
)
DEVICE = READ_FILE | WRITE_FILE | TRUNCATE | IOCTL_DEV

_RIGHT_NAMES = {
    EXECUTE: "execute",
    WRITE_FILE: "write_file",
    READ_FILE: "read_file",
    READ_DIR: "read_dir",
    REMOVE_DIR: "remove_dir",
    REMOVE_FILE: "remove_file",
    MAKE_CHAR: "make_char",
    MAKE_DIR: "make_dir",
    MAKE_REG: "make_reg",
    MAKE_SOCK: "make_sock",
    MAKE_FIFO: "make_fifo",
    MAKE_BLOCK: "make_block",
    MAKE_SYM: "make_sym",
    REFER: "refer",
    TRUNCATE: "truncate",
    IOCTL_DEV: "ioctl_dev",
}


def handled_fs(abi: int) -> int:
    return _ABI_FS.get(abi, (1 << 16) - 1) if abi >= 1 else 0


def right_names(mask: int) -> list[str]:
    return [name for bit, name in _RIGHT_NAMES.items() if mask & bit]


@dataclass(frozen=True)
class LandlockRule:
    path: str
    access: int
    why: str
    is_dir: bool = True
    # ``access`` below ``path`` except beneath these (expanded when the ruleset is
    # built, from what the directories hold then): a denied path stays unreadable
    # even if it is created after the sandbox started.
    excluding: tuple[str, ...] = ()


@dataclass(frozen=True)
class LandlockPlan:
    abi: int
    handled: int
    scoped: int  # abstract unix sockets and signals, from ABI 6
    rules: tuple[LandlockRule, ...]
    # TCP bind and connect, handled with no port granted: refused (the degraded mode's
    # network none, which has no network namespace of its own); 0 leaves them alone.
    handled_net: int = 0


def covered_dirs(ll: LandlockPlan) -> tuple[str, ...]:
    """The directories whose entries get rules one by one (every directory above an
    excluded path, up to its rule's path): a rule binds to the inode it finds, so an
    entry made or replaced in one of them after the ruleset was built is covered by
    none. Whoever keeps a ruleset for a long-lived sandbox rebuilds it when one of these
    changed (``server.hostwatch``)."""
    out: set[str] = set()
    for rule in ll.rules:
        top = rule.path.rstrip("/") + "/"
        for path in rule.excluding:
            out.update(d for d in above(path) if (d.rstrip("/") + "/").startswith(top))
    return tuple(sorted(out))


def above(path: str) -> list[str]:
    """The directories above ``path``, ``/`` included: ``/a/b/c`` -> ``/``, ``/a``, ``/a/b``."""
    return [path[:i] or "/" for i, c in enumerate(path) if c == "/"]


def plan(
    abi: int,
    writable: list[str],
    tmpdirs: tuple[str, ...],
    devices: tuple[str, ...],
    denied: tuple[str, ...] = (),
    unwritable: tuple[str, ...] = (),
    nested: bool = False,
) -> LandlockPlan:
    """``denied``: paths outside the writable roots that must stay unreadable.
    ``unwritable``: paths beneath a writable root where it grants no write (on an image,
    a shared bind of host directories above their roots: writable roots within it are
    listed in ``writable``); the directories above them get no new entries either.
    ``nested``: the policy allows nested user namespaces, whose maps are written in
    ``/proc/<pid>`` (only over the sandbox's own fresh /proc, never the host's)."""
    handled = handled_fs(abi)
    write = WRITE_TREE & handled
    device = DEVICE & handled
    why = "read and execute everywhere the mounts show"
    if denied:
        why += ", except the denied paths (existing or created later)"
    rules = [LandlockRule("/", READ, why, excluding=tuple(sorted(denied)))]
    for path in writable:
        below = tuple(sorted(u for u in unwritable if u.startswith(path.rstrip("/") + "/")))
        why = "writable root (with REFER)" + (f", except beneath {', '.join(below)}" if below else "")
        rules.append(LandlockRule(path, READ | write, why, excluding=below))
    for path in tmpdirs:
        rules.append(LandlockRule(path, READ | write, "private temporary files"))
    for path in devices:
        rules.append(LandlockRule(path, device, "device", is_dir=False))
    rules.append(LandlockRule("/dev/pts", device, "pseudo-terminals"))
    if nested:
        # A rule binds to an inode, and /proc/<pid> of a process not yet started has none:
        # the grant must sit on /proc itself. What else there takes a write is either a
        # read-only mount (mounts.PROC_READONLY) or checked by the kernel against the
        # writer's capabilities or its own processes (a nested namespace's capabilities
        # count in that namespace only).
        rules.append(
            LandlockRule(
                "/proc",
                (WRITE_FILE | TRUNCATE) & handled,
                "nested user namespaces: uid_map, gid_map and setgroups of the sandbox's processes",
            )
        )
    scoped = (SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL) if abi >= 6 else 0
    return LandlockPlan(abi=abi, handled=handled, scoped=scoped, rules=tuple(rules))
