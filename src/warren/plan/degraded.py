"""The degraded mode: a plan for a host where a sandbox can get no namespaces. Pure.

Where user namespaces are unavailable (a container or CI runner that forbids them:
the clone fails with ENOSPC or EPERM) or powerless (Ubuntu's AppArmor restriction:
the namespace is made, but holds no capability, so no mount can be made in it),
warren does not run the command unconfined and does not give up: it confines with
what needs no namespace, in the host's one mount view.

Held: Landlock for the filesystem (read and execute everywhere but the denied paths,
warren's state directory and the runtime socket directories; write only beneath the
writable roots and a private TMPDIR), Landlock's signal and abstract-socket scoping
and its ptrace rule, no_new_privs and no capabilities, seccomp's deny list, the
syscall broker (unix-socket connects and metadata changes only inside the writable
roots; no abstract unix address at all, the host's being in the same namespace),
network none as no IP socket at all (seccomp) and no TCP bind or connect (Landlock
ABI >= 4), network allow as connects to its proxy only and no listener (no TCP bind;
the broker refuses listen() on an IP socket not bound to loopback, which would bind it
to every address; seccomp refuses IP sockets but stream ones, so no UDP socket),
network open as anywhere but the host's loopback (the broker judges every connect
and send), rlimits and the caller's cgroups for limits. What cannot hold
is ``NOT_HELD``: said by ``warren plan``, ``warren doctor`` and a notice on the first
run. Without Landlock nothing would confine the filesystem: the plan is refused.
"""

from __future__ import annotations

import dataclasses
import errno
import posixpath
from collections.abc import Mapping

from ..errors import HostError
from ..net.allowlist import proxy_env
from ..policy import Policy
from ..policy import hostrun as _hostrun
from . import landlock as _landlock
from . import limits as _limits
from . import seccomp as _seccomp
from .env import credential_warnings, environment, passed
from .facts import CallerFacts, HostFacts
from .model import NetPlan, Plan
from .mounts import SCRATCH_PREFIX, strip_nested, within
from .tmpdir import cache_home, host_tmpdir

# Directories of the host's runtime sockets (dbus, the agent sockets of ssh and gpg,
# container engines): unreadable, and the broker refuses connecting to a socket there.
RUNTIME_DIRS = ("/run", "/var/run")

# (protection, what happens instead): what the full mode's namespaces give that
# nothing here can.
NOT_HELD: tuple[tuple[str, str], ...] = (
    (
        "private /tmp and /dev/shm",
        "the host's are seen read-only; TMPDIR is a private directory (mode 0700, a random name) made for "
        "the sandbox and removed after it",
    ),
    (
        "private /proc and pid view",
        "the host's processes are listed (their command lines too); reading their memory or environment, "
        "tracing and signalling them stay refused (Landlock)",
    ),
    (
        "own network namespace",
        "network none has no loopback of its own (no IP socket at all); network allow reaches only its "
        "proxy, on a port of the host's loopback, and listens nowhere (no TCP bind, no listen on an unbound "
        "socket, no UDP socket); network open refuses the host's loopback (its "
        "services, and servers the command starts there alike) but reaches the host's other addresses, "
        "so a service listening on all of them is reached there, and listens on any",
    ),
    (
        "hidden socket directories (a fresh /run)",
        "the files of the host's /run, /var/run and XDG_RUNTIME_DIR are unreadable and their sockets "
        "refused, but the directories can be listed",
    ),
    (
        "names in denied directories",
        "a denied directory (~/.ssh, ~/.aws, ...) can be listed: the names of its files show, never their "
        "content (Landlock grants listing from / down; in the full mode an empty mount covers it)",
    ),
    (
        "abstract unix sockets of its own",
        "every abstract address is refused (EACCES), the sandbox's own too: the host's live in the same "
        "namespace",
    ),
    (
        "paths denied or read-only inside a writable root",
        "a writable root is writable and readable as a whole (Landlock grants whole trees)",
    ),
    (
        "git directories kept by warren",
        "a repository's .git in a writable root is the host's own (hooks and config a command writes are "
        "what host git runs)",
    ),
    (
        "nothing outlives a crash",
        "a stop or the command's end kills every descendant, but if PID 1 or the supervisor is killed, "
        "processes outlive the sandbox unless it has a cgroup of its own (root, or a delegated cgroup2)",
    ),
    (
        "terminals made inside",
        "a command cannot open a new terminal (openpty: EACCES): its device nodes would be the host's "
        "/dev/pts, where your other sessions' terminals are (warren still gives a command run from a "
        "terminal one of its own)",
    ),
    (
        "own hostname and SysV IPC",
        "the host's (no UTS or IPC namespace)",
    ),
)


def unusable(state: tuple[str, int]) -> str | None:
    """Why namespaces cannot be had (None when they can), in a few words."""
    kind, err = state
    if kind == "usable":
        return None
    name = errno.errorcode.get(err, str(err))
    if kind == "powerless":
        return f"user namespaces are powerless here (a mount in one fails: {name}; AppArmor's restriction?)"
    return f"user namespaces are unavailable here (clone: {name})"


def refuse(policy: Policy, host: HostFacts, abi: int) -> None:
    """The degraded mode is not for this policy or host: a typed error saying why."""
    why = unusable(host.namespaces) or ""
    if policy.require_namespaces:
        raise HostError(
            f"{why}, and the policy requires them",
            operation="plan",
            hint="run warren where user namespaces work (see `warren doctor`), or drop "
            "--require-namespaces / require_namespaces to run in the degraded mode",
        )
    if abi < 1:
        raise HostError(
            f"{why}, and Landlock is unavailable: nothing could confine the filesystem",
            operation="plan",
            hint="enable Landlock (lsm=landlock in the kernel command line, Linux >= 5.13) or user "
            "namespaces; `warren doctor` says which is missing",
        )


def _with_proxy(env: dict[str, str], policy: Policy, port: int) -> dict[str, str]:
    """The proxy variables name the port chosen for this sandbox (an explicit --env of
    the policy still wins)."""
    if policy.network != "allow":
        return env
    if not port:
        raise HostError(
            "no port was chosen for the proxy of a sandbox without namespaces",
            operation="plan",
            hint="this is a bug in warren; please report it with the command you ran",
        )
    return {**env, **{k: v for k, v in proxy_env(port).items() if k not in policy.env}}


def scratch_dir(
    caller_env: Mapping[str, str], home: str, host: HostFacts, scratch_id: str
) -> tuple[str, str]:
    """(base, rel): the sandbox's private TMPDIR, a fresh name beneath the caller's
    TMPDIR, else beneath warren's directory in the caller's cache."""
    tmp = host_tmpdir(caller_env)
    if host.kind(tmp) == "dir" and tmp in host.writable_dirs:
        return tmp, SCRATCH_PREFIX + scratch_id
    return cache_home(caller_env, home), posixpath.join("warren", "tmp", scratch_id)


def make(
    policy: Policy,
    host: HostFacts,
    caller: CallerFacts,
    *,
    abi: int,
    cwd: str,
    scratch_id: str,
    state_dir_denied: list[tuple[str, str]],
) -> Plan:
    """The degraded plan: no mounts, Landlock over the host's own view."""
    refuse(policy, host, abi)
    writable = [str(r.path) for r in policy.writable]
    base, rel = scratch_dir(caller.env, caller.home, host, scratch_id)
    scratch = posixpath.join(base, rel)
    roots = strip_nested([*writable, scratch])
    hidden = [*RUNTIME_DIRS, caller.env.get("XDG_RUNTIME_DIR", "")]
    unreadable = sorted(
        {
            p
            for p in [*(str(r.path) for r in policy.denied), *(p for p, _src in state_dir_denied), *hidden]
            if p.startswith("/") and not any(within(p, w) for w in roots)
        }
    )
    devices = tuple(
        f"/dev/{n}" for n in ("null", "zero", "full", "tty") if host.kind(f"/dev/{n}") != "missing"
    )
    ll = _landlock.plan(abi, roots, (), devices, tuple(unreadable))
    # The host's /dev/pts: its terminals are other sessions' (a command's own arrives open).
    rules = tuple(r for r in ll.rules if r.path != "/dev/pts")
    # TCP bind refused but under network open; connect too under none (connects are made
    # by the broker, which judges every address itself: ``_core.broker.places``).
    handled_net = 0
    if abi >= 4 and policy.network != "open":
        handled_net = _landlock.NET_BIND_TCP | (_landlock.NET_CONNECT_TCP if policy.network == "none" else 0)
    landlock = _landlock.LandlockPlan(ll.abi, ll.handled, ll.scoped, rules, handled_net)
    limits = _limits.plan(policy.limits, host.cgroups, host.mem_total, host.cpus)
    warnings = [f"{unusable(host.namespaces)}: degraded mode (see `warren plan` for what it cannot hold)"]
    if abi < 6:
        warnings.append(
            f"Landlock ABI {abi} (< 6): commands can signal your other processes and reach abstract unix "
            "sockets (scoping needs Linux >= 6.12)"
        )
    inside = [
        str(r.path)
        for r in (*policy.denied, *policy.readable)
        if any(within(str(r.path), w) for w in roots) and str(r.path) not in roots
    ]
    if inside:
        warnings.append(
            f"not held in the degraded mode: {', '.join(sorted(inside))} (denied or read-only inside a "
            "writable root)"
        )
    secrets = [path for path, _dev, _ino, secret in host.outside_links if secret]
    if secrets:
        warnings.append(
            f"not held in the degraded mode: {', '.join(secrets[:5])} (hard links to denied files, readable "
            "under their names in a writable root)"
        )
    if policy.network == "open":
        warnings.append(
            "network open without namespaces: the host's loopback is refused (its services, and servers "
            "the command starts there alike); the host's other addresses are reached, and the command may "
            "listen where the network reaches it"
        )
    warnings.extend(credential_warnings(passed(policy, caller.env)[1]))
    warnings.extend(_hostrun.warnings(policy.writable, policy.host_run))
    warnings.extend(_limits.unenforced(limits))
    return Plan(
        mounts=(),
        landlock=landlock,
        seccomp=_seccomp.build(
            allow_nested=policy.allow_nested,
            local_sockets_only=policy.network == "none",
            ip_streams_only=policy.network == "allow",
        ),
        uid=caller.uid,
        gid=caller.gid,
        env=_with_proxy(environment(policy, caller.env, caller.home, scratch), policy, host.proxy_port),
        workspace=str(policy.workspace),
        cwd=cwd,
        net=dataclasses.replace(
            NetPlan.of(policy), proxy_port=host.proxy_port if policy.network == "allow" else 0
        ),
        cap_last_cap=host.cap_last_cap,
        create_dirs=tuple(str(r.path) for r in policy.writable if r.create),
        unshare=tuple((path, dev, ino) for path, dev, ino, secret in host.outside_links if not secret),
        scratch=scratch,
        scratch_base=base,
        # Each root is its own place for the broker: no mount is shared, none guarded.
        groups=tuple((root, (root,)) for root in roots),
        warnings=tuple(warnings),
        limits=limits,
        namespaces=False,
        not_held=NOT_HELD,
    )
