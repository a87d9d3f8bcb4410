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
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from connectrpc.code import Code
from connectrpc.errors import ConnectError
from connectrpc.request import RequestContext
from e2b.envd.filesystem import filesystem_pb as fs
from protobuf.wkt import Timestamp

from ..client.transport import Command
from ..errors import SandboxFileError
from ..models import FileInfo
from . import metadata
from .core import Core, E2BError
from .envd_base import KEEPALIVE, EnvdService, Oneof, connect_error, rpc

WATCH_EVERY = 0.2
MAX_LIST = 100_000


@dataclass
class Watcher:
    sandbox_id: str
    path: str
    recursive: bool
    include_entry: bool = False
    home: str = ""
    seen: dict[str, FileInfo] = field(default_factory=dict)
    polled: float = 0.0  # when ``seen`` was taken (uploads since then are reported)


KINDS = {"file": fs.FileType.FILE, "dir": fs.FileType.DIRECTORY, "symlink": fs.FileType.SYMLINK}
# warren's FileInfo carries permission bits and a type name; ``ls -l`` form needs both
TYPE_BITS = {"file": _stat.S_IFREG, "dir": _stat.S_IFDIR, "symlink": _stat.S_IFLNK}


def entry(
    stat: FileInfo,
    path: str,
    link: tuple[FileInfo, str] | None = None,
    home: str | None = None,
    meta: dict[str, str] | None = None,
) -> fs.EntryInfo:
    """envd's ``EntryInfo``. For a symlink, ``link`` is what it leads to and the resolved
    path: envd reports the target's type, size and mode, with ``symlink_target``. In the
    sandbox's ``home`` its own user is E2B's ``user``. ``meta``: its metadata (xattrs)."""
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
        metadata=meta or {},
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
        reply, _ = await self.file(sandbox_id, "stat", path, follow=False, xattrs=metadata.XATTR_PREFIX)
        assert reply.stat is not None
        return await self.entry(sandbox_id, reply.stat, path, reply.xattrs.get(""))

    async def entry(
        self, sandbox_id: str, stat: FileInfo, path: str, meta: dict[str, str] | None = None
    ) -> fs.EntryInfo:
        record = self.core.records.get(sandbox_id)
        home = record.inside if record is not None else None
        if stat.type != "symlink":
            return entry(stat, path, home=home, meta=meta)
        return entry(stat, path, await self.followed(sandbox_id, path), home, meta)

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
        record = self.core.records.get(sandbox_id)
        if (
            record is not None
            and record.home
            and posixpath.commonpath([record.workspace, resolved]) == record.workspace
        ):
            # the home's host path, reached through /home/user: named as the sandbox's user does
            resolved = record.home + resolved[len(record.workspace) :]
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
        meta: dict[str, dict[str, str]] = {}
        found = await self.walk(info.name, path, max(1, request.depth), meta)
        return fs.ListDirResponse(entries=[await self.entry(info.name, s, p, meta.get(p)) for p, s in found])

    async def walk(
        self, sandbox_id: str, path: str, depth: int, meta: dict[str, dict[str, str]] | None = None
    ) -> list[tuple[str, FileInfo]]:
        """The tree below ``path`` to ``depth`` levels, depth first in name order (each
        directory right before its contents), as envd's walk lists it; ``meta`` gets each
        entry's metadata, by path, when asked for."""
        out: list[tuple[str, FileInfo]] = []
        prefix = metadata.XATTR_PREFIX if meta is not None else None

        async def visit(directory: str, level: int) -> None:
            reply, _ = await self.file(sandbox_id, "list", directory, xattrs=prefix)
            for item in reply.entries:
                child = posixpath.join(directory, item.name)
                out.append((child, item))
                if meta is not None and item.name in reply.xattrs:
                    meta[child] = reply.xattrs[item.name]
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

    async def snapshot(self, sandbox_id: str, path: str, recursive: bool) -> dict[str, FileInfo]:
        found = await self.walk(sandbox_id, path, 64 if recursive else 1)
        return {posixpath.relpath(p, path): s for p, s in found}

    def changes(
        self,
        before: dict[str, FileInfo],
        after: dict[str, FileInfo],
        path: str,
        entries: bool,
        home: str,
        uploaded: Callable[[str], bool] = lambda _path: False,
    ) -> list[fs.FilesystemEvent]:
        """The events between two listings of ``path``: a file that appeared with content
        was created, then written; one written through the files API (``uploaded``, by
        its full path) then had its owner set, as envd's upload does (a CHMOD); with
        ``entries``, each created or written entry's ``EntryInfo`` as the later listing saw
        it (none for a removal: the entry is gone, as envd leaves it out)."""

        def event(name: str, kind: fs.EventType) -> fs.FilesystemEvent:
            shown = after.get(name) if entries and kind != fs.EventType.REMOVE else None
            info = entry(shown, posixpath.join(path, name), home=home) if shown is not None else None
            return fs.FilesystemEvent(name=name, type=kind, entry=info)

        def key(s: FileInfo) -> tuple[str, int, float]:
            return s.type, s.size, s.mtime

        def owner_set(name: str) -> None:
            if uploaded(posixpath.join(path, name)):
                events.append(event(name, fs.EventType.CHMOD))

        events: list[fs.FilesystemEvent] = []
        for name in sorted(after.keys() - before.keys()):
            events.append(event(name, fs.EventType.CREATE))
            if after[name].type == "file" and after[name].size > 0:
                # it was written once made: inotify would have told both
                events.append(event(name, fs.EventType.WRITE))
            owner_set(name)
        for name in sorted(after.keys() & before.keys()):
            if key(after[name]) != key(before[name]) and after[name].type != "dir":
                events.append(event(name, fs.EventType.WRITE))
                owner_set(name)
        events.extend(event(name, fs.EventType.REMOVE) for name in sorted(before.keys() - after.keys()))
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
        polled = time.time()
        while True:
            await asyncio.sleep(WATCH_EVERY)
            since, polled = polled, time.time()
            try:
                now = await self.snapshot(info.name, path, request.recursive)
            except Exception as e:
                raise connect_error(e) from None
            uploaded = partial(self.core.uploaded_since, info.name, since=since)
            for event in self.changes(seen, now, path, request.include_entry, record.inside, uploaded):
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
        watcher = Watcher(info.name, path, request.recursive, request.include_entry, record.inside)
        watcher.polled = time.time()
        watcher.seen = await self.snapshot(info.name, path, request.recursive)
        ident = uuid.uuid4().hex
        self.watchers[ident] = watcher
        return fs.CreateWatcherResponse(watcher_id=ident)

    @rpc
    async def get_watcher_events(
        self, request: fs.GetWatcherEventsRequest, ctx: RequestContext[Any, Any]
    ) -> fs.GetWatcherEventsResponse:
        watcher = await self.watcher(ctx, request.watcher_id)
        since, watcher.polled = watcher.polled, time.time()
        now = await self.snapshot(watcher.sandbox_id, watcher.path, watcher.recursive)
        uploaded = partial(self.core.uploaded_since, watcher.sandbox_id, since=since)
        events = self.changes(watcher.seen, now, watcher.path, watcher.include_entry, watcher.home, uploaded)
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
