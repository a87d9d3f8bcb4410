"""The OpenAI Agents backend's workspace archive: what a snapshot may hold, and the
shell program that puts one back without risking the files already there.

A snapshot is GNU tar's stream of the workspace, made in the sandbox, in the SDK's
portable form: each hard link stored as a file of its own (``--hard-dereference``; a
pair comes back as two files with the same content, as from the SDK's local backend,
and any backend can restore it), symlinks, modes and empty directories; FIFOs and
device nodes are dropped, as the SDK's local backend drops them. Before anything is
written the whole archive is checked by the SDK's own rules (relative paths, no
``..``, no hard link, no member beneath a symlink, symlink targets inside the root).

Restoring (``REPLACE_SCRIPT``, run by ``sh`` in the sandbox) unpacks the archive into
a fresh directory beside the live entries, then moves the live entries aside and the
restored ones in, renames within one file system; any failure moves everything back.
A failed restore leaves the workspace as it was; nothing is deleted before the
restored tree is complete.
"""

from __future__ import annotations

import io
import tarfile

from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tarfile

__all__ = ["REPLACE_SCRIPT", "UnsafeTarMemberError", "portable", "validate"]


def validate(raw: bytes) -> None:
    """Check the whole archive ``raw``; raise ``UnsafeTarMemberError`` (or
    ``tarfile.TarError``) naming the first member that could not be restored safely."""
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:*") as tar:
        validate_tarfile(tar, allow_external_symlink_targets=False)


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
