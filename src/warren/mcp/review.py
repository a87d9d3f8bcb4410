"""MCP tools of review sandboxes (``warren mcp --review``): what the agent changed
(``diff``), its checkpoints, and ``rollback`` so an agent (or its user) can undo its
last step. Registered on the server by ``server.build``; in a sandbox that is not a
review one they answer with a tool error saying so."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from pydantic import Field

if TYPE_CHECKING:
    from .server import Tools, Warren

_PATCH_LIMIT = 1 << 20  # a patch longer than this is cut (truncated says so)

SandboxArg = Annotated[
    str | None,
    Field(description="a sandbox made by create_sandbox; omit for the workspace's default sandbox"),
]


def register(mcp: Tools, w: Warren) -> None:
    transport = w.transport

    @mcp.tool()
    async def diff(
        patch: Annotated[
            bool, Field(description="also return a git-style patch (binary files named)")
        ] = False,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """What the commands changed in the workspace since the sandbox started (a review
        sandbox keeps every change in a layer of its own until the user applies it): each
        change's path and kind (added, modified, removed, mode, renamed)."""
        name = await w.ensure(sandbox)
        found = await w.call(transport.review, name, "diff", [], patch=patch)
        out: dict[str, Any] = {
            "changes": [
                {"path": c.path, "kind": c.kind, "type": c.type}
                | ({"renamed_from": c.renamed_from} if c.renamed_from else {})
                for c in found.changes
            ]
        }
        if patch:
            out["patch"] = found.patch[:_PATCH_LIMIT]
            out["truncated"] = len(found.patch) > _PATCH_LIMIT
        return out

    @mcp.tool()
    async def checkpoints(sandbox: SandboxArg = None) -> dict[str, Any]:
        """The workspace's checkpoints, oldest first: one is taken before each command that
        follows a change, with the commands that followed it. Give an id to rollback."""
        name = await w.ensure(sandbox)
        found = await w.call(transport.checkpoint, name, "list")
        return {
            "checkpoints": [
                {"id": c.id, "time": c.time, "bytes": c.bytes, "command": c.command} for c in found
            ]
        }

    @mcp.tool()
    async def rollback(
        checkpoint: Annotated[
            int | None,
            Field(description="a checkpoint's id from checkpoints; omit to undo the last command", ge=0),
        ] = None,
        keep_running: Annotated[
            bool, Field(description="refuse if processes still run, instead of stopping them")
        ] = False,
        sandbox: SandboxArg = None,
    ) -> dict[str, Any]:
        """Return the workspace to a checkpoint: without one, to the state before the last
        command that changed it (an undo of that step, rm -rf included). What was written
        since is gone, and later checkpoints with it; processes still running are stopped
        first and named."""
        name = await w.ensure(sandbox)
        back = await w.call(transport.checkpoint, name, "rollback", checkpoint or 0, keep_running)
        return {"checkpoint": back[0].id, "command": back[0].command, "stopped": back[0].stopped}
