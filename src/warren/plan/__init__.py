"""Planning: policy + host facts + caller facts -> a Plan (pure), and its rendering.

``make_plan`` decides; ``_core`` executes. ``server.hostfacts.gather`` is the only part that
reads the system (the mount table, the Landlock ABI, path kinds)."""

from .facts import CallerFacts, HostFacts
from .make import make_plan
from .model import MountKind, MountOp, NetPlan, Plan

__all__ = ["CallerFacts", "HostFacts", "MountKind", "MountOp", "NetPlan", "Plan", "make_plan"]
