"""Resolve a PolicySpec for one caller into a validated Policy.

Owns what a user-written path means (``~/``, relative to the caller's directory,
symlinks resolved so the plan names what the kernel will see), preset expansion and
the default deny list. The caller's facts (cwd, env, home) are arguments: the
supervisor resolves a spec for the client that sent it, not for itself.
"""

from __future__ import annotations

import glob
import os
import posixpath
import stat
from collections.abc import Iterable, Mapping
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from ..errors import PolicyError
from . import hostrun as _hostrun
from . import lookups as _lookups
from . import presets as _presets
from .limits import parse_size
from .model import DEFAULT_DENIED, DEFAULT_ENV_PASS, SYSTEM_DENIED, Policy, Root, is_within
from .spec import DEFAULT_ASK_TIMEOUT, PolicySpec, ask_timeout, check_text


def absolute(
    raw: str, where: str, base: Path | None, home: Path, parents: dict[str, str] | None = None
) -> Path:
    """Turn a user-written path into a normalized absolute one, its links resolved.

    ``base`` is where relative paths are anchored (the caller's cwd for flags and
    requests); ``None`` means relative paths are an error (config files).
    ``parents``: resolved parent directories to reuse (``realpath``).
    """
    path = named(raw, where, base, home)
    # Resolve symlinks so the plan names what the kernel will see.
    return as_path(_lookups.realpath(path) if parents is None else realpath(str(path), parents))


def granted(raw: str, where: str, base: Path | None, home: Path, workspace: Path, kind: str) -> Path:
    """``absolute`` of a path the sandbox is to be given (``kind``: "write" or "read"),
    unless a link inside the workspace leads it out (``stays_in_workspace``)."""
    return stays_in_workspace(named(raw, where, base, home), raw, where, workspace, kind)


def named(raw: str, where: str, base: Path | None, home: Path) -> Path:
    """``raw`` as the absolute path it names, links not resolved (``absolute``'s
    checks: text, ``~/``, anchored at ``base``, length)."""
    check_text(raw, where)
    if not raw.strip():
        raise PolicyError(
            f"{where}: empty path",
            operation="policy",
            path=raw,
            hint="name a directory (an empty path would silently mean the current directory)",
        )
    if raw.startswith("~"):
        if raw != "~" and not raw.startswith("~/"):
            raise PolicyError(
                f"{where}: only ~/ is supported, not {raw!r}",
                operation="policy",
                path=raw,
                hint="write the full path of another user's home",
            )
        raw = str(home) + raw[1:]
    path = Path(raw)
    if not path.is_absolute():
        if base is None:
            raise PolicyError(
                f"{where}: path must be absolute: {raw}",
                operation="policy",
                path=raw,
                hint="config files need absolute paths (or ~/...)",
            )
        path = base / path
    if _too_long(str(path)):
        raise PolicyError(
            f"{where}: path too long: {str(path)[:80]}...",
            operation="policy",
            path=str(path)[:200],
            errno=36,
            hint="paths are at most 4095 bytes, each name at most 255",
        )
    return path


@lru_cache(maxsize=4096)
def as_path(text: str) -> Path:
    """``Path(text)``, the same object for the same text: a Path is immutable, and
    building one parses its text again (the default deny list makes about eighty per
    sandbox, the same ones each time)."""
    return Path(text)


def _too_long(path: str) -> bool:
    """Longer than the kernel takes: 4096 bytes with its NUL, a name over 255."""
    return len(os.fsencode(path)) >= 4096 or any(len(os.fsencode(name)) > 255 for name in path.split("/"))


def _plain_absolute(raw: str) -> bool:
    """Whether ``absolute`` would take ``raw`` as it is: absolute, normalized, no
    leading ``//``, short enough (else it is given to ``absolute``, which explains)."""
    return (
        raw.startswith("/")
        and not raw.startswith("//")
        and raw == os.path.normpath(raw)
        and not _too_long(raw)
    )


def realpath(path: str, parents: dict[str, str]) -> str:
    """``os.path.realpath`` of a normalized absolute path, resolving its parent
    directory once for all the paths that share it (``parents``): the default deny
    list is dozens of paths under a few directories of home, resolved for every
    sandbox. Where the last name is a symlink (or is not a plain name), the full
    resolution."""
    _lookups.looked_up(path)
    parent, _, name = path.rpartition("/")
    if not parent or name in ("", ".", ".."):
        return os.path.realpath(path)
    real_parent = parents.get(parent)
    if real_parent is None:
        real_parent = parents[parent] = os.path.realpath(parent)
    joined = os.path.join(real_parent, name)
    try:
        if stat.S_ISLNK(os.lstat(joined).st_mode):
            return os.path.realpath(path)
    except OSError:
        pass  # absent (or unreadable): realpath keeps the name as it is
    return joined


MIN_DISK = 16 << 20


def _disk(value: object) -> int | None:
    """The writable layer's size on an image: at least 16 MiB (the root's own
    directories and mount points live there)."""
    if value is None:
        return None
    size = parse_size(value, "disk")
    if size < MIN_DISK:
        raise PolicyError(
            f"disk: {value} is less than the 16M a sandbox's layer needs",
            operation="policy",
            hint="give --disk 16M or more (default: a quarter of RAM)",
        )
    return size


def _located(grant: _presets.PresetGrant) -> dict[str, str]:
    return {var: _lookups.realpath(path) for var, path in grant.locations}


def _plain_home(home: Path) -> str | None:
    """``home`` as a string that names, followed by ``/NAME``, the same path ``absolute``
    would make of ``~/NAME`` (absolute, one leading slash, not the root, short enough);
    None when it is anything else (``absolute`` then decides, and explains)."""
    text = str(home)
    if not text.startswith("/") or text.startswith("//") or text == "/" or len(os.fsencode(text)) > 2048:
        return None
    if any(len(os.fsencode(part)) > 255 for part in text.split("/")):
        return None
    return text


def env_and_home(env: Mapping[str, str] | None, home: Path | None) -> tuple[Mapping[str, str], Path]:
    """The environment a policy is resolved in (this process's unless given) and the
    home directory (``$HOME`` of that environment unless given)."""
    env = os.environ if env is None else env
    return env, home or Path(env.get("HOME") or os.path.expanduser("~"))


def build(
    spec: PolicySpec,
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    relative_base: Path | None = None,
) -> Policy:
    """Resolve a spec into a validated :class:`Policy` for the calling user."""
    env, home = env_and_home(env, home)
    cwd = cwd or Path.cwd()
    base = relative_base if relative_base is not None else cwd
    # On an image, ``workspace = "none"``: /workspace lives in the sandbox's own layer.
    no_workspace = bool(spec.image or spec.from_snapshot) and spec.workspace == "none"
    workspace = (
        absolute(spec.workspace, "--workspace", base, home)
        if spec.workspace and not no_workspace
        else Path(_lookups.realpath(cwd))
    )
    # A tool's cache is where the sandbox's environment names it: an explicit --env of
    # its variable moves the grant (a cache private to the project), and the caller's
    # own cache is then not writable.
    grant = _presets.expand(tuple(spec.presets), {**env, **spec.env}, home)
    network = _network_mode(spec)
    asking = network == "ask"
    if asking:
        network = "allow"
    elif spec.ask_timeout is not None:
        raise PolicyError(
            f"ask_timeout given with network mode {network!r}",
            operation="policy",
            hint='ask_timeout only applies to --network ask (network = "ask")',
        )

    write = [granted(p, "--write", base, home, workspace, "write") for p in spec.write]
    read = [granted(p, "--read", base, home, workspace, "read") for p in spec.read]
    deny = [absolute(p, "--deny", base, home) for p in spec.deny]
    writable: list[Root] = []
    if spec.workspace_writable is not False and not no_workspace:
        writable.append(Root(workspace, "workspace"))
    writable += [Root(p, "--write") for p in write]
    writable += [
        Root(stays_in_workspace(p, str(p), src, workspace, "preset"), src, create=True)
        for p, src in grant.writable
    ]
    known: dict[str, tuple[str, bool]] = {}
    host_run = _host_run(env, home, known)
    for root in writable:
        if root.source.startswith("preset:") and (hit := _hostrun.reached(root.path, host_run)):
            raise PolicyError(
                f"{root.source}: {root.path} reaches {hit[0].path}, where the host runs {hit[0].what} "
                "from later; a preset never makes that writable",
                operation="policy",
                path=str(root.path),
                hint="point the tool's cache variable elsewhere, or pass --write for the directory "
                "if you mean the sandbox to write there",
            )
    if not spec.allow_broad_workspace:
        for root in writable:
            _refuse_broad(root, Path(_lookups.realpath(home)))
    readable = [Root(p, "--read") for p in read]
    denied = [Root(p, "--deny") for p in deny]
    if spec.default_deny is not False:
        # Kept whether or not they exist now: one created later stays unreadable.
        parents: dict[str, str] = {}
        under_home = _plain_home(home)
        for raw in (*DEFAULT_DENIED, *system_denied()):
            # What ``absolute`` makes of it, without building Paths to get there (dozens
            # of them, for every sandbox): a plain ~/ path, or a plain absolute one.
            if under_home is not None and raw.startswith("~/") and raw == os.path.normpath(raw):
                plain: str | None = under_home + raw[1:]
            else:
                plain = raw if _plain_absolute(raw) else None
            if plain is not None:
                check_text(raw, "default deny")
                path = as_path(realpath(plain, parents))
            else:
                path = absolute(raw, "default deny", None, home, parents)
            if not any(is_within(w.path, path) for w in writable):
                denied.append(Root(path, "default"))
    return Policy(
        workspace=workspace,
        writable=tuple(_dedupe(writable)),
        readable=tuple(_dedupe(readable)),
        denied=tuple(_dedupe(denied)),
        # On an image HOME and XDG are not the caller's: each tool is told where its
        # host cache is bound (``plan.envroot``). An explicit --env wins over a preset's.
        env={**dict(grant.env), **(_located(grant) if spec.image or spec.from_snapshot else {}), **spec.env},
        env_pass=tuple(dict.fromkeys([*DEFAULT_ENV_PASS, *spec.env_pass])),
        preset_env_pass=grant.env_pass,
        preset_env_patterns=grant.env_patterns,
        network=network,
        ask_timeout=(
            ask_timeout(spec.ask_timeout, "ask_timeout")
            if spec.ask_timeout is not None
            else DEFAULT_ASK_TIMEOUT
        )
        if asking
        else None,
        presets=tuple(spec.presets),
        allowed_hosts=tuple(dict.fromkeys([*grant.hosts, *spec.allow_hosts])) if network == "allow" else (),
        resolve=dict(spec.resolve),
        allow_nested=bool(spec.allow_nested),
        require_namespaces=bool(spec.require_namespaces),
        review=bool(spec.review),
        limits=spec.limits("policy"),
        image=spec.image,
        host_workspace=not no_workspace,
        workspace_at=_workspace_at(spec, str(workspace), writable),
        workspace_link=bool(spec.workspace_link) and spec.workspace_at not in (None, str(workspace)),
        from_snapshot=spec.from_snapshot,
        disk=_disk(spec.disk),
        secrets=_secrets(grant.secrets, spec) if network == "allow" else tuple(spec.secrets),
        http_rules=tuple(spec.allow_http),
        host_run=host_run,
        private_homes=tuple(
            (var, Path(_resolved(os.path.normpath(p), known)[0]), name) for var, p, name in grant.private
        ),
        # Paths made absolute: the same spec resolves to this policy from any directory.
        spec=replace(
            spec,
            workspace="none" if no_workspace else str(workspace),
            write=[str(p) for p in write],
            read=[str(p) for p in read],
            deny=[str(p) for p in deny],
        ),
    )


def stays_in_workspace(path: Path, raw: str, where: str, workspace: Path, kind: str) -> Path:
    """``path`` (absolute, as named: ``named``) resolved, unless a link inside the
    workspace led it out: the workspace is the sandbox's to write, and a link left there
    (``ln -s ~/.local/bin build``) would have a later ``--write build`` or ``--read
    build`` grant whatever it names (or a preset's cache kept in the project,
    ``UV_CACHE_DIR=$PWD/.uv-cache``: ``kind`` "preset"; else "write" or "read"). A path
    that ends in the workspace, or reaches outside it by no link of the workspace's
    (named outright, or through the caller's own links), is taken as it is."""
    resolved = as_path(_lookups.realpath(path))
    if is_within(resolved, workspace):
        return resolved
    instead = f"name the directory itself (--{'read' if kind == 'read' else 'write'} {resolved})"
    if kind == "preset":
        instead = f"remove the link, or point the tool's cache elsewhere; {instead}"
    try:
        links = _lookups.links_on_the_way(os.path.normpath(path))
    except OSError as e:  # a loop of links, or one changed while read
        raise PolicyError.from_os(
            e,
            f"{where} {raw}: cannot follow its links to tell whether it leaves the workspace",
            "policy",
            str(path),
            hint=instead,
        ) from None
    for link, target in links:
        if is_within(Path(link), workspace):
            raise PolicyError(
                f"{where} {raw}: {link} is a symbolic link inside the workspace, to {target}: "
                f"it leads out of the workspace, to {resolved}",
                operation="policy",
                path=str(link),
                hint=f"{instead} if you mean the sandbox to have it; a link in the workspace may "
                "have been made by a sandbox",
            )
    return resolved


def _host_run(
    env: Mapping[str, str], home: Path, known: dict[str, tuple[str, bool]]
) -> tuple[_hostrun.HostRun, ...]:
    """The places the host runs programs from, symlinks resolved as a root's are."""
    return tuple(_hostrun.HostRun(_resolved(p.path, known)[0], p.what) for p in _hostrun.places(env, home))


def _resolved(path: str, known: dict[str, tuple[str, bool]]) -> tuple[str, bool]:
    """(``os.path.realpath`` of a normalized absolute ``path``, whether it exists), one
    ``lstat`` per directory the paths share (``known``), none below a missing one: the
    places of ``hostrun`` are dozens of paths under a few directories, resolved for
    every sandbox."""
    if path in ("/", ""):
        return "/", True
    hit = known.get(path)
    if hit is not None:
        return hit
    _lookups.looked_up(path)
    parent, _, name = path.rpartition("/")
    real_parent, exists = _resolved(parent, known)
    joined = posixpath.join(real_parent, name)
    out = (joined, False)
    if exists:
        try:
            mode = os.lstat(joined).st_mode
        except OSError:
            pass  # absent (or unreadable): nothing below it is a link
        else:
            out = (os.path.realpath(joined), True) if stat.S_ISLNK(mode) else (joined, True)
    known[path] = out
    return out


def system_denied(names: tuple[str, ...] = SYSTEM_DENIED) -> list[str]:
    """``SYSTEM_DENIED`` with each glob expanded to the files that match now (the deny
    mechanism has no globs; a plain name is kept whether or not it exists)."""
    out: list[str] = []
    for name in names:
        if any(c in name for c in "*?["):
            directory = os.path.dirname(name)
            matched = sorted(glob.glob(glob.escape(directory) + "/" + os.path.basename(name)))
            _lookups.listed(directory, matched)
            out += matched
        else:
            out.append(name)
    return list(dict.fromkeys(out))


# Writable here, a sandbox could change the system or everything you own.
SYSTEM_TREES = ("/usr", "/etc", "/boot", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/snap")
BROAD = ("/", "/var", "/opt", "/srv", "/home", "/root", "/mnt", "/media", "/tmp", "/var/tmp", "/var/lib")


def _refuse_broad(root: Root, home: Path) -> None:
    path = root.path
    if path == home:
        why = f"{path} is your home (shell startup files, keys, every project)"
    elif is_within(home, path):
        why = f"{path} contains your home"
    elif str(path) in BROAD:
        why = f"{path} is a whole tree of the system"
    elif any(is_within(path, Path(t)) for t in SYSTEM_TREES):
        why = f"{path} is a system directory"
    else:
        return
    raise PolicyError(
        f"{root.source} {path} is too broad to be writable: {why}",
        operation="policy",
        path=str(path),
        hint="choose the project directory (cd into it, or --workspace DIR); if you really mean it, "
        "pass --allow-broad-workspace (or allow_broad_workspace = true in ~/.config/warren/config.toml)",
    )


# Where a sandbox gets a fresh directory of its own, or none may be made: a workspace is
# never placed there.
_NOT_PLACED = ("/proc", "/dev", "/sys", "/tmp", "/run", "/var/run")


def _workspace_at(spec: PolicySpec, workspace: str, writable: list[Root]) -> str | None:
    """``workspace_at`` checked: an absolute, normal path below a directory other than
    ``/``, outside the fresh directories, and not inside a writable root (its parent is
    shown read-only around it, ``plan.place``). Its own host path is no move at all."""
    at = spec.workspace_at
    if at is None or at == workspace:
        return None

    def refuse(problem: str) -> PolicyError:
        return PolicyError(
            f"workspace_at {at!r} {problem}",
            operation="policy",
            path=at,
            hint="give an absolute path such as /home/user whose parent directory exists on the host "
            "and is not writable in the sandbox",
        )

    if spec.image or spec.from_snapshot:
        raise refuse("is for sandboxes on the host's root: on an image the workspace is /workspace")
    if not at.startswith("/") or posixpath.normpath(at) != at:
        raise refuse("is not an absolute, normal path")
    parent = posixpath.dirname(at)
    if parent == "/":
        raise refuse("is directly under /: its parent would have to be made anew, hiding the host's root")
    if any(is_within(Path(at), Path(base)) for base in _NOT_PLACED):
        raise refuse(
            f"is under {next(b for b in _NOT_PLACED if is_within(Path(at), Path(b)))}, "
            "which the sandbox gets fresh or never has"
        )
    for root in writable:
        if is_within(Path(parent), root.path):
            raise refuse(f"lies inside the writable root {root.path} ({root.source})")
    return at


def _network_mode(spec: PolicySpec) -> str:
    """``--allow-host`` alone means ``--network allow``; with another mode it is a
    contradiction, said as such rather than silently ignored."""
    if spec.network is None:
        return "allow" if spec.allow_hosts else "none"
    if spec.allow_hosts and spec.network not in ("allow", "ask"):
        raise PolicyError(
            f"allowed hosts ({', '.join(spec.allow_hosts[:3])}) given with network mode {spec.network!r}",
            operation="policy",
            hint="allowed hosts only apply to --network allow (or ask); drop them or use --network allow",
        )
    return spec.network


def _secrets(preset: tuple[str, ...], spec: PolicySpec) -> tuple[str, ...]:
    """A preset's secret unless the caller chose otherwise for that name: passed the
    real value (``--pass-env``), set it (``--env``), or gave a ``--secret`` of it."""
    chosen = {*spec.env_pass, *spec.env, *(s.partition("=")[0].strip() for s in spec.secrets)}
    kept = [s for s in preset if s.partition("=")[0] not in chosen]
    return tuple(dict.fromkeys([*kept, *spec.secrets]))


def _dedupe(roots: Iterable[Root]) -> list[Root]:
    seen: dict[Path, Root] = {}
    for root in roots:
        seen.setdefault(root.path, root)
    return list(seen.values())
