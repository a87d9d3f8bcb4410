"""Planning: policy + host facts + caller facts -> a Plan (pure), and its rendering.

``make_plan`` decides; ``_core`` executes. ``server.hostfacts.gather`` is the only part that
reads the system (the mount table, the Landlock ABI, path kinds).

The names below load when first named: a module of the package (``plan.limits``, which
the cgroup probe needs) is imported without the planner and the whole policy with it
(``connect.systemd_scope``, on a cold start's path before the supervisor is spawned)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .facts import CallerFacts, HostFacts
    from .make import make_plan
    from .model import MountKind, MountOp, NetPlan, Plan

_LAZY = {
    "CallerFacts": "facts",
    "HostFacts": "facts",
    "make_plan": "make",
    "MountKind": "model",
    "MountOp": "model",
    "NetPlan": "model",
    "Plan": "model",
}


def __getattr__(name: str) -> object:
    from .._lazy import named

    return named(__name__, _LAZY, globals(), name)


__all__ = ["CallerFacts", "HostFacts", "MountKind", "MountOp", "NetPlan", "Plan", "make_plan"]
