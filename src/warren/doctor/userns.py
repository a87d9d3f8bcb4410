"""The doctor's namespaces section: can a sandbox get user namespaces here, and if not,
why, what the degraded mode holds without them, and how to fix it. Standard library
only, like the rest of the doctor.

Judged by the effect, as warren's planner does: a child makes a user and mount
namespace and a mount in it. Refused (a container or CI runner that forbids them:
ENOSPC, EPERM): *unavailable*. Made, but the mount fails (EPERM, EACCES): *powerless*,
which on Ubuntu >= 23.10 is AppArmor's restriction
(``kernel.apparmor_restrict_unprivileged_userns = 1``): the namespace is given no
capability unless the process runs under an AppArmor profile that allows ``userns``.
The fix a distribution package makes is to install such a profile (shipped in
``packaging/apparmor/``); ``warren doctor --fix`` prints the root commands, never runs
them.
"""

from __future__ import annotations

import errno as _errno
import os
import sys
from collections.abc import Callable, Sequence

from . import _kernel

SYSCTL = "/proc/sys/kernel/apparmor_restrict_unprivileged_userns"
PROFILE_NAME = "warren"
PROFILE_DIR = "/etc/apparmor.d"
# The supervisor's own interpreter copy, which the profile attaches to
# (``client.connect.LAUNCHER_DIR``; the doctor imports nothing of warren's).
LAUNCHER_DIR = "/usr/lib/warren"
SECTION = "namespaces"

Probe = Callable[[], tuple[str, int]]


def probe() -> tuple[str, int]:
    """("usable", 0), ("unavailable", errno) or ("powerless", errno): a forked child
    unshares a user and a mount namespace and changes a mount's propagation (which
    needs CAP_SYS_ADMIN in the new namespace)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(r)
            try:
                _kernel.unshare(_kernel.CLONE_NEWUSER | _kernel.CLONE_NEWNS)
            except OSError as e:
                os.write(w, f"unavailable {e.errno}".encode())
                raise SystemExit from None
            try:
                _kernel.mount(None, "/", None, MS_REC | MS_PRIVATE)
            except OSError as e:
                os.write(w, f"powerless {e.errno}".encode())
                raise SystemExit from None
            os.write(w, b"usable 0")
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        said = f.read().decode()
    os.waitpid(pid, 0)
    state, _, err = said.partition(" ")
    return (state, int(err)) if state else ("unavailable", 0)


MS_REC = 0x4000
MS_PRIVATE = 1 << 18


def read_sysctl(path: str = SYSCTL) -> str | None:
    """The AppArmor restriction's setting ("0", "1"), None where the kernel has none."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def fix_commands(state: str, sysctl: str | None, source: str | None) -> list[str]:
    """The root commands that give warren its namespaces back; empty when there is
    none this host can be given (a container that forbids them: its runtime's
    settings decide)."""
    if state == "powerless" and sysctl == "1":
        src = source or "packaging/apparmor/warren"
        v = sys.version_info
        return [
            f"install -D -m 0755 {os.path.realpath(sys.executable)} {LAUNCHER_DIR}/python{v.major}.{v.minor}",
            f"install -m 0644 {src} {PROFILE_DIR}/{PROFILE_NAME}",
            f"apparmor_parser -r {PROFILE_DIR}/{PROFILE_NAME}",
        ]
    return []


def shipped_profile() -> str | None:
    """The profile in this installation, if it has one (a source checkout or a
    distribution package)."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (
        os.path.join(here, "..", "..", "..", "packaging", "apparmor", PROFILE_NAME),
        os.path.join(sys.prefix, "share", "warren", "apparmor", PROFILE_NAME),
    ):
        if os.path.isfile(candidate):
            return os.path.normpath(candidate)
    return None


def check(
    sysctl_path: str = SYSCTL,
    run_probe: Probe = probe,
    landlock_abi: int | None = None,
    not_held: Sequence[tuple[str, str]] = (),
) -> dict[str, object]:
    """The section as data (the report's ``namespaces`` key). ``sysctl_path`` and
    ``run_probe`` are parameters so a test can stand in for a host with AppArmor's
    restriction. ``not_held``: what the degraded mode cannot hold, (protection, what
    happens instead), from the planner (``warren doctor`` passes it: the doctor
    imports nothing of warren's)."""
    state, err = run_probe()
    sysctl = read_sysctl(sysctl_path)
    abi = _kernel.landlock_abi() if landlock_abi is None else landlock_abi
    if state == "usable":
        mode, why = "full", "user namespaces work: every sandbox gets its own namespaces"
    elif abi < 1:
        mode, why = (
            "refused",
            "no user namespaces and no Landlock: warren refuses to run (nothing would confine)",
        )
    else:
        mode, why = "degraded", "sandboxes run in the degraded mode (Landlock, seccomp, no namespaces)"
    name = _errno.errorcode.get(err, str(err))
    if state == "powerless" and sysctl == "1":
        cause = (
            "AppArmor restricts unprivileged user namespaces "
            "(kernel.apparmor_restrict_unprivileged_userns = 1): the namespace is made but holds no "
            "capability, unless warren runs under a profile that allows it"
        )
    elif state == "powerless":
        cause = f"a mount in a new user namespace fails ({name}): a security module refuses it"
    elif state == "unavailable":
        cause = (
            f"creating a user namespace fails ({name}): a container or CI runner that forbids them "
            "(seccomp, user.max_user_namespaces = 0), or a kernel without them; its settings decide"
        )
    else:
        cause = ""
    source = shipped_profile()
    return {
        "state": state,
        "errno": err,
        "errno_name": _errno.errorcode.get(err, "") if err else "",
        "apparmor_restrict_unprivileged_userns": sysctl,
        "mode": mode,
        "summary": why,
        "cause": cause,
        "not_held": [] if mode == "full" else [{"protection": p, "instead": i} for p, i in not_held],
        "fix": fix_commands(state, sysctl, source),
        "profile": source,
    }


def render(section: dict[str, object], *, fix: bool = False) -> list[str]:
    """The section for people; with ``fix``, only the commands (for a root shell)."""
    commands = section["fix"]
    assert isinstance(commands, list)
    if fix:
        if not commands:
            return [
                "# nothing to fix for user namespaces here"
                + (f": {section['cause']}" if section["cause"] else "")
            ]
        return [
            "# run as root: the AppArmor profile that lets warren's supervisor use user namespaces",
            *commands,
            "# then, as yourself: warren shutdown (the next supervisor starts under the profile)",
        ]
    state = section["state"]
    out = ["", f"user namespaces: {state}" + (f" ({section['errno_name']})" if section["errno_name"] else "")]
    out.append(f"  {section['summary']}")
    if section["cause"]:
        out.append(f"  why: {section['cause']}")
    not_held = section["not_held"]
    assert isinstance(not_held, list)
    if not_held:
        out.append("  not held in the degraded mode:")
        out.extend(f"    {row['protection']}: {row['instead']}" for row in not_held)
        out.append("  to refuse it instead: --require-namespaces (or require_namespaces = true)")
    if commands:
        out.append("  fix (as root; `warren doctor --fix` prints just these):")
        out.extend(f"    {c}" for c in commands)
    elif state != "usable":
        out.append(
            "  fix: allow user namespaces in the container's or runner's settings (e.g. a seccomp profile"
        )
        out.append("       that permits clone(CLONE_NEWUSER), user.max_user_namespaces > 0)")
    return out
