"""HttpTransport: sandboxes behind a ``warren serve``, with httpx.

The same ``Transport`` methods as ``LocalTransport``, mapped onto API v1; an error
body comes back as the same ``WarrenError`` subclass the server raised
(``codec.error_of``). ``url`` is ``http://HOST:PORT`` or ``unix:PATH``.
Output callbacks switch exec/run to SSE so the callback sees output as it comes.
"""

from __future__ import annotations

import base64
import builtins
import json
import os
import socket
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import quote

import httpx

from .. import codec, protocol
from ..errors import SandboxError, SandboxFileError, WarrenError
from ..models import (
    Change,
    Checkpoint,
    FileInfo,
    FileOp,
    FileResult,
    NetPolicy,
    ProcessInfo,
    ProcessState,
    Result,
    Review,
    SandboxInfo,
    SnapshotInfo,
    SpawnInfo,
    Stats,
)
from ..net.allowlist import NetEvent
from ..policy.spec import PolicySpec
from .transport import Command, EventPage, Transport


def from_env(env: Mapping[str, str] | None = None) -> HttpTransport | None:
    """An HttpTransport when ``WARREN_URL`` is set (with ``WARREN_TOKEN``), else None."""
    env = os.environ if env is None else env
    url = env.get("WARREN_URL")
    return HttpTransport(url, env.get("WARREN_TOKEN")) if url else None


class HttpTransport(Transport):
    def __init__(self, url: str, token: str | None = None, *, timeout: float | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        if url.startswith("unix:"):
            transport = httpx.HTTPTransport(uds=url[5:])
            base = "http://localhost"
        else:
            # headers and body go out as two writes: without TCP_NODELAY the second waits
            # for the server's delayed ACK (~40 ms per request on loopback)
            transport = httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
            base = url.rstrip("/")
        self.url = url
        self._client = httpx.Client(
            base_url=base,
            headers=headers,
            transport=transport,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
        )

    def close(self) -> None:
        self._client.close()

    def __repr__(self) -> str:
        return f"<HttpTransport {self.url}>"

    # --- plumbing ------------------------------------------------------------------------------

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TransportError as e:
            raise self._unreachable(e) from None
        if response.status_code >= 400:
            raise codec.error_of(_json_or_none(response), response.status_code)
        return response

    def _unreachable(self, e: httpx.TransportError, lost: bool = False) -> SandboxError:
        """The service could not be reached, or (``lost``) went away while a command ran."""
        running = "is `warren serve` running there?"
        if lost:
            message = f"the connection to warren serve at {self.url} was lost: {e}"
            return SandboxError(message, operation="http", hint=running)
        message = f"cannot reach warren serve at {self.url}: {e}"
        return SandboxError(message, operation="http", hint=f"{running} check WARREN_URL")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        return self._send(method, path, **kwargs).json()

    def _stream(self, path: str, body: dict[str, Any], command: Command) -> Result:
        try:
            with self._client.stream(
                "POST", path, json=body, headers={"Accept": "text/event-stream"}
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    raise codec.error_of(_json_or_none(response), response.status_code)
                for event, data in events(response.iter_lines()):
                    if event in ("stdout", "stderr"):
                        callback = command.on_stdout if event == "stdout" else command.on_stderr
                        if callback is not None:
                            callback(base64.b64decode(data["data"]))
                    elif event == "exit":
                        return codec.decode(Result, data)
                    elif event == "error":
                        raise codec.error_of(data, 500)
        except httpx.TransportError as e:
            raise self._unreachable(e, lost=True) from None
        raise SandboxError(
            "the service ended the stream before the command finished",
            operation="http",
            hint="see the service's log",
        )

    def _captured(self, path: str, command: Command, **more: Any) -> Result:
        """A run or an exec: its output as server-sent events when a callback wants it
        as it comes, else the whole result in one answer."""
        body = {**_body(command), **more}
        if command.on_stdout is not None or command.on_stderr is not None:
            return self._stream(path, body, command)
        return codec.decode(Result, self._json("POST", path, json=body))

    # --- Transport -------------------------------------------------------------------------------

    def run(self, spec: PolicySpec, command: Command, *, config: bool, profile: str | None) -> Result:
        if config or profile:
            raise SandboxError(
                "config files and profiles are read on the caller's machine, not over HTTP",
                operation="run",
                hint="send the policy itself (PolicySpec)",
            )
        result = self._captured("/v1/run", command, policy=spec.to_mapping())
        if command.on_net_event is not None:
            for e in result.net_log:
                command.on_net_event(e)
        return result

    def create(self, spec: PolicySpec, name: str, *, config: bool, profile: str | None) -> SandboxInfo:
        body = {**spec.to_mapping(), "name": name}
        return codec.decode(SandboxInfo, self._json("POST", "/v1/sandboxes", json=body))

    def get(self, name: str) -> SandboxInfo:
        return codec.decode(SandboxInfo, self._json("GET", f"/v1/sandboxes/{name}"))

    def list(self) -> builtins.list[SandboxInfo]:
        return [codec.decode(SandboxInfo, i) for i in self._json("GET", "/v1/sandboxes")["sandboxes"]]

    def stop(self, name: str, *, remove: bool) -> SandboxInfo:
        params = {"remove": "true" if remove else "false"}
        return codec.decode(SandboxInfo, self._json("DELETE", f"/v1/sandboxes/{name}", params=params))

    def exec(self, name: str, command: Command) -> Result:
        return self._captured(f"/v1/sandboxes/{name}/exec", command)

    def spawn(self, name: str, command: Command) -> tuple[str, int]:
        data = self._json("POST", f"/v1/sandboxes/{name}/processes", json=_body(command))
        return str(data["id"]), int(data["pid"])

    def write_stdin(self, name: str, process: str, data: bytes, *, eof: bool = False) -> int:
        protocol.check_stdin_size(len(data), process)  # before sending it all
        # The raw form of the route: no base64 on the way.
        reply = self._json(
            "POST",
            f"/v1/sandboxes/{name}/processes/{process}/stdin",
            params={"eof": "true"} if eof else None,
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return int(reply["queued"])

    def process(
        self, name: str, spawn_id: str, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> tuple[ProcessState, bytes, bytes]:
        data = self._json(
            "GET",
            f"/v1/sandboxes/{name}/processes/{spawn_id}",
            params={"offset": stdout_offset, "stderr_offset": stderr_offset},
        )
        out, err = codec.get_bytes(data, "stdout"), codec.get_bytes(data, "stderr")
        state = ProcessState(
            pid=data["pid"],
            argv=tuple(data["argv"]),
            running=data["alive"],
            status=data["status"],
            timed_out=data["timed_out"],
            limit=data.get("limit"),
        )
        return state, out, err

    def processes(self, name: str) -> builtins.list[ProcessInfo]:
        return [
            codec.decode(ProcessInfo, p)
            for p in self._json("GET", f"/v1/sandboxes/{name}/processes")["processes"]
        ]

    def signal(self, name: str, pid: int, sig: int) -> None:
        self._json("POST", f"/v1/sandboxes/{name}/processes/{pid}/signal", json={"signal": sig})

    def file(self, name: str, op: FileOp, data: bytes = b"") -> FileResult:
        base = f"/v1/sandboxes/{name}/files"
        path = op.path
        if op.xattrs is not None:
            raise SandboxFileError(
                f"extended attributes of {path} cannot be read or set over warren's HTTP API",
                operation=op.op,
                path=path,
                hint="use the local transport (a supervisor on this machine), or run getfattr/setfattr "
                "in the sandbox",
            )
        if op.op == "read":
            r = self._send("GET", base, params={"path": path, "type": "file", "max_bytes": op.max_bytes})
            return FileResult(data=r.content)
        if op.op == "list":
            entries = self._json("GET", base, params={"path": path, "type": "dir"})["entries"]
            return FileResult(entries=tuple(codec.decode(FileInfo, e) for e in entries))
        if op.op == "stat":
            info = self._json("GET", f"{base}/stat", params={"path": path, "follow": int(op.follow)})
            return FileResult(stat=codec.decode(FileInfo, info))
        if op.op == "exists":
            exists = self._json("GET", f"{base}/stat", params={"path": path, "exists": 1})["exists"]
            return FileResult(exists=bool(exists))
        if op.op == "write":
            params = {
                "path": path,
                "mode": f"{op.mode if op.mode is not None else 0o644:o}",
                "parents": int(op.parents),
                "append": int(op.append),
            }
            self._send("PUT", base, params=params, content=data)
            return FileResult()
        if op.op == "remove":
            self._send("DELETE", base, params={"path": path, "recursive": int(op.recursive)})
            return FileResult()
        if op.op == "mkdir":
            body = {"path": path, "parents": op.parents, "exist_ok": op.exist_ok}
            if op.mode is not None:
                body["mode"] = op.mode
            self._send("POST", f"{base}/mkdir", json=body)
            return FileResult()
        if op.op == "rename":
            self._send("POST", f"{base}/move", json={"src": path, "dst": op.dst})
            return FileResult()
        raise WarrenError(f"file operation {op.op!r} is not available over HTTP", operation=op.op)

    def expose(self, name: str, port: int, host_port: int) -> str:
        data = self._json("POST", f"/v1/sandboxes/{name}/ports", json={"port": port, "host_port": host_port})
        return str(data["address"])

    def exposed(self, name: str) -> dict[int, str]:
        listed = self._json("GET", f"/v1/sandboxes/{name}/ports")["ports"]
        return {int(p["port"]): str(p["address"]) for p in listed}

    def unexpose(self, name: str, port: int) -> None:
        self._json("DELETE", f"/v1/sandboxes/{name}/ports/{port}")

    def spawns(self, name: str) -> builtins.list[SpawnInfo]:
        return [
            codec.decode(SpawnInfo, s) for s in self._json("GET", f"/v1/sandboxes/{name}/spawns")["spawns"]
        ]

    def events(self, name: str, after: str = "", skip: int = 0) -> EventPage:
        page = self._json("GET", f"/v1/sandboxes/{name}/events", params={"after": after, "skip": skip})
        records = tuple(r for r in page["records"] if isinstance(r, dict))
        return EventPage(records, str(page["after"]), int(page["skip"]), bool(page["running"]))

    def net_log(self, name: str) -> builtins.list[NetEvent]:
        return [
            codec.decode(NetEvent, e) for e in self._json("GET", f"/v1/sandboxes/{name}/netlog")["events"]
        ]

    def net_policy(
        self,
        name: str,
        action: str,
        *,
        rule: str = "",
        request_id: int = 0,
        always: bool = False,
        via: str = "",
    ) -> NetPolicy:
        # The service names itself to the supervisor (via "http"): ``via`` is not sent.
        path = f"/v1/sandboxes/{name}/network"
        if action in ("show", "pending"):
            data = self._json("GET", path)
        elif action in ("allow", "deny"):
            data = self._json("POST", path, json={"action": action, "rule": rule})
        else:
            body = {"action": action, "always": always}
            data = self._json("POST", f"{path}/pending/{request_id}", json=body)
        return codec.decode(NetPolicy, data)

    def stats(self, name: str) -> Stats:
        return codec.decode(Stats, self._json("GET", f"/v1/sandboxes/{name}/stats"))

    def pause(self, name: str, paused: bool) -> SandboxInfo:
        return codec.decode(
            SandboxInfo, self._json("POST", f"/v1/sandboxes/{name}/{'pause' if paused else 'resume'}")
        )

    def snapshot(self, name: str) -> SnapshotInfo:
        return codec.model_of(SnapshotInfo, self._json("POST", f"/v1/sandboxes/{name}/snapshot"))

    def snapshots(self) -> builtins.list[SnapshotInfo]:
        return [codec.model_of(SnapshotInfo, s) for s in self._json("GET", "/v1/snapshots")["snapshots"]]

    def remove_snapshot(self, snap_id: str) -> SnapshotInfo:
        return codec.model_of(SnapshotInfo, self._json("DELETE", f"/v1/snapshots/{quote(snap_id, safe='')}"))

    def review(
        self, name: str, action: str, paths: builtins.list[str], force: bool = False, patch: bool = False
    ) -> Review:
        at = f"/v1/sandboxes/{name}"
        if action == "diff":
            got = self._json("GET", f"{at}/diff", params={"patch": "1"} if patch else None)
        elif action == "apply":
            got = self._json("POST", f"{at}/apply", json={"paths": paths, "force": force})
        else:
            got = self._json("POST", f"{at}/{action}")
        return Review(
            changes=tuple(codec.model_of(Change, c) for c in got.get("changes", [])),
            patch=got.get("patch", ""),
            applied=tuple(got.get("applied", [])),
        )

    def checkpoint(
        self, name: str, action: str, ident: int = 0, keep_running: bool = False
    ) -> builtins.list[Checkpoint]:
        at = f"/v1/sandboxes/{name}"
        if action == "list":
            return [
                codec.model_of(Checkpoint, c) for c in self._json("GET", f"{at}/checkpoints")["checkpoints"]
            ]
        if action == "take":
            return [codec.model_of(Checkpoint, self._json("POST", f"{at}/checkpoints"))]
        body = {"id": ident, "keep_running": keep_running}
        return [codec.model_of(Checkpoint, self._json("POST", f"{at}/rollback", json=body))]


def _body(command: Command) -> dict[str, Any]:
    """The body of a run, exec or spawn (API v1's Command): what is not the default."""
    body: dict[str, Any] = {"argv": command.argv, "output_limit": command.output_limit}
    if command.cwd is not None:
        body["cwd"] = command.cwd
    if command.timeout is not None:
        body["timeout"] = command.timeout
    if command.env:
        body["env"] = command.env
    if command.stdin is not None:
        body["stdin"] = base64.b64encode(command.stdin).decode()
        body["stdin_encoding"] = "base64"
    if command.stdin_pipe:
        body["stdin"] = True
    return body


def events(lines: Iterator[str]) -> Iterator[tuple[str, Any]]:
    """(event, parsed JSON data) from server-sent-event lines."""
    event, data = "message", list[str]()
    for line in lines:
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", list[str]()
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


def _json_or_none(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return None
