"""Reach the supervisor: find it, start it when none runs, or fall back to one inline.

The supervisor's address is the random abstract name it published in the (verified)
state directory; the client checks that whoever answers runs as this user. When no
supervisor runs, one is started as a fresh interpreter — not a fork of the caller, so
it holds none of the caller's memory — with a scrubbed environment (the caller's is
sent per request, and filtered by the policy). When the state directory is unusable,
one-shot runs still work: an inline supervisor serves just this connection.

On the CLI's fast path: standard library only, nothing heavy.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time

from .. import protocol, statedir, wire
from ..errors import SandboxError, SetupError, WarrenError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

START_TIMEOUT = 30.0
OTHER_PAUSE = 0.05  # seconds, times the attempt, before starting one again when another holds the lock
HELD = "another supervisor of this state directory holds its lock and does not answer"
# What the supervisor process itself may see of the environment it is started from.
_SUPERVISOR_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",  # the user's config: the snapshot budget is read there (server.snapshots)
    "WARREN_SUPERVISOR_IDLE",
    "WARREN_EXEC_STUB",  # 0: commands' processes wait in Python, not as the exec stub
    "WARREN_STUB_CONFINES",  # 0: a command's process confines itself in Python, not in the exec stub
    "WARREN_CREDSEND",  # 0: a command's unix sends name PID 1, as without warren-credsend (_core.credsend)
    "WARREN_NATIVE_WALK",  # 0: the workspace walked in Python, not by warren-walk (_core.treewalk)
    "WARREN_NATIVE_CONTINUER",  # 0: a walk's window answered by the Python broker (_core.continuer)
    "WARREN_SPARE_IDLE",  # seconds before an unused spare helper is let go (pid1.SPARE_IDLE)
    "WARREN_NATIVE_INIT",  # 0: PID 1 stays Python, kept by an idle sandbox too (_core.nativeinit)
    "WARREN_NATIVE_THAW",  # 0: a paused sandbox's thaw guard is a Python process (server.pause)
    "WARREN_SERVE_AGAIN",  # 0: a helper serves one request, never the next of a burst (_core.again)
    "WARREN_LINK_WALK_DELAY",  # seconds the hard-link walk after launch waits first (tests: server.linkwalk)
    "WARREN_OVERLAY_BY_PATH",  # 1: image roots' layers by path, as before Linux 6.13 (mounts)
)
_BOOT = (
    "import os,sys\n"
    "if os.fork(): os._exit(0)\n"  # the supervisor is nobody's child here, never a zombie
    "os.setsid()\n"
    "sys.path.insert(0, sys.argv[1])\n"
    "from warren.server.supervisor import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


EXEC_STUB = "warren-exec-stub"  # the argv of a command's process while it waits (``_core.execstub``)


def is_supervisor(argv: Sequence[str]) -> bool:
    """Whether ``argv`` is the supervisor's own (its forks, PID 1 and exec helpers of a
    sandbox, keep it; and the exec stub a command's process waits as): ``warren ps``
    shows them as one word, not as this boot code."""
    return (len(argv) >= 4 and argv[2] == "-c" and argv[3] == _BOOT) or tuple(argv) == (EXEC_STUB,)


def _package_parent() -> str:
    import warren

    return os.path.dirname(os.path.dirname(os.path.abspath(warren.__file__)))


# Where a distribution package puts a copy of the interpreter for the supervisor alone,
# under the AppArmor profile that lets it make user namespaces on a host that restricts
# them (packaging/apparmor/warren; docs/degraded.md): not every Python program.
LAUNCHER_DIR = "/usr/lib/warren"


def _interpreter() -> str:
    v = sys.version_info
    launcher = f"{LAUNCHER_DIR}/python{v.major}.{v.minor}"
    return launcher if os.access(launcher, os.X_OK) else sys.executable


def _spawn_python(
    args: list[str], env: Mapping[str, str], keep: Sequence[int], log: int, prefix: Sequence[str] = ()
) -> int:
    """``prefix``: a command the interpreter is started through (``systemd_scope``)."""
    argv = [*prefix, _interpreter(), "-I", "-c", _BOOT, _package_parent(), *args]
    scrubbed = {k: v for k, v in env.items() if k in _SUPERVISOR_ENV}
    if prefix:  # systemd-run finds the user's service manager through these
        scrubbed.update(
            {k: v for k, v in env.items() if k in ("XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS")}
        )
    for fd in keep:
        os.set_inheritable(fd, True)
    devnull = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.posix_spawn(
            argv[0],
            argv,
            scrubbed,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, devnull, 0),
                (os.POSIX_SPAWN_DUP2, log, 1),
                (os.POSIX_SPAWN_DUP2, log, 2),
            ],
        )
    finally:
        os.close(devnull)
        for fd in keep:
            os.set_inheritable(fd, False)


def systemd_scope(env: Mapping[str, str]) -> list[str]:
    """How to start the supervisor in a cgroup2 group delegated to this user, when its
    own is not and a systemd user manager runs: a transient scope with Delegate=yes
    (a login session's scope is not delegated, and only a delegated group lets warren
    give each sandbox a group of its own: limits, pause, kill). Empty otherwise, or when
    WARREN_SYSTEMD_SCOPE=0."""
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if env.get("WARREN_SYSTEMD_SCOPE") == "0" or not runtime:
        return []
    if not os.path.exists(os.path.join(runtime, "systemd", "private")):
        return []  # no user manager
    # Only now: this runs before the supervisor is spawned, on a cold start's path.
    import shutil

    from .._core import cgroups

    if cgroups.probe(os.getuid()).v2_writable:
        return []  # already in a delegated group
    tool = shutil.which("systemd-run", path=env.get("PATH"))
    if tool is None:
        return []
    unit = f"warren-supervisor-{os.getuid()}-{os.getpid()}"
    return [tool, "--user", "--scope", "--quiet", "--collect", "-p", "Delegate=yes", "--unit", unit, "--"]


def _start_daemon(root: str, env: Mapping[str, str]) -> str:
    r, w = os.pipe()
    log = os.open(
        os.path.join(root, statedir.LOG_FILE), os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600
    )
    try:
        scope = systemd_scope(env)
        pid = _spawn_python(["daemon", root, str(w)], env, [w], log, scope)
        _pid, status = os.waitpid(pid, 0)  # the intermediate exits at once
        if scope and status != 0:
            # systemd-run could not make the scope (no user bus, refused): say so in
            # the log and start the supervisor where this process is.
            os.write(
                log, f"warren: systemd-run could not start a scope ({status:#x}); started without\n".encode()
            )
            pid = _spawn_python(["daemon", root, str(w)], env, [w], log)
            os.waitpid(pid, 0)
    finally:
        os.close(w)
        os.close(log)
    try:
        answer = b""
        while wire.readable(r, START_TIMEOUT):
            chunk = os.read(r, 512)
            if not chunk:
                break
            answer += chunk
            if answer.endswith(b"\n"):
                break
    finally:
        os.close(r)
    return answer.decode(errors="replace").strip()


def _verify_server(sock: wire.Sock) -> None:
    _pid, uid, _gid = wire.peer_creds(sock)
    if uid != os.getuid():
        sock.close()
        raise SandboxError(
            f"the process answering at warren's address runs as uid {uid}, not as you",
            operation="connect",
            hint="someone else may be impersonating warren's supervisor; remove "
            "supervisor.addr from warren's state directory and try again",
        )


def _elsewhere(pid: int) -> str | None:
    """Which namespace of ours the supervisor does not share: it serves only callers
    that see the files, processes and network it does. "hidden" when its namespaces
    cannot be read from here (another user namespace), "gone" when there are none to
    read: it has exited (or the pid names nothing in this pid namespace)."""
    for ns in ("net", "mnt", "user", "pid"):
        try:
            if os.readlink(f"/proc/{pid}/ns/{ns}") != os.readlink(f"/proc/self/ns/{ns}"):
                return ns
        except (FileNotFoundError, ProcessLookupError):
            return "gone"
        except OSError:
            return "hidden"
    return None


def _unreachable(root: str, pid: int, ns: str) -> SetupError:
    where = "namespaces this process cannot see" if ns == "hidden" else f"another {ns} namespace"
    return SetupError(
        f"warren's supervisor for {root} (pid {pid}) runs in {where}",
        operation="connect",
        path=root,
        hint="long-lived sandboxes are reachable from where they were created; elsewhere, "
        "set XDG_STATE_HOME to a state directory of its own",
    )


# State directory -> the address of its supervisor, once found and checked (state
# directory verified, same namespaces): later connections only check the peer's uid.
_verified: dict[str, str] = {}


def supervisor(env: Mapping[str, str] | None = None) -> wire.Sock:
    """A verified connection to this user's supervisor, starting it when needed. A
    SetupError when it cannot be had here (state directory unusable, or the running
    supervisor lives in other namespaces)."""
    env = os.environ if env is None else env
    location = statedir.location(env)
    known = _verified.get(location)
    if known is not None:
        try:
            sock = wire.connect(known)
        except OSError:
            del _verified[location]  # it exited: find (or start) the next one
        else:
            _verify_server(sock)
            return sock
    root = statedir.prepare(location)
    why = "it did not start"
    for attempt in range(6):
        found = statedir.read_address(root)
        if found is not None:
            token, pid = found
            try:
                sock = wire.connect(wire.abstract_name(token))
            except OSError as e:
                why = f"it did not answer ({e.strerror})"
            else:
                ns = _elsewhere(pid)
                if ns is None:
                    _verify_server(sock)
                    _verified[location] = wire.abstract_name(token)
                    return sock
                sock.close()
                if ns != "gone":
                    raise _unreachable(root, pid, ns)
                why = "it exited as it was reached"  # the next one, as below
        answer = _start_daemon(root, env)
        if answer.startswith("error"):
            raise SetupError(
                f"the warren supervisor could not start: {answer[6:]}",
                operation="supervisor",
                path=root,
                hint=f"see {os.path.join(root, statedir.LOG_FILE)}",
            )
        if answer == "other":
            # Another holds the lock. Alive in other namespaces: not reachable from here.
            # Else it is starting (not published yet), or it is the one published, gone:
            # a supervisor killed holds its lock until its last thread has exited, a
            # moment after its sandboxes died. The next is started again after a pause
            # (a run sent inline meanwhile would skip what the next supervisor does
            # first: adopting the repositories the dead one's sandboxes made).
            ns = _elsewhere(found[1]) if found is not None else None
            if found is not None and ns is not None and ns != "gone":
                raise _unreachable(root, found[1], ns)
            why = HELD
            time.sleep(OTHER_PAUSE * (attempt + 1))
    log = os.path.join(root, statedir.LOG_FILE)
    raise SandboxError(
        f"cannot reach the warren supervisor: {why}",
        operation="connect",
        path=root,
        hint=f"a supervisor in other namespaces (a container sharing this home?) holds it: set "
        f"XDG_STATE_HOME to a state directory of its own; else see {log}"
        if why == HELD
        else f"see {log}; check that {root} is writable",
    )


def inline() -> wire.Sock:
    """A supervisor of our own, for this one connection (no state directory needed)."""
    import socket

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    log = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
    try:
        pid = _spawn_python(["inline", str(theirs.fileno())], os.environ, [theirs.fileno()], log)
        os.waitpid(pid, 0)  # the intermediate exits at once
    finally:
        os.close(log)
        theirs.close()
    return ours


def for_run(env: Mapping[str, str] | None = None) -> wire.Sock:
    """Where a one-shot run goes: the supervisor, or inline when the state directory
    cannot be used (slower: a fresh interpreter per run)."""
    try:
        return supervisor(env)
    except SetupError:
        return inline()


def request(
    message: protocol.Message,
    expect: tuple[type[protocol.Message], ...],
    env: Mapping[str, str] | None = None,
    payload: bytes = b"",
) -> tuple[protocol.Message, bytes]:
    """One request to the supervisor (or, through it, to a sandbox's PID 1) and its
    reply; an ``Error`` reply is raised as the error it carries.

    A supervisor that exits (its idle time out, a `warren shutdown`, or killed) with the
    connection still waiting to be accepted resets it: the request was never read, so it
    goes once more, to the next supervisor (`NotTaken`)."""
    try:
        return exchange(supervisor(env), message, expect, payload, retry=not payload)
    except NotTaken:
        forget(env)
        return exchange(supervisor(env), message, expect, payload)


def lost_command(op: str, sandbox: str | None, env: Mapping[str, str] | None = None) -> SandboxError:
    """The error for a command whose connection ended before it said how it ended. Of a
    long-lived ``sandbox``, the supervisor is asked whether it still runs: then what
    ended was warren's helper for the command (killed from outside, or a bug of
    warren's), which the user should hear rather than a sandbox that stopped; one that
    warren stopped on its own (a failure that ends it, its idle timeout) says why."""
    lost = "the connection to the sandbox was lost before the command finished"
    if sandbox is not None:
        with contextlib.suppress(WarrenError, OSError):
            reply, _ = request(protocol.GetRequest(name=sandbox), (protocol.SandboxInfo,), env)
            if isinstance(reply, protocol.SandboxInfo) and reply.state != "running" and reply.reason:
                return SandboxError(
                    f"{lost}: sandbox {sandbox} is {reply.state}: {reply.reason}",
                    operation=op,
                    path=sandbox,
                    hint=f"it takes no more commands: `warren rm {sandbox}`, then create it again",
                )
            if isinstance(reply, protocol.SandboxInfo) and reply.state == "running":
                state = statedir.location(env if env is not None else os.environ)
                where = os.path.join(state, statedir.LOG_FILE)
                return SandboxError(
                    f"{lost}, though sandbox {sandbox} still runs: warren's helper for the command ended "
                    "without saying how the command ended",
                    operation=op,
                    path=sandbox,
                    hint="if nothing on the host killed it, this is a bug in warren: please report it "
                    f"with the command you ran and the end of {where}. The sandbox takes the next command",
                )
    hint = "the sandbox was stopped or its supervisor died; see `warren ls`"
    return SandboxError(lost, operation=op, hint=hint)


CLOSED = "the warren supervisor closed the connection"


class NotTaken(Exception):
    """The supervisor reset a connection before any byte of its reply: it went away
    with the connection unaccepted, or with the request not wholly read (a request
    without payload is acted on only once it is), so nothing of it was done."""


def forget(env: Mapping[str, str] | None = None) -> None:
    """Look the supervisor up afresh next time (after `NotTaken`: the one known went away)."""
    _verified.pop(statedir.location(os.environ if env is None else env), None)


def send_request(sock: wire.Sock, message: protocol.Message, fds: Sequence[int] = ()) -> None:
    """Send a request without payload (a run's, an exec's); `NotTaken` when the
    connection was reset first: no supervisor reads it."""
    try:
        wire.send(sock, message, fds=fds)
    except (ConnectionResetError, BrokenPipeError):
        raise NotTaken from None


def _await_reply(sock: wire.Sock) -> None:
    """Wait for the first byte of the reply without taking it; `NotTaken` if the
    connection is reset first. (The supervisor closes a connection it read a request
    on without leaving unread bytes behind, which ends it rather than resets it.)"""
    try:
        sock.recv(1, socket.MSG_PEEK)
    except ConnectionResetError:
        raise NotTaken from None


def exchange(
    sock: wire.Sock,
    message: protocol.Message,
    expect: tuple[type[protocol.Message], ...],
    payload: bytes = b"",
    *,
    retry: bool = False,
) -> tuple[protocol.Message, bytes]:
    """Send ``message`` on ``sock``, read the one reply and close: see ``request``.
    ``retry`` (a request without payload): `NotTaken` when it was never read."""
    try:
        try:
            wire.send(sock, message, payload)
        except (ConnectionResetError, BrokenPipeError):
            # The supervisor refuses a request (no such sandbox, paused) without
            # reading its payload, and closes: its answer is still here to read.
            # Without payload, the request never reached a supervisor that reads it.
            if retry:
                raise NotTaken from None
            if not payload:
                raise
        if retry:
            _await_reply(sock)
    except (wire.ConnectionClosed, ConnectionResetError, BrokenPipeError):
        sock.close()
        raise _closed(message.TAG) from None
    except BaseException:
        sock.close()
        raise
    return reply(sock, message.TAG, expect)


def reply(
    sock: wire.Sock, op: str, expect: tuple[type[protocol.Message], ...]
) -> tuple[protocol.Message, bytes]:
    """The one reply to a request sent on ``sock`` (``op`` its tag), which is closed
    then; an ``Error`` reply is raised as the error it carries."""
    try:
        msg, data, fds = wire.recv(sock, (*expect, protocol.Error))
    except (wire.ConnectionClosed, ConnectionResetError, BrokenPipeError):
        raise _closed(op) from None
    finally:
        sock.close()
    for fd in fds:
        os.close(fd)
    if isinstance(msg, protocol.Error):
        protocol.raise_error(msg.error)
    return msg, data


def _closed(op: str) -> SandboxError:
    return SandboxError(CLOSED, operation=op, hint="see supervisor.log in warren's state directory")


def command_event(
    sock: wire.Sock, lost: Callable[[], Exception], *, first: bool = False
) -> tuple[protocol.Started | protocol.Exited, list[int]]:
    """The next word on a running command's connection — it ``Started`` (with its
    pty's master when it has one), or it ``Exited`` — and any descriptors with it.
    An ``Error`` is raised as the error it carries; a connection that ends first
    raises ``lost()``, or `NotTaken` when it is reset before the ``first`` word. The
    one receive step of every run and exec, captured (``capture``) or attached to a
    terminal (``cli.attach``)."""
    try:
        msg, _, fds = wire.recv(sock, (protocol.Started, protocol.Exited, protocol.Error))
    except ConnectionResetError:
        # Before the first word: the request was never read (`NotTaken`); it can go again.
        raise (NotTaken() if first else lost()) from None
    except wire.ConnectionClosed:
        raise lost() from None
    if isinstance(msg, protocol.Error):
        for fd in fds:
            os.close(fd)
        protocol.raise_error(msg.error)
    assert isinstance(msg, protocol.Started | protocol.Exited)
    return msg, fds


__all__ = ["NotTaken", "WarrenError", "command_event", "for_run", "forget", "inline", "request", "supervisor"]
