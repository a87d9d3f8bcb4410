"""The code interpreter's kernels, inside an E2B sandbox: a small gateway between warren's
E2B service and Jupyter kernels (``ipykernel``), run by the kernel environment's Python
(``interpreter.KernelEnv``), never by warren's own: it imports nothing of warren.

It reads one JSON request a line on stdin and answers on stdout, one JSON line each,
tagged with the request's ``id``: ``{"id", "out": {...}}`` for each output of an
execution, in the form e2b-code-interpreter reads (``stdout``, ``stderr``, ``result``
with one field per MIME type, ``error``, ``number_of_executions``), and ``{"id", "end":
{...}}`` once the request is done (with ``"error"`` if it failed). Requests:

- ``{"op": "execute", "code", "context", "language", "env"}``: run code in a context
  (None: the language's default one, made on first use);
- ``{"op": "create", "language", "cwd"}``, ``{"op": "list"}``, ``{"op": "remove",
  "context"}``, ``{"op": "restart", "context"}``: contexts, each a kernel of its own.

Kernels talk to the gateway over the sandbox's own loopback; their runtime files live in
``$JUPYTER_RUNTIME_DIR`` (the sandbox's private /tmp), not in its home.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import uuid
from typing import Any

from jupyter_client.manager import KernelManager  # type: ignore[import-not-found]

MIME = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}
KERNELS = {"python": "python3"}
_write = threading.Lock()


def send(line: dict[str, Any]) -> None:
    text = json.dumps(line, default=str)
    with _write:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


class Context:
    def __init__(self, language: str, cwd: str) -> None:
        self.id = uuid.uuid4().hex
        self.language, self.cwd = language, cwd
        self.manager = KernelManager(kernel_name=KERNELS[language])
        self.manager.start_kernel(cwd=cwd)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.lock = threading.Lock()  # one execution at a time, as a notebook runs them

    def answer(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def execute(self, ident: int, code: str, env: dict[str, str]) -> None:
        with self.lock:
            if env and self.language == "python":
                # set for this execution only, then put back, as E2B's env_vars
                self._silent(f"import os as _o; _e2b_env = dict(_o.environ); _o.environ.update({env!r})")
            try:
                self._run(ident, code)
            finally:
                if env and self.language == "python":
                    self._silent("_o.environ.clear(); _o.environ.update(_e2b_env); del _e2b_env, _o")

    def _silent(self, code: str) -> None:
        msg_id = self.client.execute(code, silent=True, store_history=False)
        self.client.get_shell_msg(timeout=60)
        while True:
            msg = self.client.get_iopub_msg(timeout=60)
            parent = msg.get("parent_header", {}).get("msg_id")
            if (
                parent == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                return

    def _run(self, ident: int, code: str) -> None:
        msg_id = self.client.execute(code)
        while True:
            try:
                msg = self.client.get_iopub_msg(timeout=1)
            except queue.Empty:
                if not self.manager.is_alive():
                    send(
                        {
                            "id": ident,
                            "out": {
                                "type": "error",
                                "name": "KernelDied",
                                "value": "the kernel died",
                                "traceback": "",
                            },
                        }
                    )
                    return
                continue
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            stamp = msg["header"].get("date")
            if kind == "stream":
                send(
                    {
                        "id": ident,
                        "out": {"type": content["name"], "text": content["text"], "timestamp": stamp},
                    }
                )
            elif kind in ("execute_result", "display_data"):
                out: dict[str, Any] = {"type": "result", "is_main_result": kind == "execute_result"}
                extra = {}
                for mime, value in content.get("data", {}).items():
                    if mime in MIME:
                        out[MIME[mime]] = value
                    else:
                        extra[mime] = value
                if extra:
                    out["extra"] = extra
                send({"id": ident, "out": out})
            elif kind == "error":
                out = {"type": "error", "name": content["ename"], "value": content["evalue"]}
                out["traceback"] = "\n".join(content.get("traceback", []))
                send({"id": ident, "out": out})
            elif kind == "execute_input":
                send(
                    {
                        "id": ident,
                        "out": {
                            "type": "number_of_executions",
                            "execution_count": content["execution_count"],
                        },
                    }
                )
            elif kind == "status" and content["execution_state"] == "idle":
                return

    def stop(self) -> None:
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)


class Gateway:
    def __init__(self, home: str) -> None:
        self.home = home
        self.contexts: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}
        self.lock = threading.Lock()

    def context(self, ident: str | None, language: str | None) -> Context:
        with self.lock:
            if ident:
                if ident not in self.contexts:
                    raise LookupError(f"context {ident!r} not found")
                return self.contexts[ident]
            language = language or "python"
            if language not in KERNELS:
                raise ValueError(f"language {language!r} is not offered (python only)")
            if language not in self.defaults:
                made = Context(language, self.home)
                self.contexts[made.id] = made
                self.defaults[language] = made.id
            return self.contexts[self.defaults[language]]

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "execute":
            ctx = self.context(request.get("context"), request.get("language"))
            ctx.execute(request["id"], request.get("code", ""), dict(request.get("env") or {}))
            return {}
        if op == "create":
            language = request.get("language") or "python"
            if language not in KERNELS:
                raise ValueError(f"language {language!r} is not offered (python only)")
            made = Context(language, request.get("cwd") or self.home)
            with self.lock:
                self.contexts[made.id] = made
            return {"context": made.answer()}
        if op == "list":
            with self.lock:
                return {"contexts": [c.answer() for c in self.contexts.values()]}
        if op in ("remove", "restart"):
            ctx = self.context(request.get("context"), None)
            if op == "remove":
                with self.lock:
                    del self.contexts[ctx.id]
                    for language, ident in list(self.defaults.items()):
                        if ident == ctx.id:
                            del self.defaults[language]
                ctx.stop()
            else:
                with ctx.lock:
                    ctx.manager.restart_kernel(now=True)
                    ctx.client.wait_for_ready(timeout=60)
            return {}
        raise ValueError(f"unknown operation {op!r}")


def serve(gateway: Gateway, request: dict[str, Any]) -> None:
    try:
        end = gateway.handle(request)
    except LookupError as e:
        end = {"error": {"status": 404, "message": str(e)}}
    except ValueError as e:
        end = {"error": {"status": 400, "message": str(e)}}
    except Exception as e:
        end = {"error": {"status": 500, "message": f"{type(e).__name__}: {e}"}}
    send({"id": request.get("id"), "end": end})


def main() -> None:
    gateway = Gateway(os.getcwd())
    send({"id": None, "end": {"ready": True}})
    for line in sys.stdin:
        try:
            request = json.loads(line)
        except ValueError:
            continue
        if isinstance(request, dict):
            threading.Thread(target=serve, args=(gateway, request), daemon=True).start()


if __name__ == "__main__":
    main()
