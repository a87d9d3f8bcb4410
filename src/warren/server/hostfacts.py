"""Gathering the host's facts for the planner (``plan.facts.HostFacts``): the mount
table, the kernel's Landlock ABI and capabilities, the kind of each path a plan
depends on, the caller's cgroups. The only effectful half of planning, kept on the
server's side so that ``plan/`` imports nothing that touches the system through
``_core``; the planner itself (``plan.make_plan``) takes the result as plain data.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import sys
from collections.abc import Iterable

from .._core import cgroups as _cgroups
from .._core import kernel
from ..plan.facts import FIXED_PATHS, HostFacts, enclosing_repository, parse_mountinfo, path_kind
from ..plan.limits import USER_NS_SHARES
from ..plan.model import GitDir
from ..policy.limits import cpu_count, mem_total


@functools.cache
def _cap_last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except OSError:
        return 40


@functools.cache
def _kernel_landlock_abi() -> int:
    return kernel.landlock_abi()


@functools.cache
def namespaces() -> tuple[str, int]:
    """Whether user namespaces work here, probed once per process by their effect."""
    return kernel.userns_probe()


def free_loopback_port() -> int:
    """A port of 127.0.0.1 free now, for a degraded sandbox's proxy: PID 1 listens on it
    at launch, and the launch fails (never connects elsewhere) if it was taken meanwhile."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def gather(
    extra_paths: Iterable[str] = (),
    state_dir: str | None = None,
    image_store: str | None = None,
    e2b_homes: str | None = None,
    outside_links: tuple[tuple[str, int, int, bool], ...] = (),
    git: tuple[GitDir, ...] = (),
    git_files: tuple[str, ...] = (),
    workspace: str | None = None,
    caller_cgroups: str | None = None,
    secret_files: tuple[str, ...] = (),
) -> HostFacts:
    """``caller_cgroups``: the caller's /proc/PID/cgroup text (``CallerFacts.cgroups``):
    its sandboxes' cgroups go beneath the caller's groups, not this process's."""
    with open("/proc/self/mountinfo") as f:
        mounts = parse_mountinfo(f.read())
    paths = set(FIXED_PATHS) | set(extra_paths)
    paths.update(p for p in (state_dir, image_store, e2b_homes, *secret_files) if p)
    kinds = {p: path_kind(p) for p in paths}
    return HostFacts(
        mounts=mounts,
        landlock_abi=_kernel_landlock_abi(),
        cap_last_cap=_cap_last_cap(),
        machine_supported=kernel.machine_supported() and sys.platform == "linux",
        path_kinds=kinds,
        state_dir=state_dir,
        image_store=image_store,
        e2b_homes=e2b_homes,
        secret_files=secret_files,
        outside_links=outside_links,
        git=git,
        git_files=git_files,
        writable_dirs=frozenset(p for p in paths if kinds[p] == "dir" and os.access(p, os.W_OK)),
        owners=_owners(p for p in paths if kinds[p] == "dir") if os.getuid() == 0 else {},
        cgroups=_cgroups.probe(os.getuid(), caller_cgroups),
        mem_total=mem_total(),
        repository=enclosing_repository(workspace) if workspace else None,
        cpus=cpu_count(),
        namespaces=namespaces(),
        user_counts=user_counts(),
    )


def _owners(dirs: Iterable[str]) -> dict[str, int]:
    out = {}
    for d in dirs:
        with contextlib.suppress(OSError):
            out[d] = os.stat(d).st_uid
    return out


def user_counts() -> tuple[tuple[str, int], ...]:
    """The limits of /proc/sys/user a sandbox's user namespace gets a share of, as this
    user namespace has them (those the kernel has)."""
    out = []
    for name in USER_NS_SHARES:
        try:
            with open(f"/proc/sys/user/{name}") as f:
                out.append((name, int(f.read())))
        except (OSError, ValueError):
            continue
    return tuple(out)
