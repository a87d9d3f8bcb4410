"""The sandbox's environment: an allowlist of the caller's, plus what warren sets. Pure.

Tokens and keys in the caller's shell are not inherited by accident: only names the
policy passes (``Policy.passes_env``) come through, then warren's own (TMPDIR, the
proxy variables of ``--network allow``), then the policy's explicit values.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..net.allowlist import proxy_env
from ..policy import Policy

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin"


def environment(policy: Policy, caller_env: Mapping[str, str], home: str, tmpdir: str) -> dict[str, str]:
    env = {k: v for k, v in caller_env.items() if policy.passes_env(k)}
    env.setdefault("PATH", DEFAULT_PATH)
    env.setdefault("HOME", home)
    env["TMPDIR"] = tmpdir
    env["WARREN_SANDBOX"] = "1"
    if policy.network == "allow":
        env.update(proxy_env())
    env.update(policy.env)
    return env
