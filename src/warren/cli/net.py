"""``warren net NAME show|allow|deny|pending|approve|reject``: a running sandbox's
network policy, changed while it runs, and the answers to ``--network ask``."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable

from ..client.local import LocalTransport
from ..models import NetPolicy
from ..names import check_name
from ..terminal import printable
from . import flags

_ACTIONS = ("show", "allow", "deny", "pending", "approve", "reject")


def net(args: list[str]) -> int:
    p = flags.parser(
        "warren net",
        "A running sandbox's network policy (--network allow or ask): show it; allow or deny "
        "HOST[:PORT] from the next connection on (connections already open stay; checked as "
        "--allow-host is at create); list the connections waiting under --network ask and "
        "approve (--always: for the sandbox's life) or reject one. Every change is a record "
        "of `warren logs --net NAME`.",
    )
    p.add_argument("--json", action="store_true", help="the policy as one JSON object")
    p.add_argument(
        "--always", action="store_true", help="approve: allow the host and port for the sandbox's life"
    )
    p.add_argument("name")
    p.add_argument("action", choices=_ACTIONS, nargs="?", default="show")
    p.add_argument(
        "target", nargs="?", metavar="HOST[:PORT]|ID", help="allow, deny: a rule; approve, reject: an id"
    )
    ns = p.parse_args(args)
    name = check_name(ns.name)
    rule, request_id = "", 0
    if ns.action in ("allow", "deny"):
        rule = _needed(ns, "HOST[:PORT]", f"warren net {name} {ns.action} pypi.org")
    elif ns.action in ("approve", "reject"):
        raw = _needed(ns, "ID", f"warren net {name} pending")
        if not raw.isdigit():
            raise flags.UsageError(
                f"warren net {ns.action}: {raw!r} is not a request id",
                operation="cli",
                hint=f"the ids are the numbers `warren net {name} pending` lists",
            )
        request_id = int(raw)
    elif ns.target is not None:
        raise flags.UsageError(
            f"warren net {ns.action} takes no argument (got {ns.target!r})",
            operation="cli",
            hint=f"`warren net {name} allow HOST` adds a host",
        )
    if ns.always and ns.action != "approve":
        raise flags.UsageError(
            "--always goes with approve", operation="cli", hint=f"warren net {name} approve --always ID"
        )
    policy = LocalTransport().net_policy(
        name, ns.action, rule=rule, request_id=request_id, always=ns.always, via="cli"
    )
    if ns.json:
        print(json.dumps(dataclasses.asdict(policy), indent=2))
    elif ns.action == "pending":
        _pending(policy, name)
    else:
        _show(policy)
    return 0


def _needed(ns: object, what: str, example: str) -> str:
    target = getattr(ns, "target", None)
    action = getattr(ns, "action", "")
    if target is None:
        raise flags.UsageError(f"warren net {action} needs {what}", operation="cli", hint=f"e.g. {example}")
    return str(target)


def _show(policy: NetPolicy) -> None:
    mode = policy.mode + (
        f" (unlisted hosts wait {policy.ask_timeout:g} s for an answer)" if policy.mode == "ask" else ""
    )
    print(f"network: {mode}")
    for title, rules in (
        ("allowed at create", policy.allowed),
        ("allowed since", policy.added),
        ("denied since", policy.denied),
    ):
        if rules:
            print(f"{title}:")
            for rule in rules:
                print(f"  {printable(rule)}")
    if policy.pending:
        print(f"pending: {len(policy.pending)} (warren net NAME pending)")


def _pending(policy: NetPolicy, name: str) -> None:
    if not policy.pending:
        print("no connection is waiting for an answer")
        return
    print(f"{'ID':>4}  {'AGE':>6}  WAITING  TARGET")
    for p in policy.pending:
        target = printable(f"{p.method} {p.host}:{p.port}")
        process = f"  ({printable(p.process)})" if p.process else ""
        print(f"{p.id:>4}  {p.age:>5.0f}s  {p.waiting:>7}  {target}{process}")
    print(f"answer with `warren net {name} approve [--always] ID` or `warren net {name} reject ID`")


COMMANDS: dict[str, Callable[[list[str]], int]] = {"net": net}
