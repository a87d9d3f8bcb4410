"""The secrets part of a plan: placeholders, the sandbox's trust bundle, its variables. Pure.

With ``--secret`` or ``--allow-http`` the proxy terminates TLS for some hosts with a
CA of the sandbox's own (``net.tlsca``), so the sandbox must trust it: the host's
system bundle file is covered, inside, by a bundle the launch writes on the host
(``trust_bundle``: the caller's trust plus that CA's certificate), and every tool's
own variable points at it. Each secret's variable holds a placeholder
(``net.secrets.placeholder``); the real value is read at launch, for the proxy only,
and never appears in a plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..net.secrets import HttpRule, PlacedSecret, placeholder
from ..policy import Policy
from ..policy.model import CA_VARIABLES
from .model import MountKind, MountOp

# Where distributions keep the system's bundle (the first that is a file is covered).
SYSTEM_BUNDLES = (
    "/etc/ssl/certs/ca-certificates.crt",  # Debian, Ubuntu, Alpine, Arch
    "/etc/pki/tls/certs/ca-bundle.crt",  # Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",  # openSUSE
)
# What Python (ssl, requests, pip), curl, git, Node, cargo and uv read for trust, set to
# the bundle: the CA variables but the directory (SSL_CERT_DIR) and Nix's. Node and uv
# otherwise trust only their own built-in roots.
TRUST_VARIABLES = tuple(v for v in CA_VARIABLES if v not in ("SSL_CERT_DIR", "NIX_SSL_CERT_FILE"))


@dataclass(frozen=True)
class SecretsPlan:
    secrets: tuple[PlacedSecret, ...]
    http_rules: tuple[HttpRule, ...]
    env: dict[str, str]
    mounts: tuple[MountOp, ...]
    bundle_target: str | None
    warnings: tuple[str, ...]


def plan_secrets(
    policy: Policy, nonce: str, trust_bundle: str | None, system_bundle: str | None
) -> SecretsPlan:
    """``nonce``: fresh randomness for this sandbox's placeholders; ``trust_bundle``:
    the host file the launch will write (None: nothing to mount, e.g. a plan only
    shown); ``system_bundle``: the host's bundle file (None: the host has none)."""
    rules = policy.secret_rules
    http = policy.http_rule_list
    if not rules and not http:
        return SecretsPlan((), (), {}, (), None, ())
    placed = tuple(PlacedSecret(r.name, placeholder(r.name, nonce), r.hosts, r.source) for r in rules)
    env = {s.name: s.placeholder for s in placed}
    mounts: list[MountOp] = []
    warnings: list[str] = []
    target = system_bundle or SYSTEM_BUNDLES[0]
    if system_bundle is None:
        warnings.append(
            "no system certificate bundle on this host: only tools that read SSL_CERT_FILE and the "
            "other trust variables will accept the proxy's certificates for secret hosts"
        )
    if trust_bundle is not None and system_bundle is not None:
        mounts.append(
            MountOp(
                MountKind.BIND_RO,
                system_bundle,
                trust_bundle,
                why="the trust bundle: the caller's CAs plus this sandbox's proxy CA (secrets)",
            )
        )
    env.update(dict.fromkeys(TRUST_VARIABLES, target))
    return SecretsPlan(placed, http, env, tuple(mounts), target, tuple(warnings))
