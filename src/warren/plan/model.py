"""The plan as data: everything a sandbox launch will do, decided before it starts.

A ``Plan`` is the whole truth: the mount steps in order, the Landlock ruleset, the
seccomp filter, the identity, the environment, the working directory, the network
rules, what the host must prepare (directories to create, ancestor directories to
guard). Nothing is patched onto it afterwards; the executor in ``_core`` only
carries it out. It prints (``warren plan``) and compares in tests.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from ..net.allowlist import HostRule
from ..net.secrets import HttpRule, PlacedSecret
from .landlock import LandlockPlan, right_names
from .limits import LimitsPlan
from .seccomp import SeccompPlan

if TYPE_CHECKING:
    from ..policy import Policy


class MountKind(enum.Enum):
    ROOT_VIEW = "root_view"  # clone the host's / recursively, read-only and nosuid, as the new root
    BIND_RW = "bind_rw"  # clone ``source`` from the host, read-only below, writable on top
    MASK = "mask"  # read-only bind over every entry of ``target`` not named in ``keep`` (mode 0: hidden)
    TMPFS = "tmpfs"  # a fresh tmpfs (``readonly`` for hiding, ``mode`` for permissions)
    BIND_DEV = "bind_dev"  # bind the host device node ``source`` onto ``target``
    DEVPTS = "devpts"  # a new devpts instance
    SYMLINK = "symlink"  # ``target`` -> ``source`` (inside a fresh tmpfs)
    DIR = "dir"  # create directory ``target`` with ``mode`` (inside a fresh tmpfs)
    BIND_RO = "bind_ro"  # clone ``source`` from the host read-only onto ``target``
    DENY_FILE = "deny_file"  # bind an empty mode-000 file over a file (reads and writes: EACCES)
    PROC = "proc"  # a fresh procfs for the sandbox's pid namespace
    RO_SELF = "ro_self"  # re-bind ``target`` onto itself read-only (inside /proc)
    # Sandboxes on an image (plan.envroot):
    OVERLAY = "overlay"  # the root: ``layers`` (topmost first) under a tmpfs upper of ``size``
    DENY_PATH = "deny_path"  # ``target`` hidden as whatever it is when mounted (dir or file)
    # a file ``target`` holding ``source``, made in the sandbox's own layer only where its
    # directory exists and it does not (a setting the image's tools need in a sandbox)
    SEED = "seed"
    # a fresh tmpfs over ``target`` holding what the sandbox saw there, each entry bound
    # back as it was (links made again), and the empty directories ``keep`` as mount
    # points; read-only once made, with the mode of the directory it covers
    SHADOW = "shadow"
    # ``source`` as the sandbox sees it by then, with every mount beneath it (git
    # directories, denied files, read-only masks), bound again at ``target``
    MIRROR = "mirror"
    # review mode: an overlay at ``target`` whose lower is the host directory ``source``
    # (read-only) and whose upper and work directories are ``layers`` (host paths in
    # warren's state directory, opened before anything is mounted)
    REVIEW = "review"


# Cloned from the host before anything is overlaid (their sources may lie under /tmp,
# where the new root is staged).
PRECLONED = frozenset({MountKind.ROOT_VIEW, MountKind.BIND_RW, MountKind.BIND_RO})


@dataclass(frozen=True)
class MountOp:
    """One step of the mount plan, executed in order."""

    kind: MountKind
    target: str
    source: str | None = None
    why: str = ""
    keep: tuple[str, ...] = ()
    mode: int | None = None
    readonly: bool = False
    mkdir: bool = False  # create the mount point (it lies in a fresh tmpfs)
    size: int | None = None  # a tmpfs's size= in bytes
    # (dev, ino) the target must still be when the step runs (a mask for one file goes
    # only where that very file is; a sandbox of the same workspace may move things)
    ident: tuple[int, int] | None = None
    layers: tuple[str, ...] = ()  # OVERLAY: the image's layer directories, topmost first


@dataclass(frozen=True)
class NetPlan:
    mode: str  # "none" | "allow" | "open"
    hosts: tuple[str, ...] = ()  # the allowlist entries as written
    # --network ask: how long a connection to an unlisted host waits for an answer
    ask_timeout: float | None = None
    rules: tuple[HostRule, ...] = ()  # ... and parsed
    resolve: tuple[tuple[str, str], ...] = ()
    # --secret and --allow-http (net.secrets, plan.secrets): placeholders, never values
    secrets: tuple[PlacedSecret, ...] = ()
    http_rules: tuple[HttpRule, ...] = ()
    trust_bundle: str | None = None  # the host file the launch writes (mounted inside)
    bundle_target: str | None = None  # where the sandbox finds it

    # The proxy's port on the host's loopback in the degraded mode (no network namespace
    # of its own: not 3128, a free one chosen when planning); 0 in the full mode.
    proxy_port: int = 0

    @classmethod
    def of(cls, policy: Policy) -> NetPlan:
        """The policy's network mode and allowlist; what depends on the host too (the
        secrets, the proxy's port) the planner adds (``dataclasses.replace``)."""
        return cls(
            mode=policy.network,
            hosts=policy.allowed_hosts,
            ask_timeout=policy.ask_timeout,
            rules=policy.allowed_rules,
            resolve=tuple(sorted(policy.resolve.items())),
        )

    @property
    def intercepts(self) -> bool:
        return bool(self.secrets or self.http_rules)


@dataclass(frozen=True)
class GitDir:
    """A repository's git directory as a sandbox sees it (see ``server.gitstore``):
    at ``path`` the sandbox-side ``tree`` (warren's), with the host's own ``shared``
    subdirectories (objects, refs, ...) bound into it."""

    path: str
    tree: str
    shared: tuple[str, ...]


@dataclass(frozen=True)
class LinkWalk:
    """The hard-link walk of a large workspace, made after the sandbox started
    (``server.linkwalk``): ``LinkScanner.scan``'s arguments, and the writable roots whose
    files found get an inode of their own."""

    roots: tuple[str, ...]
    shared: tuple[str, ...]
    denied: tuple[str, ...]
    writable: tuple[str, ...]
    workspace: str


@dataclass(frozen=True)
class Plan:
    mounts: tuple[MountOp, ...]
    landlock: LandlockPlan | None
    seccomp: SeccompPlan
    uid: int
    gid: int
    env: dict[str, str]
    workspace: str
    cwd: str  # where a command starts unless it asks for another directory
    net: NetPlan
    cap_last_cap: int
    # the UTS namespace's name; None keeps the host's (tools name files after it:
    # coverage's parallel data, lock files, build caches)
    hostname: str | None = None
    create_dirs: tuple[str, ...] = ()  # made on the host before launch (preset caches)
    scratch: str | None = None  # TMPDIR made outside the workspace before launch, removed after
    scratch_base: str | None = None  # the caller's existing directory it is made beneath
    # The root of the git repository the workspace lies in, whose .git is outside the
    # workspace (read-only inside): for the hint when git cannot write it.
    repository: str | None = None
    guarded: tuple[str, ...] = ()  # directories above shared roots: metadata snapshotted
    git: tuple[GitDir, ...] = ()  # repositories' git directories: see server.gitstore
    git_files: tuple[str, ...] = ()  # ``.git`` files at the top of a writable root: read-only
    # (path, dev, ino): workspace names of files linked from outside, given an inode of
    # their own before launch (server.unshare)
    unshare: tuple[tuple[str, int, int], ...] = ()
    # ... or, for a large workspace none of whose denied files has a name elsewhere, the
    # walk that finds them made after launch, while PID 1 holds what could change a
    # file (``_core.broker.window``)
    link_walk: LinkWalk | None = None
    groups: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # shown by `warren plan` only (known limits that apply here)
    limits: LimitsPlan | None = None  # None: no limits (plans built by hand in tests)
    # On an image (plan.envroot): its name, the ids the caller is inside (root by
    # default), and whether PID 1's broker takes renames (lower directories' EXDEV).
    image: str | None = None
    image_id: str | None = None
    image_store: str | None = None  # the store it came from (leased while the sandbox runs)
    inner_uid: int | None = None
    inner_gid: int | None = None
    renames: bool = False
    host_workspace: str | None = None  # the host directory bound at ``workspace``
    # False: the degraded mode (``plan.degraded``), no namespaces and no mounts, and
    # ``not_held`` says (protection, what happens instead) for each one lost.
    namespaces: bool = True
    # Review mode: the layer directory (``upper`` and ``work`` in it) of the workspace's
    # overlay, in warren's state directory; made at launch (``server.review``).
    review: str | None = None
    not_held: tuple[tuple[str, str], ...] = ()

    @property
    def uid_map(self) -> str:
        inner = self.uid if self.inner_uid is None else self.inner_uid
        return f"{inner} {self.uid} 1"

    @property
    def gid_map(self) -> str:
        inner = self.gid if self.inner_gid is None else self.inner_gid
        return f"{inner} {self.gid} 1"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["mounts"] = [{**asdict(op), "kind": op.kind.value} for op in self.mounts]
        data["uid_map"], data["gid_map"] = self.uid_map, self.gid_map
        data["seccomp"] = {
            "machine": self.seccomp.machine,
            "denied": list(self.seccomp.denied),
            "deny_new_userns": self.seccomp.deny_new_userns,
            "reviewed_up_to": self.seccomp.reviewed_up_to,
            "instructions": len(self.seccomp.program),
        }
        if self.landlock is not None:
            data["landlock"] = {
                "abi": self.landlock.abi,
                "handled": right_names(self.landlock.handled),
                "scoped": self.landlock.scoped,
                "rules": [
                    {"path": r.path, "access": right_names(r.access), "why": r.why}
                    for r in self.landlock.rules
                ],
            }
        data["net"] = {
            "mode": self.net.mode,
            "hosts": list(self.net.hosts),
            "ask_timeout": self.net.ask_timeout,
            "resolve": dict(self.net.resolve),
            "secrets": [
                {"name": s.name, "hosts": list(s.hosts), "from": s.source, "placeholder": s.placeholder}
                for s in self.net.secrets
            ],
            "http_rules": [r.text for r in self.net.http_rules],
        }
        data["groups"] = [{"mount_at": a, "roots": list(r)} for a, r in self.groups]
        data["not_held"] = [{"protection": p, "instead": i} for p, i in self.not_held]
        return data
