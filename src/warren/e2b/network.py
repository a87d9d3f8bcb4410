"""E2B's egress rules (``network`` at create, ``PUT /sandboxes/ID/network``) mapped onto
warren's network policy. Pure: the routes in ``control`` apply what is planned here.

E2B's sandboxes reach the internet unless told otherwise; its rules deny addresses
(``denyOut``, ``0.0.0.0/0`` for all traffic) and allow destinations (``allowOut``: an
address, a network, a name or ``*.name``, on every port), allowed entries winning. warren
allows by list (``--network allow``: a proxy that reaches only the hosts its rules name,
every other destination refused), so:

- all traffic denied and some destinations allowed: ``network = "allow"`` with one rule
  per destination, on any port (``1.1.1.1`` is ``1.1.1.1:*``); nothing else is reached;
- all traffic denied and nothing allowed: ``network = "none"``;
- neither: the template's network (an E2B sandbox of ``base`` has none unless
  ``allow_internet_access`` opens it). Destinations allowed there get the list above, so
  what E2B promises reachable is; a sandbox opened to everything cannot also deny some
  addresses (warren's open network has no proxy to deny them): refused, never ignored.

``allowPublicTraffic`` concerns requests *to* the sandbox's ports through E2B's proxy,
which warren's E2B API does not serve (only envd and the code interpreter's kernel):
either value leaves nothing open, so both are accepted. Header transforms (``rules``),
an upstream ``egressProxy`` and ``maskRequestHost`` are refused with why.

Changes at run time replace the rules, as E2B's do: on a sandbox with a list, each
destination wanted is allowed (``net allow``, which also lifts an earlier deny of it) and
each one allowed before and no longer wanted is denied (a deny wins over the rules given
at create).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import PolicyError
from ..net.allowlist import parse_rule
from .core import E2BError

ALL_TRAFFIC = ("0.0.0.0/0", "::/0")
KNOWN = ("allowOut", "denyOut", "allowPublicTraffic", "egressProxy", "maskRequestHost", "rules")
REFUSED = {
    "rules": "header transforms need the proxy to open TLS, which warren's does not",
    "egressProxy": "an upstream proxy for the sandbox's traffic",
    "maskRequestHost": "rewriting the Host of requests to the sandbox's ports, which warren does not serve",
}


@dataclass
class Egress:
    """What a sandbox's network becomes: ``mode`` (None: the template's) and the rules."""

    mode: str | None = None
    allow: list[str] = field(default_factory=list)


def rule_of(entry: object, where: str) -> str:
    """warren's rule for an E2B destination: the same text on any port."""
    if not isinstance(entry, str) or not entry.strip():
        raise E2BError(400, f"{where}: each entry must be a non-empty string, not {entry!r}")
    text = entry.strip()
    rule = f"[{text}]:*" if ":" in text else f"{text}:*"
    try:
        parse_rule(rule, where)
    except PolicyError as e:
        raise E2BError(400, f"{e.message} (hint: {e.hint})") from None
    return rule


def _entries(config: Mapping[str, Any], key: str) -> list[object]:
    value = config.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise E2BError(400, f"network.{key} must be a list of strings")
    return value


def _parse(config: Mapping[str, Any], known: Iterable[str]) -> tuple[bool, list[str], list[str]]:
    """(all traffic denied, rules allowed, rules denied) of a network object."""
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise E2BError(400, f"network: unknown field {unknown[0]!r} (known: {', '.join(known)})")
    for key, what in REFUSED.items():
        if config.get(key) not in (None, "", {}, []):
            raise E2BError(400, f"network.{key} is not offered by warren's E2B API: {what}")
    public = config.get("allowPublicTraffic")
    if public is not None and not isinstance(public, bool):
        raise E2BError(400, "network.allowPublicTraffic must be true or false")
    denied = _entries(config, "denyOut")
    everything = [e for e in denied if isinstance(e, str) and e.strip() in ALL_TRAFFIC]
    allow = [rule_of(e, "network.allowOut") for e in _entries(config, "allowOut")]
    deny = [rule_of(e, "network.denyOut") for e in denied if e not in everything]
    deny_all = bool(everything)
    return deny_all, list(dict.fromkeys(allow)), list(dict.fromkeys(deny))


def at_create(config: object, internet: bool | None) -> Egress:
    """The egress of a sandbox created with E2B's ``network`` and
    ``allow_internet_access`` (``internet``)."""
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise E2BError(400, "network must be an object")
    deny_all, allow, deny = _parse(config, KNOWN)
    deny_all = deny_all or internet is False
    if deny_all:
        return Egress("allow", allow) if allow else Egress("none")
    if internet is True:
        if deny:
            raise E2BError(
                400,
                "network.denyOut of some addresses with the internet open is not offered by warren's "
                "E2B API: its open network has no proxy to deny them (hint: deny all traffic, "
                "0.0.0.0/0, and allow what the sandbox needs in allowOut)",
            )
        return Egress("open")
    return Egress("allow", allow) if allow else Egress()


@dataclass
class Update:
    """What a change at run time does: rules to allow, rules to deny."""

    allow: list[str] = field(default_factory=list)
    deny: list[str] = field(default_factory=list)


def at_update(config: object, listed: bool, current: Iterable[str]) -> Update:
    """The changes that make a running sandbox's rules E2B's ``config``: ``listed`` says
    whether it has warren's list (``network allow``), ``current`` the rules in force."""
    if not isinstance(config, dict):
        raise E2BError(400, "the request body must be a network object")
    internet = config.get("allow_internet_access")
    if internet is not None and not isinstance(internet, bool):
        raise E2BError(400, "allow_internet_access must be true or false")
    deny_all, allow, _ = _parse(config, (*KNOWN, "allow_internet_access"))
    deny_all = deny_all or internet is False
    if not listed:
        if allow or not deny_all:
            raise E2BError(
                400,
                "this sandbox was made without a network list (no allowOut at create), and warren "
                "starts no proxy in a running sandbox (hint: create it with network.denyOut "
                "['0.0.0.0/0'] and allowOut naming what it may reach)",
            )
        return Update()  # it reaches nothing: every denial already holds
    if not deny_all:
        raise E2BError(
            400,
            "opening a sandbox made with a network list to all traffic is not offered by warren's "
            "E2B API (hint: keep denyOut ['0.0.0.0/0'] and list what it may reach in allowOut)",
        )
    now = list(dict.fromkeys(current))
    return Update(allow=[r for r in allow if r not in now], deny=[r for r in now if r not in allow])
