"""CLI commands that explain: ``plan`` (what a run would set up, as the supervisor
plans it), ``presets``, and ``doctor`` (probes, here or inside a sandbox)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable

from .. import protocol
from ..client import checks, connect
from ..errors import CommandNotFound, ExecError, WarrenError
from ..models import Result
from . import flags


def _plan(spec: dict[str, object], profile: str | None) -> protocol.PlanReply:
    workspace = spec.get("workspace")
    cwd = checks.caller_cwd(workspace if isinstance(workspace, str) else None)
    caller = protocol.Caller(cwd=cwd, env=dict(os.environ), config=True, profile=profile)
    reply, _ = connect.exchange(
        connect.for_run(),
        protocol.PlanRequest(spec=protocol.Spec.of(spec), caller=caller),
        (protocol.PlanReply,),
    )
    assert isinstance(reply, protocol.PlanReply)
    return reply


def plan(args: list[str]) -> int:
    p = flags.parser("warren plan", "Print exactly what `warren run` with these flags would set up.")
    flags.add_policy_flags(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    ns = p.parse_args(args)
    reply = _plan(flags.spec_of(ns), ns.profile)
    print(json.dumps(reply.plan, indent=2) if ns.json else reply.text)
    return 0


def presets(args: list[str]) -> int:
    from ..policy import presets as _presets

    flags.parser("warren presets", "List the tool presets and what they make writable.").parse_args(args)
    listed = _presets.describe()
    width = max(len(name) for name, _ in listed)
    for name, summary in listed:
        print(f"{name:{width}} {summary}")
        for var, where in _presets.get(name).homes:
            print(f"{'':{width}}   its own home: {where.format(data='$XDG_DATA_HOME')} (${var})")
        for var, _, dirname in _presets.get(name).private:
            print(f"{'':{width}}   private to the sandbox: $TMPDIR/{dirname} (${var})")
        for where in _presets.get(name).not_writable:
            print(f"{'':{width}}   left read-only: {where}")
    return 0


def doctor(args: list[str]) -> int:
    p = flags.parser(
        "warren doctor",
        "Probe the filesystem semantics developer tools need, here; name each failure's cause.",
    )
    flags.add_policy_flags(p)
    p.add_argument(
        "--cache", action="append", default=[], metavar="DIR", help="a cache to probe (repeatable)"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON (schema warren-doctor/1)")
    p.add_argument(
        "--sandbox", action="store_true", help="run the probes inside a sandbox built from the flags"
    )
    p.add_argument(
        "--fix",
        action="store_true",
        help="print (never run) the root commands that give warren user namespaces here (AppArmor)",
    )
    ns = p.parse_args(args)
    from ..plan.degraded import NOT_HELD

    if ns.fix:
        from ..doctor import userns

        print("\n".join(userns.render(userns.check(not_held=NOT_HELD), fix=True)))
        return 0
    spec = flags.spec_of(ns)
    if ns.sandbox:
        return _doctor_in_sandbox(spec, ns.profile, ns.cache, ns.json)
    given = sorted(k for k in spec if k != "workspace") + (["profile"] if ns.profile else [])
    if given:
        raise WarrenError(
            f"policy flags need --sandbox: {', '.join('--' + g.replace('_', '-') for g in given)}",
            operation="doctor",
            hint="add --sandbox to probe inside a sandbox built from them",
        )
    from ..doctor import probe_main

    try:
        text, code = probe_main.run(ns.workspace, ns.cache, as_json=ns.json, not_held=NOT_HELD)
    except probe_main.UsageError as e:
        raise WarrenError(str(e), operation="doctor", hint="pass an existing directory") from None
    print(text)
    return code


def _doctor_in_sandbox(spec: dict[str, object], profile: str | None, cache: list[str], as_json: bool) -> int:
    """The same probes, run by the same interpreter inside the sandbox the policy makes."""
    from ..doctor import carry

    # The doctor travels in the command line (any install location works); only the
    # interpreter must be visible. Under /tmp (the sandbox has a /tmp of its own) it is
    # shown read-only.
    python = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    shown = sorted({p for p in (prefix, os.path.dirname(python)) if within_tmp(p)})
    if shown:
        read = spec.get("read")
        spec = {**spec, "read": [*(read if isinstance(read, list) else []), *shown]}
    plan = _plan(spec, profile).plan
    workspace = str(plan["workspace"])
    groups = plan.get("groups") or []
    roots = (
        [r for g in groups if isinstance(g, dict) for r in g.get("roots", [])]
        if isinstance(groups, list)
        else []
    )
    # The sandbox's TMPDIR is made at launch under a name of its own: not a cache.
    scratch = plan.get("scratch")
    caches = list(cache) or [str(r) for r in roots if r not in (workspace, scratch)]
    # Resource limits are left out inside: there they would describe a sandbox nested in
    # this one, while this sandbox's own limits are what `warren doctor` on the host says.
    args = ["--only-given", "--no-limits", "--workspace", workspace]
    for c in caches:
        args += ["--cache", c]
    if as_json:
        args.append("--json")
    try:
        result = _run_doctor(carry.command(python, args), spec, profile, workspace)
    except (CommandNotFound, ExecError):
        raise WarrenError(
            f"the Python running warren ({python}) is not visible inside the sandbox",
            operation="doctor",
            path=python,
            hint="run warren with a Python the sandbox can see (outside /run and denied directories), "
            f"or show {os.path.dirname(python)} with --read",
        ) from None
    for w in result.warnings:
        print(f"warren: WARNING: {w}", file=sys.stderr)
    sys.stdout.buffer.write(result.stdout)
    sys.stdout.flush()
    sys.stderr.buffer.write(result.stderr)
    return result.exit_code


def within_tmp(path: str) -> bool:
    return path == "/tmp" or path.startswith("/tmp/")


def _run_doctor(argv: list[str], spec: dict[str, object], profile: str | None, workspace: str) -> Result:
    from ..client.local import LocalTransport
    from ..client.transport import Command
    from ..policy.spec import from_mapping

    command = Command(argv, workspace, output_limit=16 << 20)
    return LocalTransport().run(from_mapping(spec, "flags"), command, config=True, profile=profile)


COMMANDS: dict[str, Callable[[list[str]], int]] = {"plan": plan, "presets": presets, "doctor": doctor}
