"""Carry the doctor into a sandbox as one command line, wherever warren is installed.

``warren doctor --sandbox`` must work whether or not the sandbox can see warren's own
files (an editable install under ``/tmp``, a checkout in a hidden or denied
directory): the doctor is standard library only, so its sources travel inside the
``python -I -c`` argument, compressed, and are imported from memory there. Only the
interpreter has to be visible. Standard library only, like the rest of the doctor.
"""

from __future__ import annotations

import base64
import json
import os
import zlib

PACKAGE = "warren.doctor"

# Runs inside the sandbox: import warren.doctor from the carried sources, run it.
_BOOT = """\
import base64, importlib.abc, importlib.util, json, sys, zlib
SRC = json.loads(zlib.decompress(base64.b64decode({blob!r})))
class Carried(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        if name not in SRC:
            return None
        return importlib.util.spec_from_loader(name, self, is_package=SRC[name][0])
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        name = module.__name__
        exec(compile(SRC[name][1], "<warren-doctor>/" + name, "exec"), module.__dict__)
sys.meta_path.insert(0, Carried())
sys.argv = ["warren doctor", *sys.argv[1:]]
from warren.doctor.probe_main import main
sys.exit(main())
"""


def sources() -> dict[str, tuple[bool, str]]:
    """Module name -> (is a package, source) for warren.doctor and an empty warren."""
    here = os.path.dirname(os.path.abspath(__file__))
    out: dict[str, tuple[bool, str]] = {"warren": (True, "")}
    for entry in sorted(os.listdir(here)):
        if not entry.endswith(".py") or entry == "__main__.py":
            continue
        with open(os.path.join(here, entry), encoding="utf-8") as f:
            text = f.read()
        if entry == "__init__.py":
            out[PACKAGE] = (True, text)
        else:
            out[f"{PACKAGE}.{entry[:-3]}"] = (False, text)
    return out


def command(python: str, args: list[str]) -> list[str]:
    """argv that runs ``warren doctor ARGS`` with ``python`` from sources carried inline."""
    blob = base64.b64encode(zlib.compress(json.dumps(sources()).encode(), 9)).decode()
    return [python, "-I", "-c", _BOOT.format(blob=blob), *args]
