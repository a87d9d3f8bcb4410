"""How long a sandbox's helpers stay without a request: ``WARREN_SPARE_IDLE``."""

from __future__ import annotations

import os


def spare_idle() -> float:
    """Seconds without a request before what serves a sandbox is let go (its spare
    helper and its command's process, its keeper, its network helper):
    ``WARREN_SPARE_IDLE`` in the supervisor's environment, 60 by default (an agent's
    next command after half a minute with its model finds one waiting; a sandbox booted
    ahead is kept as long, ``server.ahead.IDLE``)."""
    try:
        return max(0.5, float(os.environ.get("WARREN_SPARE_IDLE", "60")))
    except ValueError:
        return 60.0
