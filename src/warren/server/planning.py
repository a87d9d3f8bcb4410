"""A request's policy made into a plan, in three steps: ``resolve`` (spec, config files
and the caller's context -> ``Policy``), ``host_facts`` (everything the planner needs to
know of this host, gathered in one place: mount table, link scan, repositories, paths)
and the pure ``make_plan``.

Nothing on disk changes here: the repositories found get their git stores at launch
(``sandboxes.launch``, through ``gitkeeper.GitKeeper.lease``). What planning keeps is
warm state (the link scanner's and the repository walks' memory) and, unless ``dry``,
the writable roots' descriptors, opened before the sandbox exists (``gitkeeper.Found``:
the launch takes them over; whoever does not launch closes them).
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .. import protocol
from .._core import safepath, treewalk
from ..errors import SetupError
from ..images.ref import ImageRef
from ..plan import CallerFacts, Plan, make_plan, tmpdir
from ..plan.facts import HostFacts, paths_of
from ..plan.model import LinkWalk
from ..plan.mounts import strip_nested, within
from ..policy import Policy, build, config, lookups
from ..policy.spec import from_mapping
from . import gitkeeper, links, policymemo, snapshots, statedir
from .envroot import resolve_image, store_root
from .hostfacts import free_loopback_port, gather, namespaces

if TYPE_CHECKING:
    from .ahead import Request


def resolve(spec_map: dict[str, object], caller: CallerFacts, msg_caller: protocol.Caller) -> Policy:
    """The request's policy for this caller: its spec over the config files' (when the
    caller asked for them), with paths resolved from the caller's directory."""
    spec = from_mapping(spec_map, "the request's policy", skip=())
    home = Path(caller.home)
    here = Path(caller.cwd)
    if msg_caller.config:
        workspace = Path(lookups.realpath(here / spec.workspace if spec.workspace else here))
        if workspace.is_dir():  # else build() names the precise error
            spec = config.load_spec(workspace, msg_caller.profile, env=caller.env, home=home).merged(spec)
    elif msg_caller.profile:
        raise SetupError("a profile needs the config files", operation="policy", hint="set config=True")
    return build(spec, cwd=here, env=caller.env, home=home)


def host_facts(
    policy: Policy,
    caller: CallerFacts,
    *,
    state_dir: str,
    scanner: links.LinkScanner,
    keeper: gitkeeper.GitKeeper,
    dry: bool,
) -> tuple[HostFacts, gitkeeper.Found]:
    """What the planner must know of this host for ``policy``. ``dry``: only to show
    (``warren plan``): the repository walks keep nothing."""
    paths = [r.path for r in (*policy.writable, *policy.readable, *policy.denied)]
    held = statedir.secret_files(state_dir)
    roots = strip_nested([str(r.path) for r in policy.writable])
    # Repositories in the workspace and the --write roots (a preset's caches are
    # the tool's, shared with the host on purpose: docs/known-limits.md).
    # In review mode the workspace's repositories are the sandbox's own, in its layer:
    # nothing of them is shared with the host (``server.review`` never applies them).
    git_roots = strip_nested(
        [
            str(r.path)
            for r in policy.writable
            if r.source == "--write" or (r.source == "workspace" and not policy.review)
        ]
    )
    # With no host workspace (on an image, workspace = "none") nothing of the
    # caller's directory is in the sandbox: nothing to walk there.
    link_roots = strip_nested([*roots, str(policy.workspace)] if policy.host_workspace else roots)
    shared = [str(r.path) for r in policy.writable if r.source != "workspace"]
    denied = [*(str(r.path) for r in policy.denied), state_dir, *held]
    walk = None if dry else _later(policy, link_roots, shared, denied, roots, scanner)
    if walk is not None:
        # The workspace's files linked from outside are found after launch, while PID 1
        # holds every call that could change a file (``server.linkwalk``); the
        # repository walk is the Python one, whose per-directory memory is warm.
        found: list[links.OutsideLink] = []
        walks = treewalk.Walks(native=False)
    else:
        # A root both walks need (the workspace) is walked once, natively, for both (the
        # scan passes over roots in a shared one).
        walks = treewalk.Walks(
            {r for r in link_roots if not any(within(r, s) for s in shared)} & set(git_roots)
        )
        # A read-only workspace is walked too: a denied file linked into it must stay
        # unreadable there (nothing in it needs a copy: it cannot be written).
        found = [
            o
            for o in scanner.scan(link_roots, shared=shared, denied=denied, walks=walks)
            if o.secret or any(within(o.path, r) for r in roots)
        ]
    if namespaces()[0] == "usable":
        git = keeper.find(
            git_roots,
            caller.env,
            dry=dry,
            readonly=tuple(str(r.path) for r in policy.readable),
            walks=walks,
            # A workspace walked for hard links after launch is watched, however few its
            # directories: else that walk is never expected to find nothing, and every
            # command waits for it (``gitkeeper.link_walk_begins``).
            watch=frozenset({walk.workspace}) if walk is not None else frozenset(),
        )
    else:  # the degraded mode binds nothing: a repository's .git stays the host's own
        git = gitkeeper.Found(env=caller.env)
    try:
        ws_path = str(policy.workspace)
        host = gather(
            [
                *paths_of(paths, caller),
                *tmpdir.candidates(ws_path, caller.env, caller.home),
                # the parent of workspace_at: the sandbox shadows it (plan.mounts.place_ops)
                *([os.path.dirname(policy.workspace_at)] if policy.workspace_at else []),
            ],
            state_dir=state_dir,
            image_store=str(store_root(caller.env)),
            e2b_homes=statedir.e2b_homes(caller.env),
            outside_links=tuple((o.path, o.dev, o.ino, o.secret) for o in found),
            git=git.gitdirs,
            git_files=git.files,
            workspace=ws_path,
            caller_cgroups=caller.cgroups,
            secret_files=held,
        )
    except BaseException:
        git.close()
        raise
    if host.namespaces[0] != "usable" and policy.network == "allow":
        host = dataclasses.replace(host, proxy_port=free_loopback_port())
    if walk is not None and host.namespaces[0] == "usable":
        host = dataclasses.replace(host, link_walk=walk)
    return host, git


def _later(
    policy: Policy,
    link_roots: list[str],
    shared: list[str],
    denied: list[str],
    roots: list[str],
    scanner: links.LinkScanner,
) -> LinkWalk | None:
    """The hard-link walk to make after launch, or None: walk now, as before. Only a
    writable host workspace (not in review mode, whose layer copies a file up when it
    is written) over ``treewalk.SMALL`` entries, and only when no denied file has a name
    outside the denied paths: then no workspace file is a denied one, and what the walk
    is for is writes, which wait for it (``_core.broker.window``). A denied file with
    more links walks the workspace before launch, as always."""
    workspace = str(policy.workspace)
    if not policy.host_workspace or policy.review or workspace not in roots:
        return None
    walked = [r for r in link_roots if not any(within(r, s) for s in shared)]
    if walked != [workspace]:
        return None
    try:
        fd = safepath.open_dir(workspace)
    except OSError:
        return None
    try:
        if not scanner.large(fd):
            return None
    finally:
        os.close(fd)
    if links.denied_linked_elsewhere(denied) is not None:
        return None
    return LinkWalk(tuple(link_roots), tuple(shared), tuple(denied), tuple(roots), workspace)


class Planner:
    """Plans requests with the warm state one supervisor keeps: the link scanner's
    memory and the git keeper (``root``: its state directory, None inline)."""

    def __init__(self, root: str | None, scanner: links.LinkScanner, keeper: gitkeeper.GitKeeper) -> None:
        self.root, self.scanner, self.keeper = root, scanner, keeper

    def resolve(self, request: Request) -> Policy:
        """The request's policy, resolved now."""
        return resolve(request.spec, request.caller, request.msg_caller)

    def memo_key(self, request: Request) -> policymemo.Key:
        """What of ``request`` a kept policy must have been resolved for (``policymemo``)."""
        m = request.msg_caller
        return policymemo.key(request.spec, request.caller, bool(m.config), m.profile)

    def plan(
        self, request: Request, *, dry: bool = False, scratch_id: str | None = None
    ) -> tuple[Plan, gitkeeper.Found, HostFacts]:
        """The request's plan, the repositories found for its launch, and the host facts
        it was made from. A long-lived request's commands start in the workspace (not
        wherever the sandbox happened to be created from). ``dry``: only to show
        (``warren plan``). ``scratch_id``: the random part of the TMPDIR's name (fresh
        unless given: ``ahead`` plans a run again with the name of the sandbox booted for
        it)."""
        plan, git, host, _basis = self.planned(request, dry=dry, scratch_id=scratch_id)
        return plan, git, host

    def planned(
        self,
        request: Request,
        *,
        dry: bool = False,
        scratch_id: str | None = None,
        known: tuple[Basis, Plan] | None = None,
        policy: Policy | None = None,
    ) -> tuple[Plan, gitkeeper.Found, HostFacts, Basis | None]:
        """``plan``, and what ``make_plan`` made it from (``Basis``; None where it took
        fresh randomness). ``known``: a plan made before and its basis (the sandbox
        booted ahead's): when the basis now is equal, that plan is the one ``make_plan``
        would make again, and is returned instead. ``policy``: the request's policy as a
        resolution now would make it (``policymemo``), else it is resolved. The host
        facts are gathered afresh either way."""
        caller = request.caller
        if policy is None:
            policy = self.resolve(request)
        state_dir = self.root or statedir.location(caller.env)
        host, git = host_facts(
            policy, caller, state_dir=state_dir, scanner=self.scanner, keeper=self.keeper, dry=dry
        )
        intercepts = bool(policy.secrets or policy.http_rules)
        scratch_id = scratch_id or secrets.token_hex(12)
        basis = None
        if not (intercepts or policy.review or policy.image or policy.from_snapshot):
            cwd = str(policy.workspace) if request.long_lived else request.cwd  # (as below: no image)
            basis = Basis(policy, host, caller, cwd, scratch_id, os.path.realpath(caller.cwd))
            if known is not None and known[1].namespaces and known[0] == basis:
                return known[1], git, host, basis
        try:
            if policy.from_snapshot:
                image: ImageRef | None = snapshots.image_of(state_dir, policy.from_snapshot)
            else:
                image = resolve_image(policy.image, caller.env) if policy.image else None
            plan = make_plan(
                policy,
                host,
                caller,
                cwd=("/workspace" if image else str(policy.workspace)) if request.long_lived else request.cwd,
                scratch_id=scratch_id,
                image=image,
                secret_nonce=secrets.token_hex(16),
                # Beneath warren's state directory too (never inside the workspace), a fresh name.
                review_layer=os.path.join(state_dir, "review", secrets.token_hex(12))
                if policy.review
                else None,
                # Beneath warren's state directory (hidden in every sandbox), a fresh name.
                trust_bundle=os.path.join(state_dir, "tls", f"bundle-{secrets.token_hex(12)}.pem")
                if intercepts
                else None,
            )
            if policy.from_snapshot:
                store = snapshots.get(state_dir, policy.from_snapshot).store
                if store:  # the store whose layers it stands on: leased while it runs
                    plan = dataclasses.replace(plan, image_store=store)
            elif image is not None and policy.image and not policy.image.startswith("/"):
                plan = dataclasses.replace(plan, image_store=str(store_root(caller.env)))
            if host.link_walk is not None and image is None and plan.namespaces:
                plan = dataclasses.replace(plan, link_walk=host.link_walk)
        except BaseException:
            git.close()
            raise
        if not plan.namespaces and not dry:
            plan = _notice_once(plan, state_dir)
        return plan, git, host, basis


@dataclass(frozen=True)
class Basis:
    """What ``make_plan`` made a plan from, but the fresh random names it was given:
    the policy, the host facts, the caller, where commands start (as asked), the
    TMPDIR's random part, and the one thing ``make_plan`` reads of the host itself, the
    caller's directory resolved (``os.path.realpath``). Given an equal basis it makes
    an equal plan: ``Planner.planned`` returns the plan it made before instead. Only
    for a plan that takes no fresh randomness and no image (no secrets or interception,
    no review layer, no image or snapshot): there the names it would be given anew
    would make another plan."""

    policy: Policy
    host: HostFacts
    caller: CallerFacts
    cwd: str | None
    scratch_id: str
    real_cwd: str


DEGRADED_NOTICE = "degraded-noticed"


def _notice_once(plan: Plan, state_dir: str) -> Plan:
    """The degraded mode is said on the first run only (a marker in the state directory,
    which no sandbox sees); `warren plan` and `warren doctor` say it every time."""
    try:
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd = os.open(
            os.path.join(state_dir, DEGRADED_NOTICE),
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
            0o600,
        )
    except FileExistsError:
        return dataclasses.replace(plan, warnings=plan.warnings[1:])
    except OSError:
        return plan
    os.close(fd)
    return plan


def json_safe(value: object) -> dict[str, object]:
    """A plan's dictionary as plain JSON values (tuples become lists, and so on)."""
    result: dict[str, object] = json.loads(json.dumps(value, default=str))
    return result
