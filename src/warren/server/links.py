"""Files in the writable roots that are hard links to files elsewhere.

A file that is also linked from outside the writable roots (made before the sandbox
started: links to outside files cannot be made inside, Landlock refuses them) would let
a sandbox change that outside file, or read it when it is a secret. Such a file is one
whose link count is larger than the number of its links found inside the writable
roots: the scan counts them, and the plan masks each one — read-only when every local
user may read it anyway, unreadable otherwise.

Writable roots other than the workspace (tool caches of presets, ``--write`` paths)
are exempt: the user shares them with the host on purpose, so a file there, or linked
from there (a venv hardlinked from the uv cache, which other projects' venvs link
too), is not masked — the root already gives the sandbox that file, and masking it
would break the tool's hardlinking (a mount point cannot be linked from). The
workspace, an untrusted repository by default, is what the scan protects.

Where the cost goes, and what is cached (bench/bench_links.py has the figures): the
scan runs in the supervisor, which is warm. It remembers each directory's identity,
modification time, subdirectories and multiply-linked files, so a later scan stats only
directories, and re-reads only those whose entries changed; when none did, the last
answer stands. The memory is saved in the state directory when the supervisor exits
and loaded by the next one. What that cannot see: a link made from outside *to* a file
already in an unchanged workspace directory (the link changes the file, not its
directory). Links made *into* the workspace change its directory and are found.
"""

from __future__ import annotations

import contextlib
import gc
import marshal
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field

# name, dev, ino, nlink, mode — only for files with more than one link
_Linked = tuple[str, int, int, int, int]
# (dev, ino, mtime_ns), subdirectory names, multiply-linked files
_Dir = tuple[tuple[int, int, int], tuple[str, ...], tuple[_Linked, ...]]
_Roots = tuple[tuple[str, ...], tuple[str, ...]]  # writable roots, shared ones
_FORMAT = 1


@dataclass(frozen=True)
class OutsideLink:
    path: str
    world_readable: bool


@dataclass
class LinkScanner:
    """Remembers what it saw, per directory, across scans (one per supervisor)."""

    dirs: dict[str, _Dir] = field(default_factory=dict)
    answers: dict[_Roots, tuple[frozenset[str], tuple[tuple[str, bool], ...]]] = field(default_factory=dict)

    def scan(self, roots: Sequence[str], shared: Sequence[str] = ()) -> list[OutsideLink]:
        """Files under ``roots`` with links outside all of them; files in or linked from
        a ``shared`` root are not reported."""
        key = (tuple(roots), tuple(shared))
        seen: dict[str, _Dir] = {}
        changed = False
        collecting = gc.isenabled()
        gc.disable()  # tens of thousands of small tuples: collections would only cost
        try:
            for root in roots:
                changed |= self._walk(root, seen)
            for path in [p for p in self.dirs if p not in seen and any(_within(p, r) for r in roots)]:
                del self.dirs[path]  # gone since the last scan
            last = self.answers.get(key)
            if last is not None and not changed and last[0] == frozenset(seen):
                return [OutsideLink(p, r) for p, r in last[1]]
            answer = _outside(seen, shared)
            self.answers[key] = (frozenset(seen), tuple((o.path, o.world_readable) for o in answer))
            return answer
        finally:
            if collecting:
                gc.enable()

    def _walk(self, top: str, seen: dict[str, _Dir]) -> bool:
        """Visit every directory under ``top``; True if any had to be read again."""
        changed = False
        stack = [top]
        while stack:
            path = stack.pop()
            if path in seen:
                continue
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                continue
            ident = (st.st_dev, st.st_ino, st.st_mtime_ns)
            entry = self.dirs.get(path)
            if entry is None or entry[0] != ident:
                entry = _read(path, ident)
                self.dirs[path] = entry
                changed = True
            seen[path] = entry
            stack.extend(os.path.join(path, d) for d in entry[1])
        return changed

    def save(self, path: str) -> None:
        """Keep the memory for the next supervisor (owner-only, replaced atomically)."""
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(marshal.dumps((_FORMAT, self.dirs, self.answers)))
            os.replace(tmp, path)
        except (OSError, ValueError):
            with contextlib.suppress(OSError):
                os.unlink(tmp)

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
        if isinstance(data, tuple) and len(data) == 3 and data[0] == _FORMAT:
            self.dirs, self.answers = data[1], data[2]


def _read(path: str, ident: tuple[int, int, int]) -> _Dir:
    subdirs: list[str] = []
    linked: list[_Linked] = []
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    if e.is_dir(follow_symlinks=False):
                        subdirs.append(e.name)
                    elif e.is_file(follow_symlinks=False):
                        st = e.stat(follow_symlinks=False)
                        if st.st_nlink > 1:
                            linked.append((e.name, st.st_dev, st.st_ino, st.st_nlink, st.st_mode))
                except OSError:
                    continue
    except OSError:
        pass
    return ident, tuple(subdirs), tuple(linked)


def _outside(seen: dict[str, _Dir], shared: Sequence[str]) -> list[OutsideLink]:
    count: dict[tuple[int, int], int] = {}
    exempt: set[tuple[int, int]] = set()
    for path, (_ident, _subdirs, linked) in seen.items():
        in_shared = any(_within(path, r) for r in shared)
        for _name, dev, ino, _nlink, _mode in linked:
            key = (dev, ino)
            count[key] = count.get(key, 0) + 1
            if in_shared:
                exempt.add(key)
    out = [
        OutsideLink(os.path.join(path, name), bool(mode & stat.S_IROTH))
        for path, (_ident, _subdirs, linked) in seen.items()
        for name, dev, ino, nlink, mode in linked
        if nlink > count[(dev, ino)] and (dev, ino) not in exempt
    ]
    return sorted(out, key=lambda o: o.path)


def _within(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")
