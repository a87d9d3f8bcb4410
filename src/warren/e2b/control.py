"""E2B's control plane (``api.e2b.app``): create, list, inspect, time out, pause, resume,
connect to and kill sandboxes, as the ``e2b`` SDK calls them.

A template names a policy: ``base`` is warren's default policy; a preset name (``uv``,
``npm``, ...) adds that preset; the name of an image in the user's image store (``warren
image ls``) runs the sandbox on that image (its home, the workspace, is ``/workspace``
there); any other name is a ``[profile.NAME]`` of the user's warren config. Each sandbox
gets a fresh workspace of its own (E2B's ``/home/user``), deleted when it is killed.
A create's metadata ``warren.review: "true"`` makes it a review sandbox (``REVIEW_KEY``).
Answers are E2B's JSON (``templateID``, ``sandboxID``, ...); errors are ``{"code",
"message"}`` with E2B's status codes. Authentication (the ``X-API-Key`` header) is
checked before any route here runs (``front``).
"""

from __future__ import annotations

import datetime
import errno
import json
import math
import os
import re
import shutil
import time
import uuid
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import ConfigError, SandboxNotFound, WarrenError
from ..models import SandboxInfo
from ..plan.envroot import WORKSPACE as IMAGE_WORKSPACE
from ..policy import config, presets
from ..policy.spec import PolicySpec
from . import standins
from .core import DEFAULT_TIMEOUT, ENVD_VERSION, HOME, MAX_TIMEOUT, Core, E2BError, message_of, status_of
from .front import ELSEWHERE
from .network import Egress, at_create, at_update
from .records import Lifecycle, Record
from .rest import Handler, body, handled
from .snapshots import Snapshot

MAX_BODY = 1024 * 1024
MAX_LIMIT = 100  # E2B's page size limit for /v2/sandboxes
MAX_FORKS = 16
CODE_INTERPRETER = "code-interpreter-v1"
ALIVE = ("running", "paused")

# Create options whose E2B meaning warren does not offer: refused when set, so nothing
# is silently ignored (null, false and empty values are what the SDK sends by default).
# ``secure`` (envd needs the access token) is always so here. ``mcp`` is accepted: E2B's
# API only passes it on, and the SDK itself starts the gateway by running
# ``mcp-gateway`` in the sandbox, which a warren sandbox has not (neither has E2B's
# ``base``): the SDK then kills the sandbox and raises "Failed to start MCP gateway".
NOT_OFFERED = {
    "iam": "workload identity tokens",
    "volumeMounts": "volumes",
}
# A create's metadata key (E2B has no field of its own for it): "true" makes a review
# sandbox (warren's ``--review``): its changes go to a layer of its own, listed, applied
# and rolled back through warren's ``/v1`` routes (docs/e2b.md).
REVIEW_KEY = "warren.review"


def review_of(metadata: Mapping[str, str]) -> bool:
    """Whether a create's metadata asks for a review sandbox."""
    value = metadata.get(REVIEW_KEY)
    if value not in (None, "true", "false"):
        raise E2BError(400, f"metadata {REVIEW_KEY} must be 'true' or 'false', not {str(value)[:60]!r}")
    return value == "true"


def rfc3339(stamp: float) -> str:
    when = datetime.datetime.fromtimestamp(stamp, datetime.UTC)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


async def json_object(request: Request, required: bool, limit: int = MAX_BODY) -> dict[str, Any]:
    raw = await body(request, limit, f"request body is over {limit} bytes")
    if not raw:
        if required:
            raise E2BError(400, "request body is empty: send a JSON object")
        return {}
    try:
        data = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise E2BError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise E2BError(400, "request body must be a JSON object")
    return data


def timeout_of(data: Mapping[str, Any], default: int | None) -> int | None:
    value = data.get("timeout", default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMEOUT:
        raise E2BError(400, f"timeout must be whole seconds from 0 to {MAX_TIMEOUT}, not {value!r}")
    return value


def strings(data: Mapping[str, Any], key: str) -> dict[str, str]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise E2BError(400, f"{key} must be an object of strings")
    for k, v in value.items():
        if not k or "=" in k or "\x00" in k or "\x00" in v:
            raise E2BError(400, f"{key}: invalid entry {k[:60]!r} (no '=' in names, no NUL anywhere)")
    return dict(value)


def flag(data: Mapping[str, Any], key: str) -> bool | None:
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise E2BError(400, f"{key} must be true or false, not {value!r}")
    return value


def policy_of(template: str, workspace: str, egress: Egress) -> tuple[PolicySpec, str | None]:
    """The spec and the config profile a template stands for."""
    # E2B's home: the workspace is reached at /home/user, a link made inside the sandbox
    # only (the home stays on its host mount, with the caches: uv and npm hard-link into
    # it); on an image it is /workspace, as every sandbox on an image has it
    spec = PolicySpec(workspace=workspace, workspace_at=HOME, workspace_link=True)
    spec.network = egress.mode
    spec.allow_hosts = list(egress.allow)
    standins.give(spec)
    if template == "base":
        return spec, None
    if template == CODE_INTERPRETER:
        # e2b-code-interpreter's default template: a Python sandbox (its kernel is not
        # served: run_code gets E2B's "port is not open", see front.port_of)
        spec.presets = ["python"]
        return spec, None
    if template in presets.names():
        spec.presets = [template]
        return spec, None
    if template in _images():
        spec.image = template
        spec.workspace_at = None
        spec.workspace_link = None
        spec.read, spec.env = [], {}
        return spec, None
    return spec, template


_TEMPLATE_NAME = re.compile(r"\A[A-Za-z0-9._:-]{1,128}\Z")


def refuse_review(record: Record, what: str) -> None:
    """A snapshot copies the sandbox's home on the host, which a review sandbox leaves as
    it was (its changes are in its layer): it would lose them, so it is refused."""
    if review_of(record.metadata):
        raise E2BError(
            409,
            f"sandbox {record.sandbox_id!r} is a review sandbox: a {what} would copy its home without "
            f"the changes in its layer; apply them first (warren's POST /v1/sandboxes/"
            f"{record.sandbox_id}/apply, once stopped) or use a checkpoint "
            f"(POST /v1/sandboxes/{record.sandbox_id}/checkpoints)",
        )


def _template_known(name: str, core: Core, built: bool = True) -> bool:
    """Whether a sandbox can be created from ``name`` (``built``: counting the names
    built here)."""
    if name in ("base", CODE_INTERPRETER) or name in presets.names() or name in _images():
        return True
    if core.snapshots.get(name) is not None:
        return True
    if built and core.templates.base_of(name) is not None:
        return True
    try:
        return name in config.profile_names()
    except ConfigError:
        return False


def _images() -> list[str]:
    """The image names of this user's store (none when it cannot be read)."""
    from ..errors import ImageError
    from ..images.store import ImageStore

    try:
        return ImageStore().names() if os.path.isdir(ImageStore().root) else []
    except (ImageError, OSError):
        return []


class Control:
    def __init__(self, core: Core) -> None:
        self.core = core
        self._cpu: dict[str, tuple[float, float]] = {}  # sandbox -> (when, CPU seconds) of its last sample

    # --- answers ---------------------------------------------------------------------------------

    def created(self, record: Record) -> dict[str, Any]:
        return {
            "templateID": record.template,
            "sandboxID": record.sandbox_id,
            "clientID": "warren",
            "alias": record.template,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.core.records.access_token(record.sandbox_id),
            "trafficAccessToken": None,
            "domain": None,
        }

    def listed(self, info: SandboxInfo, record: Record, detail: bool = False) -> dict[str, Any]:
        end = record.end_at if record.end_at != float("inf") else record.started_at + 100 * 365 * 86400
        out: dict[str, Any] = {
            "templateID": record.template,
            "sandboxID": record.sandbox_id,
            "clientID": "warren",
            "alias": record.template,
            "startedAt": rfc3339(record.started_at),
            "endAt": rfc3339(end),
            "cpuCount": os.cpu_count() or 1,
            "memoryMB": 0,
            "diskSizeMB": 0,
            "state": "paused" if info.state == "paused" else "running",
            "envdVersion": ENVD_VERSION,
            "metadata": record.metadata,
        }
        if detail:
            out["envdAccessToken"] = self.core.records.access_token(record.sandbox_id)
            out["domain"] = None
        return out

    async def alive(self, sandbox_id: str) -> SandboxInfo:
        try:
            info = await self.core.call(self.core.transport.get, sandbox_id)
        except SandboxNotFound:
            raise E2BError(404, f"sandbox {sandbox_id!r} not found") from None
        if info.state not in ALIVE:
            raise E2BError(404, f"sandbox {sandbox_id!r} is {info.state}, not running")
        return info

    # --- routes ----------------------------------------------------------------------------------

    async def create(self, request: Request) -> Response:
        data = await json_object(request, required=True)
        template = data.get("templateID")
        if not isinstance(template, str) or not template:
            raise E2BError(400, "templateID must be a non-empty string (e.g. 'base')")
        for key, what in NOT_OFFERED.items():
            if data.get(key) not in (None, False, {}, []):
                raise E2BError(400, f"{key} ({what}) is not offered by warren's E2B API")
        resume = data.get("autoResume")
        enabled = resume.get("enabled") if isinstance(resume, dict) else None
        if resume is not None and not (isinstance(resume, dict) and isinstance(enabled, bool | None)):
            raise E2BError(400, 'autoResume must be an object {"enabled": true or false}')
        auto_resume = bool(enabled)
        timeout = timeout_of(data, DEFAULT_TIMEOUT)
        assert timeout is not None
        metadata, envs = strings(data, "metadata"), strings(data, "envVars")
        review_of(metadata)  # checked before anything is made
        internet = flag(data, "allow_internet_access")
        egress = at_create(data.get("network"), internet)
        auto_pause = bool(flag(data, "autoPause"))
        # a filesystem-only pause: its processes end, its files stay (``Core.pause``)
        files_only = auto_pause and flag(data, "autoPauseMemory") is False
        if files_only and auto_resume:
            raise E2BError(
                400, "autoResume cannot be combined with a filesystem-only autoPause (autoPauseMemory false)"
            )
        sandbox_id = f"e2b-{uuid.uuid4().hex[:16]}"
        snap = self.core.snapshots.get(template)
        lifecycle = Lifecycle(auto_pause, auto_resume, not files_only)
        with self.core.creating(sandbox_id):
            record = await self._create(
                sandbox_id, template, timeout, metadata, envs, internet, egress, lifecycle, snap
            )
        self.core.start_reaper()
        return JSONResponse(self.created(record), status_code=201)

    async def _create(
        self,
        sandbox_id: str,
        template: str,
        timeout: int,
        metadata: dict[str, str],
        envs: dict[str, str],
        internet: bool | None,
        egress: Egress,
        lifecycle: Lifecycle,
        snap: Snapshot | None = None,
    ) -> Record:
        workspace = await self.core.call(self.core.records.new_workspace, sandbox_id)
        if snap is not None:
            # a sandbox from a snapshot: the snapshot's template and environment, its files
            envs = {**snap.envs, **envs}
            await self.core.call(self.core.snapshots.seed, snap, workspace)
        policy_template = snap.template if snap is not None else template
        built = await self.core.call(self.core.templates.base_of, policy_template)
        policy_template = built or policy_template
        spec, profile = await self.core.call(policy_of, policy_template, workspace, egress)
        if review_of(metadata):
            if spec.image:
                await self.core.call(self.core.records.drop, sandbox_id)
                raise E2BError(
                    400,
                    f"{REVIEW_KEY}: template {template!r} is an image, and review mode on an image "
                    "is not offered yet (use a template that is not an image)",
                )
            spec.review = True
        now = time.time()
        record = Record(
            sandbox_id,
            template,
            now,
            now + timeout,
            workspace,
            metadata,
            envs,
            lifecycle.auto_pause,
            internet=internet,
            network=egress.mode,
            allow_out=list(egress.allow),
            auto_resume=lifecycle.auto_resume,
            keep_memory=lifecycle.keep_memory,
            timeout=timeout,
        )
        record.home = IMAGE_WORKSPACE if spec.image else HOME
        try:
            await self.core.call(self.core.records.save, record)
            await self.core.call(
                self.core.transport.create, spec, sandbox_id, config=profile is not None, profile=profile
            )
        except BaseException as e:
            await self.core.call(self.core.records.drop, sandbox_id)
            if isinstance(e, ConfigError) and profile is not None and "is not defined" in e.message:
                raise E2BError(
                    404,
                    f"template {template!r} not found: it is neither 'base', a warren preset "
                    f"({', '.join(presets.names())}), an image (warren image ls) nor a "
                    f"[profile.{template}] of your warren config",
                ) from None
            raise
        return record

    async def list_v1(self, request: Request) -> Response:
        return JSONResponse([item for _, item in await self._list({"running"}, {})])

    async def list_v2(self, request: Request) -> Response:
        query = request.query_params
        states = set(query.getlist("state")) or {"running", "paused"}
        for part in list(states):
            states.discard(part)
            states.update(s for s in part.split(",") if s)
        if not states <= {"running", "paused"}:
            raise E2BError(400, f"state must be 'running' or 'paused', not {sorted(states)}")
        wanted: dict[str, str] = {}
        raw = query.get("metadata")
        if raw:
            from urllib.parse import parse_qsl

            wanted = dict(parse_qsl(raw, keep_blank_values=True))
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise E2BError(400, f"order must be 'asc' or 'desc', not {order!r}")
        after = _stamp(query.get("startedAfter"))
        template = query.get("template")
        limit = _limit(query.get("limit"))
        items = await self._list(states, wanted)
        items = [
            (started, item)
            for started, item in items
            if (after is None or started >= after) and (template is None or item["templateID"] == template)
        ]
        # Newest first unless asked otherwise, as E2B lists; ties by id, so the order is total
        # and a page's cursor (the last item's start and id) says where the next one begins.
        items.sort(key=lambda pair: (pair[0], pair[1]["sandboxID"]), reverse=order == "desc")
        cursor = _cursor(query.get("nextToken"))
        if cursor is not None:
            items = [
                pair
                for pair in items
                if ((pair[0], pair[1]["sandboxID"]) < cursor) == (order == "desc")
                and (pair[0], pair[1]["sandboxID"]) != cursor
            ]
        page, rest = items[:limit], items[limit:]
        headers = {}
        if rest:
            started, last = page[-1]
            headers["X-Next-Token"] = f"{started!r}/{last['sandboxID']}"
        return JSONResponse([item for _, item in page], headers=headers)

    async def _list(self, states: set[str], metadata: dict[str, str]) -> list[tuple[float, dict[str, Any]]]:
        items = await self.core.call(self.core.transport.list)
        out = []
        for info in items:
            if info.state not in ALIVE or info.state not in states:
                continue
            record = self.core.record_of(info)
            if all(record.metadata.get(k) == v for k, v in metadata.items()):
                out.append((record.started_at, self.listed(info, record)))
        return out

    async def get(self, request: Request) -> Response:
        info = await self.alive(request.path_params["id"])
        return JSONResponse(self.listed(info, self.core.record_of(info), detail=True))

    async def kill(self, request: Request) -> Response:
        await self.alive(request.path_params["id"])
        self._cpu.pop(request.path_params["id"], None)
        await self.core.call(self.core.kill, request.path_params["id"])
        return Response(status_code=204)

    async def set_timeout(self, request: Request) -> Response:
        info = await self.alive(request.path_params["id"])
        timeout = timeout_of(await json_object(request, required=True), None)
        if timeout is None:
            raise E2BError(400, "timeout is required (seconds from now)")
        await self._extend(info, timeout, shorten=True)
        return Response(status_code=204)

    async def refresh(self, request: Request) -> Response:
        info = await self.alive(request.path_params["id"])
        data = await json_object(request, required=False)
        duration = timeout_of({"timeout": data.get("duration")}, DEFAULT_TIMEOUT)
        assert duration is not None
        await self._extend(info, duration, shorten=False)
        return Response(status_code=204)

    async def _extend(self, info: SandboxInfo, seconds: int, *, shorten: bool) -> None:
        record = self.core.records.get(info.name)
        if record is None:
            raise E2BError(
                400, f"sandbox {info.name!r} was not created through the E2B API: it has no timeout"
            )
        end = time.time() + seconds
        record.end_at = end if shorten else max(end, record.end_at)
        await self.core.call(self.core.records.save, record)

    async def pause(self, request: Request) -> Response:
        info = await self.alive(request.path_params["id"])
        if info.state == "paused":
            raise E2BError(409, f"sandbox {info.name!r} is already paused")
        memory = flag(await json_object(request, required=False), "memory")
        await self.core.call(self.core.pause, info.name, keep_memory=memory is not False)
        return Response(status_code=204)

    async def resume(self, request: Request) -> Response:
        info = await self.alive(request.path_params["id"])
        if info.state != "paused":
            raise E2BError(409, f"sandbox {info.name!r} is already running")
        return await self._connect(info, await json_object(request, required=False))

    async def connect(self, request: Request) -> Response:
        info = await self.alive(request.path_params["id"])
        return await self._connect(info, await json_object(request, required=False))

    async def _connect(self, info: SandboxInfo, data: Mapping[str, Any]) -> Response:
        timeout = timeout_of(data, None)
        resumed = info.state == "paused"
        if resumed:
            # a sandbox its timeout paused would be paused again at once without new time
            timeout = DEFAULT_TIMEOUT if timeout is None else timeout
            info = await self.core.call(self.core.transport.pause, info.name, False)
        if timeout is not None and self.core.records.get(info.name) is not None:
            await self._extend(info, timeout, shorten=False)
        return JSONResponse(self.created(self.core.record_of(info)), status_code=201 if resumed else 200)

    async def snapshot(self, request: Request) -> Response:
        """A copy of the sandbox's home as it is now, taken with its processes paused."""
        info = await self.alive(request.path_params["id"])
        record = self.core.records.get(info.name)
        if record is None:
            raise E2BError(
                400, f"sandbox {info.name!r} was not created through the E2B API: no snapshot of it"
            )
        refuse_review(record, "snapshot")
        data = await json_object(request, required=False)
        name = data.get("name") or ""
        if not isinstance(name, str) or len(name) > 200 or "/" in name or "\x00" in name:
            raise E2BError(400, "name must be a string of at most 200 characters, no '/'")
        snap = await self._take(info, record, name)
        return JSONResponse(snap.answer(), status_code=201)

    async def _take(self, info: SandboxInfo, record: Record, name: str) -> Snapshot:
        running = info.state == "running"
        if running:
            await self.core.call(self.core.transport.pause, info.name, True)
        try:
            return await self.core.call(
                self.core.snapshots.take, info.name, record.template, record.envs, record.workspace, name
            )
        except OSError as e:
            status = {errno.EFBIG: 507, errno.ELOOP: 400}.get(e.errno or 0, 500)  # too big, too deep
            raise E2BError(status, f"cannot snapshot {info.name!r}: {e.strerror}") from None
        finally:
            if running:
                await self.core.call(self.core.transport.pause, info.name, False)

    async def fork(self, request: Request) -> Response:
        """``count`` new sandboxes from one snapshot of this one (its files, template,
        environment and metadata; not its processes), each answered on its own."""
        info = await self.alive(request.path_params["id"])
        record = self.core.records.get(info.name)
        if record is None:
            raise E2BError(
                400, f"sandbox {info.name!r} was not created through the E2B API: it cannot be forked"
            )
        refuse_review(record, "fork")
        data = await json_object(request, required=False)
        timeout = timeout_of(data, DEFAULT_TIMEOUT)
        assert timeout is not None
        count = data.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise E2BError(400, f"count must be a whole number from 1 to {MAX_FORKS}, not {count!r}")
        snap = await self._take(info, record, "")
        results: list[dict[str, Any]] = []
        try:
            for _ in range(count):
                sandbox_id = f"e2b-{uuid.uuid4().hex[:16]}"
                try:
                    with self.core.creating(sandbox_id):
                        made = await self._create(
                            sandbox_id,
                            record.template,
                            timeout,
                            dict(record.metadata),
                            {},
                            record.internet,
                            Egress(record.network, list(record.allow_out)),
                            Lifecycle(record.auto_pause, record.auto_resume, record.keep_memory),
                            snap,
                        )
                    results.append({"sandbox": self.created(made)})
                except (E2BError, WarrenError) as e:
                    results.append({"error": {"code": status_of(e), "message": message_of(e)}})
        finally:
            await self.core.call(self.core.snapshots.remove, snap.snapshot_id)
        self.core.start_reaper()
        return JSONResponse(results, status_code=201)

    async def list_snapshots(self, request: Request) -> Response:
        query = request.query_params
        sandbox_id, name = query.get("sandboxID"), query.get("name")
        found = [
            s
            for s in await self.core.call(self.core.snapshots.all)
            if (sandbox_id is None or s.sandbox_id == sandbox_id) and (name is None or s.name == name)
        ]
        start = 0
        token = query.get("nextToken")
        if token:
            if not token.isdigit():
                raise E2BError(400, f"nextToken {token[:60]!r} is not one this API gave")
            start = int(token)
        limit = _limit(query.get("limit"))
        page = found[start : start + limit]
        headers = {"X-Next-Token": str(start + limit)} if start + limit < len(found) else {}
        return JSONResponse([s.answer() for s in page], headers=headers)

    async def delete_template(self, request: Request) -> Response:
        """Only snapshots are templates here that can be deleted; any other is not found."""
        template = request.path_params["id"].removesuffix(":default")
        if await self.core.call(self.core.snapshots.remove, template):
            return Response(status_code=204)
        if await self.core.call(self.core.templates.remove, template):
            return Response(status_code=204)
        raise E2BError(
            404, f"template {template!r} not found (only snapshots and templates built here can be deleted)"
        )

    async def request_build(self, request: Request) -> Response:
        """A template to build (``Template.build``): answered with its id and a build's."""
        data = await json_object(request, required=True)
        name = data.get("name")
        if not isinstance(name, str) or not _TEMPLATE_NAME.match(name):
            raise E2BError(400, "name must be 1 to 128 letters, digits, '.', '_', ':' or '-'")
        if await self.core.call(_template_known, name, self.core, False):
            raise E2BError(
                409, f"template name {name!r} is taken by warren (base, a preset, an image, a profile)"
            )
        tags = data.get("tags") or ["default"]
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise E2BError(400, "tags must be a list of strings")
        build = await self.core.call(self.core.templates.request, name)
        answer = {"templateID": build.template_id, "buildID": build.build_id, "public": False}
        return JSONResponse({**answer, "aliases": [name], "names": [name], "tags": tags}, status_code=202)

    def _build(self, request: Request) -> Any:
        build = self.core.templates.builds.get(request.path_params["build"])
        if build is None or build.template_id != request.path_params["id"]:
            raise E2BError(404, f"build {request.path_params['build']!r} of this template not found")
        return build

    async def start_build(self, request: Request) -> Response:
        """A build warren can make is a template made from another with nothing added;
        any other ends in ``error`` saying why (``templates.NOT_BUILT``)."""
        build = self._build(request)
        data = await json_object(request, required=False)
        source = data.get("fromTemplate")
        plain = not any(
            data.get(k) for k in ("fromImage", "fromImageRegistry", "steps", "startCmd", "readyCmd")
        )
        base = None
        if plain and isinstance(source, str) and await self.core.call(_template_known, source, self.core):
            base = await self.core.call(self.core.templates.base_of, source) or source
        await self.core.call(self.core.templates.finish, build, base)
        return Response(status_code=202)

    async def build_status(self, request: Request) -> Response:
        build = self._build(request)
        offset = request.query_params.get("logsOffset") or "0"
        if not offset.isdigit():
            raise E2BError(400, f"logsOffset must be a whole number, not {offset[:20]!r}")
        return JSONResponse(build.answer(int(offset)))

    async def template_alias(self, request: Request) -> Response:
        """Whether a template name stands for something here (``Template.exists``): base,
        the code interpreter's, a preset, an image, a profile of the user's config, a
        snapshot. Unlike E2B's, none is another team's (no 403)."""
        alias = request.path_params["alias"]
        known = await self.core.call(_template_known, alias, self.core)
        if not known:
            raise E2BError(404, f"template {alias!r} not found")
        return JSONResponse({"templateID": alias, "public": alias in ("base", CODE_INTERPRETER)})

    async def metrics(self, request: Request) -> Response:
        """One sample, taken now, of what the sandbox uses (warren keeps no history):
        answered when the asked range overlaps the sandbox's life, else none. CPU is the
        share of its CPUs used since the previous sample (or since it started), memory
        its cgroup's (or its processes') against its limit or the host's memory, disk the
        filesystem its home is on."""
        info = await self.alive(request.path_params["id"])
        record = self.core.record_of(info)
        start, end = _unix(request.query_params.get("start")), _unix(request.query_params.get("end"))
        now = time.time()
        if (end is not None and end < record.started_at - 1) or (start is not None and start > now):
            return JSONResponse([])
        stats = await self.core.call(self.core.transport.stats, info.name)
        cpus = stats.cpus_limit or float(os.cpu_count() or 1)
        since, used_before = self._cpu.get(info.name, (record.started_at, 0.0))
        self._cpu[info.name] = (now, stats.cpu_time)
        busy = (stats.cpu_time - used_before) / max(now - since, 1e-3) / cpus * 100
        disk = await self.core.call(shutil.disk_usage, record.workspace)
        host_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        sample = {
            "timestamp": rfc3339(now),
            "timestampUnix": int(now),
            "cpuCount": max(1, math.ceil(cpus)),
            "cpuUsedPct": round(min(max(busy, 0.0), 100.0), 2),
            "memUsed": stats.memory,
            "memTotal": stats.memory_limit or host_memory,
            "memCache": 0,
            "diskUsed": disk.used,
            "diskTotal": disk.total,
        }
        return JSONResponse([sample])

    async def update_network(self, request: Request) -> Response:
        """E2B's rules replaced at run time, as warren's live ``net allow``/``net deny``
        (``network.at_update``); every change is a record of the sandbox's network log."""
        info = await self.alive(request.path_params["id"])
        data = await json_object(request, required=True)
        try:
            policy = await self.core.call(self.core.transport.net_policy, info.name, "show", via="e2b")
        except WarrenError:
            policy = None  # no proxy: network none or open
        record = self.core.record_of(info)
        if policy is None and (record.network == "open" or record.internet is True):
            raise E2BError(400, f"sandbox {info.name!r} is open to all traffic: no proxy to deny with")
        current = [] if policy is None else [*policy.allowed, *policy.added]
        listed = policy is not None
        current = [r for r in current if policy is not None and r not in policy.denied]
        change = at_update(data, listed, current)
        for rule in change.allow:
            await self.core.call(self.core.transport.net_policy, info.name, "allow", rule=rule, via="e2b")
        for rule in change.deny:
            await self.core.call(self.core.transport.net_policy, info.name, "deny", rule=rule, via="e2b")
        return Response(status_code=204)

    async def not_offered(self, request: Request) -> Response:
        what = request.url.path.rsplit("/", 1)[-1]
        raise E2BError(501, f"{what} is not offered by warren's E2B API (see docs/e2b.md)")

    async def elsewhere(self, request: Request) -> Response:
        what = next(part for part in request.url.path.split("/") if part and part not in ("v2", "v3"))
        raise E2BError(501, f"{what} are not offered by warren's E2B API (see docs/e2b.md)")

    def routes(self) -> list[Route]:
        one = "/sandboxes/{id}"
        table: list[tuple[str, str, Handler]] = [
            ("/sandboxes/metrics", "GET", self.not_offered),
            ("/sandboxes", "POST", self.create),
            ("/v2/sandboxes", "POST", self.create),
            ("/sandboxes", "GET", self.list_v1),
            ("/v2/sandboxes", "GET", self.list_v2),
            (one, "GET", self.get),
            (one, "DELETE", self.kill),
            (f"{one}/timeout", "POST", self.set_timeout),
            (f"{one}/refreshes", "POST", self.refresh),
            (f"{one}/pause", "POST", self.pause),
            (f"{one}/resume", "POST", self.resume),
            (f"{one}/connect", "POST", self.connect),
            (f"/v2{one}/connect", "POST", self.connect),
            (f"{one}/metrics", "GET", self.metrics),
            (f"{one}/logs", "GET", self.not_offered),
            (f"/v2{one}/logs", "GET", self.not_offered),
            (f"{one}/snapshots", "POST", self.snapshot),
            ("/snapshots", "GET", self.list_snapshots),
            ("/templates/{id}", "DELETE", self.delete_template),
            ("/templates/aliases/{alias}", "GET", self.template_alias),
            ("/v3/templates", "POST", self.request_build),
            ("/v2/templates/{id}/builds/{build}", "POST", self.start_build),
            ("/templates/{id}/builds/{build}/status", "GET", self.build_status),
            (f"{one}/fork", "POST", self.fork),
            (f"{one}/network", "PUT", self.update_network),
        ]
        by_path: dict[str, dict[str, Handler]] = {}
        for path, method, handler in table:
            by_path.setdefault(path, {})[method] = handled(handler)
        out = [Route(path, dispatch(methods), methods=list(methods)) for path, methods in by_path.items()]
        every = ["GET", "POST", "PUT", "PATCH", "DELETE"]
        for prefix in ELSEWHERE:
            for path in (prefix, prefix + "/{rest:path}"):
                out.append(Route(path, handled(self.elsewhere), methods=every))
        return out


def _stamp(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        when = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise E2BError(400, f"startedAfter must be an RFC 3339 time, not {raw[:60]!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def _unix(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        raise E2BError(400, f"start and end must be Unix seconds, not {raw[:40]!r}") from None


def _limit(raw: str | None) -> int:
    if raw is None:
        return MAX_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise E2BError(400, f"limit must be a whole number from 1 to {MAX_LIMIT}, not {raw[:20]!r}")
    return int(raw)


def _cursor(raw: str | None) -> tuple[float, str] | None:
    """A page's ``nextToken``: the start time and id of the last sandbox it listed."""
    if not raw:
        return None
    started, _, sandbox_id = raw.partition("/")
    try:
        return float(started), sandbox_id
    except ValueError:
        raise E2BError(400, f"nextToken {raw[:60]!r} is not one this API gave") from None


def dispatch(methods: dict[str, Handler]) -> Handler:
    async def route(request: Request) -> Response:
        return await methods[request.method](request)

    return route
