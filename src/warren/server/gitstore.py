"""Git repositories in the writable roots: what the sandbox writes never runs on the host.

Host git runs what a repository's ``.git/config`` and ``.git/hooks`` name (hooks,
``core.fsmonitor``, filters, ``core.sshCommand``, pagers, ``include.path``, ...). So a
sandbox never writes either of the host's. Inside, ``.git/config`` and ``.git/hooks``
are the repository's *store*, kept by warren outside every sandbox
(``$XDG_DATA_HOME/warren/git/<id>``): git inside reads and writes them as usual, and
a hook installed in one run fires in the next (inside). Git replaces its config by
renaming ``config.lock`` onto it, which a mount point refuses: PID 1 performs those
renames for the sandbox (``_core.broker``).

Host and store stay in step, key by key, against the last state both agreed on
(``base.json``):

- at every launch the host's changes since then are pulled into the store;
- after the sandbox changes the config, the keys on ``SYNCED`` that it changed are
  written to the host's file (remotes, branches' upstreams, ``user.name``, ...:
  settings that only name things). Anything else it sets — hooks paths, filters,
  fsmonitor, pagers, editors, ssh commands, includes, aliases — stays in the store.

The host's hooks are copied into the store when they are newer there; the sandbox's
hooks are never copied out.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass

# The keys a sandbox's config writes reach the host with: none of them names a
# program, a file to include, or a command (git lower-cases sections and names).
SYNCED = (
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.autocrlf",
    "core.eol",
    "core.safecrlf",
    "core.symlinks",
    "core.quotepath",
    "core.sparsecheckout",
    "core.sparsecheckoutcone",
    "extensions.objectformat",
    "user.name",
    "user.email",
    "author.name",
    "author.email",
    "committer.name",
    "committer.email",
    "init.defaultbranch",
    "remote.*.url",
    "remote.*.pushurl",
    "remote.*.fetch",
    "remote.*.push",
    "remote.*.tagopt",
    "remote.*.prune",
    "remote.*.mirror",
    "branch.*.remote",
    "branch.*.merge",
    "branch.*.rebase",
    "branch.*.pushremote",
    "branch.*.description",
    "pull.rebase",
    "pull.ff",
    "push.default",
    "push.autosetupremote",
    "fetch.prune",
    "merge.ff",
    "submodule.*.url",
    "submodule.*.active",
    "submodule.*.branch",
)

Values = dict[str, list[str]]


def synced(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in SYNCED) and not _odd(key)


def _odd(key: str) -> bool:
    # A subsection holding a dot could make "remote.x.url" mean something else.
    parts = key.split(".")
    return len(parts) > 3 and parts[0] in ("remote", "branch", "submodule")


@dataclass(frozen=True)
class Store:
    gitdir: str  # the repository's git directory on the host
    path: str  # the store: config, hooks/, base.json

    @property
    def config(self) -> str:
        return os.path.join(self.path, "config")

    @property
    def hooks(self) -> str:
        return os.path.join(self.path, "hooks")


def location(gitdir: str, env: Mapping[str, str]) -> str:
    base = env.get("XDG_DATA_HOME") or ""
    if not base.startswith("/"):
        base = os.path.join(env.get("HOME") or os.path.expanduser("~"), ".local", "share")
    digest = hashlib.sha256(os.fsencode(gitdir)).hexdigest()[:20]
    return os.path.join(os.path.normpath(base), "warren", "git", digest)


def repositories(roots: list[str]) -> list[str]:
    """Git directories a sandbox with these writable roots could write: a root's own
    ``.git`` and its submodules' (``.git/modules/*``)."""
    found: list[str] = []
    for root in roots:
        for gitdir in (os.path.join(root, ".git"), root):
            if _is_gitdir(gitdir) and gitdir not in found:
                found.extend(_with_modules(gitdir))
    return found


def _is_gitdir(path: str) -> bool:
    return (
        os.path.isdir(path)
        and not os.path.islink(path)
        and all(os.path.exists(os.path.join(path, n)) for n in ("config", "HEAD", "objects"))
    )


def _with_modules(gitdir: str) -> list[str]:
    found = [gitdir]
    modules = os.path.join(gitdir, "modules")
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(modules)):
            sub = os.path.join(modules, name)
            if _is_gitdir(sub):
                found.append(sub)
    return found


def prepare(gitdir: str, env: Mapping[str, str]) -> Store:
    """The repository's store, created on first use and brought up to date with the
    host (its config changes since the last agreement, its newer hooks)."""
    store = Store(gitdir, location(gitdir, env))
    sweep(gitdir)
    os.makedirs(store.hooks, mode=0o700, exist_ok=True)
    os.chmod(store.path, 0o700)
    host_config = os.path.join(gitdir, "config")
    base_file = os.path.join(store.path, "base.json")
    if not os.path.exists(store.config):
        shutil.copyfile(host_config, store.config)
        _save_base(base_file, _stamp(host_config), _read(host_config))
    else:
        stamp, base = _load_base(base_file)
        if stamp != _stamp(host_config):
            host = _read(host_config)
            _apply(store.config, {k: host.get(k, []) for k in {*host, *base} if host.get(k) != base.get(k)})
            _save_base(base_file, _stamp(host_config), host)
    _copy_newer_hooks(os.path.join(gitdir, "hooks"), store.hooks)
    return store


def push(store: Store) -> list[str]:
    """After the sandbox changed its config: the synced keys it changed, written to the
    host's file. Returns the keys written.

    Written in place, not renamed over: the sandbox's bind sits on the host file's
    directory entry, and replacing that entry on the host detaches the bind in every
    sandbox (see ``reattach``)."""
    base_file = os.path.join(store.path, "base.json")
    _stamp_was, base = _load_base(base_file)
    mine = _read(store.config)
    changed = sorted(k for k in {*mine, *base} if synced(k) and mine.get(k) != base.get(k))
    if not changed:
        return []
    host_config = os.path.join(store.gitdir, "config")
    tmp = f"{host_config}.warren-{os.getpid()}"
    shutil.copyfile(host_config, tmp)
    try:
        _apply(tmp, {k: mine.get(k, []) for k in changed})
        with open(tmp, "rb") as src:
            data = src.read()
        fd = os.open(host_config, os.O_WRONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        try:
            os.write(fd, data)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    for k in changed:
        if k in mine:
            base[k] = mine[k]
        else:
            base.pop(k, None)
    _save_base(base_file, _stamp(host_config), base)
    return changed


# Files a sandbox could create in a protected git directory that would make host git
# read a configuration it wrote: ``commondir`` points git at another directory's
# config and hooks (git reads it in any git directory, not only linked worktrees').
PLANTED = ("commondir",)


def sweep(gitdir: str) -> list[str]:
    """Remove what a sandbox planted in a protected git directory (checked every
    quarter second while a sandbox lives, and when it ends); the paths removed."""
    removed = []
    for name in PLANTED:
        path = os.path.join(gitdir, name)
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
            removed.append(path)
    return removed


def identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _apply(path: str, changes: Values) -> None:
    """Make each key of ``changes`` hold exactly its values in the config file ``path``
    (an empty list removes the key)."""
    for key, values in changes.items():
        _git(["config", "--file", path, "--unset-all", key], ok=(0, 5))
        for v in values:
            _git(["config", "--file", path, "--add", key, v])


def _read(path: str) -> Values:
    out = _git(["config", "--file", path, "--null", "--list"], ok=(0,))
    values: Values = {}
    for item in out.split("\0"):
        if not item:
            continue
        key, _, value = item.partition("\n")
        values.setdefault(key, []).append(value)
    return values


def _git(args: list[str], ok: tuple[int, ...] = (0,)) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": "/nonexistent",
    }
    r = subprocess.run(["git", *args], capture_output=True, text=True, env=env, check=False)
    if r.returncode not in ok:
        raise OSError(f"git {' '.join(args[:3])}: {r.stderr.strip()}")
    return r.stdout


def _stamp(path: str) -> list[int]:
    try:
        st = os.stat(path)
    except OSError:
        return []
    return [st.st_ino, st.st_size, st.st_mtime_ns]


def _load_base(path: str) -> tuple[list[int], Values]:
    try:
        with open(path) as f:
            data = json.load(f)
        return list(data["stamp"]), {str(k): [str(x) for x in v] for k, v in data["values"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return [], {}


def _save_base(path: str, stamp: list[int], values: Values) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"stamp": stamp, "values": values}, f)
    os.replace(tmp, path)


def _copy_newer_hooks(host_hooks: str, store_hooks: str) -> None:
    try:
        names = os.listdir(host_hooks)
    except OSError:
        return
    for name in names:
        src, dst = os.path.join(host_hooks, name), os.path.join(store_hooks, name)
        try:
            st = os.lstat(src)
            if not os.path.isfile(src) or os.path.islink(src):
                continue
            if os.path.exists(dst) and os.lstat(dst).st_mtime_ns >= st.st_mtime_ns:
                continue
            shutil.copy2(src, dst)
        except OSError:
            continue
