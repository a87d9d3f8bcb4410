"""The one way a sandbox starts: clone PID 1 straight into new namespaces.

One raw ``clone()`` with CLONE_NEWUSER|NEWNS|NEWPID|NEWIPC|NEWUTS|NEWNET|NEWCGROUP
from the spawner (``spawner``: a process forked from the supervisor that only clones,
so every PID 1 shares its pages and none holds another client's request): the child
is PID 1 of the sandbox at once (no intermediate fork), and with CLONE_PARENT the
supervisor's child. The child keeps only its control channel to the supervisor and
runs ``pid1.main``; it never returns here.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import socket

from .. import protocol, wire
from ..errors import SetupError
from ..plan.model import Plan
from . import _sys, broker, cgroups, harden, mounts, spawner

NS_FLAGS = (
    _sys.CLONE_NEWUSER
    | _sys.CLONE_NEWNS
    | _sys.CLONE_NEWPID
    | _sys.CLONE_NEWIPC
    | _sys.CLONE_NEWUTS
    | _sys.CLONE_NEWNET
    | _sys.CLONE_NEWCGROUP
)


# The descriptor limit (soft) sandboxes start with when the caller raised its own (the
# supervisor does, to hold thousands of connections): they keep the limit it was
# started with, as the host's tools would have.
sandbox_nofile: int | None = None


_spawner: spawner.Spawner | None = None


def start_spawner() -> None:
    """Fork the spawner now, if none runs: a supervisor just started does so as it
    publishes its address, before it has read any request, so that the spawner's own
    start (importing what PID 1 needs, ~30 ms) runs beside the first request's planning
    instead of after it. A spawner that cannot be had now is started at the first
    clone, as a new interpreter (``_the_spawner``)."""
    global _spawner
    if _spawner is None:
        with contextlib.suppress(OSError):
            _spawner = spawner.Spawner.start(clone_in_spawner)


def _the_spawner() -> spawner.Spawner:
    """The spawner; where none runs (it died, or none could be forked at the start), a
    new one as a process of its own, not a fork of this one: a fork now would copy
    whatever it holds by now (``Spawner.start_fresh``). ``OSError`` when none can be."""
    global _spawner
    if _spawner is None:
        _spawner = spawner.Spawner.start_fresh(sandbox_nofile)
    return _spawner


def start_pid1(
    plan: Plan,
    control: socket.socket,
    *,
    oneshot: bool,
    cgroup_tasks: list[tuple[str, int]] | None = None,
    ahead: bool = False,
    layers: dict[int, list[int]] | None = None,
) -> int:
    """Clone PID 1 for ``plan``; ``control`` is the child's end of its channel to the
    caller (the caller closes its copy). Returns PID 1's pid as the caller sees it.
    ``cgroup_tasks`` (``cgroups.open_tasks``): PID 1 enters these cgroups before it
    does anything else, so nothing it forks escapes them; the caller closes its copies.
    ``ahead``: a one-shot sandbox booted before its command is known (``server.ahead``):
    PID 1 forks its spare helper at once, as a long-lived sandbox's does.

    The clone happens in the spawner (``spawner``: PID 1s then share their pages), and
    here only if no spawner can be had. ``layers``: overlay layers given by descriptor
    (detached mounts of another sandbox: a snapshot still in its memory), by index."""
    global _spawner
    tasks = cgroup_tasks or []
    given = layers or {}
    request = spawner.Request(
        plan, oneshot, [path for path, _fd in tasks], ahead, [(i, len(f)) for i, f in given.items()]
    )
    fds = [control.fileno(), *(fd for _path, fd in tasks), *(fd for f in given.values() for fd in f)]
    for _attempt in range(2):
        try:
            return _the_spawner().clone(request, fds)
        except OSError as e:
            if not isinstance(e, ConnectionError):
                raise _cannot_clone(e) from None
            if _spawner is not None:
                _spawner.close()
            _spawner = None  # it died: the next one is forked now
    try:
        return _clone(plan, control, oneshot, tasks, 0, ahead, given)
    except OSError as e:
        raise _cannot_clone(e) from None


def join_keeper(
    plan: Plan,
    control: socket.socket,
    cgroup_tasks: list[tuple[str, int]],
    pidfd: int,
    ruleset: int | None,
    git: list[tuple[str, int]],
) -> int:
    """A new keeper for a live sandbox whose keeper left (``rejoin``), made by the
    spawner; its pid as the host sees it. ``control``: its end of the new channel;
    ``ruleset`` and ``git``: what the last keeper left with (``protocol.Leaving``)."""
    request = spawner.Request(
        plan,
        False,
        [path for path, _fd in cgroup_tasks],
        join=True,
        ruleset=ruleset is not None,
        git=[path for path, _fd in git],
    )
    fds = [
        control.fileno(),
        *(fd for _path, fd in cgroup_tasks),
        pidfd,
        *([ruleset] if ruleset is not None else []),
        *(fd for _path, fd in git),
    ]
    return _the_spawner().clone(request, fds)


def start_helper(
    name: str, control: socket.socket, cgroup_tasks: list[tuple[str, int]], fds: list[int]
) -> int:
    """A helper of the supervisor's (``spawner.HELPERS[name]``) started by the spawner,
    so that it shares the spawner's quiet pages rather than the supervisor's busy ones;
    where no spawner can be had, forked from this process, running the same body. Its
    pid (this process's child either way, as a PID 1 is). ``control``: its end of its
    channel; ``cgroup_tasks``: what it enters first; ``fds``: the rest it is given.
    ``OSError`` when it cannot be forked either."""
    global _spawner
    request = spawner.Request(None, False, [path for path, _fd in cgroup_tasks])
    request.helper = name
    try:
        return _the_spawner().clone(request, [control.fileno(), *(fd for _path, fd in cgroup_tasks), *fds])
    except OSError as e:
        if isinstance(e, ConnectionError):
            if _spawner is not None:
                _spawner.close()
            _spawner = None  # it died: the next clone starts another
    pid = os.fork()
    if pid == 0:
        spawner.run_helper(name, control, cgroup_tasks, fds)
    return pid


def _cannot_clone(e: OSError) -> SetupError:
    return SetupError.from_os(
        e,
        "cannot create the sandbox's namespaces",
        "clone",
        hint="unprivileged user namespaces may be disabled: check "
        "/proc/sys/user/max_user_namespaces and kernel.apparmor_restrict_unprivileged_userns",
    )


def clone_in_spawner(
    plan: object,
    control: socket.socket,
    oneshot: bool,
    tasks: list[tuple[str, int]],
    ahead: bool,
    given: dict[int, list[int]],
) -> int:
    assert isinstance(plan, Plan)
    return _clone(plan, control, oneshot, tasks, _sys.CLONE_PARENT, ahead, given)


def preload() -> None:
    """Import, before any clone, every module PID 1 and its helpers use: inside the
    sandbox warren's own files may not be visible (an install under /tmp, whose /tmp is
    the sandbox's own), so nothing may be imported there for the first time."""
    from .. import protocol
    from . import continuer, credsend, execstub, nativeinit, pid1  # noqa: F401

    for name in protocol.__all__:
        getattr(protocol, name)  # the channels the package loads only when named
    execstub.load()  # the program a command's process becomes, from a sealed memfd
    credsend.load()  # the program that names a command as its unix sends' sender
    nativeinit.load()  # the program PID 1 becomes once set up
    continuer.load()  # the thread that answers a walk's window once it is done


def _clone(
    plan: Plan,
    control: socket.socket,
    oneshot: bool,
    tasks: list[tuple[str, int]],
    flags: int,
    ahead: bool = False,
    given: dict[int, list[int]] | None = None,
) -> int:
    """The clone itself; ``flags`` adds CLONE_PARENT in the spawner."""
    from . import pid1

    preload()

    harden.seccomp_program(plan)  # packed here, so the clone only copies them
    broker.prepare(plan)
    # A stop (SIGTERM, or SIGUSR1: pid1.KILL_NOW) that comes early waits, blocked,
    # until PID 1 has its own handler: before that it would run the parent's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGUSR1})
    try:
        # The degraded mode (no namespaces to be had here): a plain child, which
        # confines itself with what needs none (``plan.degraded``).
        pid = _sys.clone_process((NS_FLAGS if plan.namespaces else 0) | flags)
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1})
        raise
    if pid == 0:
        code = 125
        try:
            gc.freeze()  # its own collections never visit (so never copy) the pages it shares
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the spawner's (``rejoin.reap_keepers``)
            if not _enter_cgroups(tasks, control):
                os._exit(125)
            keep_only(control.fileno(), *(fd for f in (given or {}).values() for fd in f))
            mounts.given_layers.update(given or {})
            code = pid1.main(plan, control, oneshot=oneshot, ahead=ahead)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGUSR1})
    return pid


def keep_only(control: int, *extra: int) -> None:
    """In a new PID 1 or a joined keeper: its stdio on /dev/null, every descriptor
    closed but its channel, warren's programs still loaded and ``extra``, and the
    descriptor limit the supervisor was started with (``sandbox_nofile``), not the one
    it raised for itself."""
    from . import credsend, execstub, nativeinit

    devnull = os.open("/dev/null", os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    programs = [fd for fd in (execstub.loaded(), credsend.loaded(), nativeinit.loaded()) if fd is not None]
    _sys.close_all_but(control, *programs, *extra)
    if sandbox_nofile is not None:
        import resource

        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(sandbox_nofile, hard), hard))


def _enter_cgroups(tasks: list[tuple[str, int]], control: socket.socket) -> bool:
    """In the new PID 1, still single-threaded: join its cgroups, or tell the
    supervisor why not (it then ends the sandbox and passes the error on)."""
    try:
        cgroups.enter_self(tasks)
    except OSError as e:
        error = cgroups.cannot_enter(e)
        with contextlib.suppress(OSError):
            wire.send(control, protocol.Failed(error=protocol.error_message(error).error))
        return False
    return True
