"""The OpenAI Agents backend's workspace archive: what a snapshot may hold, and the
shell program that puts one back without risking the files already there.

A snapshot is GNU tar's stream of the workspace, made in the sandbox. It keeps hard
links as tar link entries (the pair is restored as one inode), symlinks, modes and
empty directories; FIFOs and device nodes are dropped, as the SDK's local backend
drops them. Before anything is written, the whole archive is checked: the SDK's own
rules (relative paths, no ``..``, no member beneath a symlink, symlink targets inside
the root), and a hard link only to a regular file the archive holds before it. The
SDK's checker refuses every hard link, so it sees each one as the file it names.

Restoring (``REPLACE_SCRIPT``, run by ``sh`` in the sandbox) unpacks the archive into
a fresh directory beside the live entries, then moves the live entries aside and the
restored ones in, renames within one file system; any failure moves everything back.
A failed restore leaves the workspace as it was; nothing is deleted before the
restored tree is complete.
"""

from __future__ import annotations

import copy
import io
import tarfile
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import cast

from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile

__all__ = ["REPLACE_SCRIPT", "UnsafeTarMemberError", "portable", "validate"]


def _relative(name: str) -> str:
    """A member's name as the workspace-relative path tar writes it to."""
    return PurePosixPath(*[part for part in PurePosixPath(name).parts if part != "."]).as_posix()


class _Members:
    """What ``validate_tarfile`` reads of a ``TarFile``: its members."""

    def __init__(self, members: list[tarfile.TarInfo]) -> None:
        self._members = members

    def getmembers(self) -> list[tarfile.TarInfo]:
        return self._members


def validate(raw: bytes, skip: Iterable[str] = ()) -> None:
    """Check the whole archive ``raw``; raise ``UnsafeTarMemberError`` (or
    ``tarfile.TarError``) naming the first member that could not be restored safely."""
    seen_files: set[str] = set()
    checked: list[tarfile.TarInfo] = []
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
        for member in tar.getmembers():
            if member.islnk():
                target = PurePosixPath(member.linkname)
                if target.is_absolute() or ".." in target.parts:
                    raise UnsafeTarMemberError(member=member.name, reason="hardlink target outside the root")
                if _relative(member.linkname) not in seen_files:
                    raise UnsafeTarMemberError(
                        member=member.name, reason="hardlink target is not a file earlier in the archive"
                    )
                member = copy.copy(member)
                member.type = tarfile.REGTYPE
            elif member.isreg():
                seen_files.add(_relative(member.name))
            checked.append(member)
    validate_tarfile(
        cast(tarfile.TarFile, _Members(checked)),
        skip_rel_paths=list(skip),
        allow_external_symlink_targets=False,
    )


def portable(raw: bytes) -> bytes:
    """``raw`` without FIFOs and device nodes (a workspace's named pipe or a device a
    tool made is not content to restore), unchanged when it has none."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
        members = tar.getmembers()
        if not any(m.isfifo() or m.ischr() or m.isblk() for m in members):
            return raw
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as kept:
            for member in members:
                if member.isfifo() or member.ischr() or member.isblk():
                    continue
                kept.addfile(member, tar.extractfile(member) if member.isreg() else None)
    return out.getvalue()


# $1 the workspace, $2 and $3 fresh unguessable names for the restored tree and the
# live entries set aside, then names at the workspace's top to leave in place (the
# SDK's mounts). stdin is the archive. Exit 0: replaced; else the workspace is as it
# was and stderr says why.
REPLACE_SCRIPT = r"""
set -u
root=$1 new=$1/$2 old=$1/$3
shift 3
skip() {  # whether $1 is the restore's own directory or a name to leave in place
    _s=$1; shift
    case $_s in "$new"|"$old") return 0 ;; esac
    [ -e "$_s" ] || [ -h "$_s" ] || return 0
    for k; do [ "${_s##*/}" = "$k" ] && return 0; done
    return 1
}
umask 0
mkdir -p -- "$root" && mkdir -- "$new" || exit 1
if ! tar -C "$new" --no-same-owner --no-same-permissions -m -xf -; then
    rm -rf -- "$new"; exit 1
fi
mkdir -- "$old" || { rm -rf -- "$new"; exit 1; }
phase=aside
for e in "$root"/* "$root"/.[!.]* "$root"/..?*; do
    skip "$e" "$@" && continue
    mv -- "$e" "$old/" || { phase=undo; break; }
done
if [ $phase = aside ]; then
    phase=in
    for e in "$new"/* "$new"/.[!.]* "$new"/..?*; do
        skip "$e" "$@" && continue
        mv -- "$e" "$root/" || { phase=undo-in; break; }
    done
fi
if [ $phase != in ]; then
    if [ $phase = undo-in ]; then
        for e in "$root"/* "$root"/.[!.]* "$root"/..?*; do
            skip "$e" "$@" || mv -- "$e" "$new/"
        done
    fi
    for e in "$old"/* "$old"/.[!.]* "$old"/..?*; do
        [ -e "$e" ] || [ -h "$e" ] && mv -- "$e" "$root/"
    done
    rmdir -- "$old"; rm -rf -- "$new"
    echo "warren: the workspace could not be replaced; it is as it was" >&2
    exit 1
fi
rm -rf -- "$old" "$new"
"""
