"""Build hook: the ``warren`` command is native/warren.c, compiled here with the system's
C compiler, and the pure-Python CLI is installed beside it as ``warren-python`` (what the
native front end hands everything but the plain ``run``/``exec`` to).

Without a compiler (or when it fails) the wheel is built as before: ``warren`` is the
pure-Python CLI, a warning says so, and nothing else changes but start-up time.
WARREN_NATIVE=0 asks for that build on purpose.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sysconfig
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PYTHON_CLI = "bin/warren"
SOURCE = "native/warren.c"
STUB_SOURCE = "native/exec-stub.c"  # what a sandboxed command's process execs while it waits
WALK_SOURCE = "native/walk.c"  # the supervisor's walks of a workspace (``_core.treewalk``)
CREDSEND_SOURCE = "native/credsend.c"  # names a command as its unix sends' sender (``_core.credsend``)


def protocol_version(root: Path) -> int:
    """protocol.VERSION, read from its one definition (the native side must speak it)."""
    text = (root / "src/warren/protocol/base.py").read_text()
    found = re.search(r"^VERSION = (\d+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError("src/warren/protocol/base.py defines no VERSION")
    return int(found.group(1))


def compile_native(root: Path, out: Path, source: str = SOURCE, static: bool = False) -> str | None:
    """Compile ``source`` (the front end unless said) to ``out``; None when done, else
    why not. ``static``: linked statically if the C library allows it (the stub runs
    inside image sandboxes, whose own C library may be another or none), else as usual."""
    if os.environ.get("WARREN_NATIVE") == "0":
        return "WARREN_NATIVE=0"
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = [*cc.split(), "-O2", "-Wall", "-Wextra", f"-DWARREN_PROTOCOL={protocol_version(root)}"]
    if shutil.which(argv[0]) is None:
        return f"no C compiler ({argv[0]!r} not found)"
    if static:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            linked = subprocess.run(
                [*argv, "-static", "-o", str(out), str(root / source)], capture_output=True, timeout=120
            )
            if linked.returncode == 0:
                return None
    try:
        done = subprocess.run(
            [*argv, "-o", str(out), str(root / source)], capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{argv[0]} failed: {e}"
    if done.returncode != 0:
        return f"{argv[0]} failed: {done.stderr.strip()[-2000:]}"
    return None


class NativeFrontEnd(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        self._tmp = tempfile.mkdtemp(prefix="warren-native-")
        binary = Path(self._tmp) / "warren"
        why = compile_native(Path(self.root), binary)
        stub = Path(self._tmp) / "warren-exec-stub"
        stub_why = compile_native(Path(self.root), stub, STUB_SOURCE, static=True)
        if stub_why is None:
            build_data["shared_scripts"][str(stub)] = "warren-exec-stub"
        else:
            self.app.display_warning(
                f"warren: the exec stub was not built ({stub_why}); commands in sandboxes start "
                "from a Python process (about a millisecond slower each)"
            )
        walk = Path(self._tmp) / "warren-walk"
        walk_why = compile_native(Path(self.root), walk, WALK_SOURCE)
        if walk_why is None:
            build_data["shared_scripts"][str(walk)] = "warren-walk"
        else:
            self.app.display_warning(
                f"warren: the native tree walk was not built ({walk_why}); each launch walks the "
                "workspace in Python (slower in large workspaces: bench/bench_workspace_size.py)"
            )
        credsend = Path(self._tmp) / "warren-credsend"
        credsend_why = compile_native(Path(self.root), credsend, CREDSEND_SOURCE, static=True)
        if credsend_why is None:
            build_data["shared_scripts"][str(credsend)] = "warren-credsend"
        else:
            self.app.display_warning(
                f"warren: the credentials sender was not built ({credsend_why}); a receiver asking "
                "for a unix message's sender is told warren's PID 1 (Chromium needs --no-zygote)"
            )
        if why is None or stub_why is None or walk_why is None or credsend_why is None:
            build_data["pure_python"] = False
            build_data["infer_tag"] = True
        if why is None:
            build_data["shared_scripts"][str(binary)] = "warren"
            build_data["shared_scripts"][PYTHON_CLI] = "warren-python"
        else:
            self.app.display_warning(
                f"warren: the native front end was not built ({why}); `warren` is the pure-Python "
                "CLI (the same commands, about 20 ms slower to start)"
            )
            build_data["shared_scripts"][PYTHON_CLI] = "warren"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
