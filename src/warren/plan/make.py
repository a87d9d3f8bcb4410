"""make_plan(policy, host, caller) -> Plan: one pure function, every input explicit.

The mounts come from ``mounts``, the ruleset from ``landlock``, the filter from
``seccomp``, the environment from ``env``. Inputs in, a whole plan out: the working
directory, the network rules, what the host must prepare and guard are fields of the
plan, never patched on afterwards.
"""

from __future__ import annotations

import dataclasses
import os

from ..errors import HostError, PolicyError
from ..images.ref import ImageRef
from ..policy import Policy
from ..policy import hostrun as _hostrun
from . import degraded as _degraded
from . import envroot as _envroot
from . import landlock as _landlock
from . import limits as _limits
from . import seccomp as _seccomp
from . import tmpdir as _tmpdir
from .env import credential_warnings, environment, passed
from .facts import CallerFacts, HostFacts, landlock_abi
from .model import MountKind, MountOp, NetPlan, Plan
from .mounts import DEV_NODES, OVERLAID, guarded_ancestors, plan_mounts, strip_nested, within
from .secrets import SYSTEM_BUNDLES, plan_secrets

_TOKEN_FILE = "warren serve's token file"


def make_plan(
    policy: Policy,
    host: HostFacts,
    caller: CallerFacts,
    *,
    cwd: str | None = None,
    scratch_id: str | None = None,
    image: ImageRef | None = None,
    secret_nonce: str = "",
    trust_bundle: str | None = None,
    review_layer: str | None = None,
) -> Plan:
    """``cwd``: where commands start by default (absolute, or relative to the
    workspace); None means the caller's directory when it lies in the workspace, else
    the workspace. ``scratch_id``: a fresh random name part for the sandbox's TMPDIR
    outside the workspace (see ``tmpdir``); None keeps TMPDIR on the private tmpfs.
    ``image``: the image ``policy.image`` names, resolved: the sandbox's root
    (``envroot``).
    ``secret_nonce``: fresh randomness for the placeholders of ``--secret``;
    ``trust_bundle``: the host file the launch writes the sandbox's trust bundle to
    (see ``secrets``). ``review_layer``: where a review sandbox's layer goes (a fresh
    name in warren's state directory)."""
    if policy.review:
        _check_review(policy, host, image)
    if not host.machine_supported:
        raise HostError(
            "this architecture is not supported",
            operation="plan",
            hint="warren supports Linux on x86_64 and aarch64",
        )
    writable = [str(r.path) for r in policy.writable]
    _check_state_dir(policy, host)
    host = dataclasses.replace(host, git_files=_guarded_git_files(host.git_files, writable))
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
    if image is not None:
        if host.namespaces[0] != "usable" or policy.secrets or policy.http_rules:
            raise HostError(
                "a sandbox on an image needs user namespaces and takes no secrets or HTTP rules yet"
                + (f" (user namespaces: {host.namespaces[0]})" if host.namespaces[0] != "usable" else ""),
                operation="plan",
                hint="run where user namespaces work (warren doctor says why they do not here); "
                "drop --secret/--allow-http on an image",
            )
        return _image_plan(policy, host, caller, image, abi, cwd)
    if host.namespaces[0] != "usable":
        if policy.workspace_at:
            raise PolicyError(
                f"workspace_at {policy.workspace_at} needs the full mode (user namespaces), which is "
                f"unavailable here ({host.namespaces[0]}): without them nothing can be mounted",
                operation="plan",
                path=policy.workspace_at,
                hint="run where user namespaces work (warren doctor says why they do not here), or "
                "leave workspace_at out and use the workspace at its host path",
            )
        if policy.secrets or policy.http_rules:
            # The proxy's CA must be trusted inside through a bundle mounted over the
            # system's, and the degraded mode mounts nothing: refuse rather than run with
            # the secret silently absent.
            raise PolicyError(
                "secrets and HTTP rules need the full mode (user namespaces), which is "
                f"unavailable here ({host.namespaces[0]})",
                operation="plan",
                hint="run where user namespaces work (warren doctor says why they do not "
                "here), or pass the credential another way",
            )
        state = [*host.own_dirs(), *((p, _TOKEN_FILE) for p in host.secret_files)]
        return _degraded.make(
            policy,
            host,
            caller,
            abi=abi,
            cwd=_cwd(str(policy.workspace), caller.cwd, cwd),
            scratch_id=scratch_id or "0" * 24,
            state_dir_denied=state,
        )
    warnings: list[str] = []
    if abi < 2:
        warnings.append(
            f"Landlock ABI {abi} (< 2): falling back to one bind mount per "
            "writable root; hardlinks and renames between writable roots (uv cache -> "
            "workspace) will fail with EXDEV, and ancestor directories of writable roots "
            "are protected only by mounts. Use Linux >= 5.19 with Landlock enabled."
        )
    limits = _limits.plan(policy.limits, host.cgroups, host.mem_total, host.cpus, dict(host.user_counts))
    warnings.extend(_limits.unenforced(limits))
    denied = [(str(r.path), r.source) for r in policy.denied]
    reached = _reached_own(policy, host, abi)
    denied += [
        (path, what) for path, what in host.own_dirs() if host.kind(path) == "dir" and path not in reached
    ]
    denied += [(path, _TOKEN_FILE) for path in host.secret_files]
    workspace = str(policy.workspace)
    ws_writable = any(r.path == policy.workspace for r in policy.writable)
    place = _place(policy, host)
    # workspace_link: the workspace stays at its host path (on the caches' mount), reached
    # from workspace_at through a symbolic link made inside the sandbox only.
    link, place = (place, None) if place and policy.workspace_link else (None, place)
    # Review mode: the workspace is no writable root of the host's but an overlay of its
    # own (its TMPDIR stays on the private /tmp: no host mount to join), whose files
    # linked from outside need no inode of their own (a write copies them up) and whose
    # repositories are the sandbox's (not found: ``server.planning``).
    host_bound = ws_writable and not policy.review
    if policy.review:
        host = dataclasses.replace(
            host,
            outside_links=tuple(o for o in host.outside_links if o[3] or not within(o[0], workspace)),
        )
    scratch = _tmpdir.scratch_tmpdir(
        workspace, host_bound, caller.env, caller.home, host, scratch_id, shared=abi >= 2
    )
    tmp_limit = (
        _tmpdir.limit(workspace, caller.env, host, scratch)
        if host_bound and workspace in host.writable_dirs and scratch_id is not None
        else None
    )
    # The sandbox's TMPDIR is a writable root of its own: it joins the workspace's mount.
    roots = [*writable, scratch.path] if scratch else writable
    bound = [r for r in roots if r != workspace] if policy.review else roots
    # A repository above the workspace: visible inside (``plan_mounts``), and named in
    # hints while its .git is not writable.
    repository = host.repository if ws_writable else None
    readonly_repository = (
        repository if repository and not any(within(f"{repository}/.git", r) for r in writable) else None
    )
    mounts = plan_mounts(
        bound,
        [str(r.path) for r in policy.readable],
        denied,
        ["/run", "/var/run", caller.env.get("XDG_RUNTIME_DIR", "")],
        host,
        shared=abi >= 2,
        tmp_size=limits.limits.tmp_size or None,
        repository=repository,
        place=place,
        link=link,
        review=(workspace, review_layer or "") if policy.review else None,
    )
    if reached:
        mounts = dataclasses.replace(mounts, ops=tuple(_hide_others(op, reached) for op in mounts.ops))
    warnings.extend(mounts.warnings)
    notes = list(mounts.notes)
    if tmp_limit:
        notes.append(tmp_limit)
    warnings.extend(credential_warnings(passed(policy, caller.env)[1]))
    warnings.extend(_hostrun.warnings(policy.writable, policy.host_run))
    if caller.uid == 0:
        warnings.extend(_foreign_owned(writable, host))
    system_bundle = next((b for b in SYSTEM_BUNDLES if host.kind(b) == "file"), None)
    secrets = plan_secrets(policy, secret_nonce, trust_bundle, system_bundle)
    warnings.extend(secrets.warnings)
    env = environment(policy, caller.env, caller.home, scratch.path if scratch else "/tmp")
    env.update(secrets.env)
    if policy.review:
        # uv hard-links from its cache, which cannot reach into the layer: quiet copies.
        env.setdefault("UV_LINK_MODE", "copy")
    devices = tuple(
        f"/dev/{n}" for n in ("null", "zero", "full", "tty") if host.kind(f"/dev/{n}") != "missing"
    )
    unreadable = tuple(
        str(r.path) for r in policy.denied if not any(within(str(r.path), w) for w in writable)
    ) + tuple(reached)
    landlock = (
        _landlock.plan(
            abi, strip_nested(roots), ("/tmp", "/dev/shm"), devices, unreadable, nested=policy.allow_nested
        )
        if abi >= 2
        else None
    )
    return Plan(
        mounts=(*mounts.ops, *secrets.mounts),
        landlock=landlock,
        seccomp=_seccomp.build(allow_nested=policy.allow_nested),
        uid=caller.uid,
        gid=caller.gid,
        env=env,
        workspace=place[0] if place else workspace,
        cwd=_placed_cwd(policy, caller.cwd, cwd) if place else _cwd(workspace, caller.cwd, cwd),
        host_workspace=workspace if place else None,
        net=dataclasses.replace(
            NetPlan.of(policy),
            secrets=secrets.secrets,
            http_rules=secrets.http_rules,
            trust_bundle=trust_bundle if secrets.mounts else None,
            bundle_target=secrets.bundle_target,
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
        notes=tuple([*notes, *review_notes(policy.workspace_at or workspace)] if policy.review else notes),
        limits=limits,
        review=review_layer if policy.review else None,
    )


def _image_plan(
    policy: Policy, host: HostFacts, caller: CallerFacts, image: ImageRef, abi: int, cwd: str | None
) -> Plan:
    """A sandbox on an image (``envroot``): the same limits, filter, network and
    Landlock handling as on the host's root, around the image's root."""
    if abi < 2:
        raise HostError(
            f"a sandbox on an image needs Landlock ABI >= 2 (this kernel: {abi})",
            operation="plan",
            hint="use Linux >= 5.19 with Landlock enabled",
        )
    limits = _limits.plan(policy.limits, host.cgroups, host.mem_total, host.cpus, dict(host.user_counts))
    devices = {f"/dev/{n}": host.kind(f"/dev/{n}") != "missing" for n in DEV_NODES}
    got = _envroot.plan_image(
        policy,
        image,
        caller.env,
        devices,
        host.mem_total,
        host_workspace=policy.host_workspace,
        tmp_size=limits.limits.tmp_size or None,
        cwd=_image_cwd(policy, caller.cwd, cwd),
        facts=host,
        outside_links=host.outside_links,
        git=host.git,
        git_files=host.git_files,
    )
    terminals = tuple(f"/dev/{n}" for n in ("null", "zero", "full", "tty") if devices.get(f"/dev/{n}"))
    warnings = list(credential_warnings(passed(policy, caller.env)[1]))
    warnings.extend(_hostrun.warnings(policy.writable, policy.host_run))
    warnings.extend(_limits.unenforced(limits))
    return Plan(
        mounts=got.mounts,
        landlock=_landlock.plan(
            abi,
            list(got.writable),
            ("/tmp", "/dev/shm"),
            terminals,
            unwritable=got.guarded,
            nested=policy.allow_nested,
        ),
        seccomp=_seccomp.build(allow_nested=policy.allow_nested),
        uid=caller.uid,
        gid=caller.gid,
        env=got.env,
        workspace=got.workspace,
        cwd=got.cwd,
        net=NetPlan.of(policy),
        cap_last_cap=host.cap_last_cap,
        warnings=tuple(warnings),
        notes=got.notes,
        limits=limits,
        image=image.name,
        image_id=image.id,
        inner_uid=got.inner_uid,
        inner_gid=got.inner_uid,
        renames=True,
        host_workspace=str(policy.workspace) if policy.host_workspace else None,
        guarded=guarded_ancestors(got.groups),
        create_dirs=tuple(str(r.path) for r in policy.writable if r.create),
        git=host.git,
        git_files=host.git_files,
        unshare=tuple(
            (p, dev, ino)
            for p, dev, ino, secret in host.outside_links
            if not secret and any(within(p, r) for r in _envroot.bound_roots(policy))
        ),
    )


def _image_cwd(policy: Policy, caller_cwd: str, asked: str | None) -> str | None:
    """Where a command on an image starts: a path in the host workspace is its place
    under /workspace; another path asked for is the image's; else the image's default."""
    ws = str(policy.workspace)
    real = asked if asked is not None else os.path.realpath(caller_cwd)
    if policy.host_workspace and real.startswith("/") and within(real, ws):
        return _envroot.WORKSPACE + real[len(ws) :]
    return asked


def _place(policy: Policy, host: HostFacts) -> tuple[str, str] | None:
    """Where the workspace is seen inside, when not at its host path (``workspace_at``),
    and its host directory: the mount point is made in the sandbox only, beneath a parent
    the host has."""
    at = policy.workspace_at
    if at is None:
        return None
    parent = os.path.dirname(at)
    if host.kind(parent) != "dir":
        raise PolicyError(
            f"workspace_at {at}: its parent {parent} is not a directory on this host",
            operation="plan",
            path=parent,
            hint="choose a path whose parent directory exists (the sandbox makes only the last part)",
        )
    if host.kind(str(policy.workspace)) != "dir":
        raise PolicyError(
            f"workspace_at {at}: the workspace {policy.workspace} is not a directory",
            operation="plan",
            path=str(policy.workspace),
            hint="create the workspace directory first",
        )
    return at, str(policy.workspace)


def _placed_cwd(policy: Policy, caller_cwd: str, asked: str | None) -> str:
    """Where commands start when the workspace is seen at ``workspace_at``: a relative
    path from there; the caller's directory in the workspace, at its place there."""
    at, ws = policy.workspace_at or "", str(policy.workspace)
    if asked is not None and not asked.startswith("/"):
        return os.path.normpath(os.path.join(at, asked))
    real = asked if asked is not None else os.path.realpath(caller_cwd)
    if within(real, ws):
        return at + real[len(ws) :]
    return real if asked is not None else at


def _check_state_dir(policy: Policy, host: HostFacts) -> None:
    """A sandbox that can write where warren keeps its state or its images could replace
    them (move one aside, plant another, even before the store exists): refuse any
    writable root at or above either."""
    moved_by = {host.state_dir: "XDG_STATE_HOME", host.image_store: "XDG_DATA_HOME"}
    for own, what in host.own_dirs():
        for root in policy.writable:
            if within(own, str(root.path)):
                raise PolicyError(
                    f"{root.source} {root.path} contains {what} {own}",
                    operation="policy",
                    path=str(root.path),
                    hint="choose a narrower workspace or writable path, or keep warren's files "
                    f"elsewhere (set {moved_by[own]} to a directory outside every writable root)",
                )


def _reached_own(policy: Policy, host: HostFacts, abi: int) -> tuple[str, ...]:
    """warren's E2B homes when a writable root lies beneath them (an E2B sandbox's own
    home): not hidden by a mount, which would hide that home too or, bound again on top,
    part it from the caches' mount (no hard links), but left out of every Landlock grant,
    so only the roots beneath are reachable there and whatever else is made there later
    is not. Landlock below ABI 2 gives no shared mount and so no reason: refused."""
    own = host.e2b_homes
    if not own or host.kind(own) != "dir":
        return ()
    if not any(within(str(r.path), own) and str(r.path) != own for r in policy.writable):
        return ()
    if abi < 2:
        raise PolicyError(
            f"a writable root beneath {own} (warren's E2B homes) needs Landlock ABI >= 2 "
            f"(this kernel: {abi})",
            operation="plan",
            path=own,
            hint="use Linux >= 5.19 with Landlock enabled",
        )
    return (own,)


def _guarded_git_files(found: tuple[str, ...], writable: list[str]) -> tuple[str, ...]:
    """The ``.git`` files made read-only inside: those at the top of a writable root (a
    workspace that is a linked worktree or a submodule checkout), whose directory the
    sandbox can neither rename nor remove, so ``gitdir:`` there stays the host's. One
    deeper is not: its directory can be renamed and made again with a ``.git`` of the
    sandbox's (a mount point on the old file would not stop that, and made ``git worktree
    remove`` and ``git rm`` of a submodule fail with EBUSY); host git trusts it as any
    repository made inside, once the sandbox ended and warren adopted what it names."""
    tops = set(writable)
    return tuple(path for path in found if os.path.dirname(path) in tops)


def _hide_others(op: MountOp, reached: tuple[str, ...]) -> MountOp:
    """A mask on the way down to an E2B sandbox's own home hides what it passes (other
    sandboxes' directories, records, snapshots), not only makes it read-only."""
    if op.kind is not MountKind.MASK or not any(within(op.target, own) for own in reached):
        return op
    why = "hidden at the mount level: only the writable roots below are reachable (warren's E2B homes)"
    return dataclasses.replace(op, mode=0, why=why)


def _cwd(workspace: str, caller_cwd: str, asked: str | None) -> str:
    if asked is not None:
        path = asked if asked.startswith("/") else os.path.join(workspace, asked)
        return os.path.normpath(path)
    real = os.path.realpath(caller_cwd)
    if within(real, workspace) and not any(within(real, o) for o in OVERLAID if not within(workspace, o)):
        return real
    return workspace


def review_notes(workspace: str) -> list[str]:
    return [
        f"review mode: {workspace} is an overlay; the sandbox's changes go to a layer in warren's state "
        "directory, the host's files stay as they are until `warren apply`",
        "review mode: hard links and renames between the workspace and caches or TMPDIR are EXDEV "
        "(tools copy instead: UV_LINK_MODE=copy is set); a repository's commits inside stay in the layer",
    ]


def _check_review(policy: Policy, host: HostFacts, image: ImageRef | None) -> None:
    """Review mode is planned for a writable host workspace on the host's root, in the
    full mode; what it has not been built for is refused, naming why."""
    workspace = str(policy.workspace)
    if image is not None:
        raise PolicyError(
            "review mode does not work with a sandbox on an image yet: its root has checkpoints of its "
            "own and a host workspace bound into it is written live",
            operation="plan",
            path=str(image.name),
            hint="on an image, take checkpoints of its root (`warren checkpoint NAME`, `warren rollback "
            "NAME`) with the workspace in it (--workspace none); or review a host workspace without --image",
        )
    why = None
    if not policy.host_workspace:
        why = "no host workspace (nothing to review)"
    elif host.namespaces[0] != "usable":
        why = f"the degraded mode (user namespaces: {host.namespaces[0]}): an overlay needs them"
    elif not any(r.path == policy.workspace for r in policy.writable):
        why = "a read-only workspace (nothing to review)"
    else:
        inner = [
            str(r.path)
            for r in policy.writable
            if r.path != policy.workspace and within(str(r.path), workspace)
        ]
        if inner:
            why = f"a writable path inside the workspace ({inner[0]}), which the host would see at once"
    if why is not None:
        raise PolicyError(
            f"review mode does not work with {why}",
            operation="plan",
            path=workspace,
            hint="drop --review, or drop what it cannot be combined with",
        )


def _foreign_owned(writable: list[str], host: HostFacts) -> list[str]:
    """A root caller's writable roots owned by another uid: on the host root writes them
    by its capability, inside its commands have none (docs/known-limits.md)."""
    out = []
    for root in writable:
        owner = host.owners.get(root)
        if owner is not None and owner != 0:
            out.append(
                f"{root} is owned by uid {owner}: commands run as root without capabilities "
                "inside, so they cannot write there what root writes on the host (EACCES); "
                f"give it to yourself first: chown -R 0:0 {root}"
            )
    return out
