"""A cold start (no supervisor running: the first command of a state directory, or one
after the supervisor's idle exit) starts the supervisor before anything else: what the
client does before the spawn is on the command's path, and the supervisor's own start
(its imports) follows it. ``connect.systemd_scope``, which decides how to spawn it,
imported the whole planner and policy (``warren.plan`` and ``warren.policy`` loaded every
module of theirs on import) to probe the caller's cgroups: 85-250 ms before the
supervisor even began to start. It now looks for a systemd user manager first and probes
only where there is one, and the probe loads the cgroup planning alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

# What only planning a sandbox needs: never loaded on a cold start's path before the spawn.
PLANNER = (
    "warren.plan.make",
    "warren.plan.facts",
    "warren.plan.model",
    "warren.policy.model",
    "warren.policy.resolve",
    "warren.policy.presets",
)


def _probe(code: str) -> str:
    """What ``code`` prints, run in a fresh interpreter (nothing of this one's loaded)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _scope_loads(runtime: Path) -> tuple[str, list[str]]:
    """What ``systemd_scope`` returns for a client whose XDG_RUNTIME_DIR is ``runtime``,
    and which of the planner's modules (and the cgroup module) it loaded, in a fresh
    interpreter."""
    watched = (*PLANNER, "warren._core.cgroups")
    probe = (
        "import json, sys\n"
        "from warren.client import connect\n"
        f"scope = connect.systemd_scope({{'XDG_RUNTIME_DIR': {str(runtime)!r}, 'PATH': '/usr/bin:/bin'}})\n"
        "print(repr(scope))\n"
        f"print(json.dumps(sorted(m for m in {watched!r} if m in sys.modules)))\n"
    )
    scope, loaded = _probe(probe).splitlines()
    return scope, json.loads(loaded)


def test_without_a_user_manager_the_spawn_waits_on_nothing_of_the_cgroups(tmp_path: Path) -> None:
    scope, loaded = _scope_loads(tmp_path)
    assert (scope, loaded) == ("[]", [])


def test_with_a_user_manager_the_cgroup_probe_loads_no_planner(tmp_path: Path) -> None:
    (tmp_path / "systemd").mkdir()
    (tmp_path / "systemd" / "private").touch()  # what marks a running user manager
    scope, loaded = _scope_loads(tmp_path)
    assert loaded == ["warren._core.cgroups"], loaded
    # Its answer as before: none where this uid's group is delegated, else systemd-run.
    assert scope == "[]" or "systemd-run" in scope, scope


def test_the_planner_and_policy_packages_still_name_what_they_export() -> None:
    probe = (
        "import warren.plan as plan, warren.policy as policy\n"
        "for mod in (plan, policy):\n"
        "    for name in mod.__all__:\n"
        "        assert getattr(mod, name).__module__.startswith(mod.__name__ + '.'), name\n"
        "try:\n"
        "    plan.nothing\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    assert _probe(probe).strip() == "module 'warren.plan' has no attribute 'nothing'"


def test_the_supervisor_starts_without_the_image_store_or_the_tls_stack() -> None:
    """What only an image sandbox (the image store: its unpacking and archive modules) or
    a sandbox with secrets (warren's CA, ``ssl``) uses is loaded when one comes, not on
    every supervisor's start: planning names the caller's image store
    (``images.location``), the rest only annotates."""
    probe = (
        "import json, sys\n"
        "import warren.server.supervisor\n"
        "import warren.server.daemon\n"
        "watched = ('warren.images.store', 'warren.images.unpack', 'warren.net.tlsca', 'ssl')\n"
        "print(json.dumps([m for m in watched if m in sys.modules]))\n"
    )
    assert json.loads(_probe(probe)) == []
