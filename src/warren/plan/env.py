"""The sandbox's environment: an allowlist of the caller's, plus what warren sets. Pure.

Tokens and keys in the caller's shell are not inherited by accident: only names the
policy passes (``Policy.passes_env``) come through, then warren's own (TMPDIR, the
proxy variables of ``--network allow``), then the policy's explicit values.

A preset passes its tool's settings, index URLs included; a URL that carries a
user name or password (``https://user:pass@host/simple``) is passed *without* them,
with a warning: credentials reach a sandbox only when the caller passes the
variable explicitly (``--pass-env NAME``) or sets it (``--env NAME=VALUE``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from ..net.allowlist import proxy_env
from ..policy import Policy
from ..policy.model import is_within

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"

# scheme://userinfo@ : the userinfo (anything up to the first @ before a / or space).
_URL_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def strip_url_credentials(value: str) -> str:
    """Every URL in ``value`` (lists separated by spaces or commas too) without userinfo."""
    return _URL_USERINFO.sub(lambda m: m.group("scheme"), value)


def passed(policy: Policy, caller_env: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The caller's variables the policy passes, and the names whose URL credentials
    were left out."""
    env: dict[str, str] = {}
    stripped: list[str] = []
    for name, value in caller_env.items():
        if policy.passes_explicitly(name):
            env[name] = value
        elif policy.passes_by_preset(name):
            clean = strip_url_credentials(value)
            if clean != value:
                stripped.append(name)
            env[name] = clean
    return env, sorted(stripped)


def credential_warnings(stripped: list[str]) -> list[str]:
    if not stripped:
        return []
    names = ", ".join(stripped)
    return [
        f"{names}: URL credentials (user:password@) left out of the sandbox; pass "
        f"{'it' if len(stripped) == 1 else 'them'} with --pass-env NAME to let the sandbox use them"
    ]


def environment(policy: Policy, caller_env: Mapping[str, str], home: str, tmpdir: str) -> dict[str, str]:
    env, _ = passed(policy, caller_env)
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", home)
    env["TMPDIR"] = tmpdir
    env["WARREN_SANDBOX"] = "1"
    if policy.network == "allow":
        env.update(proxy_env())
    env.update(private_homes(policy, tmpdir))
    env.update(policy.env)
    return env


def private_homes(policy: Policy, tmpdir: str) -> dict[str, str]:
    """A preset tool's home of installed programs, private to the sandbox: the host's is
    read-only there (the host runs what it holds), yet ``uvx``, ``pipx run`` and
    pre-commit need theirs writable merely to run. Unless a writable root grants the
    host's, the tool is pointed at a directory in the sandbox's TMPDIR, which it makes."""
    return {
        var: f"{tmpdir}/{name}"
        for var, host, name in policy.private_homes
        if not any(is_within(host, root.path) for root in policy.writable)
    }
