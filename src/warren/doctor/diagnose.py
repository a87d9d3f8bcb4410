"""Diagnosis: evidence + probe results -> the cause of every failure, with a fix. Pure.

Causes are decided from measured facts, never from the error alone: EXDEV means four
different things depending on whether source and destination share a mount id (no:
separate bind mounts, or different filesystems when the superblocks differ too; yes:
Landlock without REFER for files, overlayfs for directories). Each rule names the
evidence it used, so a reader can check it. No I/O here.
"""

from __future__ import annotations

import errno as E
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from .evidence import PASSTHROUGH_FS, Evidence, Location
from .limits import LOCATION as LIMITS
from .probes import ProbeResult

UV_STOPGAP = (
    "stopgap for uv only: UV_LINK_MODE=copy (no hardlinks: every install copies each file, "
    "slower and a full copy of every package per venv); pip, cargo and git have no such switch"
)

# id -> (title, fix). Ids are part of the JSON schema: never rename one.
CAUSES: dict[str, tuple[str, str]] = {
    "landlock_no_refer": (
        "Landlock domain without REFER",
        "grant LANDLOCK_ACCESS_FS_REFER (Landlock ABI >= 2, kernel >= 5.19) on every writable root, "
        "in every stacked ruleset: an ABI 1 ruleset can never allow a rename or link across "
        "directories. `mv` hides this by copying, so it proves nothing; " + UV_STOPGAP,
    ),
    "separate_bind_mounts": (
        "separate bind mounts of one filesystem",
        "expose cache and workspace through ONE mount (bind their common ancestor once and confine "
        "writes with Landlock, as warren does), or put the cache on the workspace's mount; " + UV_STOPGAP,
    ),
    "cross_device": (
        "genuinely different filesystems",
        "nothing is broken: the host behaves the same. To get hardlinks, put the cache on the "
        "workspace's filesystem (e.g. UV_CACHE_DIR=<dir on it>); UV_LINK_MODE=copy silences uv's "
        "fallback warning (installs copy every file)",
    ),
    "overlay_dir_limit": (
        "overlayfs cannot move this directory",
        "mount the overlay with redirect_dir=on (needs privilege), and in a user namespace with "
        "userxattr (kernel >= 5.11) so it can mark moved directories opaque; or create the tree in "
        "a directory that is not from a lower (image) layer",
    ),
    "uid_mapping": (
        "user-id mapping",
        "map the sandbox user to the uid that owns the files (one user namespace mapping the "
        "caller's own uid/gid); for virtiofs/9p/FUSE, make the daemon map credentials for the "
        "caller's uid instead of assuming uid 1000",
    ),
    "read_only": (
        "read-only mount",
        "mount it read-write, grant it to the sandbox as writable (warren: --preset NAME or --write "
        "DIR), or point the tool at a writable cache (UV_CACHE_DIR, PIP_CACHE_DIR, "
        "npm_config_cache, CARGO_HOME)",
    ),
    "not_writable": (
        "not writable for this process",
        "fix ownership or mode (chown/chmod to this uid), or grant the path to the sandbox as "
        "writable (warren: --preset NAME or --write DIR), or point the tool at a writable cache",
    ),
    "deleted_cwd": (
        "the working directory was deleted",
        "cd to an existing directory: the directory was removed or replaced while this process was "
        "in it; re-create the workspace, then start commands there",
    ),
    "seccomp_denied": (
        "seccomp filter refuses the system call",
        "allow this system call in the seccomp filter (a sandbox should deny only what it must)",
    ),
    "fs_unsupported": (
        "the filesystem does not support it",
        "use a workspace or cache on a local filesystem (ext4, xfs, btrfs, tmpfs); on FUSE, "
        "virtiofs or 9p, check the daemon's options for this feature",
    ),
    "missing_dir": (
        "the directory does not exist",
        "create it, or point the variable that names it (TMPDIR, UV_CACHE_DIR, ...) at an existing "
        "writable directory",
    ),
    "no_space": ("no space or quota left", "free space or raise the quota on that filesystem"),
    # Resource limits: what is missing, and how to get a whole-sandbox limit instead of the
    # fallback each row names. warren prefers cgroup v1 controllers it can write, then a
    # delegated cgroup2 group (limits by the controllers it offers, pause, kill).
    "cgroup_absent": (
        "no such cgroup hierarchy here",
        "whole-sandbox limits need writable cgroup v1 pids, memory and cpu hierarchies, or a delegated "
        "cgroup2 group offering those controllers; until a host offers them, warren uses the fallback "
        "each row names",
    ),
    "cgroup_not_writable": (
        "this user cannot make a cgroup there",
        "for whole-sandbox limits run warren as root, or have an administrator delegate a subtree to "
        "this user: in cgroup v1, chown the caller's own cgroup in each of pids, memory, cpu and "
        "freezer to it (warren makes sandboxes' cgroups beneath it); or in cgroup2, start warren in a "
        "group delegated to this user (systemd: Delegate=yes, e.g. systemd-run --user --scope -p "
        "Delegate=yes) that offers memory, pids and cpu. Until then warren uses the fallback each row names",
    ),
    "no_user_namespace": (
        "this caller cannot create a user namespace",
        "enable unprivileged user namespaces (sysctl user.max_user_namespaces > 0; Debian: "
        "kernel.unprivileged_userns_clone=1; Ubuntu: kernel.apparmor_restrict_unprivileged_userns=0); "
        "inside another sandbox its policy refusing one is expected",
    ),
    "nproc_not_per_userns": (
        "RLIMIT_NPROC is counted per user, not per user namespace",
        "use a kernel >= 5.14 (it counts RLIMIT_NPROC per user namespace), or give this user a cgroup v1 "
        "pids hierarchy it can write; otherwise a sandbox's pids limit also counts the user's processes "
        "outside it",
    ),
    "no_freezer": (
        "no freezer this user can write",
        "for an atomic pause run warren as root (cgroup v1 freezer) or in a cgroup2 subtree delegated to "
        "this user (systemd user session); signals work, but stop the processes one by one",
    ),
    "unknown": (
        "no known cause matched",
        "run with --json and report the output: it holds every piece of evidence used",
    ),
}


@dataclass(frozen=True)
class Cause:
    id: str
    title: str
    explanation: str  # the evidence that led here, in one or two sentences
    fix: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _cause(cause_id: str, explanation: str, fix: str | None = None) -> Cause:
    title, default_fix = CAUSES[cause_id]
    return Cause(cause_id, title, explanation, fix or default_fix)


def _mnt(loc: Location | None) -> str:
    if loc is None or loc.mount_id is None:
        return "an unknown mount"
    return f"mount {loc.mount_id} ({loc.fstype} at {loc.mount_point}, dev {loc.dev}, root {loc.mount_root})"


def _errname(err: int | None) -> str:
    return "no errno" if err is None else E.errorcode.get(err, str(err))


def refer_blocked(evidence: Evidence, results: Sequence[ProbeResult]) -> bool:
    """The Landlock REFER signature: a file rename or link across directories fails
    with EXDEV although source and destination are on one mount."""
    for r in results:
        if r.status == "fail" and r.errno == E.EXDEV and r.kind == "file":
            locs = [evidence.location(role) for role in r.roles]
            ids = {loc.mount_id for loc in locs if loc is not None}
            if len(ids) == 1 and None not in ids:
                return True
    return False


def _passed(results: Sequence[ProbeResult], probe_id: str) -> bool | None:
    seen = [r.status == "pass" for r in results if r.id == probe_id]
    return None if not seen else all(seen)


_CROSS_DIR_FILE_PROBES = ("rename_across_dirs", "hardlink_across_dirs")


def _passed_in(results: Sequence[ProbeResult], location: str, probe_ids: Sequence[str]) -> bool:
    return any(r.status == "pass" and r.location == location and r.id in probe_ids for r in results)


def _exdev(r: ProbeResult, ev: Evidence, results: Sequence[ProbeResult]) -> Cause:
    src = ev.location(r.src or r.location)
    dst = ev.location(r.dst or r.location)
    what = f"{r.operation} of a {r.kind or 'file'}"
    if src is not None and dst is not None and src.mount_id != dst.mount_id:
        if src.dev is not None and src.dev == dst.dev:
            return _cause(
                "separate_bind_mounts",
                f"{what} from {src.role} to {dst.role} got EXDEV: they are two different mounts "
                f"({src.mount_id} and {dst.mount_id}) of the same filesystem (dev {src.dev}, "
                f"{src.fstype}); link() and rename() never cross a mount, even within one disk.",
            )
        return _cause(
            "cross_device",
            f"{what} from {src.role} to {dst.role} got EXDEV: they are on different filesystems "
            f"({_mnt(src)} vs {_mnt(dst)}).",
        )
    loc = src or dst
    abi = ev.process.landlock_abi
    same_dir = _passed(results, "rename_same_dir")
    within = f"source and destination are both on {_mnt(loc)}"
    if r.kind == "dir" and loc is not None and loc.fstype == "overlay" and not refer_blocked(ev, results):
        opts = loc.super_options
        xattr = "userxattr" if "userxattr" in opts else "no userxattr"
        return _cause(
            "overlay_dir_limit",
            f"{what} got EXDEV on overlayfs ({within}; options: {opts or 'none'}), while files move "
            f"across directories fine. Overlay refuses to move a directory from a lower layer without "
            f"redirect_dir, and to move a new directory into a lower-layer directory without xattr "
            f"support to mark it opaque ({xattr}"
            f"{', in a user namespace' if ev.process.user_namespace else ''}).",
        )
    if r.kind == "file" and r.src is None and _passed_in(results, r.location, _CROSS_DIR_FILE_PROBES):
        return _cause(
            "unknown",
            f"{what} got EXDEV on {_mnt(loc)}, yet plain renames and links across directories work "
            f"in the same place, so neither Landlock nor the mount layout explains it.",
        )
    if abi > 0 or r.kind == "file":
        signature = (
            "a rename within one directory works, "
            if same_dir
            else "(a rename within one directory failed too) "
            if same_dir is False
            else ""
        )
        return _cause(
            "landlock_no_refer",
            f"{what} across directories got EXDEV although {within}: {signature}which is the "
            f"signature of a Landlock domain that does not grant REFER (this kernel offers Landlock "
            f"ABI {abi}; no_new_privs={ev.process.no_new_privs}).",
        )
    return _cause("unknown", f"{what} got EXDEV although {within}, and this kernel has no Landlock.")


def _denied(r: ProbeResult, ev: Evidence) -> Cause:
    loc = ev.location(r.dst or r.location)
    p = ev.process
    err = _errname(r.errno)
    if loc is None:
        return _cause("unknown", f"{r.operation} failed with {err}.")
    owner = f"{loc.path} (probed in {loc.probe_dir}) is owned by uid {loc.owner_uid}, mode {loc.mode}"
    if p.user_namespace and loc.owner_uid == p.overflow_uid:
        return _cause(
            "uid_mapping",
            f"{r.operation} got {err}: {owner}, the overflow uid — its real owner has no mapping in "
            f"this user namespace (uid_map: {p.uid_map}), so this process can never act as its owner.",
        )
    if loc.fstype in PASSTHROUGH_FS and (loc.dac_writable or loc.owner_uid == p.uid):
        return _cause(
            "uid_mapping",
            f"{r.operation} got {err} on {loc.fstype}, although local permissions allow it ({owner}; "
            f"this process is uid {p.uid}): the filesystem is checked again on the far side under "
            f"another uid (uid_map: {p.uid_map}).",
        )
    if r.errno == E.EPERM and p.seccomp == "filter" and loc.dac_writable:
        return _cause(
            "seccomp_denied",
            f"{r.operation} got EPERM although permissions allow it, and this process runs under "
            f"{p.seccomp_filters} seccomp filter(s).",
        )
    if loc.dac_writable:
        return _cause(
            "not_writable",
            f"{r.operation} got {err} on {loc.role} although file permissions allow it ({owner}; "
            f"this process is uid {p.uid}): a security module refuses — a Landlock domain (ABI "
            f"{p.landlock_abi} here), AppArmor or SELinux — so the sandbox policy does not grant "
            f"write access there.",
        )
    return _cause(
        "not_writable",
        f"{r.operation} got {err} on {loc.role}: {owner}, and this process is uid {p.uid}, gid {p.gid}.",
    )


_UNSUPPORTED = {E.EOPNOTSUPP, E.ENOTSUP, E.EINVAL, E.ENAMETOOLONG, E.EILSEQ, E.ENOTTY}


def explain(r: ProbeResult, ev: Evidence, results: Sequence[ProbeResult]) -> Cause | None:
    """The cause of one failed probe, or None when it did not fail."""
    if r.status != "fail":
        return None
    if r.location == LIMITS:
        return _limit_cause(r, ev, results)
    p = ev.process
    if r.id == "cwd":
        if p.cwd_deleted or r.errno == E.ENOENT:
            return _cause(
                "deleted_cwd",
                f"getcwd() fails with {_errname(r.errno)}; /proc/self/cwd reads {p.cwd_link!r}.",
            )
        return _cause("unknown", f"the working directory is unusable: {r.message}")
    loc = ev.location(r.dst or r.location)
    fstype = loc.fstype if loc is not None else "unknown"
    if r.errno == E.EXDEV:
        return _exdev(r, ev, results)
    if r.errno == E.EROFS:
        return _cause(
            "read_only",
            f"{r.operation} got EROFS: {_mnt(loc)} is mounted with options "
            f"{loc.mount_options if loc else '?'}.",
        )
    if r.errno == E.EOVERFLOW:
        return _cause(
            "uid_mapping",
            f"{r.operation} got EOVERFLOW: a uid or gid involved has no mapping in this user "
            f"namespace (uid_map: {p.uid_map}; gid_map: {p.gid_map}), so the kernel cannot record an "
            f"owner for new files.",
        )
    if r.errno in (E.EACCES, E.EPERM):
        return _denied(r, ev)
    if r.errno in (E.ENOSPC, E.EDQUOT):
        return _cause("no_space", f"{r.operation} got {_errname(r.errno)} on {_mnt(loc)}.")
    if r.errno == E.ENOSYS:
        if p.seccomp == "filter":
            return _cause(
                "seccomp_denied",
                f"{r.operation} got ENOSYS under {p.seccomp_filters} seccomp filter(s) on kernel {p.kernel}.",
            )
        return _cause("fs_unsupported", f"{r.operation} got ENOSYS: kernel {p.kernel} lacks it.")
    if r.errno in _UNSUPPORTED:
        return _cause("fs_unsupported", f"{r.operation} got {_errname(r.errno)} on {fstype} ({_mnt(loc)}).")
    if r.errno == E.ENOENT and loc is not None and not loc.exists:
        return _cause("missing_dir", f"{loc.path} ({loc.role}) does not exist.")
    if r.errno is None and r.operation is not None and not r.operation.startswith("git"):
        return _cause("fs_unsupported", f"on {fstype}: {r.message}.")
    return _cause("unknown", f"{r.operation} failed: {r.message}")


def _status(results: Sequence[ProbeResult], probe_id: str) -> str | None:
    return next((r.status for r in results if r.location == LIMITS and r.id == probe_id), None)


def _pause(results: Sequence[ProbeResult]) -> str:
    row = next((r for r in results if r.location == LIMITS and r.id == "pause"), None)
    return str(row.facts.get("mechanism")) if row is not None else "an unknown mechanism"


def limit_meaning(r: ProbeResult, ev: Evidence, results: Sequence[ProbeResult]) -> str:
    """What a missing mechanism means for warren's sandboxes: the fallback `warren plan`
    takes for this caller, judged by the other rows' measurements."""
    if r.id == "cgroup1_memory":
        return "memory is limited per process only (RLIMIT_DATA): several processes together can use more"
    if r.id == "cgroup1_pids":
        nproc = next((x for x in results if x.location == LIMITS and x.id == "nproc_per_userns"), None)
        if nproc is not None and nproc.status == "skip" and nproc.facts.get("forked") is not None:
            # Measured: forks beyond the limit succeeded for root.
            return "the kernel never applies RLIMIT_NPROC to root, so its sandboxes get no pids limit"
        return "pids fall back to RLIMIT_NPROC in the sandbox's own user namespace, " + (
            "which caps the whole sandbox here (nproc_per_userns)"
            if nproc is not None and nproc.status == "pass"
            else "which does not cap the whole sandbox here (see nproc_per_userns)"
        )
    if r.id == "cgroup1_cpu":
        return (
            "--cpus is not enforceable, and a sandbox's busy processes get a fair share each, not one in all"
        )
    if r.id == "cgroup1_freezer":
        return f"pause uses {_pause(results)}"
    if r.id == "cgroup2":
        return f"pause cannot use cgroup.freeze (it uses {_pause(results)}), and no limit comes from cgroup2"
    if r.id == "nproc_per_userns":
        if _status(results, "cgroup1_pids") == "pass":
            return "warren limits pids with cgroup v1 pids.max instead (usable here), so nothing is lost"
        return "sandboxes get no pids limit that covers the whole sandbox"
    if r.id == "tmpfs_size":
        return "--tmp-size cannot cap /tmp and /dev/shm in a sandbox"
    if r.id == "pause":
        return "pause stops each process with SIGSTOP, one by one, not the sandbox as one"
    return "warren cannot use it"


def _limit_cause(r: ProbeResult, ev: Evidence, results: Sequence[ProbeResult]) -> Cause:
    why = f"{r.message}. For warren: {limit_meaning(r, ev, results)}."
    op = r.operation or ""
    if r.id == "pause":
        return _cause("no_freezer", why)
    if op in ("mountinfo", "/proc/self/cgroup"):
        return _cause("cgroup_absent", why)
    if op == "mkdir" and r.errno in (E.EACCES, E.EPERM, E.EROFS):
        return _cause("cgroup_not_writable", why)
    if op.startswith(("unshare", "write /proc/self/")):
        return _cause("no_user_namespace", why)
    if r.id == "nproc_per_userns" and r.errno == E.EAGAIN:
        return _cause("nproc_not_per_userns", why)
    if r.errno == E.EPERM and ev.process.seccomp == "filter":
        return _cause("seccomp_denied", why)
    return _cause("unknown", why)


def diagnose(evidence: Evidence, results: Sequence[ProbeResult]) -> list[Cause | None]:
    """One entry per result, in order: its cause when it failed, else None."""
    return [explain(r, evidence, results) for r in results]
