"""The workspace probes: what a build needs beyond plain files, run in the workspace
only (a unix socket, a FIFO, inotify, a git commit), and the process's own working
directory.

Each works only inside the scratch directory it is given. Standard library only.
"""

from __future__ import annotations

import errno as _errno
import os
import select
import shutil
import socket
import subprocess

from . import _kernel
from .probe_base import ProbeFailure, ProbeSkipped, _check, _op, _write, describe, j


def unix_socket(d: str) -> str:
    path = j(d, "sock")
    dfd = None
    # sun_path holds 108 bytes: reach a deep directory through its /proc/self/fd link.
    if len(os.fsencode(path)) > 100 and os.path.isdir("/proc/self/fd"):
        dfd = os.open(d, os.O_PATH | os.O_CLOEXEC)
        path = f"/proc/self/fd/{dfd}/sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        _op("bind", server.bind, path)
        server.listen(1)
        _op("connect", client.connect, path)
        conn, _ = server.accept()
        with conn:
            client.sendall(b"!")
            _check(conn.recv(1) == b"!", "recv", "no data arrived through the socket")
    finally:
        client.close()
        server.close()
        if dfd is not None:
            os.close(dfd)
    return ""


def fifo(d: str) -> str:
    path = j(d, "fifo")
    _op("mkfifo", os.mkfifo, path, 0o600)
    r = _op("open(fifo)", os.open, path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        w = _op("open(fifo)", os.open, path, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            os.write(w, b"!")
            _check(os.read(r, 1) == b"!", "read", "no data arrived through the FIFO")
        finally:
            os.close(w)
    finally:
        os.close(r)
    return ""


def inotify(d: str) -> str:
    fd = _op("inotify_init1", _kernel.inotify_init)
    try:
        _op("inotify_add_watch", _kernel.inotify_add_watch, fd, d, _kernel.IN_CREATE | _kernel.IN_MOVED_TO)
        _write(j(d, "watched"))
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        _check(bool(poller.poll(2000)), "read(inotify)", "no event within 2 s of creating a file")
        _check(b"watched" in os.read(fd, 4096), "read(inotify)", "the event does not name the created file")
    finally:
        os.close(fd)
    return ""


def _git_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    # The user's own config (hooks, signing) is not filesystem semantics: leave it out.
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_AUTHOR_NAME="warren doctor",
        GIT_AUTHOR_EMAIL="doctor@warren.invalid",
        GIT_COMMITTER_NAME="warren doctor",
        GIT_COMMITTER_EMAIL="doctor@warren.invalid",
    )
    return env


_STRERRORS = {
    os.strerror(e): e for e in (_errno.EXDEV, _errno.EACCES, _errno.EPERM, _errno.EROFS, _errno.ENOSPC)
}


def git_commit(d: str) -> str:
    git = shutil.which("git")
    if git is None:
        raise ProbeSkipped("git is not installed")
    repo = j(d, "repo")
    _op("mkdir", os.mkdir, repo)
    _write(j(repo, "README"))
    for step in (["init", "-q"], ["add", "README"], ["commit", "-q", "--no-gpg-sign", "-m", "doctor"]):
        try:
            p = subprocess.run(
                [git, *step], cwd=repo, env=_git_env(), capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ProbeFailure(f"git {step[0]}", str(e)) from e
        if p.returncode != 0:
            out = (p.stderr or p.stdout).strip().splitlines()
            msg = out[-1] if out else f"exit status {p.returncode}"
            err = next((n for s, n in _STRERRORS.items() if s in msg), None)
            raise ProbeFailure(f"git {step[0]}", msg, err)
    return ""


def _cwd() -> str:
    try:
        cwd = os.getcwd()
    except OSError as e:
        raise ProbeFailure("getcwd", describe(e), e.errno) from e
    _op("stat", os.stat, ".")
    return cwd
