"""envd's ``filesystem.Filesystem`` service: warren's file operations, run inside the
sandbox, so a path leads only where the sandbox itself could go (a relative path is
relative to the sandbox's home). Watching a directory is a poll of its listing (warren's
files API has no inotify), so events come within ``WATCH_EVERY`` and a rename shows as a
removal and a creation.
"""

from __future__ import annotations

import asyncio
import errno
import grp
import os
import posixpath
import pwd
import stat as _stat
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as fs
from protobuf.wkt import Timestamp

from ..client.transport import Command
from ..errors import SandboxFileError
from ..models import FileInfo
from .core import Core, E2BError
from .envd_base import KEEPALIVE, EnvdService, Oneof, connect_error, rpc

WATCH_EVERY = 0.2
MAX_LIST = 100_000


@dataclass
class Watcher:
    sandbox_id: str
    path: str
    recursive: bool
    seen: dict[str, tuple[str, int, float]] = field(default_factory=dict)


KINDS = {"file": fs.FileType.FILE, "dir": fs.FileType.DIRECTORY, "symlink": fs.FileType.SYMLINK}
# warren's FileInfo carries permission bits and a type name; ``ls -l`` form needs both
TYPE_BITS = {"file": _stat.S_IFREG, "dir": _stat.S_IFDIR, "symlink": _stat.S_IFLNK}


def entry(
    stat: FileInfo, path: str, link: tuple[FileInfo, str] | None = None, home: str | None = None
) -> fs.EntryInfo:
    """envd's ``EntryInfo``. For a symlink, ``link`` is what it leads to and the resolved
    path: envd reports the target's type, size and mode, with ``symlink_target``. In the
    sandbox's ``home`` its own user is E2B's ``user``."""
    shown = link[0] if link is not None else stat
    ours = home is not None and posixpath.commonpath([home, path]) == home
    bits = shown.mode & 0o7777
    return fs.EntryInfo(
        name=stat.name or posixpath.basename(path.rstrip("/")) or "/",
        type=KINDS.get(shown.type, fs.FileType.UNSPECIFIED),
        path=path,
        size=shown.size,
        mode=bits,
        permissions=_stat.filemode(TYPE_BITS.get(shown.type, 0) | bits),
        owner=E2B_USER if ours and shown.uid == os.getuid() else _user(shown.uid),
        group=E2B_USER if ours and shown.gid == os.getgid() else _group(shown.gid),
        modified_time=Timestamp.from_nanos(int(shown.mtime * 1e9)),
        symlink_target=link[1] if link is not None else None,
        is_symlink=stat.type == "symlink",
    )


# E2B names the one user its sandboxes run as "user" (and its group): in an E2B
# sandbox's home the user a warren sandbox runs as (the service's, the caller's) plays that
# part. Elsewhere (/usr, /etc) an owner is named as the host names it.
E2B_USER = "user"


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


class FilesystemService(EnvdService):
    def __init__(self, core: Core) -> None:
        super().__init__(core)
        self.watchers: dict[str, Watcher] = {}

    async def stat(self, sandbox_id: str, path: str) -> fs.EntryInfo:
        reply, _ = await self.file(sandbox_id, "stat", path, follow=False)
        assert reply.stat is not None
        return await self.entry(sandbox_id, reply.stat, path)

    async def entry(self, sandbox_id: str, stat: FileInfo, path: str) -> fs.EntryInfo:
        record = self.core.records.get(sandbox_id)
        home = record.inside if record is not None else None
        if stat.type != "symlink":
            return entry(stat, path, home=home)
        return entry(stat, path, await self.followed(sandbox_id, path), home)

    async def followed(self, sandbox_id: str, path: str) -> tuple[FileInfo, str] | None:
        """What a symlink leads to and its resolved path, both as the sandbox sees them
        (``readlink -f`` inside it); None for a dangling link."""
        try:
            target, _ = await self.file(sandbox_id, "stat", path, follow=True)
        except SandboxFileError:
            return None
        command = Command(["readlink", "-f", "--", path], "/", timeout=10, output_limit=16384)
        result = await self.core.call(self.core.transport.exec, sandbox_id, command)
        resolved = result.stdout.decode(errors="replace").rstrip("\n")
        if result.exit_code != 0 or target.stat is None or not resolved:
            return None
        return target.stat, resolved

    @rpc
    async def fs_stat(self, request: fs.StatRequest, ctx: RequestContext[Any, Any]) -> fs.StatResponse:
        info, record = await self.sandbox(ctx.request_headers)
        return fs.StatResponse(entry=await self.stat(info.name, self.core.resolve(record, request.path)))

    @rpc
    async def make_dir(self, request: fs.MakeDirRequest, ctx: RequestContext[Any, Any]) -> fs.MakeDirResponse:
        info, record = await self.sandbox(ctx.request_headers)
        path = self.core.resolve(record, request.path)
        exists, _ = await self.file(info.name, "exists", path)
        if exists.exists:
            raise ConnectError(Code.ALREADY_EXISTS, f"{path} already exists")
        await self.file(info.name, "mkdir", path, parents=True, exist_ok=False, mode=0o755)
        return fs.MakeDirResponse(entry=await self.stat(info.name, path))

    @rpc
    async def move(self, request: fs.MoveRequest, ctx: RequestContext[Any, Any]) -> fs.MoveResponse:
        info, record = await self.sandbox(ctx.request_headers)
        src = self.core.resolve(record, request.source)
        dst = self.core.resolve(record, request.destination)
        await self.file(info.name, "rename", src, dst=dst)
        return fs.MoveResponse(entry=await self.stat(info.name, dst))

    @rpc
    async def list_dir(self, request: fs.ListDirRequest, ctx: RequestContext[Any, Any]) -> fs.ListDirResponse:
        info, record = await self.sandbox(ctx.request_headers)
        path = self.core.resolve(record, request.path)
        found = await self.walk(info.name, path, max(1, request.depth))
        return fs.ListDirResponse(entries=[await self.entry(info.name, s, p) for p, s in found])

    async def walk(self, sandbox_id: str, path: str, depth: int) -> list[tuple[str, FileInfo]]:
        """The tree below ``path`` to ``depth`` levels, depth first in name order (each
        directory right before its contents), as envd's walk lists it."""
        out: list[tuple[str, FileInfo]] = []

        async def visit(directory: str, level: int) -> None:
            reply, _ = await self.file(sandbox_id, "list", directory)
            for item in reply.entries:
                child = posixpath.join(directory, item.name)
                out.append((child, item))
                if len(out) > MAX_LIST:
                    raise E2BError(413, f"{path} holds over {MAX_LIST} entries at this depth")
                if item.type == "dir" and level < depth:
                    await visit(child, level + 1)

        await visit(path, 1)
        return out

    @rpc
    async def remove(self, request: fs.RemoveRequest, ctx: RequestContext[Any, Any]) -> fs.RemoveResponse:
        info, record = await self.sandbox(ctx.request_headers)
        try:
            await self.file(info.name, "remove", self.core.resolve(record, request.path), recursive=True)
        except SandboxFileError as e:
            if e.errno != errno.ENOENT:
                raise
            # envd's remove is os.RemoveAll: a path already gone is success
        return fs.RemoveResponse()

    async def snapshot(
        self, sandbox_id: str, path: str, recursive: bool
    ) -> dict[str, tuple[str, int, float]]:
        found = await self.walk(sandbox_id, path, 64 if recursive else 1)
        return {posixpath.relpath(p, path): (s.type, s.size, s.mtime) for p, s in found}

    @staticmethod
    def changes(
        before: dict[str, tuple[str, int, float]], after: dict[str, tuple[str, int, float]]
    ) -> list[fs.FilesystemEvent]:
        events = []
        for name in sorted(after.keys() - before.keys()):
            events.append(fs.FilesystemEvent(name=name, type=fs.EventType.CREATE))
        for name in sorted(after.keys() & before.keys()):
            if after[name] != before[name] and after[name][0] != "dir":
                events.append(fs.FilesystemEvent(name=name, type=fs.EventType.WRITE))
        for name in sorted(before.keys() - after.keys()):
            events.append(fs.FilesystemEvent(name=name, type=fs.EventType.REMOVE))
        return events

    async def watch_dir(
        self, request: fs.WatchDirRequest, ctx: RequestContext[Any, Any]
    ) -> AsyncIterator[fs.WatchDirResponse]:
        try:
            info, record = await self.sandbox(ctx.request_headers)
            path = self.core.resolve(record, request.path)
            seen = await self.snapshot(info.name, path, request.recursive)
        except Exception as e:
            raise connect_error(e) from None
        yield fs.WatchDirResponse(event=Oneof("start", fs.WatchDirResponse.StartEvent()))
        quiet_since = time.monotonic()
        while True:
            await asyncio.sleep(WATCH_EVERY)
            try:
                now = await self.snapshot(info.name, path, request.recursive)
            except Exception as e:
                raise connect_error(e) from None
            for event in self.changes(seen, now):
                quiet_since = time.monotonic()
                yield fs.WatchDirResponse(event=Oneof("filesystem", event))
            seen = now
            if time.monotonic() - quiet_since > KEEPALIVE:
                quiet_since = time.monotonic()
                yield fs.WatchDirResponse(event=Oneof("keepalive", fs.WatchDirResponse.KeepAlive()))

    @rpc
    async def create_watcher(
        self, request: fs.CreateWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> fs.CreateWatcherResponse:
        info, record = await self.sandbox(ctx.request_headers)
        path = self.core.resolve(record, request.path)
        watcher = Watcher(info.name, path, request.recursive)
        watcher.seen = await self.snapshot(info.name, path, request.recursive)
        ident = uuid.uuid4().hex
        self.watchers[ident] = watcher
        return fs.CreateWatcherResponse(watcher_id=ident)

    @rpc
    async def get_watcher_events(
        self, request: fs.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> fs.GetWatcherEventsResponse:
        watcher = await self.watcher(ctx, request.watcher_id)
        now = await self.snapshot(watcher.sandbox_id, watcher.path, watcher.recursive)
        events = self.changes(watcher.seen, now)
        watcher.seen = now
        return fs.GetWatcherEventsResponse(events=events)

    @rpc
    async def remove_watcher(
        self, request: fs.RemoveWatcherRequest, ctx: RequestContext[Any, Any]
    ) -> fs.RemoveWatcherResponse:
        await self.watcher(ctx, request.watcher_id)
        del self.watchers[request.watcher_id]
        return fs.RemoveWatcherResponse()

    async def watcher(self, ctx: RequestContext[Any, Any], ident: str) -> Watcher:
        """The watcher ``ident`` of the sandbox the request is for (another's is not found)."""
        info, _ = await self.sandbox(ctx.request_headers)
        watcher = self.watchers.get(ident)
        if watcher is None or watcher.sandbox_id != info.name:
            raise E2BError(404, f"watcher {ident!r} not found")
        return watcher


FILESYSTEM_METHODS = {
    "stat": "fs_stat",
    "make_dir": "make_dir",
    "move": "move",
    "list_dir": "list_dir",
    "remove": "remove",
    "watch_dir": "watch_dir",
    "create_watcher": "create_watcher",
    "get_watcher_events": "get_watcher_events",
    "remove_watcher": "remove_watcher",
}
