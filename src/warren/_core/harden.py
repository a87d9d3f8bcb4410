"""Process hardening (DESIGN.md section 4), applied with system calls. No decisions.

Two kinds of process live in a sandbox:

- warren's own: PID 1 and the helpers it forks. After setup they hold no capability
  (and can regain none: the bounding set is empty), are not dumpable, and stay
  *outside* every Landlock domain, so a command — which Landlock confines to its own
  domain, with signal scoping from ABI 6 — can neither ptrace, read the memory or
  environment of, nor signal them.
- commands, and the file helpers that act for a client: each restricts itself
  (``harden``): no_new_privs, its own Landlock domain from the ruleset PID 1 built
  once, no capabilities, the seccomp filter. Irreversible.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import SetupError
from ..plan.landlock import (
    EXECUTE,
    READ_DIR,
    READ_FILE,
    TRUNCATE,
    WRITE_FILE,
    WRITE_TREE,
    LandlockPlan,
    LandlockRule,
    above,
)
from ..plan.model import Plan
from . import _sys

PR_SET_DUMPABLE = 4
LL_DIR_ONLY = READ_DIR  # listing a directory on the way to something denied, not reading its files
LL_FILE_RIGHTS = EXECUTE | READ_FILE | WRITE_FILE | TRUNCATE
HINT = "process hardening failed; run `warren doctor` to see what this kernel supports"


def _step(what: str, fn, *args) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(*args)
    except OSError as e:
        raise SetupError.from_os(e, f"sandbox setup failed: {what}", what, hint=HINT) from None


def landlock_ruleset(ll: LandlockPlan) -> int:
    """Build the Landlock ruleset and return its fd (PID 1 does it once, right after
    pivoting: rules bind to the inodes of their paths then, so a later exec does not
    depend on a writable root still being reachable by its path)."""
    try:
        ruleset = _sys.landlock_create_ruleset(ll.handled, ll.handled_net, ll.scoped)
    except OSError as e:
        raise SetupError.from_os(
            e, "sandbox setup failed: landlock_create_ruleset", "landlock", hint=HINT
        ) from None
    try:
        for rule in _expanded(ll.rules):
            try:
                fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                if not rule.access & WRITE_TREE:
                    # Reading something gone since it was listed (an entry of a
                    # directory above a denied path): nothing to grant.
                    continue
                raise SetupError(
                    f"writable root vanished before the sandbox started: {rule.path}",
                    operation="landlock_add_rule",
                    path=rule.path,
                    errno=errno.ENOENT,
                    hint="recreate it or remove it from the policy",
                ) from None
            try:
                _sys.landlock_add_path_rule(ruleset, fd, rule.access & ll.handled, rule.path)
            except OSError as e:
                raise SetupError.from_os(
                    e,
                    f"sandbox setup failed: landlock_add_rule {rule.path}",
                    "landlock_add_rule",
                    rule.path,
                    hint=HINT,
                ) from None
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


def _expanded(rules: tuple[LandlockRule, ...]) -> list[LandlockRule]:
    """Rules as given, a read rule with exclusions turned into rules for every entry
    of the directories above the excluded paths (as they are now) but those."""
    out: list[LandlockRule] = []
    for rule in rules:
        if not rule.excluding:
            out.append(rule)
        else:
            _cover(rule.path, rule, _Exclusions(rule.excluding), out)
    return out


class _Exclusions:
    """Set lookups instead of comparing each path with every excluded one: PID 1
    builds the ruleset on every launch, and the pairwise string tests were most of
    its cost (dozens of denied paths times every entry of the directories above)."""

    def __init__(self, excluded: tuple[str, ...]) -> None:
        self.exact = set(excluded)
        self.roots = {x.rstrip("/") for x in excluded}
        # Every string d such that d + "/" begins an excluded path.
        self.above = {d.rstrip("/") for x in excluded for d in above(x)}

    def has_below(self, directory: str) -> bool:
        """Something excluded lies beneath ``directory``."""
        return directory.rstrip("/") in self.above

    def covers(self, path: str) -> bool:
        """``path`` is excluded, or beneath an excluded path."""
        return path in self.exact or any(path[:i] in self.roots for i in _slashes(path))


def _slashes(path: str) -> list[int]:
    return [i for i, c in enumerate(path) if c == "/"]


def _cover(directory: str, rule: LandlockRule, excluded: _Exclusions, out: list[LandlockRule]) -> None:
    """``directory`` is canonical (no symlink in it): so is every entry of it that is
    not a symlink itself, and one lstat tells what that entry is."""
    if not excluded.has_below(directory):
        out.append(LandlockRule(directory, rule.access, rule.why))
        return
    out.append(LandlockRule(directory, rule.access & LL_DIR_ONLY, rule.why))
    prefix = directory.rstrip("/") + "/"
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        child = prefix + name
        if child in excluded.exact:
            continue
        try:
            mode = os.lstat(child).st_mode
        except OSError:
            continue  # gone meanwhile
        if stat.S_ISLNK(mode):
            target = os.path.realpath(child)
            if excluded.covers(target) or excluded.has_below(target):
                # A link into something denied, or to a directory above it (a rule
                # binds to the inode: it would grant reading the denied path too; that
                # directory is covered under its own name).
                continue
            if os.path.exists(child):
                is_dir = os.path.isdir(target)
                access = rule.access if is_dir else rule.access & LL_FILE_RIGHTS
                out.append(LandlockRule(child, access, rule.why, is_dir=is_dir))
        elif excluded.covers(child):
            continue
        elif stat.S_ISDIR(mode):
            _cover(child, rule, excluded, out)
        else:
            out.append(LandlockRule(child, rule.access & LL_FILE_RIGHTS, rule.why, is_dir=False))


_PROGRAMS: dict[tuple[tuple[int, int, int, int], ...], _sys.SeccompProgram] = {}


def seccomp_program(plan: Plan) -> _sys.SeccompProgram:
    """Packed once per process, so installing it in a fresh child is one call."""
    program = plan.seccomp.program
    packed = _PROGRAMS.get(program)
    if packed is None:
        packed = _PROGRAMS[program] = _sys.SeccompProgram(program)
    return packed


def settle_pid1(plan: Plan) -> None:
    """PID 1 after setup: the bounding set emptied for every descendant, no
    capabilities of its own, no_new_privs, not dumpable."""
    for cap in range(plan.cap_last_cap + 1):
        if not plan.namespaces and not _holds_setpcap():
            # The degraded mode as an ordinary user: no capability to drop from the
            # bounding set, and no_new_privs (below) keeps exec from granting any.
            break
        _step("drop capability", _sys.prctl, _sys.PR_CAPBSET_DROP, cap)
    _step("clear ambient capabilities", _sys.prctl, _sys.PR_CAP_AMBIENT, _sys.PR_CAP_AMBIENT_CLEAR_ALL)
    _step("no_new_privs", _sys.prctl, _sys.PR_SET_NO_NEW_PRIVS, 1)
    _step("drop capabilities", _sys.capset_empty)
    _step("not dumpable", _sys.prctl, PR_SET_DUMPABLE, 0)


def limit_user_ns(plan: Plan) -> None:
    """The plan's limits of the sandbox's own user namespace (inotify, fanotify), set
    by PID 1 while it is still root there: the kernel charges these counts at every
    user namespace level up to the host's uid, so the sandbox's own limit keeps it to
    its share of the user's. Only a holder of CAP_SYS_RESOURCE in this namespace may
    change them: after ``settle_pid1`` nobody inside can (a nested namespace's limit
    only narrows this one)."""
    for name, value in plan.limits.user_ns if plan.limits is not None and plan.namespaces else ():
        _step(f"set {name} of the sandbox's user namespace", _write_sysctl, f"/proc/sys/user/{name}", value)


def _write_sysctl(path: str, value: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        os.write(fd, str(value).encode())
    finally:
        os.close(fd)


def _holds_setpcap() -> bool:
    """CAP_SETPCAP (8) in the effective set: what dropping from the bounding set takes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) & (1 << 8))
    return False


def harden(plan: Plan, ruleset: int | None) -> None:
    """Confine this process for good: its own Landlock domain (from ``ruleset``), no
    capabilities, the seccomp filter. Called in a command's process right before
    execve, and in a file helper before it touches a path."""
    _step("no_new_privs", _sys.prctl, _sys.PR_SET_NO_NEW_PRIVS, 1)
    if ruleset is not None:
        _step("landlock_restrict_self", _sys.landlock_restrict_self, ruleset)
    _step("drop capabilities", _sys.capset_empty)
    _step("install seccomp filter", seccomp_program(plan).install)
