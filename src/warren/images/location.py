"""Where a caller's image store is: apart from ``store`` so that planning a sandbox,
which names the store of every caller, does not load the store itself (its unpacking
and archive modules) on the supervisor's start."""

from __future__ import annotations

import os
from pathlib import Path


def default_root(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    base = env.get("XDG_DATA_HOME") or ""
    if not base.startswith("/"):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "share")
    return Path(os.path.normpath(base)) / "warren" / "images"
