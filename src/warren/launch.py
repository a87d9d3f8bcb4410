"""Launch: execute a Plan with system calls. No policy decisions here.

Process shape:

    caller ── PID 1: cloned straight into new user/mount/pid/ipc/uts/net/cgroup
              │      namespaces; writes the id maps, executes the mount plan, pivots,
              │      hardens itself (caps, no_new_privs, Landlock, seccomp, fds), then
              │      relays signals and reaps zombies
              └─ the command: posix_spawn (vfork) from PID 1, inheriting the hardening

Failures anywhere are written as one JSON line to a report pipe, which also carries
the command's raw wait status at the end; ``Child.wait`` turns it into an outcome.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import os
import select
import signal
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

from . import _sys, netns
from .errors import (
    CommandNotFound,
    CwdNotFound,
    ExecError,
    SetupError,
    WarrenError,
    from_dict,
)
from .plan import LandlockPlan, MountOp, Plan

STAGE = "/tmp"  # where the new root is assembled, in the sandbox's own mount namespace
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
NS_FLAGS = (
    _sys.CLONE_NEWUSER
    | _sys.CLONE_NEWNS
    | _sys.CLONE_NEWPID
    | _sys.CLONE_NEWIPC
    | _sys.CLONE_NEWUTS
    | _sys.CLONE_NEWNET
    | _sys.CLONE_NEWCGROUP
)
_CLONE = _sys.OPEN_TREE_CLONE | _sys.OPEN_TREE_CLOEXEC
_HIDE_ATTRS = _sys.MOUNT_ATTR_RDONLY | _sys.MOUNT_ATTR_NOSUID | _sys.MOUNT_ATTR_NODEV


class Failure(Exception):
    """A setup step failed inside a launcher process; carries the report record."""

    def __init__(self, record: dict[str, object]) -> None:
        super().__init__(record.get("message"))
        self.record = record


def fail(
    kind: type[WarrenError], message: str, operation: str, path: str | None, err: int | None, hint: str
) -> Failure:
    return Failure(
        {
            "error": kind.__name__,
            "message": message,
            "operation": operation,
            "path": path,
            "errno": err,
            "hint": hint,
        }
    )


def _step(operation: str, path: str | None, hint: str, fn, *args):  # type: ignore[no-untyped-def]
    try:
        return fn(*args)
    except OSError as e:
        raise fail(
            SetupError,
            f"sandbox setup failed: {operation} {path or ''}".rstrip(),
            operation,
            path,
            e.errno,
            hint,
        ) from None


def report(fd: int, record: dict[str, object]) -> None:
    data = (json.dumps(record) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(fd, data)


# --- A: namespaces and id maps ------------------------------------------------------


def _write_file(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _write_id_maps(plan: Plan) -> None:
    hint = "the kernel refused the single-id map; is this process already in a restricted userns?"
    _step("write uid_map", "/proc/self/uid_map", hint, _write_file, "/proc/self/uid_map", plan.uid_map)
    _step("deny setgroups", "/proc/self/setgroups", hint, _write_file, "/proc/self/setgroups", "deny")
    _step("write gid_map", "/proc/self/gid_map", hint, _write_file, "/proc/self/gid_map", plan.gid_map)


# --- B: the mount plan ----------------------------------------------------------------


def _clone(path: str, recursive: bool = True) -> int:
    flags = _CLONE | (_sys.AT_RECURSIVE if recursive else 0)
    return _sys.open_tree(path, flags)


def _preclone(op: MountOp) -> int:
    """Clone a host source as a detached mount with the attributes the op needs.

    Done for every op before anything is overlaid, so sources under /tmp (where the
    new root is staged) are taken from the host, not from the stage.
    """
    src = op.source or op.target
    if op.kind == "root_view":
        fd = _clone("/")
        _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)
    elif op.kind == "bind_rw":
        fd = _clone(src)
        _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)  # submounts stay read-only
        _sys.mount_setattr(fd, 0, _sys.MOUNT_ATTR_RDONLY, False)
    else:  # bind_ro
        fd = _clone(src)
        _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)
    return fd


def _attach(fd: int, target: str) -> None:
    try:
        _sys.move_mount(fd, target)
    finally:
        os.close(fd)


def _mount_point(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    elif not os.path.lexists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _mask(directory: str, keep: tuple[str, ...]) -> None:
    for name in os.listdir(directory):
        if name in keep:
            continue
        path = f"{directory.rstrip('/')}/{name}"
        if os.path.islink(path):
            continue  # a symlink cannot be a mount point; Landlock denies replacing it
        fd = _clone(path)
        try:
            _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)
        except OSError:
            os.close(fd)
            raise
        _attach(fd, path)


def _apply_op(op: MountOp, target: str, fd: int | None) -> None:
    kind = op.kind
    if fd is not None:
        if op.mkdir:
            _mount_point(target, kind == "bind_rw" or os.path.isdir(op.source or op.target))
        _attach(fd, target)
    elif kind == "mask":
        _mask(target, op.keep)
    elif kind == "tmpfs":
        if op.mkdir:
            os.mkdir(target, 0o755)
        flags = _sys.MS_NOSUID | _sys.MS_NODEV | (_sys.MS_RDONLY if op.readonly else 0)
        _sys.mount("tmpfs", target, "tmpfs", flags, None if op.mode is None else f"mode={op.mode:o}")
    elif kind == "bind_dev":
        # The host /dev is still reachable at /dev (the stage sits on /tmp).
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _sys.mount(op.source, target, None, _sys.MS_BIND)
    elif kind == "deny_file":
        _sys.mount("/dev/null", target, None, _sys.MS_BIND)
        _sys.mount(None, target, None, _sys.MS_REMOUNT | _sys.MS_BIND | _sys.MS_RDONLY)
    elif kind == "devpts":
        os.mkdir(target, 0o755)
        flags = _sys.MS_NOSUID | _sys.MS_NOEXEC
        _sys.mount("devpts", target, "devpts", flags, "newinstance,ptmxmode=0666,mode=620")
    elif kind == "symlink":
        os.symlink(op.source or "", target)
    elif kind == "dir":
        os.mkdir(target)
        os.chmod(target, op.mode if op.mode is not None else 0o755)
    elif kind == "proc":
        _sys.mount("proc", target, "proc", _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC)
    elif kind == "ro_self":
        if os.path.exists(target):
            clone = _clone(target)
            _sys.mount_setattr(clone, _HIDE_ATTRS, 0, True)
            _attach(clone, target)
    else:  # pragma: no cover - the planner only emits the kinds above
        raise OSError(errno.EINVAL, f"unknown mount step {kind}")


_PRECLONED = ("root_view", "bind_rw", "bind_ro")


def _execute_mounts(plan: Plan) -> None:
    ops = plan.mounts
    fds: dict[int, int] = {}
    step = -1
    op: MountOp | None = None
    try:
        _sys.mount(None, "/", None, _sys.MS_REC | _sys.MS_PRIVATE)
        for step, op in enumerate(ops):
            if op.kind in _PRECLONED:
                fds[step] = _preclone(op)
        for step, op in enumerate(ops):
            target = STAGE if op.target == "/" else STAGE + op.target
            _apply_op(op, target, fds.pop(step, None))
        op = None
        os.chdir(STAGE)
        _sys.pivot_root(".", ".")
        _sys.umount2(".", _sys.MNT_DETACH)
        os.chdir("/")
    except OSError as e:
        for fd in fds.values():
            os.close(fd)
        if op is None:
            raise fail(
                SetupError,
                "sandbox setup failed: entering the new root",
                "pivot_root",
                None,
                e.errno,
                "the assembled root could not replace the host's",
            ) from None
        path = e.filename if isinstance(e.filename, str) else op.target
        raise fail(
            SetupError,
            f"sandbox setup failed at mount step {step} ({op.kind} {op.target})",
            op.kind,
            path,
            e.errno,
            f"{op.why or op.kind}; check that {op.source or op.target} exists and is "
            "readable by you, and run `warren plan` to see every step",
        ) from None


def enter_new_root(plan: Plan) -> None:
    """In a process cloned into fresh namespaces: id maps, hostname, the whole mount
    plan and pivot_root. Afterwards "/" is the sandbox's root; nothing is hardened yet."""
    _write_id_maps(plan)
    _sys.sethostname(plan.hostname)
    try:
        _sys.loopback_up()
    except OSError as e:
        raise fail(
            SetupError,
            "cannot bring up the loopback interface in the sandbox's network namespace",
            "ioctl(SIOCSIFFLAGS)",
            "lo",
            e.errno,
            "run `warren doctor`; the kernel refused to configure the new network namespace",
        ) from None
    _execute_mounts(plan)


# --- C: per-process hardening ---------------------------------------------------------


def landlock_ruleset(ll: LandlockPlan) -> int:
    """Build the Landlock ruleset and return its fd; restricting is a separate step.

    A long-lived sandbox builds it once in PID 1, right after pivoting: rules bind to
    the inodes of their paths then, so a later exec does not depend on a writable
    root still being reachable by its path (DESIGN F5).
    """
    hint = "Landlock refused the ruleset; run `warren doctor` to see what this kernel supports"
    ruleset: int = _step(
        "landlock_create_ruleset", None, hint, _sys.landlock_create_ruleset, ll.handled, 0, ll.scoped
    )
    try:
        for rule in ll.rules:
            try:
                fd = os.open(rule.path, os.O_PATH | os.O_CLOEXEC)
            except FileNotFoundError:
                raise fail(
                    SetupError,
                    f"writable root vanished before the sandbox started: {rule.path}",
                    "landlock_add_rule",
                    rule.path,
                    errno.ENOENT,
                    "recreate it or remove it from the policy",
                ) from None
            try:
                _step(
                    "landlock_add_rule",
                    rule.path,
                    hint,
                    _sys.landlock_add_path_rule,
                    ruleset,
                    fd,
                    rule.access & ll.handled,
                    rule.path,
                )
            finally:
                os.close(fd)
    except BaseException:
        os.close(ruleset)
        raise
    return ruleset


_PROGRAMS: dict[tuple[tuple[int, int, int, int], ...], _sys.SeccompProgram] = {}


def seccomp_program(plan: Plan) -> _sys.SeccompProgram:
    """Packed once per process (before cloning), so the child only installs it."""
    program = plan.seccomp.program
    packed = _PROGRAMS.get(program)
    if packed is None:
        packed = _PROGRAMS[program] = _sys.SeccompProgram(program)
    return packed


_bounding_set_empty = False  # true in a process (and its forks) after drop_bounding_set


def drop_bounding_set(plan: Plan) -> None:
    """Empty the capability bounding set of this process and every later fork.

    Its effective capabilities stay (a long-lived PID 1 still needs them); what goes is
    any way for a descendant to regain a capability through execve. Done once in PID 1,
    it spares each exec helper ~40 prctl calls."""
    global _bounding_set_empty
    hint = "process hardening failed"
    for cap in range(plan.cap_last_cap + 1):
        _step("drop capability", None, hint, _sys.prctl, _sys.PR_CAPBSET_DROP, cap)
    _bounding_set_empty = True


def harden(plan: Plan, ruleset: int | None) -> None:
    """Per-process hardening (DESIGN section 4), applied by every process that will run
    user code: capabilities dropped, no_new_privs, the Landlock domain of ``ruleset``
    (from ``landlock_ruleset``), the seccomp filter. Irreversible."""
    hint = "process hardening failed"
    if not _bounding_set_empty:
        drop_bounding_set(plan)
    _step(
        "clear ambient capabilities",
        None,
        hint,
        _sys.prctl,
        _sys.PR_CAP_AMBIENT,
        _sys.PR_CAP_AMBIENT_CLEAR_ALL,
    )
    _step("no_new_privs", None, hint, _sys.prctl, _sys.PR_SET_NO_NEW_PRIVS, 1)
    if ruleset is not None:
        _step(
            "landlock_restrict_self",
            None,
            "Landlock refused the ruleset; run `warren doctor` to see what this kernel supports",
            _sys.landlock_restrict_self,
            ruleset,
        )
    _step("drop capabilities", None, hint, _sys.capset_empty)
    _step("install seccomp filter", None, hint, seccomp_program(plan).install)


def _harden(plan: Plan) -> None:
    ruleset = landlock_ruleset(plan.landlock) if plan.landlock is not None else None
    try:
        harden(plan, ruleset)
    finally:
        if ruleset is not None:
            os.close(ruleset)


def _enter_cwd(cwd: str) -> None:
    try:
        os.chdir(cwd)
    except OSError as e:
        raise fail(
            CwdNotFound,
            f"working directory does not exist in the sandbox: {cwd}"
            if e.errno == errno.ENOENT
            else f"cannot enter working directory {cwd}",
            "chdir",
            cwd,
            e.errno,
            f"create it first (mkdir -p {cwd}) or run without --cwd to use the workspace",
        ) from None


def resolve_command(cmd: str, path_var: str) -> str:
    """PATH search with the sandbox's PATH, as execvp would, keeping the first
    error that is not "absent" (EACCES on a non-executable file wins over ENOENT)."""
    if "/" in cmd:
        return cmd
    first_error: str | None = None
    for directory in (path_var or "/usr/bin:/bin").split(":"):
        candidate = os.path.join(directory or ".", cmd)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            first_error = first_error or candidate
    if first_error:
        return first_error
    raise fail(
        CommandNotFound,
        f"command not found in the sandbox: {cmd}",
        "execve",
        cmd,
        errno.ENOENT,
        "check the name; the sandbox searches PATH=" + path_var,
    )


def spawn_failure(e: OSError, cmd: str, path: str) -> Failure:
    """The typed failure for a command that could not be started."""
    if e.errno in (errno.ENOENT, errno.ENOTDIR):
        return fail(
            CommandNotFound,
            f"command not found in the sandbox: {cmd}",
            "execve",
            path,
            e.errno,
            "check the path; inside the sandbox only what the policy shows exists",
        )
    return fail(
        ExecError,
        f"cannot execute {cmd}",
        "execve",
        path,
        e.errno,
        "is it a program with its execute bit set (chmod +x), built for this machine?",
    )


def _spawn_command(plan: Plan, argv: Sequence[str]) -> int:
    """Start the command as PID 2 with everything inherited from the hardened PID 1."""
    path = resolve_command(argv[0], plan.env.get("PATH", ""))
    try:
        return os.posix_spawn(
            path,
            list(argv),
            plan.env,
            setsid=plan.new_session,
            setsigdef=(*FORWARDED, signal.SIGPIPE, signal.SIGXFSZ),
            setsigmask=(),
        )
    except OSError as e:
        raise spawn_failure(e, argv[0], path) from None


# --- the sandbox's PID 1 ---------------------------------------------------------------


def _forward_signals(target: int, new_session: bool) -> None:
    """Relay signals to the command. On a terminal (no new session) the terminal
    already delivers SIGINT/SIGQUIT to the whole foreground group: relaying them
    too would deliver them twice, so PID 1 ignores them instead."""

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(target, signum)

    for sig in FORWARDED:
        if not new_session and sig in (signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)
        else:
            signal.signal(sig, forward)


def _pid1(
    plan: Plan, argv: Sequence[str], report_fd: int, cwd: str, alive_fd: int, net: socket.socket | None
) -> int:
    """PID 1 of the sandbox: set up, harden itself, spawn the command, reap, report.

    PID 1 applies the hardening to itself before spawning, so the command inherits
    it through a cheap vfork-style spawn; PID 1 afterwards only waits and relays.
    """
    _sys.prctl(_sys.PR_SET_PDEATHSIG, signal.SIGKILL)
    # The parent is outside this pid namespace (getppid() is 0): EOF on this pipe
    # means it died before PR_SET_PDEATHSIG took effect.
    if select.select([alive_fd], [], [], 0)[0]:
        return 125
    os.close(alive_fd)
    enter_new_root(plan)
    if net is not None and not netns.pid1_handshake(plan, net):
        return 125
    _enter_cwd(cwd)
    _harden(plan)
    _sys.close_range(3, 0xFFFFFFFF, _sys.CLOSE_RANGE_CLOEXEC)
    child = _spawn_command(plan, argv)
    _forward_signals(child, plan.new_session)
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 125
        if pid == child:
            # End the rest of the sandbox before reporting, so that when the caller
            # sees the status no process of this sandbox is left running.
            with contextlib.suppress(ProcessLookupError):
                os.kill(-1, signal.SIGKILL)
            report(report_fd, {"status": status})
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


# --- the caller's side ----------------------------------------------------------------


@dataclass
class Outcome:
    exit_code: int
    signal: int | None
    error: WarrenError | None


_unreaped: set[int] = set()


def _reap_finished() -> None:
    """Collect launchers that exited after their status was already delivered."""
    for pid in list(_unreaped):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _unreaped.discard(pid)


@atexit.register
def _reap_all() -> None:
    for pid in list(_unreaped):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    _unreaped.clear()


class Child:
    """A launched sandbox as seen from the caller."""

    def __init__(self, pid: int, report_fd: int, alive_fd: int, net: socket.socket | None = None) -> None:
        self.pid = pid
        # The caller's end of the network handshake (``netns.complete``),
        # for --network allow/open; None for none.
        self.net = net
        self._report_fd = report_fd
        self._alive_fd = alive_fd
        self._buf = b""
        self._final = False
        self.outcome: Outcome | None = None

    @property
    def report_fd(self) -> int:
        return self._report_fd

    @property
    def finished(self) -> bool:
        """True once the final record (status or error) has arrived."""
        return self._final

    def read_report(self) -> bool:
        """Read what is available on the report pipe; False at end of file or once
        the final record is in (the launcher may still be tearing down)."""
        chunk = os.read(self._report_fd, 65536)
        self._buf += chunk
        if b'"status"' in self._buf or b'"error"' in self._buf:
            self._final = True
        return bool(chunk) and not self._final

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.outcome is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def wait(self, deadline: float | None = None) -> Outcome | None:
        """Wait for the command to end; None if ``deadline`` (monotonic) passes first."""
        if self.outcome is not None:
            return self.outcome
        while not self._final:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._report_fd], [], [], timeout)
            if not ready:
                return None
            if not self.read_report():
                break
        os.close(self._report_fd)
        os.close(self._alive_fd)
        if self._final:
            # PID 1 has killed the sandbox's other processes and reported; its own
            # exit (namespace teardown) need not delay the caller.
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if not done:
                _unreaped.add(self.pid)
        else:
            _, status = os.waitpid(self.pid, 0)
        self.outcome = self._interpret(status)
        _reap_finished()
        return self.outcome

    def _interpret(self, a_status: int) -> Outcome:
        records = [
            json.loads(line) for line in self._buf.decode(errors="replace").splitlines() if line.strip()
        ]
        for rec in records:
            if "error" in rec:
                err = from_dict(rec)
                return Outcome(err.exit_code, None, err)
        for rec in records:
            if "status" in rec:
                status = int(rec["status"])
                if os.WIFSIGNALED(status):
                    sig = os.WTERMSIG(status)
                    return Outcome(128 + sig, sig, None)
                return Outcome(os.waitstatus_to_exitcode(status), None, None)
        if os.WIFSIGNALED(a_status):
            sig = os.WTERMSIG(a_status)
            return Outcome(
                128 + sig,
                sig,
                SetupError(
                    f"the sandbox was killed by signal {signal.Signals(sig).name} before it reported",
                    operation="wait",
                    hint="something outside killed the launcher; see the system log",
                ),
            )
        return Outcome(
            125,
            None,
            SetupError(
                "the sandbox ended without reporting a status",
                operation="wait",
                hint="run `warren doctor` to check this host's support",
            ),
        )


def close_all_but(*keep: int) -> None:
    """The cloned PID 1 inherits every descriptor of the caller (other sandboxes'
    pipes among them); holding a pipe's write end would keep its reader from EOF."""
    low = 3
    for fd in sorted(keep):
        _sys.close_range(low, fd - 1)
        low = fd + 1
    _sys.close_range(low, 0xFFFFFFFF)


def start(
    plan: Plan,
    argv: Sequence[str],
    *,
    stdin: int | None = None,
    stdout: int | None = None,
    stderr: int | None = None,
    cwd: str | None = None,
) -> Child:
    """Fork the launcher chain and return at once; the caller waits on ``Child``."""
    if not argv:
        raise ExecError("no command given", operation="exec", hint="pass a command after --")
    for path in plan.create_dirs:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise SetupError(
                f"cannot create tool cache {path}",
                operation="mkdir",
                path=path,
                errno=e.errno,
                hint="create it yourself or drop the preset",
            ) from None
    seccomp_program(plan)
    r, w = os.pipe2(os.O_CLOEXEC)
    alive_r, alive_w = os.pipe2(os.O_CLOEXEC)
    net = netns.Channel(plan)
    try:
        pid = _sys.clone_process(NS_FLAGS)
    except OSError as e:
        for fd in (r, w, alive_r, alive_w):
            os.close(fd)
        net.close()
        raise SetupError(
            "cannot create the sandbox's namespaces",
            operation="clone",
            errno=e.errno,
            hint="unprivileged user namespaces may be disabled: check "
            "/proc/sys/user/max_user_namespaces and kernel.apparmor_restrict_unprivileged_userns",
        ) from None
    if pid == 0:
        code = 125
        try:
            os.close(r)
            os.close(alive_w)
            for given, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
                if given is not None and given != target:
                    os.dup2(given, target)
            theirs = net.in_child()  # before close_all_but, which closes our end's fd
            close_all_but(w, alive_r, *net.child_fds())
            code = _pid1(plan, argv, w, cwd or plan.cwd, alive_r, theirs)
        except Failure as f:
            report(w, f.record)
        except BaseException as e:
            report(w, {"error": "SetupError", "message": f"launcher crashed: {e!r}", "operation": "setup"})
        os._exit(code)
    os.close(w)
    os.close(alive_r)
    return Child(pid, r, alive_w, net.in_parent())
