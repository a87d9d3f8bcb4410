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

import json
import os
import secrets
from pathlib import Path

from .. import protocol
from ..errors import SetupError
from ..plan import CallerFacts, Plan, make_plan, tmpdir
from ..plan.facts import HostFacts, paths_of
from ..plan.mounts import strip_nested, within
from ..policy import Policy, build, config
from ..policy.spec import from_mapping
from . import gitkeeper, links, statedir
from .hostfacts import gather


def resolve(spec_map: dict[str, object], caller: CallerFacts, msg_caller: protocol.Caller) -> Policy:
    """The request's policy for this caller: its spec over the config files' (when the
    caller asked for them), with paths resolved from the caller's directory."""
    spec = from_mapping(spec_map, "the request's policy", skip=())
    home = Path(caller.home)
    here = Path(caller.cwd)
    if msg_caller.config:
        workspace = Path(os.path.realpath(here / spec.workspace)) if spec.workspace else here.resolve()
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
    roots = strip_nested([str(r.path) for r in policy.writable])
    # A read-only workspace is walked too: a denied file linked into it must stay
    # unreadable there (nothing in it needs a copy: it cannot be written).
    found = [
        o
        for o in scanner.scan(
            strip_nested([*roots, str(policy.workspace)]),
            shared=[str(r.path) for r in policy.writable if r.source != "workspace"],
            denied=[*(str(r.path) for r in policy.denied), state_dir],
        )
        if o.secret or any(within(o.path, r) for r in roots)
    ]
    # Repositories in the workspace and the --write roots (a preset's caches are
    # the tool's, shared with the host on purpose: docs/known-limits.md).
    git_roots = strip_nested([str(r.path) for r in policy.writable if r.source in ("workspace", "--write")])
    git = keeper.find(git_roots, caller.env, dry=dry, readonly=tuple(str(r.path) for r in policy.readable))
    try:
        ws_path = str(policy.workspace)
        host = gather(
            [*paths_of(paths, caller), *tmpdir.candidates(ws_path, caller.env, caller.home)],
            state_dir=state_dir,
            outside_links=tuple((o.path, o.dev, o.ino, o.secret) for o in found),
            git=git.gitdirs,
            git_files=git.files,
            workspace=ws_path,
            caller_cgroups=caller.cgroups,
        )
    except BaseException:
        git.close()
        raise
    return host, git


class Planner:
    """Plans requests with the warm state one supervisor keeps: the link scanner's
    memory and the git keeper (``root``: its state directory, None inline)."""

    def __init__(self, root: str | None, scanner: links.LinkScanner, keeper: gitkeeper.GitKeeper) -> None:
        self.root, self.scanner, self.keeper = root, scanner, keeper

    def plan(
        self,
        spec_map: dict[str, object],
        caller: CallerFacts,
        msg_caller: protocol.Caller,
        cwd: str | None,
        *,
        long_lived: bool = False,
        dry: bool = False,
    ) -> tuple[Plan, gitkeeper.Found]:
        """The plan, and the repositories found for its launch. ``long_lived``:
        commands start in the workspace (not wherever the sandbox happened to be
        created from). ``dry``: only to show (``warren plan``)."""
        policy = resolve(spec_map, caller, msg_caller)
        state_dir = self.root or statedir.location(caller.env)
        host, git = host_facts(
            policy, caller, state_dir=state_dir, scanner=self.scanner, keeper=self.keeper, dry=dry
        )
        try:
            plan = make_plan(
                policy,
                host,
                caller,
                cwd=str(policy.workspace) if long_lived else cwd,
                scratch_id=secrets.token_hex(12),
            )
        except BaseException:
            git.close()
            raise
        return plan, git


def json_safe(value: object) -> dict[str, object]:
    """A plan's dictionary as plain JSON values (tuples become lists, and so on)."""
    result: dict[str, object] = json.loads(json.dumps(value, default=str))
    return result
