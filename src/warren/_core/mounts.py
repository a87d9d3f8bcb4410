"""Execute a plan's identity and mount steps inside fresh namespaces. No decisions.

Runs in PID 1 right after the clone: id maps, hostname, ``lo`` up, then every
``MountOp`` in order on a stage at /tmp (the sandbox's own mount namespace), then
pivot_root. Sources are cloned from the host before anything is overlaid, so a
source under /tmp is the host's, not the stage's.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ..errors import SetupError
from ..plan.model import PRECLONED, MountKind, MountOp, Plan
from . import _sys

STAGE = "/tmp"
DENIED_FILE = "/dev/.warren-denied"  # in the sandbox's fresh /dev: what a denied file shows
_CLONE = _sys.OPEN_TREE_CLONE | _sys.OPEN_TREE_CLOEXEC
_HIDE_ATTRS = _sys.MOUNT_ATTR_RDONLY | _sys.MOUNT_ATTR_NOSUID | _sys.MOUNT_ATTR_NODEV
_HIDE_REMOUNT = _sys.MS_RDONLY | _sys.MS_NOSUID | _sys.MS_NODEV


def _write_file(path: str, data: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, data.encode())
    finally:
        os.close(fd)


def _write_id_maps(plan: Plan) -> None:
    for path, data in (
        ("/proc/self/uid_map", plan.uid_map),
        ("/proc/self/setgroups", "deny"),
        ("/proc/self/gid_map", plan.gid_map),
    ):
        try:
            _write_file(path, data)
        except OSError as e:
            raise SetupError.from_os(
                e,
                f"sandbox setup failed: writing {path}",
                "id map",
                path,
                hint="the kernel refused the single-id map; is this process already in a restricted "
                "user namespace?",
            ) from None


def _clone(path: str, recursive: bool = True) -> int:
    return _sys.open_tree(path, _CLONE | (_sys.AT_RECURSIVE if recursive else 0))


def _preclone(op: MountOp) -> int:
    fd = _clone(op.source or op.target)
    _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)  # submounts stay read-only
    if op.kind is MountKind.BIND_RW:
        _sys.mount_setattr(fd, 0, _sys.MOUNT_ATTR_RDONLY, False)
    return fd


def _attach(fd: int, target: str) -> None:
    try:
        _sys.move_mount(fd, target)
    finally:
        os.close(fd)


def _mount_point(path: str, is_dir: bool) -> None:
    if is_dir:
        os.makedirs(path, exist_ok=True)
    elif not os.path.lexists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))


def _listed(directory: int) -> list[str]:
    return os.listdir(directory)


def _mask(directory: str, keep: tuple[str, ...], hide: bool = False) -> None:
    """Every entry of ``directory`` but ``keep`` read-only (``hide``: hidden, as a
    denied path is). Another sandbox may be changing the entries meanwhile (a home
    holds other workspaces): each is opened without following a link and masked
    through that descriptor, so the mask lands on what was checked; one gone since the
    listing is left out, as one made after."""
    listing = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in _listed(listing):
            if name not in keep:
                (_hide_entry if hide else _mask_entry)(listing, name)
    finally:
        os.close(listing)


def _hide_entry(directory: int, name: str) -> None:
    """A directory ``name`` hidden through a descriptor that followed no link, under an
    empty read-only tmpfs nobody may enter. Anything else is left as it is: where
    masks hide, Landlock grants reading no file (it is there for what is made later)."""
    try:
        held = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return
    try:
        if stat.S_ISDIR(os.fstat(held).st_mode):
            flags = _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_RDONLY
            with contextlib.suppress(FileNotFoundError):  # removed since the open: gone, as hidden
                _sys.mount("tmpfs", f"/proc/self/fd/{held}", "tmpfs", flags, "mode=0")
    finally:
        os.close(held)


def _mask_entry(directory: int, name: str) -> None:
    try:
        held = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
    except FileNotFoundError:
        return  # gone since it was listed (another sandbox's TMPDIR removed as it ended)
    try:
        if stat.S_ISLNK(os.fstat(held).st_mode):
            return  # a symbolic link cannot be a mount point; Landlock denies replacing it
        try:
            fd = _sys.open_tree("", _CLONE | _sys.AT_RECURSIVE | _sys.AT_EMPTY_PATH, held)
        except FileNotFoundError:
            return
        try:
            _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)
            _sys.move_mount_onto(fd, held)
        except FileNotFoundError:
            pass  # removed between the open and the attach: the same, a moment later
        finally:
            os.close(fd)
    finally:
        os.close(held)


def _shadow(target: str, keep: tuple[str, ...], link_to: str | None = None) -> None:
    """A fresh tmpfs over ``target`` showing what was there: each entry taken first
    (through a descriptor that follows no link, as ``_mask`` does) and bound back as it
    was, links made again, then the ``keep`` directories made empty (``link_to``: made
    symbolic links to that path); read-only after.
    Everything happens in the sandbox's own mount namespace: the host's directory is not
    touched."""
    listing = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    taken: list[tuple[str, int | None, str, bool]] = []  # name, clone, link target, a directory
    try:
        mode = stat.S_IMODE(os.fstat(listing).st_mode)
        for name in _listed(listing):
            if name in keep:
                continue
            try:
                held = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=listing)
            except FileNotFoundError:
                continue
            try:
                st = os.fstat(held)
                if stat.S_ISLNK(st.st_mode):
                    taken.append((name, None, os.readlink(name, dir_fd=listing), False))
                else:
                    tree = _sys.open_tree("", _CLONE | _sys.AT_RECURSIVE | _sys.AT_EMPTY_PATH, held)
                    taken.append((name, tree, "", stat.S_ISDIR(st.st_mode)))
            finally:
                os.close(held)
        _sys.mount("tmpfs", target, "tmpfs", _sys.MS_NOSUID | _sys.MS_NODEV, f"mode={mode:o}")
        while taken:
            name, fd, link, is_dir = taken[-1]
            path = os.path.join(target, name)
            if fd is None:
                os.symlink(link, path)
            else:
                _mount_point(path, is_dir)
            taken.pop()
            if fd is not None:
                _attach(fd, path)
        for name in keep:
            if link_to is not None:
                os.symlink(link_to, os.path.join(target, name))
            else:
                os.mkdir(os.path.join(target, name), 0o755)
        _sys.mount(None, target, None, _sys.MS_REMOUNT | _sys.MS_BIND | _HIDE_REMOUNT)
    finally:
        for _, left, _, _ in taken:
            if left is not None:
                os.close(left)
        os.close(listing)


def _mask_file(source: str, target: str, ident: tuple[int, int]) -> None:
    """The stand-in over ``target`` only if it still is the file ``ident``: checked
    through a descriptor, and the mount lands on what was checked (a sandbox of the
    same workspace may be moving its directories meanwhile). The bind keeps the
    nosuid, nodev of the fresh /dev it comes from."""
    held = os.open(target, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(held)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != ident:
            raise OSError(errno.ESTALE, "no longer the file planned", target)
        _sys.mount(source, f"/proc/self/fd/{held}", None, _sys.MS_BIND)
    finally:
        os.close(held)


def _layer_fds(op: MountOp) -> list[int]:
    """The image's layers taken before anything is overlaid (they may lie under the
    host's /tmp, where the stage goes), each as a detached mount of this sandbox's own
    (the overlay names them by descriptor): they outlive pivot_root, so the root can be
    stacked again later (``_core.restack``). A layer given by descriptor
    (``given_layers``: a snapshot still in another sandbox's memory) is adopted. Each
    is opened by path too (``by_path``), for a kernel that takes layers by path only."""
    fds: list[int] = []
    try:
        for i, layer in enumerate(op.layers):
            given = given_layers.pop(i, None)
            if given is not None:
                adopted = [_adopt(fd) for fd in given]
                fds.extend(adopted)
                by_path.extend(os.dup(fd) for fd in adopted)
                continue
            by_path.append(os.open(layer, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            try:
                fds.append(_clone(layer, recursive=False))
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                # Mounts beneath it (a root directory with /proc bound in): by path, as
                # before; such a root is never stacked again (snapshots copy instead).
                fds.append(os.dup(by_path[-1]))
                restackable[0] = False
    except OSError:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _adopt(fd: int) -> int:
    """A layer another sandbox's namespaces hold, as a detached mount of ours: attached
    (for a moment, on the host's /tmp of our copy), cloned, let go."""
    try:
        _sys.move_mount(fd, STAGE)
    finally:
        os.close(fd)
    try:
        return _clone(STAGE, recursive=False)
    finally:
        _sys.umount2(STAGE, _sys.MNT_DETACH)


# Layers given by descriptor (``_core.clone``), by their index in the overlay's layers.
given_layers: dict[int, list[int]] = {}
# The layer tmpfs and the lower layers as detached mounts (``held``: tmpfs first), for
# the supervisor with Ready; none when a layer could only be taken by path.
held: list[int] = []
restackable = [True]
by_path: list[int] = []  # the layers as O_PATH descriptors of their paths (``_layer_fds``)
# The overlay by paths (/proc/self/fd/N) only, as on kernels before 6.13, whose overlay
# takes no layer by descriptor: snapshots then copy. For testing that path here.
_BY_PATH = os.environ.get("WARREN_OVERLAY_BY_PATH") == "1"


# The sandbox's own layer (the overlay's upper directory), held by PID 1 from the mount
# on: the supervisor gets it with Ready, to snapshot it (``server.snapshots``).
layer_fd: list[int] = []
# Each repository's git directory as it lies on its writable root's mount, opened just
# before warren's tree is bound over it (then no path reaches it): the broker makes
# hard links out of the host's shared git data there (``broker.links``).
git_under: dict[str, int] = {}
_UNDER = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _overlay_root(op: MountOp, layers: list[int], links: list[MountOp]) -> str:
    """The image's root: a tmpfs of ``op.size`` (the sandbox's layer: upper and work
    directories) on the stage, the overlay beside them. Returns the new stage.

    ``links``: the plan's links at the top of the root (``/workspace`` -> its host path),
    made in the upper directory before the overlay is mounted. There a link hides
    whatever the image has at that name, a directory with files in it included; made
    through the overlay it could not replace a directory (EEXIST)."""
    _sys.mount("tmpfs", STAGE, "tmpfs", _sys.MS_NOSUID | _sys.MS_NODEV, f"mode=755,size={op.size}")
    for name in ("upper", "work", "root"):
        os.mkdir(f"{STAGE}/{name}", 0o755)
    for link in links:
        os.symlink(link.source or "", f"{STAGE}/upper{link.target}")
    # The tmpfs as a detached mount of its own: it outlives the stage (on the host's
    # /tmp, let go with the host's tree at pivot_root), for stacking the root again.
    tmpfs = _clone(STAGE, recursive=False)
    try:
        layer_fd.append(os.open("upper", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=tmpfs))
        root = None if _BY_PATH else _overlay_by_fds(tmpfs, layers)
        if root is None:
            # Layers by path (a kernel before 6.13): the root is never stacked again.
            restackable[0] = False
            lower = ":".join(f"/proc/self/fd/{fd}" for fd in by_path)
            options = f"lowerdir={lower},upperdir={STAGE}/upper,workdir={STAGE}/work,userxattr"
            _sys.mount("overlay", f"{STAGE}/root", "overlay", _sys.MS_NOSUID | _sys.MS_NODEV, options)
        else:
            _attach(root, f"{STAGE}/root")
    except BaseException:
        os.close(tmpfs)
        raise
    if restackable[0]:
        held[:] = [tmpfs, *layers]
        layers.clear()  # held from here on: the supervisor gets them with Ready
    else:
        os.close(tmpfs)
    return f"{STAGE}/root"


def _overlay_by_fds(tmpfs: int, layers: list[int]) -> int | None:
    """The overlay with every layer named by descriptor, detached; None where the
    kernel takes no layer by descriptor (before 6.13: ``fsconfig`` refuses)."""
    upper = os.open("upper", _UNDER, dir_fd=tmpfs)
    work = os.open("work", _UNDER, dir_fd=tmpfs)
    try:
        return _sys.overlay_from_fds(layers, upper, work)
    except OSError as e:
        if e.errno in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            return None
        raise
    finally:
        os.close(upper)
        os.close(work)


def _review_overlay(op: MountOp) -> int:
    """Review mode's workspace, detached: the host's directory (a read-only clone of it
    alone: the overlay does not look into mounts beneath a layer) under the sandbox's
    layer, every layer named by descriptor before the stage hides the host's /tmp."""
    lower = _clone(op.source or op.target, recursive=False)
    try:
        _sys.mount_setattr(lower, _HIDE_ATTRS, 0, False)
        upper = os.open(op.layers[0], _UNDER)
        try:
            work = os.open(op.layers[1], _UNDER)
            try:
                mnt = _sys.overlay_from_fds([lower], upper, work)
            finally:
                os.close(work)
        finally:
            os.close(upper)
    except BaseException:
        os.close(lower)
        raise
    # The host's directory stays held, for the supervisor (with Ready), and the layer's
    # own directory as a detached mount: a checkpoint or a rollback stacks the workspace
    # again on them (``server.checkpoints``); the overlay takes a layer only from a
    # mount of the namespace that makes it, or a detached one.
    try:
        layer = _clone(os.path.dirname(op.layers[0]), recursive=False)
        _sys.mount_setattr(layer, _sys.MOUNT_ATTR_NODEV_NOSUID, 0, False)
    except BaseException:
        os.close(lower)
        os.close(mnt)
        raise
    held.extend((lower, layer))
    return mnt


def _no_links(stage: str, target: str) -> None:
    """On an image, every directory down to a mount point must be a directory, not a
    link: a link there would be followed out of the stage (into the host's tree)."""
    cur = stage
    for part in target[len(stage) :].strip("/").split("/"):
        cur = f"{cur}/{part}"
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "the image has a symbolic link where the sandbox mounts", cur)


def _deny_path(target: str) -> None:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        flags = _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_RDONLY
        _sys.mount("tmpfs", target, "tmpfs", flags, "mode=0")
    elif not stat.S_ISLNK(st.st_mode):
        _apply(MountOp(MountKind.DENY_FILE, target), target, None)


def _removed_since_planning(op: MountOp, target: str) -> bool:
    """A denied path removed on the host between planning and its step needs no
    stand-in: the read-only view of its parent shows it missing, as the plan would have
    had the planner looked a moment later (it skips denied paths that do not exist).
    Only for deny steps; a missing target of any other step still fails the start."""
    denied = op.kind is MountKind.DENY_FILE or (op.kind is MountKind.TMPFS and op.mode == 0)
    return denied and not op.mkdir and not os.path.lexists(target)


def _deny_file(op: MountOp, source: str, target: str, tries: int = 3) -> None:
    """The stand-in put over a denied file in one step: a detached copy of it, made
    nosuid, nodev before it is attached (a bind and then a remount would leave a moment
    between them in which the host's removal of the file detaches the bind and the
    remount finds nothing). The host may remove the file at any moment: nothing is left
    to hide and the step is done. The kernel refuses the attach also when the name was
    replaced after it was looked up (a new file renamed over it); the stand-in is then
    put over the new one."""
    for tried in range(1, tries + 1):
        clone = _clone(source, recursive=False)
        try:
            _sys.mount_setattr(clone, _sys.MOUNT_ATTR_NOSUID | _sys.MOUNT_ATTR_NODEV)
        except BaseException:
            os.close(clone)
            raise
        try:
            _attach(clone, target)
            return
        except FileNotFoundError:
            if _removed_since_planning(op, target):
                return
            if tried == tries:
                raise


def _apply(op: MountOp, target: str, fd: int | None) -> None:
    kind = op.kind
    if fd is not None:
        if op.mkdir:
            # The clone itself says what it is: by now its source path may name
            # something else (the stage is on /tmp).
            _mount_point(target, stat.S_ISDIR(os.fstat(fd).st_mode))
        _attach(fd, target)
    elif kind is MountKind.MASK:
        _mask(target, op.keep, hide=op.mode == 0)
    elif kind is MountKind.SHADOW:
        _shadow(target, op.keep, op.source)
    elif kind is MountKind.MIRROR:
        # the source as the stage shows it now, every mount beneath it kept as it is
        _attach(_clone(target[: len(target) - len(op.target)] + (op.source or "")), target)
    elif kind is MountKind.TMPFS:
        if op.mkdir and not os.path.isdir(target):
            os.mkdir(target, 0o755)
        flags = _sys.MS_NOSUID | _sys.MS_NODEV | (_sys.MS_RDONLY if op.readonly else 0)
        options = [f"mode={op.mode:o}"] if op.mode is not None else []
        if op.size is not None:
            options.append(f"size={op.size}")
        try:
            _sys.mount("tmpfs", target, "tmpfs", flags, ",".join(options) or None)
        except FileNotFoundError:
            if not _removed_since_planning(op, target):
                raise
    elif kind is MountKind.BIND_DEV:
        # The host /dev is still reachable at /dev (the stage sits on /tmp).
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        _sys.mount(op.source, target, None, _sys.MS_BIND)
    elif kind is MountKind.DENY_FILE:
        # An empty file nobody may open (mode 000, and no capability inside overrides
        # that): reads and writes fail with EACCES, as a program can tell.
        source = STAGE + DENIED_FILE
        if not os.path.exists(source):
            os.close(os.open(source, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0))
            os.chmod(source, 0)
        # Writable mount, so writes meet the mode (EACCES), not the mount (EROFS); PID 1's
        # broker refuses chmod and the like on it.
        if op.ident is None:
            _deny_file(op, source, target)
        else:
            try:
                _mask_file(source, target, op.ident)
            except FileNotFoundError:
                # The link removed before its step, or between the open and the bind (the
                # kernel mounts on no unlinked file): nothing is left at that name to hide.
                if not _removed_since_planning(op, target):
                    raise
    elif kind is MountKind.DEVPTS:
        os.mkdir(target, 0o755)
        flags = _sys.MS_NOSUID | _sys.MS_NOEXEC
        _sys.mount("devpts", target, "devpts", flags, "newinstance,ptmxmode=0666,mode=620")
    elif kind is MountKind.SYMLINK:
        os.symlink(op.source or "", target)
    elif kind is MountKind.DIR:
        if not os.path.isdir(target):  # an image may have it already
            os.mkdir(target)
            os.chmod(target, op.mode if op.mode is not None else 0o755)
    elif kind is MountKind.SEED:
        _seed(target, (op.source or "").encode())
    elif kind is MountKind.DENY_PATH:
        _deny_path(target)
    elif kind is MountKind.PROC:
        if op.mkdir:
            os.makedirs(target, exist_ok=True)
        _sys.mount("proc", target, "proc", _sys.MS_NOSUID | _sys.MS_NODEV | _sys.MS_NOEXEC)
    elif kind is MountKind.RO_SELF:
        if os.path.exists(target):
            clone = _clone(target)
            _sys.mount_setattr(clone, _HIDE_ATTRS, 0, True)
            _attach(clone, target)
    else:  # pragma: no cover - every kind is handled above
        raise OSError(errno.EINVAL, f"unknown mount step {kind}")


def _seed(target: str, data: bytes) -> None:
    """``target`` made with ``data`` where its directory exists (the image's) and it does
    not: a sandbox made from a snapshot has it, or the user's own, already. The path was
    checked for links (``_no_links``) and the last step follows none."""
    try:
        fd = os.open(target, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except (FileExistsError, FileNotFoundError, NotADirectoryError):
        return
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _top_link(op: MountOp) -> bool:
    return op.kind is MountKind.SYMLINK and op.target.count("/") == 1 and len(op.target) > 1


def _execute(plan: Plan) -> None:
    trees = {g.path: g.tree for g in plan.git}
    fds: dict[int, int] = {}
    layers: list[int] = []
    step = -1
    op: MountOp | None = None
    stage = STAGE
    try:
        _sys.mount(None, "/", None, _sys.MS_REC | _sys.MS_PRIVATE)
        for step, op in enumerate(plan.mounts):
            if op.kind in PRECLONED:
                fds[step] = _preclone(op)
            elif op.kind is MountKind.OVERLAY:
                layers = _layer_fds(op)
            elif op.kind is MountKind.REVIEW:
                fds[step] = _review_overlay(op)
        links = {i: op for i, op in enumerate(plan.mounts) if _top_link(op)} if plan.image else {}
        for step, op in enumerate(plan.mounts):
            if op.kind is MountKind.OVERLAY:
                stage = _overlay_root(op, layers, list(links.values()))
                continue
            if step in links:
                continue
            target = stage if op.target == "/" else stage + op.target
            if plan.image is not None:
                _no_links(stage, target)
            if op.kind is MountKind.BIND_RW and op.target in trees and trees[op.target] == op.source:
                git_under[op.target] = os.open(target, _UNDER)
            _apply(op, target, fds.pop(step, None))
        op = None
        os.chdir(stage)
        _sys.pivot_root(".", ".")
        _sys.umount2(".", _sys.MNT_DETACH)
        os.chdir("/")
        for fd in [*layers, *by_path]:
            os.close(fd)
        by_path.clear()
    except OSError as e:
        for fd in fds.values():
            os.close(fd)
        if op is None:
            raise SetupError.from_os(
                e,
                "sandbox setup failed: entering the new root",
                "pivot_root",
                hint="the assembled root could not replace the host's",
            ) from None
        raise SetupError.from_os(
            e,
            f"sandbox setup failed at mount step {step} ({op.kind.value} {op.target})",
            op.kind.value,
            e.filename if isinstance(e.filename, str) else op.target,
            hint=f"{op.why or op.kind.value}; check that {op.source or op.target} exists and is "
            "readable by you, and run `warren plan` to see every step",
        ) from None


def enter_new_root(plan: Plan) -> None:
    """In a process cloned into fresh namespaces: id maps, hostname, ``lo``, the whole
    mount plan and pivot_root. Afterwards "/" is the sandbox's root."""
    _write_id_maps(plan)
    if plan.hostname is not None:
        _sys.sethostname(plan.hostname)
    try:
        _sys.loopback_up()
    except OSError as e:
        raise SetupError.from_os(
            e,
            "cannot bring up the loopback interface in the sandbox's network namespace",
            "ioctl(SIOCSIFFLAGS)",
            "lo",
            hint="run `warren doctor`; the kernel refused to configure the new network namespace",
        ) from None
    _execute(plan)


def rebind_writable(path: str) -> None:
    """In the sandbox's namespaces: ``path`` now names another directory (replaced on
    the host) that the sandbox sees read-only; bind it read-write where it is, as the
    mount plan would have."""
    fd = _clone(path)
    try:
        _sys.mount_setattr(fd, _HIDE_ATTRS, 0, True)
        _sys.mount_setattr(fd, 0, _sys.MOUNT_ATTR_RDONLY, False)
    except OSError:
        os.close(fd)
        raise
    _attach(fd, path)
