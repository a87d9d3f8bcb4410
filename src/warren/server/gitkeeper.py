"""The supervisor's side of git protection: which repositories each sandbox has, their
trees kept in step with the host, repositories made inside adopted at the end.

``gitstore`` does the work on one repository; this module keeps the leases: a sandbox
holds one per writable root it was planned with (the root's descriptor, opened before
the sandbox existed, and the shadows of the repositories found there). A repository
two live sandboxes share has one shadow. Adoption of what a sandbox made waits until no
live sandbox can write that root any more.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .._core import dirwatch, safepath, treewalk
from ..errors import SetupError
from ..plan.model import GitDir
from ..plan.mounts import within
from . import gitadopt, gitfind, gitleases, gitstore, repowatch

# A root whose last walk listed this many directories is watched from then on
# (``repowatch``): below it, the walk with the memory costs about a millisecond.
WATCH_FROM = 256


@dataclass
class Found:
    """The repositories of a sandbox's writable roots as planned, before anything is
    made (``GitKeeper.find``): per root its descriptor (opened now, before the sandbox
    exists) and what a walk found there. ``GitKeeper.lease`` makes their stores at
    launch; ``close`` lets go of the descriptors when there is no launch."""

    env: Mapping[str, str]
    roots: dict[str, int] = field(default_factory=dict)
    known: dict[str, set[str]] = field(default_factory=dict)  # root -> relative git directories
    repos: list[tuple[str, str]] = field(default_factory=list)  # (root, rel) to give a store
    gitdirs: tuple[GitDir, ...] = ()  # for the plan
    files: tuple[str, ...] = ()  # ``.git`` files, for the plan

    def close(self) -> None:
        for fd in self.roots.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.roots.clear()


@dataclass
class Lease:
    """What one sandbox holds: per writable root (by path) its descriptor and the
    git directories found there when it started."""

    roots: dict[str, int] = field(default_factory=dict)
    known: dict[str, set[str]] = field(default_factory=dict)  # root -> relative git directories
    shadows: list[gitstore.Shadow] = field(default_factory=list)
    env: Mapping[str, str] = field(default_factory=dict)
    # Its sandbox was booted ahead and nothing has run in it: it writes nothing, and
    # whoever takes it plans again (a repository adopted meanwhile is another plan).
    idle: bool = False
    ended: bool = False  # its sandbox ended: released now (``GitKeeper.release``)
    # Its sandbox's running execs (``Box.active``, the same set): while one runs, no sync
    # drains the watches of its repositories (``GitKeeper._sync``).
    running: set[int] = field(default_factory=set)
    record: str | None = None  # its record in the state directory (``gitleases``)


class GitKeeper:
    def __init__(self, state: str | None = None) -> None:
        """``state``: the state directory, where each lease is recorded until released
        (``gitleases``; None: a supervisor without one records nothing)."""
        self.shadows: dict[str, gitstore.Shadow] = {}  # by git directory path
        self.leases: list[Lease] = []
        self.memory: dict[str, gitfind.Memory] = {}  # per root: what the last walks saw
        # Roots of more than ``WATCH_FROM`` directories: their directories watched, so a
        # walk lists only what changed (``repowatch``).
        self.watched = repowatch.WatchedRoots()
        # Per watched root: the token of the last hard-link walk that left no file of it
        # linked from outside (``link_walk_ends``), and the shared roots it was made with
        # (a link into a tool cache is nothing to a walk that shares the cache, and is one
        # to a walk that does not).
        self.unlinked: dict[str, tuple[repowatch.Token, tuple[str, ...]]] = {}
        # The supervisor's log, a line per kind every few seconds (``clients.Notes.log``).
        self.note: Callable[[str, str], None] | None = None
        # Made inside and adopted since: safe for host git until a sandbox has them again
        # (then they are shadows).
        self.adopted: set[str] = set()
        # Git directories a live sandbox wrote on the host directly (made inside, not yet
        # adopted), seen named by an index: a shadow another sandbox's launch made of one
        # since does not make what the host holds there safe (``_sync``).
        self.made_inside: set[str] = set()
        self.state = state
        self.records: int | None = None  # the records' directory, once opened (``_records``)
        # The top level of each shadow's git directory on the host (by its path): a host
        # commit there is synced before the sandbox's next command starts (``caught_up``).
        self.host = dirwatch.Changed()

    def recover(self) -> None:
        """Before anything is served: what the sandboxes of a supervisor that ended
        without releasing them (killed, crashed: they died with it) made in their roots
        is adopted, as their release would have (``gitleases``)."""
        try:
            records = self._records()
        except OSError as e:
            _log(f"the records of leases in {self.state} cannot be read now: {e}")
            return
        if records is None:
            return
        for record in list(gitleases.read_all(records)):
            if isinstance(record, str):
                _log(f"a lease's record that cannot be read ({record}): removed")
                gitleases.remove(records, record)
                continue
            for root, known in record.known.items():
                try:
                    fd = safepath.open_dir(root)
                except OSError:
                    continue  # gone, or not a directory now: nothing of it to adopt
                try:
                    self._adopt_made(fd, root, known, self._walk(root, fd, None), record.env)
                except OSError as e:
                    _log(f"adopting what was made in {root}: {e}")
                finally:
                    os.close(fd)
            gitleases.remove(records, record.name)

    def _records(self) -> int | None:
        """The records' directory (opened, and made, on first use; None without a state
        directory). OSError when it cannot be: a launch then fails, typed (``lease``)."""
        if self.records is None and self.state is not None:
            self.records = gitleases.open_directory(self.state)
        return self.records

    def find(
        self,
        roots: list[str],
        env: Mapping[str, str],
        dry: bool = False,
        readonly: tuple[str, ...] = (),
        walks: treewalk.Walks | None = None,
        watch: frozenset[str] = frozenset(),
    ) -> Found:
        """The git directories and ``.git`` files of these writable roots, for the plan;
        nothing is made (``lease`` does that at launch). ``dry``: only to show (``warren
        plan``): no descriptor is kept, the walks' memory is neither used nor changed.
        Those under a ``readonly`` path (``--read`` inside a writable root) stay
        read-only instead: the sandbox cannot write them at all. ``watch``: roots whose
        directories are watched whatever their number (``_walk``)."""
        found = Found(env=dict(env))
        gitdirs: list[GitDir] = []
        files: list[str] = []
        try:
            for root in roots:
                try:
                    fd = safepath.open_dir(root)
                except OSError:
                    continue  # not a directory: nothing of git's to protect
                if dry:
                    try:
                        walk = gitfind.find(fd, tree=treewalk.Walks().tree(root, fd, links=False, git=True))
                    finally:
                        os.close(fd)
                else:
                    found.roots[root] = fd
                    walk = self._walk(root, fd, walks, watch=root in watch)
                    found.known[root] = set(walk.gitdirs)
                files += [os.path.join(root, rel) for rel in walk.gitfiles]
                for rel in walk.gitdirs:
                    path = os.path.normpath(os.path.join(root, rel))
                    if any(within(path, r) for r in readonly):
                        continue
                    gitdirs.append(self._as_planned(path, env, dry))
                    if not dry:
                        found.repos.append((root, rel))
        except BaseException:
            found.close()
            raise
        found.gitdirs, found.files = tuple(gitdirs), tuple(files)
        return found

    def link_walk_begins(
        self, root: str, root_fd: int | None, shared: tuple[str, ...]
    ) -> tuple[bool, tuple[repowatch.Token, int] | None]:
        """A hard-link walk of ``root`` with these shared roots begins: whether it is
        expected to find nothing linked from outside (``repowatch.WatchedRoot.predict``:
        only a watched root, whose last walk, with the same shared roots, left it so),
        and the token its end is given back with."""
        watched = self.watched.get(root)
        if watched is None or root_fd is None:
            return False, None
        last = self.unlinked.get(root)
        try:
            expected = watched.predict(root_fd, last[0] if last is not None and last[1] == shared else None)
            why = watched.why_not
        except OSError as e:
            expected, why = False, f"{e}"
        if not expected and self.note is not None:
            # Its launch walks before its commands start (a launch in a large workspace
            # then costs the walk): the log says why.
            self.note(f"walk-first {why[:24]}", f"{root}: walked before its commands: {why}")
        return expected, watched.begin()

    def link_walk_ends(
        self, root: str, begun: tuple[repowatch.Token, int] | None, shared: tuple[str, ...], ok: bool
    ) -> None:
        """The walk that began with ``begun`` ended: ``ok``, nothing of the root is linked
        from outside any more but into ``shared`` (none was, or each got an inode of its
        own); else (a file that had to be masked, or could not be copied) nothing is
        expected of the next."""
        watched = self.watched.get(root)
        if watched is None or begun is None:
            return
        token, mark = begun
        if ok and token == (watched.serial, watched.epoch):
            self.unlinked[root] = (token, shared)
            watched.verified(mark)
        elif not ok:
            self.unlinked.pop(root, None)
            watched.epoch += 1  # nor of a walk that began before and ends after this one

    def _walk(self, root: str, fd: int, walks: treewalk.Walks | None, watch: bool = False) -> gitfind.Found:
        """The repositories of ``root`` now: from its watches where it is watched (or
        large enough to be: ``WATCH_FROM`` directories at the last walk; or ``watch``:
        a root whose hard-link walk goes after launch, which only its watches can let
        run beside the command instead of before it: ``link_walk_begins``), else walked
        (natively when ``walks`` has that walk, else with the per-directory memory)."""
        memory = self.memory.setdefault(root, {})
        # (The memory is left as it was while the watches answer: an entry is believed
        # only with the directory's change time, however old.)
        watched = self.watched.find(root, fd, large=watch or len(memory) >= WATCH_FROM)
        if watched is not None:
            return watched
        tree = walks.tree(root, fd, links=False, git=True) if walks is not None else None
        return gitfind.find(fd, memory, tree)

    def _as_planned(self, path: str, env: Mapping[str, str], dry: bool) -> GitDir:
        """The git directory as the sandbox will see it: a live sandbox's store is
        shared as it is; else the store ``lease`` makes (its tree, the host's
        subdirectories as they are now)."""
        shadow = None if dry else self.shadows.get(path)
        if shadow is not None and shadow.users > 0:
            return GitDir(path, shadow.tree, shadow.shared)
        return GitDir(path, os.path.join(gitstore.location(path, env), "tree"), _shared_now(path))

    def lease(self, found: Found) -> Lease:
        """At launch: the stores of the repositories found, made or brought up to date,
        held (with the roots' descriptors, which the lease takes over) until
        ``release``. A store that no longer matches the plan (the host's git directory
        changed in between) is a SetupError."""
        lease = Lease(roots=found.roots, known=found.known, env=found.env)
        found.roots, found.known = {}, {}
        planned = {g.path: g for g in found.gitdirs}
        try:
            for root, rel in found.repos:
                shadow = self._shadow(lease.roots[root], root, rel, lease.env)
                lease.shadows.append(shadow)
                want = planned.get(shadow.path)
                if want is None or (want.tree, want.shared) != (shadow.tree, shadow.shared):
                    raise SetupError(
                        f"the git directory {shadow.path} changed while the sandbox was being planned",
                        operation="git store",
                        path=shadow.path,
                        hint="start the sandbox again",
                    )
            try:
                records = self._records()
                if records is not None:
                    lease.record = gitleases.write(records, lease.known, lease.env)
            except OSError as e:
                raise SetupError(
                    f"cannot record the sandbox's repositories in warren's state directory: {e}",
                    operation="git store",
                    hint="check that the state directory ($XDG_STATE_HOME/warren) is writable and not full",
                ) from None
        except BaseException:
            self._drop(lease)
            raise
        self.leases.append(lease)
        return lease

    def _shadow(self, root_fd: int, root: str, rel: str, env: Mapping[str, str]) -> gitstore.Shadow:
        path = os.path.normpath(os.path.join(root, rel))
        shadow = self.shadows.get(path)
        if shadow is not None and shadow.users > 0:
            self._sync(shadow)
        else:
            if shadow is not None:
                self._close(shadow)
            try:
                shadow = gitstore.prepare(root_fd, root, rel, env)
            except OSError as e:
                raise SetupError(
                    f"cannot prepare warren's git directory for the repository {path}: {e}",
                    operation="git store",
                    path=path,
                    hint="check that $XDG_DATA_HOME (default ~/.local/share) is writable, that git is "
                    "installed, and that the repository is not a link",
                ) from None
            shadow.watch = dirwatch.watch(shadow.tfd)
            self.host.add(shadow.path, shadow.gfd)
            _watch_worktrees(shadow)
            self.shadows[path] = shadow
        self.adopted.discard(path)
        shadow.users += 1
        return shadow

    def watches(self, lease: Lease) -> list[int]:
        """The watches of the lease's repositories (``Shadow.watch``), for an exec's
        helper; none when one of them has none (the helper then always waits)."""
        watches = [s.watch for s in lease.shadows if s.watch is not None]
        return watches if len(watches) == len(lease.shadows) else []

    def sync(self, lease: Lease | None) -> None:
        """After a command of this sandbox ended: its repositories, now."""
        if lease is not None:
            for shadow in lease.shadows:
                self._sync(shadow)

    def caught_up(self, lease: Lease | None) -> None:
        """Before a command of this sandbox starts: each of its repositories whose git
        directory changed on the host since its last sync is synced now. A host commit
        moves the branch at once inside (``refs`` is shared) while the index is a copy:
        without this, a command in the next half second saw the new commit with the
        index before it (``git status``: its files deleted, or untracked). One read when
        nothing changed."""
        if lease is not None:
            for shadow in lease.shadows:
                if self.host.take(shadow.path):
                    self._sync(shadow)

    def _close(self, shadow: gitstore.Shadow) -> None:
        self.host.remove(shadow.path)
        shadow.close()

    def tick(self) -> None:
        """Every repository a live sandbox has (twice a second: a command in the
        background commits too)."""
        for shadow in list(self.shadows.values()):
            if shadow.users > 0:
                self._sync(shadow)

    def release(self, lease: Lease | None) -> None:
        """A sandbox ended: a last sync, then the repositories it made are adopted where
        no other live sandbox can write, then a sync again (an index held back for a
        submodule made inside can go once that repository is adopted)."""
        if lease is None or lease not in self.leases:
            return
        lease.ended = True  # its sandbox writes nothing more (``_written_directly``)
        for shadow in lease.shadows:
            self._sync(shadow)
        # Sandboxes that can write these roots (a sandbox booted ahead and unused cannot:
        # its taker plans again, and a repository adopted now is in that plan).
        others = [other for other in self.leases if other is not lease and not other.idle]
        for root, fd in lease.roots.items():
            if any(_overlap(r, root) for other in others for r in other.roots):
                continue
            try:
                # The launches' memory of this root: its watches, or each directory
                # checked against its change time before it is believed.
                found = self._walk(root, fd, None)
            except OSError:
                continue
            self._adopt_made(fd, root, lease.known.get(root, set()), found, lease.env)
        for shadow in lease.shadows:
            self._sync(shadow)
        self.leases.remove(lease)
        self._drop(lease)

    def _adopt_made(
        self, fd: int, root: str, known: set[str], found: gitfind.Found, env: Mapping[str, str]
    ) -> None:
        """Adopt the git directories ``found`` in ``root`` that were not ``known`` when
        the sandbox started: it made them."""
        for rel in found.gitdirs:
            if rel in known:
                continue
            try:
                for line in gitadopt.adopt(fd, root, rel, env):
                    _log(line)
                path = os.path.normpath(os.path.join(root, rel))
                self.adopted.add(path)
                self.made_inside.discard(path)
            except OSError as e:
                _log(f"adopting {os.path.join(root, rel)}: {e}")

    def _drop(self, lease: Lease) -> None:
        if lease.record is not None and self.records is not None:
            gitleases.remove(self.records, lease.record)
            lease.record = None
        for shadow in lease.shadows:
            shadow.users -= 1
            if shadow.users <= 0 and self.shadows.get(shadow.path) is shadow:
                self._close(shadow)
                del self.shadows[shadow.path]
        lease.shadows.clear()
        for fd in lease.roots.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        lease.roots.clear()

    def _sync(self, shadow: gitstore.Shadow) -> None:
        lease_roots = [(root, fd) for lse in self.leases for root, fd in lse.roots.items()]
        protected = (set(self.shadows) | self.adopted) - self.made_inside

        def gitlink_ok(rel_path: str) -> bool:
            # A submodule path in this repository's index: its .git must be missing, or
            # a git directory warren protects, which no live sandbox writes directly.
            worktree = os.path.dirname(shadow.path)
            target = os.path.join(worktree, rel_path, ".git")
            path = os.path.normpath(target)
            if path in protected and self._written_directly(path):
                self.made_inside.add(path)
                return False
            for root, fd in lease_roots:
                if _beneath(target, root):
                    return _protected_or_absent(fd, root, os.path.relpath(target, root), protected)
            return True  # outside every writable root: no sandbox made it

        def checkout_gone(gitfile: str, content: bytes) -> list[str]:
            for root, fd in lease_roots:
                if _beneath(gitfile, root):
                    return _remove_checkout(fd, root, os.path.relpath(gitfile, root), content)
            return []  # outside every writable root: no sandbox kept it read-only

        # Drained before: what changes from now on is seen next time. Not while an exec of
        # a sandbox holding the repository runs (``Lease.running``): its helper reads the
        # watch once the command has ended, to know whether its answer waits for a sync,
        # and a queue drained here (the round twice a second, the end of the exec before
        # it, another sandbox's on the same repository) read as "nothing changed" while
        # this sync, still running, had not written the host's index: the client read the
        # index without the command's ``git add``. Its events stay for its own sync.
        if shadow.watch is not None and not any(lse.running for lse in self.leases if shadow in lse.shadows):
            dirwatch.drain(shadow.watch)
        self.host.take(shadow.path)  # and the host's side: this sync carries what changed there
        try:
            for line in gitstore.sync(shadow, gitlink_ok, checkout_gone):
                _log(line)
        except OSError as e:
            _log(f"git directory {shadow.path}: {e}")
        _watch_worktrees(shadow)

    def _written_directly(self, path: str) -> bool:
        """Whether a live sandbox can write the git directory ``path`` on the host as it
        is: it lies in one of its writable roots and is none of its shadows (made inside
        since it started). Another sandbox launched on the same workspace meanwhile
        finds it as a repository and makes a shadow of it; that shadow protects the
        host from the new sandbox only, not from the one that made it (a sandbox booted
        ahead beside a live one did so: the host's index then named a repository whose
        ``core.fsmonitor`` the sandbox had set, and host git ran it)."""
        for lse in self.leases:
            if lse.idle or lse.ended or path in {s.path for s in lse.shadows}:
                continue
            if any(_beneath(path, root) for root in lse.roots):
                return True
        return False


def _watch_worktrees(shadow: gitstore.Shadow) -> None:
    """The watch of a repository's tree covers its linked worktrees' directories too: a
    commit in one changes its ``index`` and logs there, nothing at the top, and the exec's
    end must wait for the sync that carries them (host git in the worktree at once)."""
    if shadow.watch is None:
        return
    try:
        wfd = safepath.dir_beneath(shadow.tfd, "worktrees")
    except OSError:
        return
    try:
        dirwatch.also(shadow.watch, wfd)
        with os.scandir(wfd) as entries:
            names = [e.name for e in entries if e.is_dir(follow_symlinks=False)]
        for name in names:
            try:
                dfd = safepath.dir_beneath(wfd, name)
            except OSError:
                continue
            try:
                dirwatch.also(shadow.watch, dfd)
            finally:
                os.close(dfd)
    except OSError:
        pass
    finally:
        os.close(wfd)


def _beneath(path: str, root: str) -> bool:
    """``path`` lies strictly below ``root`` (``within`` counts ``root`` itself too)."""
    return path.startswith(root.rstrip("/") + "/")


def _overlap(a: str, b: str) -> bool:
    a, b = a.rstrip("/") or "/", b.rstrip("/") or "/"
    return a == b or a.startswith(b + "/") or b.startswith(a + "/") or "/" in (a, b)


def _protected_or_absent(root_fd: int, root: str, rel: str, protected: set[str]) -> bool:
    try:
        st = safepath.lstat_beneath(root_fd, rel)
    except OSError:
        return False
    if st is None:
        return True
    if stat.S_ISDIR(st.st_mode):
        return os.path.normpath(os.path.join(root, rel)) in protected
    if stat.S_ISREG(st.st_mode):
        try:
            text = safepath.read_file(root_fd, rel, 4096).decode("utf-8", "replace").strip()
        except OSError:
            return False
        if not text.startswith("gitdir: "):
            return True  # git refuses it: nothing runs
        target = os.path.normpath(os.path.join(os.path.dirname(os.path.join(root, rel)), text[8:]))
        if not within(target, root):
            return True  # outside the root: not the sandbox's
        return target in protected or safepath.lstat_beneath(root_fd, os.path.relpath(target, root)) is None
    return False


def _remove_checkout(root_fd: int, root: str, rel: str, content: bytes) -> list[str]:
    """What ``git worktree remove`` inside left of a checkout: its ``.git`` file (when it
    still names the removed entry) and then its directory, if that is empty. Reached from
    the root's descriptor without following a link; the directory is the sandbox's to
    write, so nothing here removes what it could not have removed itself."""
    parent, _, leaf = rel.rpartition("/")
    if not parent or leaf != ".git":
        return []
    try:
        dfd = safepath.dir_beneath(root_fd, parent)
    except OSError:
        return []
    try:
        try:
            if safepath.read_file(dfd, ".git", 4096) != content:
                return []
        except OSError:
            return []
        safepath.unlink(dfd, ".git")
        with contextlib.suppress(OSError), os.scandir(dfd) as it:
            if next(it, None) is not None:
                return [f"{os.path.join(root, rel)}: removed, as inside (the directory is not empty)"]
    finally:
        os.close(dfd)
    grand, _, base = parent.rpartition("/")
    try:
        gfd = safepath.dir_beneath(root_fd, grand) if grand else os.dup(root_fd)
    except OSError:
        return [f"{os.path.join(root, rel)}: removed, as inside"]
    try:
        os.rmdir(base, dir_fd=gfd)
    except OSError:
        pass  # filled meanwhile, or gone: left as it is
    finally:
        os.close(gfd)
    return [f"{os.path.join(root, parent)}: removed, as inside"]


def _shared_now(path: str) -> tuple[str, ...]:
    # Read as it is, nothing made (the store does that at launch: ALWAYS_SHARED counts
    # whether the host has it yet or not).
    names: set[str] = set()
    with contextlib.suppress(OSError), os.scandir(path) as it:
        names = {e.name for e in it if e.is_dir(follow_symlinks=False)}
    return gitstore.shared_of(names)


def _log(line: str) -> None:
    print(f"warren supervisor: git: {line}", file=sys.stderr, flush=True)
