"""The seccomp filter: which system calls a sandboxed process may not make.

Owns the deny list and its compilation to classic BPF as plain (code, jt, jf, k)
tuples. Pure: installing the program is the launcher's job (``_core.harden``).
The filter is a deny list on top of what namespaces, dropped capabilities and
Landlock already forbid; it closes the kernel surfaces those do not cover. It is
closed by construction towards the future: every number above ``REVIEWED_UP_TO`` (the
highest call someone read and decided about here) and every unallocated hole below
it gets ENOSYS, so the next kernel's calls stay shut until they are reviewed.
"""

from __future__ import annotations

import dataclasses
import errno
import os
from dataclasses import dataclass
from functools import lru_cache

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}

# Only the calls denied here need numbers; anything else is allowed.
_ARCH_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "add_key": 248,
        "request_key": 249,
        "keyctl": 250,
        "bpf": 321,
        "perf_event_open": 298,
        "userfaultfd": 323,
        "kexec_load": 246,
        "kexec_file_load": 320,
        "mount": 165,
        "umount2": 166,
        "pivot_root": 155,
        "setns": 308,
        "unshare": 272,
        "clone": 56,
        "ioctl": 16,
        "open": 2,
        "creat": 85,
        "chmod": 90,
        "fchmod": 91,
        "mkdir": 83,
        "mknod": 133,
        "openat": 257,
        "mkdirat": 258,
        "mknodat": 259,
        "fchmodat": 268,
        "acct": 163,
        "swapon": 167,
        "swapoff": 168,
        "reboot": 169,
        "init_module": 175,
        "finit_module": 313,
        "delete_module": 176,
        "syslog": 103,
        "name_to_handle_at": 303,
        "open_by_handle_at": 304,
        "lookup_dcookie": 212,
        "quotactl": 179,
        "socket": 41,
    },
    "aarch64": {
        "add_key": 217,
        "request_key": 218,
        "keyctl": 219,
        "bpf": 280,
        "perf_event_open": 241,
        "userfaultfd": 282,
        "kexec_load": 104,
        "kexec_file_load": 294,
        "mount": 40,
        "umount2": 39,
        "pivot_root": 41,
        "setns": 268,
        "unshare": 97,
        "clone": 220,
        "ioctl": 29,
        "openat": 56,
        "mkdirat": 34,
        "mknodat": 33,
        "fchmod": 52,
        "fchmodat": 53,
        "acct": 89,
        "swapon": 224,
        "swapoff": 225,
        "reboot": 142,
        "init_module": 105,
        "finit_module": 273,
        "delete_module": 106,
        "syslog": 116,
        "name_to_handle_at": 264,
        "open_by_handle_at": 265,
        "lookup_dcookie": 18,
        "quotactl": 60,
        "socket": 198,
    },
}
# Calls added since Linux 5.1 have one number on every architecture.
_UNIFIED_NR = {
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "openat2": 437,
    "mount_setattr": 442,
    "quotactl_fd": 443,
    "fchmodat2": 452,
    "setxattrat": 463,
    "getxattrat": 464,
    "listxattrat": 465,
    "removexattrat": 466,
    "open_tree_attr": 467,
    "file_getattr": 468,
    "file_setattr": 469,
}
_NR = {machine: {**nrs, **_UNIFIED_NR} for machine, nrs in _ARCH_NR.items()}

# Denied outright, with why (shown by `warren plan`).
DENIED: dict[str, str] = {
    "add_key": "kernel keyrings are shared state outside the sandbox",
    "request_key": "kernel keyrings are shared state outside the sandbox",
    "keyctl": "kernel keyrings are shared state outside the sandbox",
    "bpf": "eBPF is kernel attack surface",
    "perf_event_open": "perf events leak host activity",
    "userfaultfd": "a classic exploit primitive",
    "kexec_load": "replaces the kernel",
    "kexec_file_load": "replaces the kernel",
    "io_uring_setup": "io_uring bypasses seccomp and is kernel attack surface",
    "io_uring_enter": "io_uring bypasses seccomp and is kernel attack surface",
    "io_uring_register": "io_uring bypasses seccomp and is kernel attack surface",
    "mount": "the mount plan is fixed at launch",
    "umount2": "the mount plan is fixed at launch (unmounting would reveal masked paths)",
    "pivot_root": "the mount plan is fixed at launch",
    "open_tree": "the mount plan is fixed at launch",
    "move_mount": "the mount plan is fixed at launch",
    "fsopen": "the mount plan is fixed at launch",
    "fsconfig": "the mount plan is fixed at launch",
    "fsmount": "the mount plan is fixed at launch",
    "fspick": "the mount plan is fixed at launch",
    "mount_setattr": "the mount plan is fixed at launch",
    "open_tree_attr": "the mount plan is fixed at launch",
    "setns": "no joining other namespaces",
    "acct": "host administration",
    "swapon": "host administration",
    "swapoff": "host administration",
    "reboot": "host administration",
    "init_module": "loads kernel code",
    "finit_module": "loads kernel code",
    "delete_module": "unloads kernel code",
    "syslog": "the kernel log leaks host activity",
    "name_to_handle_at": "file handles can bypass path-based rules",
    "open_by_handle_at": "file handles can bypass path-based rules",
    "lookup_dcookie": "kernel profiling interface",
    "quotactl": "host administration",
    "quotactl_fd": "host administration",
}

# The highest system call number reviewed (Linux 6.18: file_setattr). Each call up to
# it is allowed, denied in ``DENIED``, refused in ``UNBROKERED``, judged by the broker
# (``BROKERED``) or checked below; everything above gets ENOSYS, as from an older
# kernel, so libc and tools fall back. To raise it: read each new call's man page and
# kernel source, place it in one of those tables, then move this number.
REVIEWED_UP_TO = 469
# Numbers below the cap that no call has (a later kernel will not fill them: calls
# added since 5.1 are numbered from 424 on every architecture); refused the same way.
UNALLOCATED: dict[str, tuple[tuple[int, int], ...]] = {
    "x86_64": ((335, 423),),
    "aarch64": ((244, 259), (295, 423)),
}

# Refused with ENOSYS, so that libc and tools take the older call the broker judges
# (or that they already use): a call that writes metadata by a path or fd is either
# brokered or refused here, never left to the kernel, which would not ask Landlock.
UNBROKERED: dict[str, str] = {
    "setxattrat": "its xattr writes (ACLs among them) are not brokered; tools use setxattr, which is",
    "removexattrat": "its xattr removals are not brokered; tools use removexattr, which is",
    "file_setattr": "inode flags and project ids by path are not brokered; tools use the ioctl",
}

CLONE_NEWUSER = 0x10000000
SETID_BITS = 0o6000  # S_ISUID | S_ISGID
CREATING = 0o100 | 0o20000000  # O_CREAT | __O_TMPFILE
# (syscall, argument holding the mode, argument holding open flags or None): a mode
# with a setuid or setgid bit is refused, so nothing a sandbox makes can carry one.
MODE_ARGS = (
    ("chmod", 1, None),
    ("fchmod", 1, None),
    ("fchmodat", 2, None),
    ("fchmodat2", 2, None),
    ("mkdir", 1, None),
    ("mkdirat", 2, None),
    ("mknod", 1, None),
    ("mknodat", 2, None),
    ("creat", 1, None),
    ("open", 2, 1),
    ("openat", 3, 2),
)
# The socket families a sandbox with no network namespace keeps under network none:
# unix sockets (the broker judges their connects) and netlink (libc asks it which
# addresses exist); AF_INET, AF_INET6, AF_PACKET and the rest would reach the host's.
LOCAL_FAMILIES = (1, 16)  # AF_UNIX, AF_NETLINK
# ... and under network allow: IP sockets of type SOCK_STREAM only. Its TCP binds are
# Landlock's to refuse and its listen()s the broker's; a UDP (or ICMP) socket could be
# bound to every address of the host, which nothing else sees.
IP_FAMILIES = (2, 10)  # AF_INET, AF_INET6
SOCK_STREAM = 1
SOCK_TYPE_MASK = 0xF  # the rest of socket()'s type is SOCK_NONBLOCK and SOCK_CLOEXEC
TIOCSTI = 0x5412
TIOCLINUX = 0x541C

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_JSET_K = 0x45
_RET_K = 0x06
_AND_K = 0x54

RET_KILL_PROCESS = 0x80000000
RET_ALLOW = 0x7FFF0000


def _ret_errno(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


_OFF_NR = 0
_OFF_ARCH = 4


def _arg_low(i: int) -> int:
    # Low 32 bits of argument i (little-endian); the kernel truncates these args to int.
    return 16 + 8 * i


Instruction = tuple[int, int, int, int]


@dataclass(frozen=True)
class SeccompPlan:
    machine: str
    denied: tuple[str, ...]
    deny_new_userns: bool
    program: tuple[Instruction, ...]
    local_sockets_only: bool = False  # the degraded mode's network none
    reviewed_up_to: int = REVIEWED_UP_TO
    ip_streams_only: bool = False  # the degraded mode's network allow

    def summary(self) -> list[str]:
        holes = ", ".join(f"{lo}-{hi}" for lo, hi in UNALLOCATED[self.machine])
        lines = [
            f"calls above {self.reviewed_up_to} (unreviewed) -> ENOSYS: a newer kernel's calls stay shut "
            "until reviewed; libc falls back",
            f"unallocated numbers {holes} -> ENOSYS",
        ]
        lines += [f"deny {name}: {DENIED[name]}" for name in self.denied]
        if self.deny_new_userns:
            lines.append("deny clone/unshare with CLONE_NEWUSER: no nested user namespaces")
            lines.append("clone3 -> ENOSYS so libc falls back to clone, whose flags are checked")
        if self.local_sockets_only:
            lines.append(
                "deny socket() but AF_UNIX and AF_NETLINK (EACCES): no IP socket at all (network none)"
            )
        lines.extend(f"{name} -> ENOSYS: {why}" for name, why in UNBROKERED.items())
        if self.ip_streams_only:
            lines.append(
                "deny socket() of AF_INET/AF_INET6 but SOCK_STREAM (EACCES): no UDP socket to bind "
                "(network allow)"
            )
        lines.append("deny ioctl TIOCSTI/TIOCLINUX: no typing into the caller's terminal")
        lines.append(
            "deny setuid/setgid modes in chmod, fchmod(at), open(at) with O_CREAT, mkdir(at), mknod(at), "
            "creat; openat2 -> ENOSYS (its mode is out of reach), so libc uses openat"
        )
        return lines


def build(
    machine: str | None = None,
    allow_nested: bool = False,
    local_sockets_only: bool = False,
    reviewed_up_to: int = REVIEWED_UP_TO,
    ip_streams_only: bool = False,
) -> SeccompPlan:
    """``local_sockets_only``: refuse every socket family but ``LOCAL_FAMILIES`` (a
    sandbox that shares the host's network namespace, under network none);
    ``ip_streams_only``: refuse IP sockets but stream ones (the same, under allow).
    ``reviewed_up_to``: the cap; only a test lowers it, to see a real call refused."""
    plan = _build(machine or os.uname().machine, allow_nested, local_sockets_only, reviewed_up_to)
    return _ip_streams_only(plan) if ip_streams_only else plan


def _ip_streams_only(plan: SeccompPlan) -> SeccompPlan:
    """``plan`` with socket() of an IP family refused unless its type is SOCK_STREAM,
    placed before the program's final allow."""
    nr = _NR[plan.machine]
    inet, inet6 = IP_FAMILIES
    block: list[Instruction] = [
        (_JEQ_K, 0, 8, nr["socket"]),
        (_LD_W_ABS, 0, 0, _arg_low(0)),
        (_JEQ_K, 1, 0, inet),
        (_JEQ_K, 0, 4, inet6),
        (_LD_W_ABS, 0, 0, _arg_low(1)),
        (_AND_K, 0, 0, SOCK_TYPE_MASK),
        (_JEQ_K, 1, 0, SOCK_STREAM),
        (_RET_K, 0, 0, _ret_errno(errno.EACCES)),
        (_RET_K, 0, 0, RET_ALLOW),
    ]
    program = (*plan.program[:-1], *block, plan.program[-1])
    return dataclasses.replace(plan, program=program, ip_streams_only=True)


@lru_cache(maxsize=8)
def _build(machine: str, allow_nested: bool, local_sockets_only: bool, reviewed_up_to: int) -> SeccompPlan:
    nr = _NR[machine]
    eperm = _ret_errno(errno.EPERM)
    enosys = _ret_errno(errno.ENOSYS)
    prog: list[Instruction] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, AUDIT_ARCH[machine]),
        (_RET_K, 0, 0, RET_KILL_PROCESS),
        (_LD_W_ABS, 0, 0, _OFF_NR),
    ]
    if machine == "x86_64":
        # x32 ABI syscalls carry bit 30; nothing a developer tool needs uses them.
        prog += [(_JGE_K, 0, 1, 0x40000000), (_RET_K, 0, 0, eperm)]
    prog += [(_JGE_K, 0, 1, reviewed_up_to + 1), (_RET_K, 0, 0, enosys)]
    for lo, hi in UNALLOCATED[machine]:
        prog += [(_JGE_K, 0, 2, lo), (_JGE_K, 1, 0, hi + 1), (_RET_K, 0, 0, enosys)]
    denied = tuple(DENIED)
    for name in denied:
        prog += [(_JEQ_K, 0, 1, nr[name]), (_RET_K, 0, 0, eperm)]

    # ioctl(fd, TIOCSTI|TIOCLINUX): compare the low word of arg 1.
    prog += [
        (_JEQ_K, 0, 5, nr["ioctl"]),
        (_LD_W_ABS, 0, 0, _arg_low(1)),
        (_JEQ_K, 2, 0, TIOCSTI),
        (_JEQ_K, 1, 0, TIOCLINUX),
        (_RET_K, 0, 0, RET_ALLOW),
        (_RET_K, 0, 0, eperm),
    ]
    if not allow_nested:
        prog += [
            (_JEQ_K, 0, 1, nr["clone3"]),
            (_RET_K, 0, 0, _ret_errno(errno.ENOSYS)),
        ]
        for name in ("clone", "unshare"):
            # clone's flags are arg 0 on x86_64 and aarch64; unshare's too.
            prog += [
                (_JEQ_K, 0, 4, nr[name]),
                (_LD_W_ABS, 0, 0, _arg_low(0)),
                (_JSET_K, 0, 1, CLONE_NEWUSER),
                (_RET_K, 0, 0, eperm),
                (_RET_K, 0, 0, RET_ALLOW),
            ]
    for name in ("openat2", *UNBROKERED):
        prog += [(_JEQ_K, 0, 1, nr[name]), (_RET_K, 0, 0, enosys)]
    for name, mode_arg, flags_arg in MODE_ARGS:
        if name not in nr:
            continue  # not on this architecture (aarch64 has only the *at calls)
        block: list[Instruction] = []
        if flags_arg is not None:
            # Without O_CREAT/O_TMPFILE the mode is ignored: allow.
            block += [(_LD_W_ABS, 0, 0, _arg_low(flags_arg)), (_JSET_K, 0, 3, CREATING)]
        block += [
            (_LD_W_ABS, 0, 0, _arg_low(mode_arg)),
            (_JSET_K, 0, 1, SETID_BITS),
            (_RET_K, 0, 0, eperm),
            (_RET_K, 0, 0, RET_ALLOW),
        ]
        prog += [(_JEQ_K, 0, len(block), nr[name]), *block]
    if local_sockets_only:
        unix, netlink = LOCAL_FAMILIES
        prog += [
            (_JEQ_K, 0, 5, nr["socket"]),
            (_LD_W_ABS, 0, 0, _arg_low(0)),
            (_JEQ_K, 2, 0, unix),
            (_JEQ_K, 1, 0, netlink),
            (_RET_K, 0, 0, _ret_errno(errno.EACCES)),
            (_RET_K, 0, 0, RET_ALLOW),
        ]
    prog.append((_RET_K, 0, 0, RET_ALLOW))
    return SeccompPlan(machine, denied, not allow_nested, tuple(prog), local_sockets_only, reviewed_up_to)


RET_USER_NOTIF = 0x7FC00000

# The calls PID 1's broker (_core.broker) answers for a sandbox, by architecture.
BROKERED: dict[str, dict[str, int]] = {
    "x86_64": {
        "connect": 42,
        "sendto": 44,
        "sendmsg": 46,
        "sendmmsg": 307,
        "chmod": 90,
        "fchmod": 91,
        "fchmodat": 268,
        "fchmodat2": 452,
        "utimensat": 280,
        "utime": 132,
        "utimes": 235,
        "futimesat": 261,
        "setxattr": 188,
        "lsetxattr": 189,
        "fsetxattr": 190,
        "removexattr": 197,
        "lremovexattr": 198,
        "fremovexattr": 199,
        "rename": 82,
        "renameat": 264,
        "renameat2": 316,
        "link": 86,
        "linkat": 265,
        "prlimit64": 302,
        "setpriority": 141,
        "ioprio_set": 251,
        "sched_setaffinity": 203,
        "sched_setscheduler": 144,
        "sched_setparam": 142,
        "sched_setattr": 314,
        "listen": 50,
    },
    "aarch64": {
        "connect": 203,
        "sendto": 206,
        "sendmsg": 211,
        "sendmmsg": 269,
        "fchmod": 52,
        "fchmodat": 53,
        "fchmodat2": 452,
        "utimensat": 88,
        "setxattr": 5,
        "lsetxattr": 6,
        "fsetxattr": 7,
        "removexattr": 14,
        "lremovexattr": 15,
        "fremovexattr": 16,
        "renameat": 38,
        "renameat2": 276,
        "linkat": 37,
        "prlimit64": 261,
        "setpriority": 140,
        "ioprio_set": 30,
        "sched_setaffinity": 122,
        "sched_setscheduler": 119,
        "sched_setparam": 118,
        "sched_setattr": 274,
        "listen": 201,
    },
}
SOCKETS = ("connect", "sendto", "sendmsg", "sendmmsg")
# On an image only (plan.envroot): a lower directory's rename is made a move of its tree.
RENAMES = ("rename", "renameat", "renameat2")
# Where repositories' git data is bound in (plan.git): a hard link out of it is made on
# the mount it lies on (a local clone hardlinks its objects, as on the host). Only
# link(2), which git's local clone calls: linkat(2), which uv, cargo, cp -l and ln
# call, thousands of times in an install, stays the kernel's own (unbrokered). On
# aarch64, which has no link(2), linkat is brokered instead (``_brokered``).
LINKS = ("link", "linkat")
METADATA = (
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "utimensat",
    "utime",
    "utimes",
    "futimesat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
)

# Calls that change another process (limits, priority, scheduling): only with a pid
# (pid 0, the caller, passes at once, as does prlimit64 without a new limit); the
# broker lets the caller's own ids through (``_core.broker.processes``).
PROCESSES = (
    "prlimit64",
    "setpriority",
    "ioprio_set",
    "sched_setaffinity",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
)
# (call, argument that must equal ``which`` for a single process, that value): the
# pid of these is their next argument.
_WHICH = {"setpriority": (0, 0), "ioprio_set": (0, 1)}  # PRIO_PROCESS, IOPRIO_WHO_PROCESS

# The degraded mode under network none or allow (the host's network namespace): listen()
# on an IP socket never bound would bind it to every address of the host (autobind, which
# Landlock's bind rule does not see); the broker refuses it (``_core.broker.sockets``).
LISTENERS = ("listen",)


GROUPS = {
    "sockets": SOCKETS,
    "metadata": METADATA,
    "renames": RENAMES,
    "links": LINKS,
    "processes": PROCESSES,
    "listeners": LISTENERS,
}


# While a sandbox's hard-link walk runs in the background (``server.linkwalk``), the
# commands started meanwhile also send PID 1 every call that could change a file's
# contents or metadata or give an existing file another name; PID 1 holds each until
# the walk is done (``_core.broker.window``). Numbers beyond ``BROKERED``'s:
WINDOW_NR: dict[str, dict[str, int]] = {
    "x86_64": {
        "open": 2,
        "openat": 257,
        "creat": 85,
        "truncate": 76,
        "chown": 92,
        "fchown": 93,
        "lchown": 94,
        "fchownat": 260,
        "ioctl": 16,
    },
    "aarch64": {"openat": 56, "truncate": 45, "fchown": 55, "fchownat": 54, "ioctl": 29},
}
# open(2)'s flags are its argument 1, openat(2)'s its argument 2: held with any of these
# (openat2 needs none: the deny filter refuses it, ENOSYS).
WRITING = 0o1 | 0o2 | 0o100 | 0o1000  # O_WRONLY | O_RDWR | O_CREAT | O_TRUNC
_OPEN_FLAGS = {"open": 1, "openat": 2}
# ioctl types that set an inode's flags, attributes or verity from a descriptor opened
# only for reading: 'f' (FS_IOC_SETFLAGS, FS_IOC_ENABLE_VERITY), 'X' (FS_IOC_FSSETXATTR),
# 'v' (FS_IOC_SETVERSION), 0x94 (btrfs, FICLONE). A terminal's ioctls are never held.
FS_IOCTL_TYPES = (0x66, 0x58, 0x76, 0x94)
WINDOW = (
    *WINDOW_NR["x86_64"],
    *RENAMES,
    *LINKS,
    *METADATA,
)


def window_calls(machine: str | None = None) -> dict[str, int]:
    """The calls a command started during the walk sends PID 1, by name."""
    machine = machine or os.uname().machine
    nr = {**BROKERED[machine], **WINDOW_NR[machine]}
    return {name: nr[name] for name in WINDOW if name in nr}


def _window_block(name: str, nr: int) -> list[Instruction]:
    if name in _OPEN_FLAGS:
        return [
            (_JEQ_K, 0, 4, nr),
            (_LD_W_ABS, 0, 0, _arg_low(_OPEN_FLAGS[name])),
            (_JSET_K, 0, 1, WRITING),
            (_RET_K, 0, 0, RET_USER_NOTIF),
            (_RET_K, 0, 0, RET_ALLOW),
        ]
    if name == "ioctl":
        n = len(FS_IOCTL_TYPES)
        block: list[Instruction] = [(_LD_W_ABS, 0, 0, _arg_low(1)), (_AND_K, 0, 0, 0xFF00)]
        for i, kind in enumerate(FS_IOCTL_TYPES):
            block.append((_JEQ_K, n - i, 0, kind << 8))
        block += [(_RET_K, 0, 0, RET_ALLOW), (_RET_K, 0, 0, RET_USER_NOTIF)]
        return [(_JEQ_K, 0, len(block), nr), *block]
    return [(_JEQ_K, 0, 1, nr), (_RET_K, 0, 0, RET_USER_NOTIF)]


def _brokered(name: str, nr: dict[str, int]) -> bool:
    return name in nr and not (name == "linkat" and "link" in nr)


@lru_cache(maxsize=8)
def notify_program(groups: tuple[str, ...], machine: str | None = None) -> tuple[Instruction, ...]:
    """A second filter: the brokered calls of ``groups`` ("sockets",
    "metadata", "renames", "links", "processes") go to PID 1 (seccomp user notification); everything else
    passes on to the deny filter. ``sendto`` without an address (a connected socket) is not sent, nor a
    call of "processes" that names the caller as pid 0."""
    machine = machine or os.uname().machine
    nr = BROKERED[machine]
    names = [n for g, members in GROUPS.items() if g in groups for n in members if _brokered(n, nr)]
    window: list[Instruction] = []
    if "window" in groups:
        # "window": the calls of ``window_calls`` too, ahead of the groups' own blocks.
        held = window_calls(machine)
        names = [n for n in names if n not in held]
        for name, number in held.items():
            window += _window_block(name, number)
    prog: list[Instruction] = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, AUDIT_ARCH[machine]),
        (_RET_K, 0, 0, RET_ALLOW),  # the deny filter kills a foreign architecture
        (_LD_W_ABS, 0, 0, _OFF_NR),
        *window,
    ]
    for name in names:
        if name == "sendto":
            # sendto(fd, buf, len, flags, dest_addr, addrlen): only with an address.
            prog += [
                (_JEQ_K, 0, 6, nr[name]),
                (_LD_W_ABS, 0, 0, _arg_low(4)),
                (_JEQ_K, 0, 2, 0),
                (_LD_W_ABS, 0, 0, _arg_low(4) + 4),
                (_JEQ_K, 1, 0, 0),
                (_RET_K, 0, 0, RET_USER_NOTIF),
                (_RET_K, 0, 0, RET_ALLOW),
            ]
        elif name in PROCESSES:
            block = _process_block(name)
            prog += [(_JEQ_K, 0, len(block), nr[name]), *block]
        else:
            prog += [(_JEQ_K, 0, 1, nr[name]), (_RET_K, 0, 0, RET_USER_NOTIF)]
    prog.append((_RET_K, 0, 0, RET_ALLOW))
    return tuple(prog)


def _process_block(name: str) -> list[Instruction]:
    """Allow the call on pid 0 (the caller), notify it otherwise."""
    if name in _WHICH:
        which_arg, which = _WHICH[name]
        return [
            (_LD_W_ABS, 0, 0, _arg_low(which_arg)),
            (_JEQ_K, 0, 3, which),  # a group or a user: the broker refuses
            (_LD_W_ABS, 0, 0, _arg_low(which_arg + 1)),
            (_JEQ_K, 0, 1, 0),
            (_RET_K, 0, 0, RET_ALLOW),
            (_RET_K, 0, 0, RET_USER_NOTIF),
        ]
    block: list[Instruction] = []
    if name == "prlimit64":
        # prlimit64(pid, resource, new_limit, old_limit): without a new limit, a read.
        block += [
            (_LD_W_ABS, 0, 0, _arg_low(2)),
            (_JEQ_K, 0, 3, 0),
            (_LD_W_ABS, 0, 0, _arg_low(2) + 4),
            (_JEQ_K, 0, 1, 0),
            (_RET_K, 0, 0, RET_ALLOW),
        ]
    return [
        *block,
        (_LD_W_ABS, 0, 0, _arg_low(0)),
        (_JEQ_K, 0, 1, 0),
        (_RET_K, 0, 0, RET_ALLOW),
        (_RET_K, 0, 0, RET_USER_NOTIF),
    ]
