"""make_plan(policy, host, caller) -> Plan: one pure function, every input explicit.

The mounts come from ``mounts``, the ruleset from ``landlock``, the filter from
``seccomp``, the environment from ``env``. Inputs in, a whole plan out: the working
directory, the network rules, what the host must prepare and guard are fields of the
plan, never patched on afterwards.
"""

from __future__ import annotations

import os

from ..errors import HostError, PolicyError
from ..policy import Policy
from . import landlock as _landlock
from . import limits as _limits
from . import seccomp as _seccomp
from . import tmpdir as _tmpdir
from .env import credential_warnings, environment, passed
from .facts import CallerFacts, HostFacts, landlock_abi
from .model import NetPlan, Plan
from .mounts import OVERLAID, guarded_ancestors, plan_mounts, strip_nested, within

STATE_DIR_SOURCE = "warren's state directory"


def make_plan(
    policy: Policy,
    host: HostFacts,
    caller: CallerFacts,
    *,
    cwd: str | None = None,
    scratch_id: str | None = None,
) -> Plan:
    """``cwd``: where commands start by default (absolute, or relative to the
    workspace); None means the caller's directory when it lies in the workspace, else
    the workspace. ``scratch_id``: a fresh random name part for the sandbox's TMPDIR
    outside the workspace (see ``tmpdir``); None keeps TMPDIR on the private tmpfs."""
    if not host.machine_supported:
        raise HostError(
            "this architecture is not supported",
            operation="plan",
            hint="warren supports Linux on x86_64 and aarch64",
        )
    writable = [str(r.path) for r in policy.writable]
    _check_state_dir(policy, host)
    for root in writable:
        for base in ("/dev", "/proc"):
            if within(root, base):
                raise HostError(
                    f"writable root {root} is inside {base}",
                    operation="plan",
                    path=root,
                    hint=f"the sandbox gets a fresh {base}; choose a path elsewhere",
                )

    abi = landlock_abi(host.landlock_abi, caller.env)
    warnings: list[str] = []
    if abi < 2:
        warnings.append(
            f"Landlock ABI {abi} (< 2): falling back to one bind mount per "
            "writable root; hardlinks and renames between writable roots (uv cache -> "
            "workspace) will fail with EXDEV, and ancestor directories of writable roots "
            "are protected only by mounts. Use Linux >= 5.19 with Landlock enabled."
        )
    limits = _limits.plan(policy.limits, host.cgroups, host.mem_total, host.cpus)
    denied = [(str(r.path), r.source) for r in policy.denied]
    if host.state_dir and host.kind(host.state_dir) == "dir":
        denied.append((host.state_dir, STATE_DIR_SOURCE))
    workspace = str(policy.workspace)
    ws_writable = any(r.path == policy.workspace for r in policy.writable)
    scratch = _tmpdir.scratch_tmpdir(
        workspace, ws_writable, caller.env, caller.home, host, scratch_id, shared=abi >= 2
    )
    tmp_limit = (
        _tmpdir.limit(workspace, caller.env, host, scratch)
        if ws_writable and workspace in host.writable_dirs and scratch_id is not None
        else None
    )
    # The sandbox's TMPDIR is a writable root of its own: it joins the workspace's mount.
    roots = [*writable, scratch.path] if scratch else writable
    # A repository above the workspace: visible inside (``plan_mounts``), and named in
    # hints while its .git is not writable.
    repository = host.repository if ws_writable else None
    readonly_repository = (
        repository if repository and not any(within(f"{repository}/.git", r) for r in writable) else None
    )
    mounts = plan_mounts(
        roots,
        [str(r.path) for r in policy.readable],
        denied,
        ["/run", "/var/run", caller.env.get("XDG_RUNTIME_DIR", "")],
        host,
        shared=abi >= 2,
        tmp_size=limits.limits.tmp_size or None,
        repository=repository,
    )
    warnings.extend(mounts.warnings)
    notes = list(mounts.notes)
    if tmp_limit:
        notes.append(tmp_limit)
    warnings.extend(credential_warnings(passed(policy, caller.env)[1]))
    devices = tuple(
        f"/dev/{n}" for n in ("null", "zero", "full", "tty") if host.kind(f"/dev/{n}") != "missing"
    )
    unreadable = tuple(
        str(r.path) for r in policy.denied if not any(within(str(r.path), w) for w in writable)
    )
    landlock = (
        _landlock.plan(abi, strip_nested(roots), ("/tmp", "/dev/shm"), devices, unreadable)
        if abi >= 2
        else None
    )
    return Plan(
        mounts=mounts.ops,
        landlock=landlock,
        seccomp=_seccomp.build(allow_nested=policy.allow_nested),
        uid=caller.uid,
        gid=caller.gid,
        env=environment(policy, caller.env, caller.home, scratch.path if scratch else "/tmp"),
        workspace=workspace,
        cwd=_cwd(workspace, caller.cwd, cwd),
        net=NetPlan(
            mode=policy.network,
            hosts=policy.allowed_hosts,
            rules=policy.allowed_rules,
            resolve=tuple(sorted(policy.resolve.items())),
        ),
        cap_last_cap=host.cap_last_cap,
        create_dirs=tuple(str(r.path) for r in policy.writable if r.create),
        scratch=scratch.path if scratch else None,
        scratch_base=scratch.base if scratch else None,
        repository=readonly_repository,
        guarded=guarded_ancestors(mounts.groups),
        git=host.git,
        git_files=host.git_files,
        unshare=tuple((path, dev, ino) for path, dev, ino, secret in host.outside_links if not secret),
        groups=tuple((g.mount_at, g.roots) for g in mounts.groups),
        warnings=tuple(warnings),
        notes=tuple(notes),
        limits=limits,
    )


def _check_state_dir(policy: Policy, host: HostFacts) -> None:
    """A sandbox that can write where warren keeps its state could replace it (move it
    aside, plant another): refuse any writable root at or above it."""
    state = host.state_dir
    if not state:
        return
    for root in policy.writable:
        if within(state, str(root.path)):
            raise PolicyError(
                f"{root.source} {root.path} contains warren's state directory {state}",
                operation="policy",
                path=str(root.path),
                hint="choose a narrower workspace or writable path, or keep warren's state elsewhere "
                "(set XDG_STATE_HOME to a directory outside every writable root)",
            )


def _cwd(workspace: str, caller_cwd: str, asked: str | None) -> str:
    if asked is not None:
        path = asked if asked.startswith("/") else os.path.join(workspace, asked)
        return os.path.normpath(path)
    real = os.path.realpath(caller_cwd)
    if within(real, workspace) and not any(within(real, o) for o in OVERLAID if not within(workspace, o)):
        return real
    return workspace
