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
# The helper programs beside the front end: (name, source, linked statically if the C
# library allows it — the ones that run inside image sandboxes, whose own C library may
# be another or none —, what goes without it).
HELPERS = (
    (
        "warren-exec-stub",  # what a sandboxed command's process execs while it waits
        "native/exec-stub.c",
        True,
        "commands in sandboxes start from a Python process (about a millisecond slower each)",
    ),
    (
        "warren-walk",  # the supervisor's walks of a workspace (``_core.treewalk``)
        "native/walk.c",
        False,
        "each launch walks the workspace in Python (slower in large workspaces: "
        "bench/bench_workspace_size.py)",
    ),
    (
        "warren-init",  # a sandbox's PID 1 once set up (``_core.nativeinit``)
        "native/init.c",
        True,
        "a sandbox's PID 1 stays a Python process (about 4 MB of memory of its own per sandbox)",
    ),
    (
        "warren-credsend",  # names a command as its unix sends' sender (``_core.credsend``)
        "native/credsend.c",
        True,
        "a receiver asking for a unix message's sender is told warren's PID 1 (Chromium needs --no-zygote)",
    ),
    (
        "warren-thaw",  # thaws a paused sandbox if its supervisor dies (``server.pause``)
        "native/thaw.c",
        False,
        "a paused sandbox's guard is a Python process (about 1.5 MB of memory of its own)",
    ),
)
# Shared objects loaded (ctypes) by warren's own processes: (name, source, what goes
# without it).
LIBRARIES = (
    (
        "warren-continuer.so",  # answers a walk's window in PID 1 (``_core.continuer``)
        "native/continuer.c",
        "a command started during a large workspace's hard-link walk waits about 50 us more "
        "at each writing open (bench/bench_workspace_size.py)",
    ),
)


def protocol_version(root: Path) -> int:
    """protocol.VERSION, read from its one definition (the native side must speak it)."""
    text = (root / "src/warren/protocol/base.py").read_text()
    found = re.search(r"^VERSION = (\d+)", text, re.MULTILINE)
    if found is None:
        raise RuntimeError("src/warren/protocol/base.py defines no VERSION")
    return int(found.group(1))


def compile_native(
    root: Path, out: Path, source: str = SOURCE, static: bool = False, shared: bool = False
) -> str | None:
    """Compile ``source`` (the front end unless said) to ``out``; None when done, else
    why not. ``static``: linked statically if the C library allows it (the stub runs
    inside image sandboxes, whose own C library may be another or none), else as usual.
    ``shared``: a shared object (with threads) rather than a program."""
    if os.environ.get("WARREN_NATIVE") == "0":
        return "WARREN_NATIVE=0"
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    argv = [*cc.split(), "-O2", "-Wall", "-Wextra", f"-DWARREN_PROTOCOL={protocol_version(root)}"]
    if shared:
        argv += ["-shared", "-fPIC", "-pthread"]
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
        built = why is None
        for name, source, static, without in HELPERS:
            out = Path(self._tmp) / name
            helper_why = compile_native(Path(self.root), out, source, static=static)
            if helper_why is None:
                build_data["shared_scripts"][str(out)] = name
                built = True
            else:
                self.app.display_warning(f"warren: {name} was not built ({helper_why}); {without}")
        for name, source, without in LIBRARIES:
            out = Path(self._tmp) / name
            library_why = compile_native(Path(self.root), out, source, shared=True)
            if library_why is None:
                build_data["shared_scripts"][str(out)] = name
                built = True
            else:
                self.app.display_warning(f"warren: {name} was not built ({library_why}); {without}")
        if built:
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
