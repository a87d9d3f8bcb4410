"""What every framework backend shares: turning "warren's policy keys" into a spec.

A backend takes the keys of ``warren.toml`` (a mapping such as
``{"preset": ["python"], "network": "allow"}``) or a ``PolicySpec``; with neither it
means warren's default policy for the current directory. The directory is fixed when
the backend is built, so a sandbox created later (or by another thread) does not
depend on where the process happens to be then. Also here: the shell line that runs
an agent's command with stderr folded into stdout in the order it was written, as the
frameworks' own local backends return it, and the one that gives it a terminal.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from ..errors import ConfigError
from ..policy import PolicySpec
from ..policy.spec import from_mapping

PolicyKeys = Mapping[str, object] | PolicySpec | None


def spec_from(policy: PolicyKeys, where: str) -> PolicySpec:
    """A spec from ``policy`` (warren.toml keys or a PolicySpec); ``where`` names the
    integration in errors. The workspace defaults to the current directory."""
    if policy is None:
        spec = PolicySpec()
    elif isinstance(policy, PolicySpec):
        spec = PolicySpec().merged(policy)
    elif isinstance(policy, Mapping):
        spec = from_mapping(policy, where)
    else:
        raise ConfigError(
            f"{where}: policy must be a mapping of warren.toml keys or a PolicySpec, "
            f"not {type(policy).__name__}",
            operation="config",
            hint='pass e.g. {"workspace": ".", "preset": ["python"]}',
        )
    spec.workspace = os.path.abspath(spec.workspace or os.getcwd())
    return spec


def keys_of(spec: PolicySpec) -> dict[str, object]:
    """The warren.toml form of ``spec``: what a backend stores to recreate its sandbox."""
    return spec.to_mapping()


def merged_stdout(argv: list[str]) -> list[str]:
    """``argv`` with its stderr sent to stdout by the sandbox's own shell, so both
    arrive interleaved as written (two captured pipes would lose that order)."""
    return ["/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh", *argv]


# The terminal relay, run by the sandbox's python3: the command gets a PTY of its own
# (24x80, its own session, the signals a parent ignored back to their defaults), the
# relay's stdin is typed into it and what it shows goes to stdout; the relay ends as
# the command did, by the same signal when one killed it. util-linux ``script`` (the
# fallback where the sandbox has no python3) can only say 128+N for both.
_RELAY = r"""
import os, pty, select, signal, struct, sys, fcntl, termios
pid, master = pty.fork()
if pid == 0:
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(sys.argv[1], sys.argv[1:])
    except OSError as e:
        os.write(2, f"{sys.argv[1]}: {e.strerror}\n".encode())
        os._exit(127 if e.errno == 2 else 126)
def put(fd, data):
    while data:
        data = data[os.write(fd, data):]
fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGTERM):
    signal.signal(sig, lambda n, f: os.kill(pid, n))
watch = [0, master]
while master in watch:
    for fd in select.select(watch, [], [])[0]:
        try:
            data = os.read(fd, 65536)
        except OSError:
            data = b""
        if fd == master:
            if not data:
                watch.remove(master)
            else:
                put(1, data)
        elif data:
            put(master, data)
        else:
            watch.remove(0)
status = os.waitpid(pid, 0)[1]
if os.WIFSIGNALED(status):
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
    os.kill(os.getpid(), os.WTERMSIG(status))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def in_terminal(argv: list[str]) -> list[str]:
    """``argv`` in a terminal of its own, relayed over the process's pipes (so the
    caller's terminal is never the command's; what it prints arrives on stdout, as a
    terminal shows it): by warren's relay where the sandbox has python3, which ends
    the way the command did (killed by signal N, its wait status says so), else by
    util-linux ``script`` (128+N)."""
    inner = f"stty rows 24 cols 80 2>/dev/null; exec {shlex.join(argv)}"
    script = shlex.join(["script", "--quiet", "--flush", "--return", "--command", inner, "/dev/null"])
    pick = (
        "for py in /usr/bin/python3 /usr/local/bin/python3; do "
        'test -x "$py" && exec "$py" -I -S -c "$0" "$@"; done; '
        f"exec {script}"
    )
    return ["/bin/sh", "-c", pick, _RELAY, *argv]


def workspace_named(policy: PolicyKeys) -> bool:
    """Whether ``policy`` names a workspace (else the current directory is meant)."""
    if isinstance(policy, PolicySpec):
        return policy.workspace is not None
    return isinstance(policy, Mapping) and policy.get("workspace") is not None
