"""Running ``warren sandboxd``: the sandbox, then both listeners in one event loop.

Where they listen is the contract's: ``SANDBOXD_GRPC_ADDR`` and ``SANDBOXD_REST_ADDR``
(HOST:PORT, the variables the contract's clients discover the daemon by), else
``0.0.0.0:9090`` and ``0.0.0.0:8080`` as the contract's daemon (the pod's network: the
router and the kubelet's probes reach it there; the sandbox itself has no network, so
its commands cannot). Port 0 takes a free port; the line ``warren sandboxd: grpc
HOST:PORT rest HOST:PORT workspace DIR`` on stderr says where, once both are up. SIGTERM
or SIGINT: health turns 503, both listeners stop, the sandbox (and every process in it)
is removed; the workspace stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from ..errors import PolicyError
from ..policy import PolicySpec

DEFAULT_GRPC = "0.0.0.0:9090"
DEFAULT_REST = "0.0.0.0:8080"
GRACE = 5.0  # seconds in-flight calls get at shutdown


class AddressError(PolicyError):
    """An address ``warren sandboxd`` cannot listen on."""


@dataclass(frozen=True)
class Options:
    spec: PolicySpec
    grpc_addr: str
    rest_addr: str
    metadata_prefix: str = "SANDBOX_"
    name: str | None = None


def address(value: str, what: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise AddressError(
            f"{what} {value!r} is not HOST:PORT",
            operation="sandboxd",
            hint="e.g. 0.0.0.0:9090, 127.0.0.1:8080, [::]:9090, or port 0 for a free one",
        )
    return host.strip("[]") or "0.0.0.0", int(port)


def addresses(grpc_flag: str | None, rest_flag: str | None, env: Mapping[str, str]) -> tuple[str, str]:
    grpc_addr = grpc_flag or env.get("SANDBOXD_GRPC_ADDR") or DEFAULT_GRPC
    rest_addr = rest_flag or env.get("SANDBOXD_REST_ADDR") or DEFAULT_REST
    g, r = address(grpc_addr, "gRPC address"), address(rest_addr, "REST address")
    if g == r and g[1] != 0:
        raise AddressError(
            f"the gRPC and REST addresses are the same ({grpc_addr})",
            operation="sandboxd",
            hint="give them different ports (the contract's are 9090 and 8080)",
        )
    return grpc_addr, rest_addr


def _rest_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise AddressError.from_os(
            e,
            f"cannot listen on {host}:{port} for REST",
            "sandboxd",
            hint="another process holds it? pass --rest-addr",
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _uvicorn_server() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield  # the daemon's own handlers stop both listeners

    return Server


def _hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _serve(opts: Options) -> None:
    import grpc
    import uvicorn

    from ..client.local import LocalTransport
    from . import processes, rest, stubs
    from .runtime import Runtime

    stubs.load()  # a missing extra is one line, before anything starts
    g_host, g_port = address(opts.grpc_addr, "gRPC address")
    r_host, r_port = address(opts.rest_addr, "REST address")
    # A stop asked for at any point from here on ends both listeners and removes the
    # sandbox (uvicorn's own handlers would re-raise the signal after its shutdown).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Both addresses are taken before the sandbox is made: a port in use is one line.
    rest_sock = _rest_socket(r_host, r_port)
    server = grpc.aio.server()
    try:
        bound = server.add_insecure_port(_hostport(g_host, g_port))
    except RuntimeError:
        bound = 0
    if not bound:
        rest_sock.close()
        raise AddressError(
            f"cannot listen on {opts.grpc_addr} for gRPC",
            operation="sandboxd",
            hint="another process holds it? pass --grpc-addr",
        )
    name = opts.name or f"sandboxd-{os.getpid()}"
    try:
        runtime = await asyncio.to_thread(Runtime.create, opts.spec, LocalTransport(), name)
    except BaseException:
        rest_sock.close()
        await server.stop(None)
        raise
    try:
        if stop.is_set():
            return
        processes.register(server, runtime)
        await server.start()
        config = uvicorn.Config(
            rest.app(runtime, os.environ, opts.metadata_prefix),
            log_level="warning",
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=int(GRACE),
        )
        web = _uvicorn_server()(config)
        web_task = asyncio.create_task(web.serve(sockets=[rest_sock]))
        while not web.started and not web_task.done():
            await asyncio.sleep(0.01)
        rest_at = _hostport(r_host, rest_sock.getsockname()[1])
        print(
            f"warren sandboxd: grpc {_hostport(g_host, bound)} rest {rest_at} workspace {runtime.root}",
            file=sys.stderr,
            flush=True,
        )
        stopped = asyncio.create_task(stop.wait())
        await asyncio.wait({web_task, stopped}, return_when=asyncio.FIRST_COMPLETED)
        runtime.ready = False
        web.should_exit = True
        await server.stop(GRACE)
        with contextlib.suppress(Exception):
            await web_task
        stopped.cancel()
    finally:
        rest_sock.close()
        await asyncio.to_thread(runtime.close)


def serve(opts: Options) -> int:
    asyncio.run(_serve(opts))
    return 0
