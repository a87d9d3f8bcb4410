"""Git repositories in the writable roots: host git never runs what a sandbox wrote.

Host git runs what a git directory names: hooks, ``core.fsmonitor``, filters, pagers,
``include.path``, ``core.sshCommand`` in its config, and ``commondir`` or
``config.worktree`` point it at other files of that kind. All of these live at the
*top level* of a git directory (``hooks/`` is one level down). So inside a sandbox
every repository that exists when it starts gets a **sandbox-side git directory**: at
``REPO/.git`` the sandbox sees warren's *tree* for that repository
(``$XDG_DATA_HOME/warren/git/<id>/tree``), whose top level is the sandbox's own —
config, hooks, ``HEAD``, the index — while the subdirectories that hold only data
(``objects``, ``refs``, ``logs``, ``info``, ``modules``, ...) are the host's own,
bound in read-write. Nothing the sandbox writes at the top level reaches the host's
git directory, because the sandbox cannot name it: a planted ``commondir`` or
``config.worktree`` lands in the tree, by construction, however often it is planted.
A repository's submodule git directories (``modules/NAME``) get trees of their own.

The supervisor keeps both sides in step (``sync``: when a sandbox starts, after
each command, twice a second while one lives, before a command when the host's git
directory changed since the last sync, and when it ends), never through a
path the sandbox could have changed — the host's git directory and the tree are
reached only from directory descriptors opened before the sandbox existed
(``_core.safepath``):

- **config** (and ``config.worktree``, the main worktree's own settings with
  ``extensions.worktreeConfig``: sparse checkout's), key by key against the last state
  both agreed on (``base.json``): the host's changes are pulled into the tree; of the
  sandbox's changes only the keys on ``SYNCED`` — settings that only name things
  (remotes, upstreams, ``user.*``) — are written to the host's file. Everything else it
  sets stays inside.
- **hooks** are the tree's; the host's newer hooks are copied in, never out.
- **the top-level data files** (``SYNC_FILES``: ``HEAD``, the index, ``packed-refs``,
  ``ORIG_HEAD``, ...) are copied whichever side changed, the host winning a tie;
  ``HEAD`` must be a ref or an object name, and an index that names a submodule whose
  git directory nobody protects (a repository made inside, not yet adopted) is held
  back, so host ``git status`` never recurses into one.
- **linked worktrees' metadata** travels both ways as data (``_sync_worktrees``): one
  made inside works on the host afterwards, one removed on a side goes from the other,
  the host's are mirrored in (so ``git gc`` inside keeps what they need); their
  ``config.worktree`` never leaves the tree, and the host's ``commondir`` is ``../..``.

Repositories *made* inside a sandbox (``git init sub``, ``cargo new``, a ``.git``
planted by hand, a bare-repository-shaped directory) are the sandbox's own until it
ends: then, when no other sandbox can write there, they are **adopted** — their
config is moved into a store and the host keeps only its ``SYNCED`` keys, their
hooks, ``commondir`` and ``config.worktree`` move into the store too — and from the
next sandbox on they are protected like any other. A workspace whose ``.git`` is a
file (a linked worktree, a submodule checkout) keeps that file read-only inside.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import json
import os
import re
import shutil
import stat
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .._core import dirwatch, safepath
from ..statedir import data_home
from .gitfind import is_dir as _is_dir

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
    "extensions.worktreeconfig",
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

# Top-level files of a git directory that hold only data, kept in step both ways.
SYNC_FILES = (
    "HEAD",
    "ORIG_HEAD",
    "FETCH_HEAD",
    "MERGE_HEAD",
    "MERGE_MSG",
    "MERGE_MODE",
    "MERGE_AUTOSTASH",
    "CHERRY_PICK_HEAD",
    "REVERT_HEAD",
    "AUTO_MERGE",
    "COMMIT_EDITMSG",
    "TAG_EDITMSG",
    "SQUASH_MSG",
    "BISECT_LOG",
    "BISECT_START",
    "BISECT_TERMS",
    "BISECT_NAMES",
    "BISECT_EXPECTED_REV",
    "BISECT_ANCESTORS_OK",
    "index",
    "packed-refs",
    "shallow",
    "description",
)
_SHARED_INDEX = re.compile(r"sharedindex\.[0-9a-f]{40,64}")
# Top-level directories the host never shares with a sandbox: hooks and the git
# directories of linked worktrees name programs and configs host git runs; an
# operation in progress holds commands (a rebase's todo list runs ``exec`` lines).
PRIVATE_DIRS = frozenset({"hooks", "worktrees", "rebase-merge", "rebase-apply", "sequencer"})
# Made on the host when missing, so that what git writes there inside is shared.
ALWAYS_SHARED = ("objects", "refs", "logs", "info", "modules")
_HEAD = re.compile(rb"(ref: refs/[^\0\n]{1,1024}|[0-9a-f]{40}|[0-9a-f]{64})\n?")
_WORKTREE_FILES = ("HEAD", "ORIG_HEAD", "index", "gitdir", "commondir", "locked")
MAX_CONFIG = 4 << 20
MAX_DATA = 256 << 20
SMALL = 256 << 10  # files up to this size are told apart by content too
# A file changed this recently before its digest was taken may change again within the
# same timestamp (a coarse clock tick; a filesystem that keeps seconds): read it again.
RACY_NS = 2_000_000_000

Values = dict[str, list[str]]


def synced(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in SYNCED) and not _odd(key)


def _odd(key: str) -> bool:
    # A subsection holding a dot could make "remote.x.url" mean something else.
    parts = key.split(".")
    return len(parts) > 3 and parts[0] in ("remote", "branch", "submodule")


def location(gitdir: str, env: Mapping[str, str]) -> str:
    digest = hashlib.sha256(os.fsencode(gitdir)).hexdigest()[:20]
    return os.path.join(data_home(env), "git", digest)


# --- one repository's sandbox-side git directory -------------------------------------------


@dataclass
class Shadow:
    """A repository's git directory (``path``, reached by ``gfd``) and warren's tree
    of it (``tree``, reached by ``tfd``; the store around it by ``sfd``)."""

    path: str
    store: str
    shared: tuple[str, ...]
    gfd: int
    sfd: int
    tfd: int
    users: int = 0
    held: str | None = None  # why the index is held back, once said
    # a linked worktree's file ("wt/HEAD") -> why it is held back, once said
    held_worktree: dict[str, str] = field(default_factory=dict)
    # (fd, name) -> (the file's stat part of its stamp, its digest, when that was taken):
    # a file whose stat is unchanged and whose last change is older than RACY_NS before
    # its digest was taken has the same content (``_stamp``), so it is not read again.
    digests: dict[tuple[int, str], tuple[list[int], int, int]] = field(default_factory=dict)
    # base.json as the last sync left it, and the state parsed from it (see ``sync``)
    base: tuple[bytes, dict[str, Any]] | None = None
    # An inotify instance on the tree's top level (``_core.dirwatch``), drained before
    # each sync: an exec's helper that finds it empty answers without waiting for one.
    watch: int | None = None
    # The shared directories warren made in the host's git directory (``ALWAYS_SHARED``
    # it lacked): removed again at the end where nothing was put in them, so the
    # repository holds only what the same commands on the host would have made.
    made: tuple[str, ...] = ()

    @property
    def tree(self) -> str:
        return os.path.join(self.store, "tree")

    def close(self) -> None:
        for name in self.made:
            with contextlib.suppress(OSError):  # not empty (used), or gone: left as it is
                os.rmdir(name, dir_fd=self.gfd)
        for fd in (self.gfd, self.sfd, self.tfd):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self.watch is not None:
            dirwatch.close(self.watch)  # (its grace period not on the caller's path)
            self.watch = None


def prepare(root_fd: int, root: str, rel: str, env: Mapping[str, str]) -> Shadow:
    """Open the git directory ``rel`` beneath the root and bring its tree up to date."""
    path = os.path.normpath(os.path.join(root, rel))
    gfd = safepath.dir_beneath(root_fd, rel) if rel else os.dup(root_fd)
    try:
        store, sfd, tfd = open_store(path, env)
    except OSError:
        os.close(gfd)
        raise
    shadow = Shadow(path=path, store=store, shared=(), gfd=gfd, sfd=sfd, tfd=tfd)
    try:
        shadow.shared, shadow.made = _shared_dirs(gfd)
        for name in shadow.shared:
            ensure_dir(tfd, name)
        if safepath.lstat_beneath(tfd, "config") is None:
            data = safepath.read_file(gfd, "config", MAX_CONFIG)
            safepath.write_atomic(tfd, "config", data, mode=0o644)
            save_json(sfd, "base.json", {"values": values_of(sfd, data), "stamps": {}})
        _copy_newer_hooks(gfd, tfd)
        sync(shadow)
    except BaseException:
        shadow.close()
        raise
    return shadow


def open_store(path: str, env: Mapping[str, str]) -> tuple[str, int, int]:
    """The store of the git directory ``path``, made on first use (an old store's
    config and hooks move into its tree): its path, and descriptors of it and of its
    tree, which holds a ``hooks`` directory (whatever a sandbox planted there)."""
    store = location(path, env)
    os.makedirs(store, mode=0o700, exist_ok=True)
    sfd = safepath.open_dir(store)
    try:
        os.fchmod(sfd, 0o700)
        _migrate(sfd)
        with contextlib.suppress(FileExistsError):
            os.mkdir("tree", 0o700, dir_fd=sfd)
        tfd = safepath.dir_beneath(sfd, "tree")
    except BaseException:
        os.close(sfd)
        raise
    try:
        ensure_dir(tfd, "hooks")
    except BaseException:
        os.close(sfd)
        os.close(tfd)
        raise
    return store, sfd, tfd


def _migrate(sfd: int) -> None:
    """Stores made before trees held ``config`` and ``hooks/`` beside ``base.json``."""
    if safepath.lstat_beneath(sfd, "tree") is not None:
        return
    st = safepath.lstat_beneath(sfd, "config")
    if st is None or not stat.S_ISREG(st.st_mode):
        return
    os.mkdir("tree", 0o700, dir_fd=sfd)
    os.rename("config", "tree/config", src_dir_fd=sfd, dst_dir_fd=sfd)
    hooks = safepath.lstat_beneath(sfd, "hooks")
    if hooks is not None and stat.S_ISDIR(hooks.st_mode):
        os.rename("hooks", "tree/hooks", src_dir_fd=sfd, dst_dir_fd=sfd)
    with contextlib.suppress(OSError):
        base = json.loads(safepath.read_file(sfd, "base.json", MAX_CONFIG))
        save_json(sfd, "base.json", {"values": base.get("values", {}), "stamps": {}})


def _shared_dirs(gfd: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The shared directories, and those of them made here."""
    made: list[str] = []
    for name in ALWAYS_SHARED:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=gfd)
            made.append(name)
    with os.scandir(gfd) as it:
        return shared_of({e.name for e in it if _is_dir(e)}), tuple(made)


def shared_of(dirs: set[str]) -> tuple[str, ...]:
    """Which of a git directory's subdirectories a sandbox shares with the host."""
    return tuple(sorted((dirs | set(ALWAYS_SHARED)) - PRIVATE_DIRS))


def ensure_dir(fd: int, name: str) -> None:
    """``name`` beneath ``fd`` is a directory: whatever else stands there (a link, a
    file) is removed first."""
    st = safepath.lstat_beneath(fd, name)
    if st is not None and not stat.S_ISDIR(st.st_mode):
        safepath.unlink(fd, name)
        st = None
    if st is None:
        os.mkdir(name, 0o755, dir_fd=fd)


# --- keeping both sides in step --------------------------------------------------------------


def sync(
    shadow: Shadow,
    gitlink_ok: Callable[[str], bool] | None = None,
    checkout_gone: Callable[[str, bytes], list[str]] | None = None,
) -> list[str]:
    """One round of keeping the host's git directory and the tree in step; what was
    done, one line each (for the supervisor's log). ``checkout_gone(path, content)``
    finishes a worktree removed inside: its ``.git`` file at ``path``, if it still
    holds exactly ``content``, goes on the host (see ``_sync_worktrees``)."""
    done: list[str] = []
    try:
        raw = safepath.read_file(shadow.sfd, "base.json", MAX_CONFIG)
    except OSError:
        raw = b""
    # The state as this round found it: parsed again only when the file is not what the
    # last round left (a round mutates the object it parsed: it is kept with its bytes).
    state = shadow.base[1] if shadow.base is not None and shadow.base[0] == raw else _parse_json(raw)
    stamps: dict[str, list[int]] = state.setdefault("stamps", {})
    done += _sync_config(shadow, state, stamps)
    done += _sync_config(shadow, state, stamps, "config.worktree")
    done += _sync_files(shadow, stamps, gitlink_ok)
    done += _sync_worktrees(shadow, state, gitlink_ok, checkout_gone)
    after = json.dumps(state).encode()  # as save_json writes it
    if after != raw:  # a quiet round writes nothing
        safepath.write_atomic(shadow.sfd, "base.json", after, mode=0o600, fsync=False)
    shadow.base = (after, state)
    return done


def _stamp(fd: int, name: str, memo: Shadow | None = None) -> list[int]:
    """What tells a file's versions apart: mode, inode, size, times, and for a small
    file its content (an inode number is reused and times are as coarse as the
    kernel's tick: ``HEAD`` rewritten twice in one tick keeps all the rest).

    With ``memo`` (the repository's shadow: a sync after every command) the content is
    read again only when it may have changed, as git's own index does against racy
    timestamps: any change of a file sets its ctime to the current time, which nobody
    but the clock moves (utimensat sets mtime, never ctime), so a file whose stat is as
    it was and whose ctime was already RACY_NS old when its digest was taken has not
    changed since."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return []
    stamp = [st.st_mode, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    if stat.S_ISREG(st.st_mode) and st.st_size <= SMALL:
        known = memo.digests.get((fd, name)) if memo is not None else None
        if known is not None and known[0] == stamp and st.st_ctime_ns < known[2] - RACY_NS:
            return [*stamp, known[1]]
        taken = time.time_ns()
        with contextlib.suppress(OSError):
            digest = hashlib.blake2b(safepath.read_file(fd, name, SMALL), digest_size=8).digest()
            value = int.from_bytes(digest, "big")
            if memo is not None:
                memo.digests[(fd, name)] = (list(stamp), value, taken)
            stamp.append(value)
    return stamp


def _sync_config(
    shadow: Shadow, state: dict[str, Any], stamps: dict[str, list[int]], name: str = "config"
) -> list[str]:
    """One config file of the git directory (``config``, or ``config.worktree``, where
    git puts a worktree's own settings, sparse checkout's among them, once
    ``extensions.worktreeConfig`` is on), three-way against its last agreed values."""
    g_now, t_now = _stamp(shadow.gfd, name, shadow), _stamp(shadow.tfd, name, shadow)
    if stamps.get(name + ":host") == g_now and stamps.get(name + ":tree") == t_now:
        return []
    if not g_now and not t_now and name != "config":
        stamps[name + ":host"], stamps[name + ":tree"] = g_now, t_now
        return []  # on neither side: nothing to read (no git run for it)
    values_key = "values" if name == "config" else f"values:{name}"
    base: Values = state.get(values_key, {})
    # No config.worktree on the host (yet): made when a key of the sandbox's reaches it.
    host_data = safepath.read_file(shadow.gfd, name, MAX_CONFIG) if name == "config" or g_now else b""
    try:
        tree_data = safepath.read_file(shadow.tfd, name, MAX_CONFIG)
    except OSError:
        tree_data = host_data  # gone or not a file inside: the host's again
    host, mine = values_of(shadow.sfd, host_data), values_of(shadow.sfd, tree_data, lenient=True)
    pulled = {k: host.get(k, []) for k in {*host, *base} if host.get(k) != base.get(k)}
    pushed = {
        k: mine.get(k, [])
        for k in {*mine, *base}
        if synced(k) and mine.get(k) != base.get(k) and k not in pulled and mine.get(k) != host.get(k)
    }
    done = []
    if pushed:
        safepath.write_atomic(shadow.gfd, name, applied(shadow.sfd, host_data, pushed))
        host = {**host, **{k: v for k, v in pushed.items() if v}}
        for k, v in pushed.items():
            if not v:
                host.pop(k, None)
        done.append(f"{shadow.path}/{name}: {', '.join(sorted(pushed))} from the sandbox")
    fix = {k: v for k, v in pulled.items() if mine.get(k, []) != v}
    wrote_tree = bool(fix) or (tree_data is host_data and (name == "config" or bool(g_now)))
    if wrote_tree:
        safepath.write_atomic(shadow.tfd, name, applied(shadow.sfd, tree_data, fix))
    state[values_key] = host
    # A side only read is recorded as it was before the read (a change made while this
    # round ran is seen next round); a side written, as right after the write.
    stamps[name + ":host"] = _stamp(shadow.gfd, name) if pushed else g_now
    stamps[name + ":tree"] = _stamp(shadow.tfd, name) if wrote_tree else t_now
    return done


def _names(shadow: Shadow) -> list[str]:
    extra: set[str] = set()
    for fd in (shadow.gfd, shadow.tfd):
        with contextlib.suppress(OSError), os.scandir(fd) as it:
            extra |= {e.name for e in it if _SHARED_INDEX.fullmatch(e.name)}
    return [*SYNC_FILES, *sorted(extra)]


def _sync_files(
    shadow: Shadow, stamps: dict[str, list[int]], gitlink_ok: Callable[[str], bool] | None
) -> list[str]:
    done = []
    for name in _names(shadow):
        g_now, t_now = _stamp(shadow.gfd, name, shadow), _stamp(shadow.tfd, name, shadow)
        g_was, t_was = stamps.get("host:" + name), stamps.get("tree:" + name)
        if g_now == g_was and t_now == t_was:
            continue
        if _stamp(shadow.gfd, name + ".lock") or _stamp(shadow.tfd, name + ".lock"):
            continue  # a git command is writing it: next round
        if (g_was is None and t_was is None) or g_now != g_was:
            # The host changed (or this is the first meeting): the tree follows it. The
            # host's side is recorded as it was before the copy, the tree's right after.
            if g_now:
                copy_file(shadow.gfd, shadow.tfd, name)
            elif t_now:
                safepath.unlink(shadow.tfd, name)
            stamps["host:" + name] = g_now
            stamps["tree:" + name] = _stamp(shadow.tfd, name)
            continue
        else:
            verdict = _checked(shadow.tfd, name, t_now, gitlink_ok)
            if isinstance(verdict, str):
                if shadow.held != verdict:
                    done.append(f"{shadow.path}/{name}: kept the host's ({verdict})")
                    shadow.held = verdict
                continue  # looked at again next round (held: said once)
            shadow.held = None
            if verdict is not None:
                # What was checked is what is written: never a second read of the tree.
                safepath.write_atomic(shadow.gfd, name, verdict, mode=stat.S_IMODE(t_now[0]), fsync=False)
            elif name != "HEAD":
                safepath.unlink(shadow.gfd, name)
            stamps["host:" + name] = _stamp(shadow.gfd, name)
            stamps["tree:" + name] = t_now
    return done


def _checked(
    fd: int,
    rel: str,
    t_now: list[int],
    gitlink_ok: Callable[[str], bool] | None,
    kept: tuple[str, ...] = ("HEAD",),
) -> bytes | str | None:
    """The tree's ``rel`` (beneath ``fd``: the tree, or a worktree's directory in it) as
    it may reach the host (None: it was removed; ``kept`` may not be), or why not."""
    if not t_now:
        return f"{rel} may not go" if rel in kept else None
    if not stat.S_ISREG(t_now[0]):
        return "not a regular file"
    parent, _, leaf = rel.rpartition("/")
    try:
        with _at(fd, parent) as dfd:
            data = safepath.read_file(dfd, leaf, MAX_DATA)
    except OSError as e:
        return f"unreadable: {e.strerror}"
    if rel == "HEAD" and not _HEAD.fullmatch(data):
        return "not a ref or an object name"
    if rel == "gitdir" and not _GITDIR.fullmatch(data):
        return "not the path of a worktree's .git file"
    if rel == "index" and gitlink_ok is not None:
        try:
            links = gitlinks(data)
        except ValueError as e:
            return str(e)
        for path in links:
            if not gitlink_ok(path):
                return f"it names a submodule at {path} whose git directory warren does not protect yet"
    return data


def copy_file(src_fd: int, dst_fd: int, name: str) -> None:
    st = os.stat(name, dir_fd=src_fd, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
        # A file with another name may be a secret's other name (git's own top-level
        # files never have one): its content does not travel.
        return
    # Never waiting in the open: the sandbox may have swapped a FIFO in since the look.
    fd = safepath.open_beneath(src_fd, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        now = os.fstat(fd)
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return
        safepath.write_atomic(dst_fd, name, _chunks(fd), mode=stat.S_IMODE(st.st_mode), fsync=False)
    finally:
        os.close(fd)


def _chunks(fd: int) -> Iterator[bytes]:
    total = 0
    while chunk := os.read(fd, 1 << 20):
        total += len(chunk)
        if total > MAX_DATA:
            raise OSError(errno.EFBIG, "larger than warren copies")
        yield chunk


# What a linked worktree's git directory holds that travels: data git rewrites as it
# works there. Never ``config.worktree`` (host git reads it with extensions.worktreeConfig)
# nor ``commondir``: the host's is always ``../..``, its own common directory.
_WORKTREE_DATA = ("HEAD", "ORIG_HEAD", "index", "gitdir", "locked", "logs/HEAD")
_GITDIR = re.compile(rb"/[^\0\n]{0,4090}/\.git\n?")


def _sync_worktrees(
    shadow: Shadow,
    state: dict[str, Any],
    gitlink_ok: Callable[[str], bool] | None,
    checkout_gone: Callable[[str, bytes], list[str]] | None = None,
) -> list[str]:
    """Linked worktrees, both ways. One made on either side is made on the other (made
    inside, ``git worktree add`` works on the host afterwards: host ``git -C wt status``,
    ``git worktree list``); one removed on a side since the last round (``git worktree
    remove``/``prune``) goes from the other, unless that side changed it meanwhile; the
    files of ``_WORKTREE_DATA`` follow whichever side changed them, the host winning a
    tie. What reaches the host from the tree is checked as the top-level files are, and
    the host's ``commondir`` is warren's own.

    A sandbox started after a worktree was made has that worktree's ``.git`` file
    read-only (a mount point, which its own mount namespace cannot unlink: anything it
    could unlink it could plant again, pointing anywhere). ``git worktree remove`` there
    removes all of the checkout but that file, then the worktree's git directory; so
    when an entry goes as inside, ``checkout_gone`` is given the ``.git`` file its
    ``gitdir`` named, to remove on the host where it still names this entry (which also
    lifts the mount inside: an unlink in another mount namespace detaches it)."""
    done: list[str] = []
    known: list[str] = state.setdefault("worktrees", [])
    stamps: dict[str, list[int]] = state.setdefault("stamps", {})
    skipped: set[str] = set()  # known, and judged again next round
    # What this round left on both sides: known to the next. Not a listing made at the
    # round's end: an entry git inside removed since its sync would be missing from it,
    # and the next round would take the host's for new and make it inside again.
    both: set[str] = set()
    hw = _open_worktrees(shadow.gfd)
    try:
        tw = _open_worktrees(shadow.tfd)
    except BaseException:
        if hw is not None:
            os.close(hw)
        raise
    try:
        host, tree = _dir_names(hw), _dir_names(tw)
        for name in sorted(host | tree | set(known)):
            key = f"wt:{name}:"
            on_host, on_tree = name in host, name in tree
            if not on_host and not on_tree:
                pass
            elif on_tree and not on_host and name in known and tw is not None:
                safepath.remove_tree(tw, name)  # the host removed it
                on_tree = False
            elif (
                on_host
                and not on_tree
                and name in known
                and hw is not None
                and not _changed(hw, name, stamps, key + "host:")
            ):
                gitfile = _gitdir_of(hw, name)
                safepath.remove_tree(hw, name)  # removed inside, and the host left it as it was
                done.append(f"{shadow.path}/worktrees/{name}: removed, as inside")
                if gitfile is not None and checkout_gone is not None:
                    entry = os.path.join(shadow.path, "worktrees", name)
                    done += checkout_gone(gitfile, b"gitdir: " + os.fsencode(entry) + b"\n")
                on_host = False
            else:
                hw = hw if hw is not None else _make_worktrees(shadow.gfd)
                tw = tw if tw is not None else _make_worktrees(shadow.tfd)
                if not on_host:
                    done.append(f"{shadow.path}/worktrees/{name}: made, as inside")
                try:
                    done += _sync_worktree(
                        shadow,
                        hw,
                        tw,
                        name,
                        stamps,
                        key,
                        gitlink_ok,
                        new_on_host=not on_host,
                        new_on_tree=not on_tree,
                        first=name not in known,
                    )
                except FileNotFoundError:
                    # removed on a side since this round listed it: judged next round
                    if name in known:
                        skipped.add(name)
                    continue
                on_host = on_tree = True
            if on_host and on_tree:
                both.add(name)
            else:
                for k in [k for k in stamps if k.startswith(key)]:
                    del stamps[k]
                for k in [k for k in shadow.held_worktree if k.startswith(name + "/")]:
                    del shadow.held_worktree[k]
        state["worktrees"] = sorted(both | skipped)
    finally:
        for fd in (hw, tw):
            if fd is not None:
                os.close(fd)
    return done


def _gitdir_of(wfd: int, name: str) -> str | None:
    """The ``.git`` file a worktree entry's ``gitdir`` names (checked as it travels)."""
    try:
        data = safepath.read_file(wfd, f"{name}/gitdir", 4096)
    except OSError:
        return None
    if not _GITDIR.fullmatch(data):
        return None
    return os.path.normpath(os.fsdecode(data.rstrip(b"\n")))


def _open_worktrees(fd: int) -> int | None:
    try:
        return safepath.dir_beneath(fd, "worktrees")
    except OSError:
        return None


def _make_worktrees(fd: int) -> int:
    ensure_dir(fd, "worktrees")
    return safepath.dir_beneath(fd, "worktrees")


def _dir_names(fd: int | None) -> set[str]:
    if fd is None:
        return set()
    with contextlib.suppress(OSError), os.scandir(fd) as it:
        return {e.name for e in it if _is_dir(e)}
    return set()


def _changed(wfd: int, name: str, stamps: dict[str, list[int]], prefix: str) -> bool:
    try:
        dfd = safepath.dir_beneath(wfd, name)
    except OSError:
        return False
    try:
        return any(_stamp_rel(dfd, f) != stamps.get(prefix + f) for f in _WORKTREE_DATA)
    finally:
        os.close(dfd)


def _stamp_rel(fd: int, rel: str) -> list[int]:
    """``_stamp`` of a file one directory down (``logs/HEAD``) or at ``fd``."""
    parent, _, name = rel.rpartition("/")
    if not parent:
        return _stamp(fd, name)
    try:
        sub = safepath.dir_beneath(fd, parent)
    except OSError:
        return []
    try:
        return _stamp(sub, name)
    finally:
        os.close(sub)


def _sync_worktree(
    shadow: Shadow,
    hw: int,
    tw: int,
    name: str,
    stamps: dict[str, list[int]],
    key: str,
    gitlink_ok: Callable[[str], bool] | None,
    new_on_host: bool,
    new_on_tree: bool,
    first: bool,
) -> list[str]:
    # An entry is made only on the side that lacked it when the round began: one gone
    # since was removed there meanwhile (git inside: ``worktree remove``, ``prune``) and
    # is not made again (its rmdir would fail, or the removal be undone).
    if new_on_host:
        ensure_dir(hw, name)
    if new_on_tree:
        ensure_dir(tw, name)
    done: list[str] = []
    hd = safepath.dir_beneath(hw, name)
    try:
        td = safepath.dir_beneath(tw, name)
        try:
            if new_on_host or _stamp(hd, "commondir") == []:
                safepath.write_atomic(hd, "commondir", b"../..\n", mode=0o644, fsync=False)
            if first and _stamp(td, "commondir") == []:
                # A worktree the host made: git inside needs it too to take the entry
                # for a git directory ("not a git repository" without it). Only when the
                # entry is first seen: later, its absence is git inside removing the entry
                # (``git worktree remove``), whose rmdir a new file would make fail.
                safepath.write_atomic(td, "commondir", b"../..\n", mode=0o644, fsync=False)
            for rel in _WORKTREE_DATA:
                done += _sync_one(shadow, hd, td, name, rel, stamps, key, gitlink_ok)
        finally:
            os.close(td)
    finally:
        os.close(hd)
    return done


def _sync_one(
    shadow: Shadow,
    hd: int,
    td: int,
    name: str,
    rel: str,
    stamps: dict[str, list[int]],
    key: str,
    gitlink_ok: Callable[[str], bool] | None,
) -> list[str]:
    g_now, t_now = _stamp_rel(hd, rel), _stamp_rel(td, rel)
    g_was, t_was = stamps.get(key + "host:" + rel), stamps.get(key + "tree:" + rel)
    if g_now == g_was and t_now == t_was:
        return []
    if _stamp_rel(hd, rel + ".lock") or _stamp_rel(td, rel + ".lock"):
        return []  # a git command is writing it: next round
    parent, _, leaf = rel.rpartition("/")
    if (g_now != g_was or t_now == t_was) and (g_now or g_was is not None or not t_now):
        # The host changed, or nothing to take from the tree: the tree follows the host.
        if parent:
            ensure_dir(td, parent)
        with _at(td, parent) as dst:
            if g_now:
                with _at(hd, parent) as src:
                    copy_file(src, dst, leaf)
            elif t_now:
                safepath.unlink(dst, leaf)
        stamps[key + "host:" + rel] = g_now
        stamps[key + "tree:" + rel] = _stamp_rel(td, rel)
        return []
    data = _checked(td, rel, t_now, gitlink_ok, kept=("HEAD", "gitdir"))
    where = f"{name}/{rel}"
    if isinstance(data, str):
        if shadow.held_worktree.get(where) == data:
            return []  # looked at again each round, said once
        shadow.held_worktree[where] = data
        return [f"{shadow.path}/worktrees/{where}: kept the host's ({data})"]
    shadow.held_worktree.pop(where, None)
    if parent:
        ensure_dir(hd, parent)
    with _at(hd, parent) as dst:
        if data is None:
            safepath.unlink(dst, leaf)
        else:
            safepath.write_atomic(dst, leaf, data, mode=0o644, fsync=False)
    stamps[key + "host:" + rel] = _stamp_rel(hd, rel)
    stamps[key + "tree:" + rel] = t_now
    return []


@contextlib.contextmanager
def _at(fd: int, parent: str) -> Iterator[int]:
    if not parent:
        yield fd
        return
    sub = safepath.dir_beneath(fd, parent)
    try:
        yield sub
    finally:
        os.close(sub)


def gitlinks(index: bytes) -> list[str]:
    """Paths of the submodule entries (mode 160000) of a git index (v2-v4, SHA-1 or
    SHA-256 by entry size). Raises ValueError for what is not an index."""
    if len(index) < 12 or index[:4] != b"DIRC":
        raise ValueError("not a git index")
    version, count = struct.unpack_from(">II", index, 4)
    if version not in (2, 3, 4):
        raise ValueError(f"index version {version}")
    for hash_len in (20, 32):
        with contextlib.suppress(ValueError, struct.error, IndexError):
            return _entries(index, version, count, hash_len)
    raise ValueError("unreadable index")


def _entries(index: bytes, version: int, count: int, hash_len: int) -> list[str]:
    pos, out, prev = 12, [], b""
    end = len(index) - hash_len
    for _ in range(count):
        start = pos
        mode = struct.unpack_from(">I", index, pos + 24)[0]
        pos += 40 + hash_len
        flags = struct.unpack_from(">H", index, pos)[0]
        pos += 2
        if flags & 0x4000 and version >= 3:
            pos += 2
        if version == 4:
            strip, n = 0, 0
            while True:
                byte = index[pos + n]
                strip = (strip << 7) | (byte & 0x7F)
                n += 1
                if not byte & 0x80:
                    break
                strip += 1
            pos += n
            nul = index.index(b"\0", pos)
            if strip > len(prev):
                raise ValueError("bad prefix")
            path = prev[: len(prev) - strip] + index[pos:nul]
            pos = nul + 1
        else:
            nul = index.index(b"\0", pos)
            path = index[pos:nul]
            pos = start + ((nul - start + 8) // 8) * 8
        if pos > end or not path:
            raise ValueError("entry past the end")
        prev = path
        if mode >> 12 == 0o16:
            out.append(os.fsdecode(path))
    return out


# --- config files, through git, on private copies ------------------------------------------


def values_of(sfd: int, data: bytes, lenient: bool = False) -> Values:
    """The keys and values of config text ``data`` (read by git from a private copy)."""
    with _private_copy(sfd, data) as path:
        out = _git(["config", "--file", path, "--null", "--list"], ok=(0, 1, 128) if lenient else (0,))
    values: Values = {}
    for item in out.split("\0"):
        if not item:
            continue
        key, _, value = item.partition("\n")
        values.setdefault(key, []).append(value)
    return values


def applied(sfd: int, data: bytes, changes: Values) -> bytes:
    """Config text ``data`` with each key of ``changes`` holding exactly its values (an
    empty list removes the key)."""
    with _private_copy(sfd, data) as path:
        for key, values in changes.items():
            _git(["config", "--file", path, "--unset-all", key], ok=(0, 5))
            for v in values:
                _git(["config", "--file", path, "--add", key, v])
        with open(path, "rb") as f:
            return f.read()


@contextlib.contextmanager
def _private_copy(sfd: int, data: bytes) -> Iterator[str]:
    # In warren's store (never in the tree or the repository), under a fresh name.
    directory = tempfile.mkdtemp(prefix="cfg-", dir=os.readlink(f"/proc/self/fd/{sfd}"))
    path = os.path.join(directory, "config")
    try:
        with open(path, "wb") as f:
            f.write(data)
        yield path
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _git(args: list[str], ok: tuple[int, ...] = (0,)) -> str:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "HOME": "/nonexistent",
    }
    r = subprocess.run(["git", *args], capture_output=True, text=True, env=env, check=False)
    if r.returncode not in ok:
        raise OSError(errno.EINVAL, f"git {' '.join(args[:3])}: {r.stderr.strip()}")
    return r.stdout


def _load_json(sfd: int, name: str) -> dict[str, Any]:
    try:
        return _parse_json(safepath.read_file(sfd, name, MAX_CONFIG))
    except OSError:
        return {}


def _parse_json(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def save_json(sfd: int, name: str, data: dict[str, Any]) -> None:
    safepath.write_atomic(sfd, name, json.dumps(data).encode(), mode=0o600, fsync=False)


def _copy_newer_hooks(gfd: int, tfd: int) -> None:
    try:
        hfd = safepath.dir_beneath(gfd, "hooks")
    except OSError:
        return
    try:
        th = safepath.dir_beneath(tfd, "hooks")
    except OSError:
        os.close(hfd)
        return
    try:
        with os.scandir(hfd) as it:
            names = [e.name for e in it]
        for name in names:
            src = _stamp(hfd, name)
            if not src or not stat.S_ISREG(src[0]):
                continue
            dst = _stamp(th, name)
            if dst and dst[3] >= src[3]:
                continue
            with contextlib.suppress(OSError):
                copy_file(hfd, th, name)
    finally:
        os.close(hfd)
        os.close(th)
