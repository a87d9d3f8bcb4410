"""Where a caller's image store is: apart from ``store`` so that planning a sandbox,
which names the store of every caller, does not load the store itself (its unpacking
and archive modules) on the supervisor's start."""

from __future__ import annotations

import os
from pathlib import Path

from ..statedir import data_home


def default_root(env: dict[str, str] | None = None) -> Path:
    return Path(data_home(os.environ if env is None else env)) / "images"
