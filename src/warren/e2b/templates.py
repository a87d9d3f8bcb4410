"""Templates built through E2B's build API, as far as warren can build them: a template
made from another one with nothing added (``Template().from_template("base")``) is a new
name for what that one stands for (a policy, a preset, an image, a profile). A build with
steps, an image or a start command needs E2B's build service: it ends in ``error``,
saying so, and names nothing.

The names live beside the sandboxes' root (``ROOT-templates/names.json``, a private
directory of this user), so a restarted ``warren serve`` still knows them; builds in
flight are the service's memory only. No I/O on sandboxes here.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .records import ensure_root

NAMES = "names.json"
NOT_BUILT = (
    "building a template from an image or with steps (run_cmd, copy, ...) or a start command "
    "needs E2B's build service, which warren does not offer: only a template made from another "
    "one with nothing added is built (a new name for it)"
)


@dataclass
class Build:
    template_id: str
    build_id: str
    name: str
    status: str = "waiting"
    reason: str | None = None
    log: list[dict[str, str]] = field(default_factory=list)

    def answer(self, offset: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "templateID": self.template_id,
            "buildID": self.build_id,
            "status": self.status,
            "logs": [e["message"] for e in self.log[offset:]],
            "logEntries": self.log[offset:],
        }
        if self.reason is not None:
            out["reason"] = {"message": self.reason}
        return out

    def say(self, message: str, level: str = "info") -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.log.append({"timestamp": stamp, "message": message, "level": level})


class Templates:
    def __init__(self, root: str) -> None:
        self.root = root + "-templates"
        self._lock = threading.Lock()
        self.builds: dict[str, Build] = {}

    def _names(self) -> dict[str, dict[str, str]]:
        try:
            with open(os.path.join(self.root, NAMES), encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _save(self, names: dict[str, dict[str, str]]) -> None:
        ensure_root(self.root)
        path = os.path.join(self.root, NAMES)
        tmp = f"{path}.{secrets.token_hex(4)}"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(names, f, sort_keys=True)
        os.replace(tmp, path)

    def base_of(self, name: str) -> str | None:
        """What a built name stands for (by its name or its id), or None."""
        with self._lock:
            names = self._names()
        if name in names:
            return names[name]["base"]
        return next((v["base"] for v in names.values() if v["id"] == name), None)

    def request(self, name: str) -> Build:
        template_id = f"tpl-{secrets.token_hex(8)}"
        with self._lock:
            known = self._names().get(name)
        build = Build(known["id"] if known else template_id, secrets.token_hex(8), name)
        build.say(f"Template created with ID: {build.template_id}, Build ID: {build.build_id}")
        self.builds[build.build_id] = build
        return build

    def finish(self, build: Build, base: str | None) -> None:
        """The build done: ``base`` named under the build's name, or (None) refused."""
        if base is None:
            build.status, build.reason = "error", NOT_BUILT
            build.say(NOT_BUILT, "error")
            return
        with self._lock:
            names = self._names()
            names[build.name] = {"id": build.template_id, "base": base}
            self._save(names)
        build.status = "ready"
        build.say(f"Template {build.name!r} is {base!r} under a new name")

    def remove(self, name: str) -> bool:
        with self._lock:
            names = self._names()
            found = [k for k, v in names.items() if k == name or v["id"] == name]
            for k in found:
                del names[k]
            if found:
                self._save(names)
            if not names:
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.root, NAMES))
                    os.rmdir(self.root)
        return bool(found)
