"""Policy: what a sandbox may see and do, as plain validated data.

Owns the meaning of every policy field and its validation. Validation reads the
filesystem only to check that named paths exist (``stat``); it makes no mount,
namespace or Landlock call. ``resolve.build`` turns a ``PolicySpec`` into one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import PolicyError
from ..net import allowlist as _allowlist
from ..net import secrets as _secrets
from . import lookups as _lookups
from .limits import Limits
from .presets import is_credential_name
from .spec import PolicySpec

if TYPE_CHECKING:
    from .hostrun import HostRun

NETWORK_MODES = ("none", "allow", "open")

# Which certificates to trust: the variables naming a CA file or directory (file names,
# not secrets). Without them uv, pip, npm, git and curl fail TLS behind a corporate or
# CI proxy with its own CA.
CA_VARIABLES = (
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "NIX_SSL_CERT_FILE",
)

# The locale's categories by name (POSIX's, then glibc's): a locale needs these, and
# "LC_*" as a pattern also passed whatever else a caller named so (LC_PRIVATE_TOKEN).
LOCALE_VARIABLES = (
    "LC_ALL",
    "LC_CTYPE",
    "LC_COLLATE",
    "LC_MESSAGES",
    "LC_MONETARY",
    "LC_NUMERIC",
    "LC_TIME",
    "LC_ADDRESS",
    "LC_IDENTIFICATION",
    "LC_MEASUREMENT",
    "LC_NAME",
    "LC_PAPER",
    "LC_TELEPHONE",
)

# Passed from the caller's environment unless the policy says otherwise.
DEFAULT_ENV_PASS = (
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "SHELL",
    "TERM",
    "COLORTERM",
    "LANG",
    "LANGUAGE",
    *LOCALE_VARIABLES,
    "TZ",
    "NO_COLOR",
    "FORCE_COLOR",
    "COLUMNS",
    "LINES",
    *CA_VARIABLES,
    "UV_NATIVE_TLS",
    "UV_SYSTEM_CERTS",  # uv's newer name for UV_NATIVE_TLS
)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Where developer tools, clouds, registries, forges, browsers and agents keep secrets
# in a home: unreadable by default, whether they exist when the sandbox starts or are
# created later (docs/security.md, "What is hidden", lists them with their owners).
DEFAULT_DENIED = (
    # keys and agents
    "~/.ssh",
    "~/.gnupg",
    "~/.password-store",
    "~/.local/share/keyrings",
    "~/.config/op",
    "~/.vault-token",
    # clouds and infrastructure
    "~/.aws",
    "~/.azure",
    "~/.config/gcloud",
    "~/.oci",
    "~/.kube",
    "~/.docker",
    "~/.dockercfg",
    "~/.config/doctl",
    "~/.terraform.d/credentials.tfrc.json",
    "~/.config/rclone",
    "~/.s3cfg",
    "~/.boto",
    "~/.fly",
    "~/.local/share/com.vercel.cli",
    "~/.netlify",
    # package registries
    "~/.netrc",
    "~/.pypirc",
    "~/.local/share/uv/credentials",
    "~/.npmrc",
    "~/.yarnrc",
    "~/.yarnrc.yml",
    "~/.cargo/credentials",
    "~/.cargo/credentials.toml",
    "~/.gem/credentials",
    "~/.m2/settings.xml",
    "~/.gradle/gradle.properties",
    "~/.cache/huggingface/token",
    "~/.huggingface/token",
    # forges and git
    "~/.git-credentials",
    "~/.config/git/credentials",
    "~/.config/gh",
    "~/.config/hub",
    "~/.config/glab-cli",
    # databases
    "~/.pgpass",
    "~/.my.cnf",
    # warren serve's token where earlier docs put it (its default is the state directory now)
    "~/.warren-token",
    # AI agents and editors
    "~/.claude",
    "~/.claude.json",
    "~/.codex",
    "~/.gemini",
    "~/.config/github-copilot",
    # browsers (cookies, saved passwords)
    "~/.mozilla",
    "~/.config/google-chrome",
    "~/.config/chromium",
)

# The system's own secrets: password and group hashes (and the backups the tools keep),
# sudo rules, SSH host private keys (the .pub files stay readable), TLS and Kerberos
# keys, VPN and network secrets, systemd's credentials. Permissions keep them from other
# users, but not from a root caller's sandbox (its uid 0 owns them), so they are denied
# like the home's. ``*`` in a name is expanded when the policy is built (the deny
# mechanism has no globs): the usual host key names are listed too, so those stay
# hidden when created after the sandbox started.
SYSTEM_DENIED = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/security/opasswd",
    "/var/backups/shadow.bak",
    "/var/backups/gshadow.bak",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private",
    "/etc/pki/tls/private",
    "/etc/letsencrypt/archive",
    "/etc/letsencrypt/live",
    "/etc/krb5.keytab",
    "/etc/wireguard",
    "/etc/NetworkManager/system-connections",
    "/etc/ipsec.secrets",
    "/etc/ppp/chap-secrets",
    "/etc/ppp/pap-secrets",
    "/etc/credstore",
    "/etc/credstore.encrypted",
    "/var/lib/systemd/credential.secret",
)

# The spec's key for a Policy's list of roots (named in an error).
_SPEC_KEY = {"writable": "write", "readable": "read", "denied": "deny"}

# Writable roots here would hand the sandbox the kernel or the device tree.
_FORBIDDEN_WRITABLE = ("/proc", "/sys", "/dev")


@dataclass(frozen=True)
class Root:
    """A path the policy names, with where the grant came from (shown in the plan)."""

    path: Path
    source: str
    create: bool = False

    def refused(self, problem: str, hint: str) -> PolicyError:
        """This rule cannot hold: the error names its source and path."""
        return PolicyError(f"{self.source}: {problem}", operation="policy", path=str(self.path), hint=hint)


@dataclass(frozen=True)
class Policy:
    workspace: Path
    writable: tuple[Root, ...] = ()
    readable: tuple[Root, ...] = ()
    denied: tuple[Root, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    env_pass: tuple[str, ...] = DEFAULT_ENV_PASS
    # What presets pass: their tools' settings, never a name that looks like a
    # credential (see ``presets.is_credential_name``) unless ``env_pass`` names it too.
    preset_env_pass: tuple[str, ...] = ()
    preset_env_patterns: tuple[str, ...] = ()
    network: str = "none"
    # ``network = "ask"``: network "allow", and a connection to an unlisted host waits
    # this many seconds for the owner's answer (``net.live``); None: refused at once.
    ask_timeout: float | None = None
    presets: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    resolve: Mapping[str, str] = field(default_factory=dict)
    allow_nested: bool = False
    limits: Limits = field(
        default_factory=Limits
    )  # as set (flags, config); the planner fills in the defaults
    # On an image (docs/images.md): its name or a root directory, and the writable
    # layer's size in bytes (None: the machine's default, ``plan.envroot``).
    image: str | None = None
    disk: int | None = None
    host_workspace: bool = True  # False: on an image, /workspace is in the sandbox's layer
    # Where the sandbox sees its workspace, when not at its host path (``plan.place``).
    workspace_at: str | None = None
    # ``workspace_at`` is a symbolic link to the workspace at its host path, not a mount.
    workspace_link: bool = False
    from_snapshot: str | None = None  # on a snapshot's image and layer (server.snapshots)
    # Secrets the proxy puts in, and HTTP rules of intercepted hosts, as written
    # (``net.secrets``): only with ``network == "allow"``, only for allowed hosts.
    secrets: tuple[str, ...] = ()
    http_rules: tuple[str, ...] = ()
    # The spec this policy was resolved from: what a client sends, so the supervisor
    # resolves the same policy for the same caller.
    spec: PolicySpec = field(default_factory=PolicySpec, compare=False)
    # Refuse to start without namespaces rather than run in the degraded mode.
    require_namespaces: bool = False
    # Review mode (``plan.mounts``: the workspace is an overlay whose upper layer lies in
    # warren's state directory; ``server.review`` shows and applies it).
    review: bool = False
    # Where this caller's host runs programs from (``hostrun``): a writable root that
    # reaches one is warned about in the plan.
    host_run: tuple[HostRun, ...] = ()
    # (variable, host directory, name): a preset tool's home of installed programs. The
    # sandbox's tool gets a private one (``$TMPDIR/name``) unless a root grants the host's.
    private_homes: tuple[tuple[str, Path, str], ...] = ()

    def __post_init__(self) -> None:
        # A Policy made by hand (``build`` makes one from a spec) may name its workspace
        # as a string; anything else is refused by name, not with a traceback.
        if not isinstance(self.workspace, Path):
            if not isinstance(self.workspace, str | os.PathLike):
                raise PolicyError(
                    f"workspace must be a path, not {type(self.workspace).__name__}",
                    operation="policy",
                    hint='pass e.g. Policy(workspace=Path("/path")), or PolicySpec(workspace="/path")',
                )
            object.__setattr__(self, "workspace", Path(self.workspace))
        lists = {"writable": self.writable, "readable": self.readable, "denied": self.denied}
        for what, roots in lists.items():
            for root in roots:
                if not isinstance(root, Root):
                    raise PolicyError(
                        f"{what} entries must be Root(path, source), not {type(root).__name__}: {root!r}",
                        operation="policy",
                        hint=f'pass paths in a spec instead: PolicySpec({_SPEC_KEY[what]}=["/path"])',
                    )
        self._validate()

    # -- validation ------------------------------------------------------------

    def _validate(self) -> None:
        _require_dir(self.workspace, "workspace")
        if self.network not in NETWORK_MODES:
            raise PolicyError(
                f"unknown network mode {self.network!r}",
                operation="policy",
                hint=f"use one of: {', '.join(NETWORK_MODES)} (a spec's ask is allow with ask_timeout)",
            )
        # Parsed here so a bad entry is an error before anything starts.
        _allowlist.parse_rules(self.allowed_hosts)
        _allowlist.parse_resolve(self.resolve)
        self._validate_secrets()
        for root in (*self.writable, *self.readable, *self.denied):
            if not root.path.is_absolute():
                raise root.refused(
                    f"path must be absolute: {root.path}", "write it as an absolute path or start it with ~/"
                )
        for root in (*self.writable, *self.readable):
            if not root.create and not _lookups.lexists(root.path):
                raise root.refused(
                    f"path does not exist: {root.path}", "create it first, or remove it from the policy"
                )
        for root in self.denied:
            if root.source != "default" and not _lookups.lexists(root.path):
                raise root.refused(
                    f"denied path does not exist: {root.path}",
                    "check the spelling; a deny rule that matches nothing protects nothing",
                )
        for root in self.writable:
            for forbidden in _FORBIDDEN_WRITABLE:
                if is_within(root.path, Path(forbidden)):
                    raise root.refused(
                        f"{root.path} cannot be writable",
                        f"{forbidden} is the kernel's; the sandbox gets its own",
                    )
            for deny in self.denied:
                if is_within(root.path, deny.path):
                    raise root.refused(
                        f"writable path {root.path} is inside denied path {deny.path} ({deny.source})",
                        "remove one of the two rules; a denied path hides everything below it",
                    )
        for name in (*self.env, *self.env_pass, *self.preset_env_pass):
            if not _ENV_NAME.fullmatch(name):
                raise PolicyError(
                    f"invalid environment variable name {name!r}",
                    operation="policy",
                    hint="names are letters, digits and _, not starting with a digit",
                )

    def _validate_secrets(self) -> None:
        secrets = _secrets.parse_secrets(self.secrets)
        rules = _secrets.parse_http_rules(self.http_rules)
        if (secrets or rules) and self.network != "allow":
            what = f"secret {secrets[0].name}" if secrets else f"HTTP rule {rules[0].text!r}"
            raise PolicyError(
                f"{what} needs --network allow (the network mode is {self.network!r})",
                operation="policy",
                hint="secrets and HTTP rules are applied by the allowlist proxy: use --network allow "
                "with --allow-host for their hosts",
            )
        _secrets.check_hosts_allowed(secrets, rules, self.allowed_rules)

    # -- derived views -----------------------------------------------------------

    @property
    def secret_rules(self) -> tuple[_secrets.SecretRule, ...]:
        return _secrets.parse_secrets(self.secrets)

    @property
    def http_rule_list(self) -> tuple[_secrets.HttpRule, ...]:
        return _secrets.parse_http_rules(self.http_rules)

    @property
    def allowed_rules(self) -> tuple[_allowlist.HostRule, ...]:
        return _allowlist.parse_rules(self.allowed_hosts)

    def passes_env(self, name: str) -> bool:
        return self.passes_explicitly(name) or self.passes_by_preset(name)

    def passes_explicitly(self, name: str) -> bool:
        """Passed by default or because the caller named it (not only by a preset)."""
        return name in self.env_pass

    def passes_by_preset(self, name: str) -> bool:
        if not (name in self.preset_env_pass or any(re.fullmatch(p, name) for p in self.preset_env_patterns)):
            return False  # asked first: with no preset, every variable of the caller stops here
        return not is_credential_name(name)


def is_within(path: Path, parent: Path) -> bool:
    p, q = str(path), str(parent)
    if p.startswith("/") and q.startswith("/") and not p.startswith("//") and not q.startswith("//"):
        # The common case, as strings: walking ``path.parents`` builds a Path per
        # ancestor, and planning asks this hundreds of times per sandbox.
        return p == q or p.startswith(q if q == "/" else q + "/")
    return path == parent or parent in path.parents


def _require_dir(path: Path, what: str) -> None:
    def refused(problem: str, hint: str) -> PolicyError:
        return PolicyError(f"{what} {problem}: {path}", operation="policy", path=str(path), hint=hint)

    if not path.is_absolute():
        raise refused("must be an absolute path", "pass an absolute path")
    _lookups.looked_up(path)
    if not path.exists():
        raise refused("does not exist", f"create it (mkdir -p {path}) or pass another --workspace")
    if not path.is_dir():
        raise refused("is not a directory", "the workspace must be a directory")
