"""LocalTransport: sandboxes of this user on this machine, through the supervisor.

Every call is one connection to the supervisor's abstract socket (``connect``): a
request the supervisor answers, or one it hands to the sandbox's PID 1, whose helper
answers on the same connection. The caller's context (working directory and
environment) travels with the requests that plan a sandbox.
"""

from __future__ import annotations

import builtins
import dataclasses
import json
import os
from collections.abc import Callable, Mapping

from .. import codec, protocol
from ..errors import SandboxError
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
from . import checks, connect, origin
from .transport import Command, EventPage, Transport

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..policy.spec import PolicySpec


def info(msg: protocol.SandboxInfo) -> SandboxInfo:
    return codec.model_of(SandboxInfo, msg.to_fields())


def _spec(spec: PolicySpec) -> protocol.Spec:
    """The spec as sent; checked here first with the supervisor's own check, so a bad
    value is the same ``PolicyError`` naming its key, not a malformed message."""
    from ..policy.spec import from_mapping  # only a run or a create: not rm, stop, ls

    mapping = spec.to_mapping()
    from_mapping(mapping, "the request's policy", skip=())
    return protocol.Spec.of(mapping)


def _command(command: Command) -> protocol.Command:
    """The command as the supervisor takes it (its stdio is ``run_captured``'s)."""
    c = command
    return protocol.Command(argv=c.argv, cwd=c.cwd, env=c.env, timeout=c.timeout, output_limit=c.output_limit)


def _lost(
    op: str, sandbox: str | None = None, env: Mapping[str, str] | None = None
) -> Callable[[], Exception]:
    return lambda: connect.lost_command(op, sandbox, env)


class LocalTransport(Transport):
    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = env  # None: this process's environment at each call

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    def _caller(
        self, config: bool = False, profile: str | None = None, workspace: str | None = None
    ) -> protocol.Caller:
        cwd = checks.caller_cwd(workspace)
        return protocol.Caller(cwd=cwd, env=dict(self.env), config=config, profile=profile)

    def _request(
        self, message: protocol.Message, expect: tuple[type[protocol.Message], ...], payload: bytes = b""
    ) -> tuple[protocol.Message, bytes]:
        return connect.request(message, expect, self.env, payload)

    # --- one-shot --------------------------------------------------------------------

    def run(self, spec: PolicySpec, command: Command, *, config: bool, profile: str | None) -> Result:
        caller = self._caller(config, profile, spec.workspace)
        message = protocol.RunRequest(
            spec=_spec(spec), caller=caller, command=_command(command), net_events=True
        )
        return self._captured(message, command, _lost("run"))

    # --- lifecycle ------------------------------------------------------------------------

    def create(self, spec: PolicySpec, name: str, *, config: bool, profile: str | None) -> SandboxInfo:
        caller = self._caller(config, profile, spec.workspace)
        request = protocol.CreateRequest(name=name, spec=_spec(spec), caller=caller)
        reply, _ = self._request(request, (protocol.SandboxInfo,))
        assert isinstance(reply, protocol.SandboxInfo)
        return info(reply)

    def get(self, name: str) -> SandboxInfo:
        reply, _ = self._request(protocol.GetRequest(name=name), (protocol.SandboxInfo,))
        assert isinstance(reply, protocol.SandboxInfo)
        return info(reply)

    def list(self) -> builtins.list[SandboxInfo]:
        reply, _ = self._request(protocol.ListRequest(), (protocol.SandboxList,))
        assert isinstance(reply, protocol.SandboxList)
        return [info(i) for i in reply.items]

    def stop(self, name: str, *, remove: bool) -> SandboxInfo:
        reply, _ = self._request(protocol.StopRequest(name=name, remove=remove), (protocol.SandboxInfo,))
        assert isinstance(reply, protocol.SandboxInfo)
        return info(reply)

    # --- in a sandbox -------------------------------------------------------------------------

    def exec(self, name: str, command: Command) -> Result:
        message = protocol.ExecRequest(sandbox=name, command=_command(command), origin=origin.current())
        return self._captured(message, command, _lost("exec", name, self._env))

    def _captured(
        self,
        message: protocol.RunRequest | protocol.ExecRequest,
        command: Command,
        lost: Callable[[], Exception],
    ) -> Result:
        """A run or exec; once more, to the next supervisor, when the one reached went
        away without reading it (``connect.NotTaken``: nothing ran, no byte of stdin
        was read, so the second one is the first the command sees)."""
        try:
            return self._captured_once(message, command, lost)
        except connect.NotTaken:
            connect.forget(self.env)
        try:
            return self._captured_once(message, command, lost)
        except connect.NotTaken:
            raise lost() from None

    def _captured_once(
        self,
        message: protocol.RunRequest | protocol.ExecRequest,
        command: Command,
        lost: Callable[[], Exception],
    ) -> Result:
        if isinstance(message, protocol.RunRequest):
            sock = connect.for_run(self.env)
        else:
            sock = connect.supervisor(self.env)
        from .capture import run_captured

        try:
            return run_captured(sock, message, command, lost=lost)
        finally:
            sock.close()

    def spawn(self, name: str, command: Command) -> tuple[str, int]:
        message = protocol.SpawnRequest(
            sandbox=name, command=_command(command), stdin=command.stdin_pipe, origin=origin.current()
        )
        reply, _ = self._request(message, (protocol.Started,))
        assert isinstance(reply, protocol.Started) and reply.spawn_id is not None
        return reply.spawn_id, reply.pid

    def write_stdin(self, name: str, process: str, data: bytes, *, eof: bool = False) -> int:
        # Checked here too: the supervisor refuses an oversized payload before reading
        # it, and the refusal could be lost while this side is still sending.
        protocol.check_stdin_size(len(data), process)
        request = protocol.StdinRequest(sandbox=name, process=process, eof=eof)
        reply, _ = self._request(request, (protocol.StdinState,), data)
        assert isinstance(reply, protocol.StdinState)
        return reply.queued

    def process(
        self, name: str, spawn_id: str, stdout_offset: int = 0, stderr_offset: int = 0
    ) -> tuple[ProcessState, bytes, bytes]:
        request = protocol.ProcessRequest(
            sandbox=name, spawn_id=spawn_id, stdout_offset=stdout_offset, stderr_offset=stderr_offset
        )
        reply, data = self._request(request, (protocol.ProcessState,))
        assert isinstance(reply, protocol.ProcessState)
        out_len, err_len = reply.stdout_len, reply.stderr_len
        return (
            codec.model_of(ProcessState, reply.to_fields()),
            data[:out_len],
            data[out_len : out_len + err_len],
        )

    def processes(self, name: str) -> builtins.list[ProcessInfo]:
        reply, _ = self._request(protocol.PsRequest(sandbox=name), (protocol.ProcessList,))
        assert isinstance(reply, protocol.ProcessList)
        return [codec.model_of(ProcessInfo, p.to_fields()) for p in reply.items]

    def spawns(self, name: str) -> builtins.list[SpawnInfo]:
        reply, _ = self._request(protocol.SpawnListRequest(sandbox=name), (protocol.SpawnList,))
        assert isinstance(reply, protocol.SpawnList)
        return [codec.model_of(SpawnInfo, r.to_fields()) for r in reply.items]

    def signal(self, name: str, pid: int, sig: int) -> None:
        self._request(
            protocol.SignalRequest(sandbox=name, pid=pid, signal=sig, origin=origin.current()), (protocol.Ok,)
        )

    def file(self, name: str, op: FileOp, data: bytes = b"") -> FileResult:
        request = protocol.FileRequest(sandbox=name, origin=origin.current(), **dataclasses.asdict(op))
        try:
            reply, payload = self._request(request, (protocol.FileReply,), data)
        except SandboxError as e:
            if request.op != "write" or e.message != connect.CLOSED:
                raise
            raise SandboxError(
                f"the connection was lost before the write of {request.path} was confirmed",
                operation="write",
                path=request.path,
                hint="the sandbox or its helper may have died (see `warren ls`); "
                + (
                    "the append may be partial"
                    if request.append
                    else "a write is all or nothing: the file has either its old content or all of the new"
                ),
            ) from None
        assert isinstance(reply, protocol.FileReply)
        return FileResult(
            data=payload,
            entries=tuple(codec.model_of(FileInfo, e.to_fields()) for e in reply.entries),
            stat=None if reply.stat is None else codec.model_of(FileInfo, reply.stat.to_fields()),
            exists=reply.exists,
            xattrs={x.name: dict(x.attrs) for x in reply.xattrs},
        )

    def expose(self, name: str, port: int, host_port: int) -> str:
        reply, _ = self._request(
            protocol.ExposeRequest(sandbox=name, port=port, host_port=host_port), (protocol.Exposed,)
        )
        assert isinstance(reply, protocol.Exposed)
        return reply.address

    def exposed(self, name: str) -> dict[int, str]:
        reply, _ = self._request(protocol.ExposeListRequest(sandbox=name), (protocol.ExposedList,))
        assert isinstance(reply, protocol.ExposedList)
        return {e.port: e.address for e in reply.items}

    def unexpose(self, name: str, port: int) -> None:
        self._request(protocol.UnexposeRequest(sandbox=name, port=port), (protocol.Ok,))

    def stats(self, name: str) -> Stats:
        reply, _ = self._request(protocol.StatsRequest(sandbox=name), (protocol.Stats,))
        assert isinstance(reply, protocol.Stats)
        return codec.model_of(Stats, reply.to_fields())

    def pause(self, name: str, paused: bool) -> SandboxInfo:
        reply, _ = self._request(protocol.PauseRequest(sandbox=name, paused=paused), (protocol.SandboxInfo,))
        assert isinstance(reply, protocol.SandboxInfo)
        return info(reply)

    def snapshot(self, name: str) -> SnapshotInfo:
        reply, _ = self._request(protocol.SnapshotRequest(sandbox=name), (protocol.SnapshotInfo,))
        assert isinstance(reply, protocol.SnapshotInfo)
        return codec.model_of(SnapshotInfo, reply.to_fields())

    def snapshots(self) -> builtins.list[SnapshotInfo]:
        reply, _ = self._request(protocol.SnapshotListRequest(), (protocol.SnapshotList,))
        assert isinstance(reply, protocol.SnapshotList)
        return [codec.model_of(SnapshotInfo, s.to_fields()) for s in reply.items]

    def remove_snapshot(self, snap_id: str) -> SnapshotInfo:
        reply, _ = self._request(protocol.SnapshotRemoveRequest(id=snap_id), (protocol.SnapshotInfo,))
        assert isinstance(reply, protocol.SnapshotInfo)
        return codec.model_of(SnapshotInfo, reply.to_fields())

    def review(
        self, name: str, action: str, paths: builtins.list[str], force: bool = False, patch: bool = False
    ) -> Review:
        msg = protocol.ReviewRequest(sandbox=name, action=action, paths=paths, force=force, patch=patch)
        reply, _ = self._request(msg, (protocol.ReviewResult,))
        assert isinstance(reply, protocol.ReviewResult)
        return Review(
            changes=tuple(codec.model_of(Change, c.to_fields()) for c in reply.changes),
            patch=reply.patch,
            applied=tuple(reply.applied),
        )

    def events(self, name: str, after: str = "", skip: int = 0) -> EventPage:
        message = protocol.EventsRequest(sandbox=name, after=after, skip=skip)
        reply, _ = self._request(message, (protocol.Events,))
        assert isinstance(reply, protocol.Events)
        return EventPage(tuple(_record(r) for r in reply.records), reply.after, reply.skip, reply.running)

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
        msg = protocol.NetPolicyRequest(
            sandbox=name, action=action, rule=rule, id=request_id, always=always, via=via
        )
        reply, _ = self._request(msg, (protocol.NetPolicy,))
        assert isinstance(reply, protocol.NetPolicy)
        return codec.model_of(NetPolicy, reply.to_fields())

    def checkpoint(
        self, name: str, action: str, ident: int = 0, keep_running: bool = False
    ) -> builtins.list[Checkpoint]:
        msg = protocol.CheckpointRequest(sandbox=name, action=action, id=ident, keep_running=keep_running)
        reply, _ = self._request(msg, (protocol.CheckpointResult,))
        assert isinstance(reply, protocol.CheckpointResult)
        return [
            Checkpoint(id=c.id, time=c.time, bytes=c.bytes, command=c.command, stopped=reply.stopped)
            for c in reply.items
        ]

    def net_log(self, name: str) -> builtins.list[NetEvent]:
        reply, _ = self._request(protocol.NetLogRequest(sandbox=name), (protocol.NetLog,))
        assert isinstance(reply, protocol.NetLog)
        return [codec.model_of(NetEvent, e.to_fields()) for e in reply.events]


def _record(line: str) -> dict[str, object]:
    data = json.loads(line)
    return data if isinstance(data, dict) else {"kind": "unreadable", "text": line}
