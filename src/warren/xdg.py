"""The XDG base directories as the specification reads them: a variable set to an
absolute path names the directory; unset, empty or relative, it is ignored and the
default under the home stands. Every place warren derives a path from one of them reads
it here, so that the supervisor's state, the presets' grants, the places the host runs
programs from and the user's config agree. Standard library only (the CLI's fast path
imports ``statedir``)."""

from __future__ import annotations

import posixpath

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

DEFAULTS = {
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
    "XDG_BIN_HOME": ".local/bin",
}


def base(env: Mapping[str, str], name: str, home: str) -> str:
    """The directory ``$name`` names for a caller whose environment is ``env`` and whose
    home is ``home`` (normalized; the default under ``home`` unless absolute)."""
    value = env.get(name) or ""
    if value.startswith("/"):
        return posixpath.normpath(value)
    return posixpath.join(home, DEFAULTS[name])
