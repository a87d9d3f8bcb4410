"""e2b-code-interpreter's ``run_code``: its kernel port (49999) answered from the host.

E2B's code-interpreter sandboxes run a Jupyter server behind a small HTTP service on port
49999. Here the service is ours: ``/execute`` (and the ``/contexts`` routes) are answered
by warren's E2B service, which drives a gateway inside the sandbox (``kernel_gateway``,
run by the kernel environment's Python) over that process's stdin and stdout, through
the same transport as every command: no port of the sandbox is opened to the host. The
kernels (``ipykernel``) run inside the sandbox, as the sandbox's user, under its policy.

The kernel environment (``KernelEnv``) is a virtual environment with ``ipykernel`` and
``matplotlib`` from PyPI (wheels only: nothing of theirs runs at install), made once per
user on the host in ``~/.cache/warren-e2b-kernel`` (or ``WARREN_E2B_KERNEL_ENV``), outside
every writable root of an E2B template's policy: sandboxes read it, none can change it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..client.transport import Command
from ..errors import SandboxError, WarrenError
from .control import MAX_BODY, json_object
from .core import Core, E2BError
from .envd_base import EnvdService
from .rest import handled

PACKAGES = ("ipykernel", "matplotlib")
# The gateway's source, run as ``python -c``: warren's own files need not be visible in
# the sandbox (an install under /tmp is not: the sandbox's /tmp is its own).
GATEWAY = Path(__file__).with_name("kernel_gateway.py")
POLL = 0.05
# The gateway's output is kept like any command's, to this many bytes: past it, the
# gateway (and its kernels) is started anew.
OUTPUT_LIMIT = 64 * 1024 * 1024
MAX_LINE = 32 * 1024 * 1024
MAX_CODE = 16 * 1024 * 1024


class KernelEnv:
    """The host's virtual environment the kernels run from, made on first use."""

    def __init__(self, env: Mapping[str, str]) -> None:
        given = env.get("WARREN_E2B_KERNEL_ENV")
        self.path = Path(given) if given else Path(os.path.expanduser("~")) / ".cache" / "warren-e2b-kernel"
        self._lock = threading.Lock()

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")

    def ready(self) -> bool:
        return (self.path / ".warren-ready").is_file()

    def ensure(self) -> None:
        """Make the environment unless it is there: in a directory of its own, renamed
        into place once whole, under a lock another service of this user shares."""
        with self._lock:
            if self.ready():
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.parent / ".warren-e2b-kernel.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if self.ready():
                    return
                staging = self.path.parent / f".warren-e2b-kernel-{uuid.uuid4().hex}"
                try:
                    self._make(staging)
                    with contextlib.suppress(FileNotFoundError):
                        shutil.rmtree(self.path)
                    # its programs are run as ``bin/python -m``: nothing names the staging path
                    os.rename(staging, self.path)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)

    def _make(self, where: Path) -> None:
        pip = [str(where / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        for step in ([sys.executable, "-m", "venv", str(where)], [*pip, "--only-binary=:all:", *PACKAGES]):
            done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
            if done.returncode != 0:
                raise SandboxError(
                    f"cannot make the code interpreter's kernel environment in {where}: "
                    f"{(done.stderr or done.stdout).strip()[-400:]}",
                    operation="e2b-kernel",
                    path=str(where),
                    hint="pip needs to reach PyPI (or your index) once to fetch ipykernel and matplotlib; "
                    "or make the environment yourself and point WARREN_E2B_KERNEL_ENV at it",
                )
        (where / ".warren-ready").write_text(" ".join(PACKAGES) + "\n")


class Gateway:
    """The gateway process of one sandbox and the requests waiting for its answers."""

    def __init__(self, core: Core, sandbox_id: str, spawn_id: str) -> None:
        self.core, self.sandbox_id, self.spawn_id = core, sandbox_id, spawn_id
        self.offset = 0
        self.buffer = b""
        self.waiting: dict[int, asyncio.Queue[dict[str, Any]]] = {}
        self.ids = itertools.count(1)
        self.ready = asyncio.Event()
        self.ended: str | None = None
        self.on_end: Callable[[Gateway], None] | None = None
        self.reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        try:
            while True:
                state, out, _ = await self.core.call(
                    self.core.transport.process, self.sandbox_id, self.spawn_id, self.offset, 0
                )
                self.offset += len(out)
                self.buffer += out
                while b"\n" in self.buffer:
                    line, _, self.buffer = self.buffer.partition(b"\n")
                    self._dispatch(line)
                if len(self.buffer) > MAX_LINE:
                    raise SandboxError(
                        "the kernel gateway sent a line over the limit", operation="e2b-kernel"
                    )
                if not state.running:
                    self._end("the kernel gateway ended")
                    return
                if not out:
                    await asyncio.sleep(POLL)
        except (WarrenError, OSError) as e:
            self._end(f"the kernel gateway is gone: {e}")

    def _dispatch(self, raw: bytes) -> None:
        try:
            line = json.loads(raw)
        except ValueError:
            return
        if not isinstance(line, dict):
            return
        if line.get("id") is None:
            self.ready.set()
            return
        queue = self.waiting.get(line["id"]) if isinstance(line.get("id"), int) else None
        if queue is not None:
            queue.put_nowait(line)

    def _end(self, why: str) -> None:
        self.ended = why
        if self.on_end is not None:
            self.on_end(self)
        self.ready.set()
        for queue in self.waiting.values():
            queue.put_nowait({"end": {"error": {"status": 502, "message": why}}})

    async def request(self, body: dict[str, Any]) -> AsyncGenerator[dict[str, Any], None]:
        """Each output line of the request, then its end (``{"end": ...}``)."""
        await self.ready.wait()
        if self.ended is not None:
            raise E2BError(502, self.ended)
        ident = next(self.ids)
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.waiting[ident] = queue
        try:
            data = (json.dumps({**body, "id": ident}) + "\n").encode()
            await self.core.call(self.core.transport.write_stdin, self.sandbox_id, self.spawn_id, data)
            while True:
                line = await queue.get()
                yield line
                if "end" in line:
                    return
        finally:
            del self.waiting[ident]

    async def call(self, body: dict[str, Any]) -> dict[str, Any]:
        """A request whose answer is its end alone; its error an E2B error."""
        end: dict[str, Any] = {}
        async for line in self.request(body):
            end = line.get("end") or {}
        error = end.get("error")
        if isinstance(error, dict):
            raise E2BError(int(error.get("status", 500)), str(error.get("message", "kernel error")))
        return end


class Interpreter:
    """The gateways of this service's sandboxes, started on first use."""

    def __init__(self, core: Core, env: Mapping[str, str]) -> None:
        self.core = core
        self.kernel_env = KernelEnv(env)
        self.gateways: dict[str, Gateway] = {}
        self._starting = asyncio.Lock()

    async def gateway(self, sandbox_id: str, home: str) -> Gateway:
        async with self._starting:
            found = self.gateways.get(sandbox_id)
            if found is not None and found.ended is None and found.offset < OUTPUT_LIMIT // 2:
                return found
            if found is not None:
                with contextlib.suppress(WarrenError):
                    await self.core.call(
                        self.core.transport.write_stdin, sandbox_id, found.spawn_id, b"", eof=True
                    )
            await self.core.call(self.kernel_env.ensure)
            runtime = f"/tmp/.e2b-kernel-{uuid.uuid4().hex}"
            env = {
                "HOME": home,
                "PWD": home,
                "JUPYTER_RUNTIME_DIR": runtime,
                "JUPYTER_DATA_DIR": f"{runtime}/data",
                "IPYTHONDIR": f"{runtime}/ipython",
                "MPLCONFIGDIR": f"{runtime}/matplotlib",
                "MPLBACKEND": "module://matplotlib_inline.backend_inline",
                "PYTHONUNBUFFERED": "1",
            }
            command = Command(
                [self.kernel_env.python, "-c", GATEWAY.read_text()],
                home,
                {**self.core.record(sandbox_id).envs, **env},
                output_limit=OUTPUT_LIMIT,
                stdin_pipe=True,
            )
            spawn_id, _ = await self.core.call(self.core.transport.spawn, sandbox_id, command)
            made = Gateway(self.core, sandbox_id, spawn_id)
            made.on_end = self._forget
            self.gateways[sandbox_id] = made
            return made

    def _forget(self, gateway: Gateway) -> None:
        """An ended gateway (its sandbox gone, or itself) is started anew when next asked."""
        if self.gateways.get(gateway.sandbox_id) is gateway:
            del self.gateways[gateway.sandbox_id]


class KernelPort(EnvdService):
    """The routes of port 49999, as e2b-code-interpreter calls them; the access token was
    checked by ``front.Access`` (every one of them needs it)."""

    def __init__(self, core: Core, env: Mapping[str, str]) -> None:
        super().__init__(core)
        self.interpreter = Interpreter(core, env)

    async def _gateway(self, request: Request) -> Gateway:
        info, record = await self.sandbox(request.headers)
        if self.core.records.get(info.name) is None:
            raise E2BError(404, f"sandbox {info.name!r} was not created through the E2B API: no kernel")
        return await self.interpreter.gateway(info.name, record.inside)

    async def execute(self, request: Request) -> Response:
        data = await json_object(request, required=True, limit=MAX_CODE)
        code, context, language = data.get("code"), data.get("context_id"), data.get("language")
        envs = data.get("env_vars") or {}
        if not isinstance(code, str):
            raise E2BError(400, "code must be a string")
        if context is not None and not isinstance(context, str):
            raise E2BError(400, "context_id must be a string")
        if language is not None and not isinstance(language, str):
            raise E2BError(400, "language must be a string")
        if not isinstance(envs, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
        ):
            raise E2BError(400, "env_vars must be an object of strings")
        gateway = await self._gateway(request)
        lines = gateway.request(
            {"op": "execute", "code": code, "context": context, "language": language, "env": envs}
        )
        first = await anext(lines)
        error = (first.get("end") or {}).get("error")
        if isinstance(error, dict):
            await lines.aclose()
            raise E2BError(int(error.get("status", 500)), str(error.get("message", "kernel error")))

        async def stream() -> AsyncIterator[bytes]:
            line: dict[str, Any] | None = first
            try:
                while line is not None and "end" not in line:
                    if isinstance(line.get("out"), dict):
                        yield (json.dumps(line["out"]) + "\n").encode()
                    line = await anext(lines, None)
            finally:
                await lines.aclose()

        return StreamingResponse(stream(), media_type="application/x-ndjson")

    async def contexts(self, request: Request) -> Response:
        gateway = await self._gateway(request)
        if request.method == "GET":
            return JSONResponse((await gateway.call({"op": "list"})).get("contexts", []))
        data = await json_object(request, required=False, limit=MAX_BODY)
        language, cwd = data.get("language"), data.get("cwd")
        if language is not None and not isinstance(language, str):
            raise E2BError(400, "language must be a string")
        if cwd is not None and not isinstance(cwd, str):
            raise E2BError(400, "cwd must be a string")
        end = await gateway.call({"op": "create", "language": language, "cwd": cwd})
        return JSONResponse(end.get("context", {}))

    async def context(self, request: Request) -> Response:
        gateway = await self._gateway(request)
        await gateway.call({"op": "remove", "context": request.path_params["id"]})
        return Response(status_code=204)

    async def restart(self, request: Request) -> Response:
        gateway = await self._gateway(request)
        await gateway.call({"op": "restart", "context": request.path_params["id"]})
        return Response(status_code=204)

    def routes(self) -> list[Route]:
        return [
            Route("/execute", handled(self.execute), methods=["POST"]),
            Route("/contexts", handled(self.contexts), methods=["GET", "POST"]),
            Route("/contexts/{id}", handled(self.context), methods=["DELETE"]),
            Route("/contexts/{id}/restart", handled(self.restart), methods=["POST"]),
        ]
