"""pasta (from the passt package) for ``--network open``: a user-mode TCP/IP stack
attached to the sandbox's user and network namespaces from outside.

pasta runs in the host's namespaces and translates the sandbox's traffic into
ordinary sockets of the user; it is told never to map the host's loopback or
forward ports. It runs in the foreground as a child of the supervisor, under a
parent-death signal: measured, a daemonized pasta does not exit when the
namespace's processes die (it holds the netns), so it would be litter forever.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal

from ..errors import SetupError

PASTA_TIMEOUT = 10.0


class Pasta:
    """pasta attached to a sandbox's user and network namespaces, in the foreground
    as a child of the caller, with a parent-death signal: if the caller dies, pasta
    dies too (by itself it would keep the namespace alive forever)."""

    def __init__(self, pid: int, pidfd: int, log: int) -> None:
        self.pid = pid
        self.pidfd: int | None = pidfd
        self.log = log

    @classmethod
    def spawn(cls, pid1: int, search_path: str | None = None) -> Pasta:
        """``search_path``: the caller's PATH, where its pasta is found."""
        exe = shutil.which("pasta", path=search_path)
        if exe is None:
            raise SetupError(
                "--network open needs pasta, which is not installed",
                operation="network",
                hint="install the passt package (apt install passt), or use --network allow",
            )
        tun = "/dev/net/tun"
        if not os.access(tun, os.R_OK | os.W_OK):
            raise SetupError(
                f"--network open needs {tun}, which you cannot open",
                operation="network",
                path=tun,
                hint="the distribution default is mode 0666 (as root: chmod 0666 /dev/net/tun), "
                "or use --network allow",
            )
        argv = [
            exe,
            "--foreground",
            "--quiet",
            "--config-net",
            # No port forwarding in either direction, and the gateway address is the
            # real gateway: nothing in the sandbox can reach the host's loopback.
            *("-t", "none", "-u", "none", "-T", "none", "-U", "none"),
            "--no-map-gw",
            *("--userns", f"/proc/{pid1}/ns/user", "--netns", f"/proc/{pid1}/ns/net"),
        ]
        if os.getuid() == 0:
            # As root pasta would switch to "nobody" before opening the namespaces,
            # which are root's (it gives up its capabilities by itself).
            argv += ["--runas", "0:0"]
        setpriv = shutil.which("setpriv", path=search_path)
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "KILL", *argv]
        log = os.memfd_create("warren-pasta-log", os.MFD_CLOEXEC)
        devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            pid = os.posix_spawn(
                argv[0],
                argv,
                {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, devnull, 0),
                    (os.POSIX_SPAWN_DUP2, devnull, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                ],
                setsigdef=(signal.SIGPIPE, signal.SIGINT, signal.SIGTERM),
            )
        except OSError as e:
            os.close(log)
            raise SetupError.from_os(
                e,
                f"cannot start pasta: {e.strerror}",
                "network",
                argv[0],
                hint="check the passt package, or use --network allow",
            ) from None
        finally:
            os.close(devnull)
        return cls(pid, os.pidfd_open(pid), log)

    def failure(self) -> SetupError:
        return SetupError(
            f"pasta could not set up the sandbox's network: {self.output() or 'it did not finish in time'}",
            operation="network",
            hint="check that pasta works here (pasta --version); or use --network allow",
        )

    def output(self) -> str:
        data = os.pread(self.log, 8192, 0).decode(errors="replace")
        return " ".join(line.strip() for line in data.splitlines() if line.strip() and "syslog" not in line)

    def stop(self, wait: bool = True) -> None:
        if self.pidfd is None:
            return
        with contextlib.suppress(OSError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGTERM)
        if wait:
            poller = select.poll()  # not select(): the supervisor's descriptors pass 1024
            poller.register(self.pidfd, select.POLLIN)
            if not poller.poll(1000):
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        os.close(self.pidfd)
        os.close(self.log)
        self.pidfd = None
