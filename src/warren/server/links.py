"""Files in the workspace that are hard links to files outside the writable roots.

A workspace file also linked from outside the writable roots (made before the sandbox
started: links to outside files cannot be made inside, Landlock refuses them) would
let a sandbox change that outside file, or read it when the policy denies it. Such a
file is one whose link count is larger than the number of its names in the workspace
and has no name in a shared root. The scan finds them; what happens to each is the
plan's (``plan.mounts``): its workspace names get an inode of their own before the
sandbox starts (``server.unshare``), or — when another name of it is under a denied
path, or the user cannot read it to copy it — it is masked unreadable.

Writable roots other than the workspace (tool caches of presets, ``--write`` paths)
are shared with the host on purpose: a file with a name there (a venv hardlinked from
the uv cache) is given to the sandbox by that root already, and is left alone.

No stale answers: a file's link count changes without its directory changing, so
every workspace file is stat'ed on every scan (``bench/bench_links.py`` has the
cost). What *can* be remembered is which inodes a directory names — that changes
only with the directory's own modification time — so the shared roots (asked only
when some workspace file has links outside) are indexed per directory and re-read
only when a directory changed. A directory modified within the last two seconds is
never remembered (its timestamp is coarse: a change in the same tick would not move
it). The memory is saved in the state directory when the supervisor exits and loaded
by the next one. The denied paths (small, and asked only for files still linked from
outside) are read afresh, inode numbers from stat.

Every directory of the workspace is opened beneath its parent's descriptor, never
through a link (``_core.safepath``): a sandbox of the same workspace may be changing
it while the supervisor walks it.
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import stat
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from .._core import safepath, treewalk

_Ident = tuple[int, int, int]  # dev, ino, mtime_ns of a directory
# identity (None: changed too recently to be trusted), subdirectories, inode numbers
# of its regular files
_Dir = tuple[_Ident | None, tuple[str, ...], tuple[int, ...]]
_FORMAT = 2
RACY_NS = 2_000_000_000  # younger directories are read again next time
_Key = tuple[int, int]  # dev, ino
_KEY = itemgetter(0, 1)
_NLINK = itemgetter(2)


@dataclass(frozen=True)
class OutsideLink:
    path: str
    dev: int
    ino: int
    # Another name of it is under a denied path, or the user cannot read it (or
    # replace it in its directory): never copied, masked unreadable instead.
    secret: bool


# dev, ino, nlink, directory, name of each multiply-linked regular file walked
_Found = tuple[int, int, int, str, str]


# Seconds a root's size (``LinkScanner.large``) is taken as known without counting again.
SIZE_KEEP = 30.0
_SIZES_KEPT = 256  # roots remembered at most (the oldest forgotten first)


@dataclass
class LinkScanner:
    """Remembers, per directory of the shared roots and denied paths, which inodes it
    names (one per supervisor); and, for ``SIZE_KEEP`` seconds, which roots are larger
    than ``treewalk.SMALL`` entries (``large``)."""

    dirs: dict[str, _Dir] = field(default_factory=dict)
    sizes: dict[_Key, tuple[bool, float]] = field(default_factory=dict)

    def large(self, root_fd: int) -> bool:
        """``treewalk.large`` of the directory ``root_fd``, counted at most once per
        ``SIZE_KEEP`` seconds (about 2 ms for a tree past ``treewalk.SMALL``, at every
        planning of a run in a real project). The answer only chooses between two walks
        that protect alike (before launch, or beside the first command while its writes
        wait: ``planning._later``): one outdated costs time, never a protection."""
        st = os.fstat(root_fd)
        key, now = (st.st_dev, st.st_ino), time.monotonic()
        known = self.sizes.pop(key, None)
        if known is None or now - known[1] >= SIZE_KEEP:
            known = (treewalk.large(root_fd), now)
        self.sizes[key] = known  # (last: the most recent)
        while len(self.sizes) > _SIZES_KEPT:
            del self.sizes[next(iter(self.sizes))]
        return known[0]

    def scan(
        self,
        roots: Sequence[str],
        shared: Sequence[str] = (),
        denied: Sequence[str] = (),
        walks: treewalk.Walks | None = None,
    ) -> list[OutsideLink]:
        """Files under ``roots`` with links outside all of them; files with a name in a
        ``shared`` root are not reported; ``secret`` when a name is under ``denied``.
        ``walks``: the launch's native walks (one pass with the repository walk)."""
        walked = [r for r in roots if not any(_within(r, s) for s in shared)]
        found: list[_Found] = []
        collecting = gc.isenabled()
        gc.disable()  # tens of thousands of small tuples: collections would only cost
        try:
            for root in walked:
                _walk(root, found, walks or treewalk.Walks())
            keys = list(map(_KEY, found))
            count = Counter(keys)
            # The largest count seen: a name unlinked during the walk (a sandbox of the
            # workspace may be running) lowers it for the names stat'ed after, never the
            # names counted below what the file had when first stat'ed.
            nlink: dict[_Key, int] = {}
            for key, n in zip(keys, map(_NLINK, found), strict=True):
                if n > nlink.get(key, 0):
                    nlink[key] = n
            outside = {k for k, c in count.items() if nlink[k] > c}
            nested = [s for s in shared if any(_within(s, w) for w in walked)]
            if outside and nested:  # a name in a shared root inside the workspace
                outside -= {(f[0], f[1]) for f in found if any(_within(f[3], s) for s in nested)}
            if outside:
                index = [s for s in shared if s not in nested]
                outside -= self._named(index, outside, exact=False)
            secret = self._named(denied, outside, exact=True) if outside and denied else set()
            paths: dict[_Key, list[str]] = {}
            if outside:
                for dev, ino, _n, directory, name in found:
                    if (dev, ino) in outside:
                        paths.setdefault((dev, ino), []).append(f"{directory}/{name}")
        finally:
            if collecting:
                gc.enable()
        out: list[OutsideLink] = []
        for key, names in paths.items():
            hidden = key in secret or not all(_copyable(p) for p in names)
            out.extend(OutsideLink(p, key[0], key[1], hidden) for p in names)
        return sorted(out, key=lambda o: o.path)

    def _named(self, tops: Iterable[str], wanted: set[_Key], exact: bool) -> set[_Key]:
        """Which of ``wanted`` have a name under ``tops`` (files or directories).
        ``exact``: inode numbers from stat, not from the directory entry (they differ
        on some overlay filesystems; a miss there must not make a secret copyable)."""
        by_dev: dict[int, set[int]] = {}
        for dev, ino in wanted:
            by_dev.setdefault(dev, set()).add(ino)
        found: set[_Key] = set()
        for top in tops:
            try:
                st = os.lstat(top)
            except OSError:
                continue
            inos = by_dev.get(st.st_dev)
            if inos is None:
                continue
            if stat.S_ISREG(st.st_mode):
                if st.st_ino in inos:
                    found.add((st.st_dev, st.st_ino))
            elif stat.S_ISDIR(st.st_mode):
                found.update((st.st_dev, ino) for ino in self._index(top, st.st_dev, inos, exact))
        return found

    def _index(self, top: str, dev: int, wanted: set[int], exact: bool) -> set[int]:
        """Which inode numbers of ``wanted`` the tree ``top`` names."""
        hits: set[int] = set()
        seen: set[str] = set()
        stack = [top]
        now = time.time_ns()
        changed = False
        while stack:
            path = stack.pop()
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_dev != dev:
                continue
            seen.add(path)
            ident = (st.st_dev, st.st_ino, st.st_mtime_ns)
            entry = self.dirs.get(path)
            if entry is None or entry[0] is None or entry[0] != ident or exact:
                entry = _read(path, ident if now - st.st_mtime_ns >= RACY_NS else None, exact)
                if not exact:
                    self.dirs[path] = entry
                    changed = True
            hits.update(wanted.intersection(entry[2]))
            stack.extend(os.path.join(path, d) for d in entry[1])
        if changed:  # a directory gone since the last scan changed its parent
            for path in [p for p in self.dirs if _within(p, top) and p not in seen]:
                del self.dirs[path]
        return hits

    def save(self, path: str) -> None:
        """Keep the memory for the next supervisor (owner-only, replaced atomically)."""
        parent, name = os.path.split(path)
        try:
            fd = safepath.open_dir(parent)
            try:
                safepath.write_atomic(fd, name, marshal.dumps((_FORMAT, self.dirs)), mode=0o600, fsync=False)
            finally:
                os.close(fd)
        except (OSError, ValueError):
            pass

    def load(self, path: str) -> None:
        """Start from a saved memory; anything unreadable or of another format is ignored
        (the next scan is then cold)."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                if os.fstat(f.fileno()).st_uid != os.getuid():
                    return
                blob = f.read()
            collecting = gc.isenabled()
            gc.disable()
            try:
                data = marshal.loads(blob)
            finally:
                if collecting:
                    gc.enable()
        except (OSError, EOFError, ValueError, TypeError):
            return
        if isinstance(data, tuple) and len(data) == 2 and data[0] == _FORMAT and isinstance(data[1], dict):
            self.dirs = data[1]


def denied_linked_elsewhere(denied: Sequence[str]) -> str | None:
    """A regular file under ``denied`` with more names than it has under them (one may
    be in the workspace: then the launch walks it before the sandbox starts), or None.
    A denied file with one link, or whose every link is a name under the denied paths,
    cannot be reached by another name. Each directory is opened beneath its parent,
    never through a link (the walks of ``_walk``)."""
    found: list[_Found] = []
    tops = {_norm(top) for top in denied}
    for top in sorted(tops):
        if _beneath_any(top, tops):
            continue  # its names are counted with the path that holds it
        try:
            st = os.lstat(top)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            if st.st_nlink > 1:
                found.append((st.st_dev, st.st_ino, st.st_nlink, os.path.dirname(top), os.path.basename(top)))
        elif stat.S_ISDIR(st.st_mode):
            _walk(top, found, treewalk.Walks())
    names: dict[_Key, set[str]] = {}
    nlink: dict[_Key, int] = {}
    for dev, ino, n, directory, name in found:
        names.setdefault((dev, ino), set()).add(f"{directory}/{name}")
        nlink[(dev, ino)] = max(n, nlink.get((dev, ino), 0))
    for key, paths in names.items():
        if nlink[key] > len(paths):
            return min(paths)
    return None


def _copyable(path: str) -> bool:
    """The user may read the file and replace it in its directory."""
    return os.access(path, os.R_OK, follow_symlinks=False) and os.access(os.path.dirname(path), os.W_OK)


def _entries(where: str | int) -> Iterator[tuple[os.DirEntry[str], bool]]:
    """The subdirectories and regular files of a directory (a link is neither), each with
    whether it is a directory; an entry, or the rest of the directory, that cannot be
    read is passed over."""
    try:
        with os.scandir(where) as it:
            for e in it:
                try:
                    is_dir = e.is_dir(follow_symlinks=False)
                    if not is_dir and not e.is_file(follow_symlinks=False):
                        continue
                except OSError:
                    continue
                yield e, is_dir
    except OSError:
        pass


def _read(path: str, ident: _Ident | None, exact: bool) -> _Dir:
    subdirs: list[str] = []
    inodes: list[int] = []
    for e, is_dir in _entries(path):
        if is_dir:
            subdirs.append(e.name)
        elif not exact:
            inodes.append(e.inode())
        else:
            with contextlib.suppress(OSError):
                inodes.append(e.stat(follow_symlinks=False).st_ino)
    return ident, tuple(subdirs), tuple(inodes)


def _walk(root: str, found: list[_Found], walks: treewalk.Walks) -> None:
    """Stat every regular file under ``root`` (each directory opened beneath its
    parent, never through a link; at most one open descriptor per level) and note the
    multiply-linked ones: natively (``_core.treewalk``) for a large tree, else here. A
    tree that may be either is walked here first, until it is past the size a Python
    walk takes (``Walks.python_first``): a small one (a denied directory, most
    workspaces) is then listed once, not counted and then walked."""
    try:
        top = safepath.open_dir(root)
    except OSError:
        return
    budget = walks.python_first(root)
    if budget is not None:
        mine: list[_Found] = []
        if _walk_here(top, root, mine, walks, budget):
            found.extend(mine)
            return
        try:  # past the budget: the native walk, from the top again
            top = safepath.open_dir(root)
        except OSError:
            return
    try:
        tree = walks.tree(root, top, links=True, git=False, counted=budget is not None)
    except BaseException:
        os.close(top)
        raise
    if tree is not None:
        os.close(top)
        for dev, ino, nlink, rel in tree.linked:
            directory, _, name = rel.rpartition("/")
            found.append((dev, ino, nlink, f"{root}/{directory}" if directory else root, name))
        return
    _walk_here(top, root, found, walks, None)


def _walk_here(top: int, root: str, found: list[_Found], walks: treewalk.Walks, budget: int | None) -> bool:
    """The Python walk of ``root`` from its descriptor ``top`` (closed here); False,
    with ``found`` partial, once it has listed more than ``budget`` entries."""
    subdirs, listed = _files(top, root, found)
    # (descriptor, path, subdirectories not yet visited)
    stack: list[tuple[int, str, list[str]]] = [(top, root, subdirs)]
    try:
        while stack:
            if budget is not None and listed > budget:
                return False
            if walks.stop is not None:
                walks.stop.check()
            fd, path, pending = stack[-1]
            if not pending:
                os.close(fd)
                stack.pop()
                continue
            name = pending.pop()
            try:
                child = safepath.dir_beneath(fd, name)
            except OSError:
                continue
            sub = f"{path}/{name}"
            subdirs, n = _files(child, sub, found)
            listed += n
            stack.append((child, sub, subdirs))
    finally:
        for fd, _path, _pending in stack:
            os.close(fd)
    return True


def _files(fd: int, path: str, found: list[_Found]) -> tuple[list[str], int]:
    """Note the directory's multiply-linked files; its subdirectories, and how many
    entries it listed. What ``_entries`` does, written out: this loop runs once per
    workspace file at every launch, and the generator and a context manager per file
    were a third of its time."""
    subdirs: list[str] = []
    listed = 0
    try:
        it = os.scandir(fd)
    except OSError:
        return subdirs, listed
    with it:
        while True:
            try:
                e = next(it)
            except StopIteration:
                break
            except OSError:  # the rest of the directory cannot be read
                break
            listed += 1
            try:
                if e.is_dir(follow_symlinks=False):
                    subdirs.append(e.name)
                    continue
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_nlink > 1:
                found.append((st.st_dev, st.st_ino, st.st_nlink, path, e.name))
    return subdirs, listed


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _norm(path: str) -> str:
    return path.rstrip("/") or "/"


def _beneath_any(path: str, tops: set[str]) -> bool:
    """Whether a directory above ``path`` (itself not) is one of ``tops``: its
    ancestors looked up, not every top compared (the default deny list has about 80
    paths: comparing each with each took 3.5 ms of every planning; ``os.path.dirname``
    at each step was then most of what was left). ``path`` is absolute, without a
    trailing or a doubled slash (``_norm``)."""
    while True:
        cut = path.rfind("/")
        if cut <= 0:
            return path != "/" and "/" in tops
        path = path[:cut]
        if path in tops:
            return True
