"""Human-readable rendering of a Plan (``warren plan``). Pure string building."""

from __future__ import annotations

from ..policy.limits import show_size
from .landlock import right_names
from .limits import render as render_limits
from .model import MountKind, MountOp, Plan

_K = MountKind


SHOWN = 50  # files given an inode of their own listed by name (a local clone has thousands)


# The kinds whose line is one pattern of the op's fields; the others are built below.
_LINES = {
    _K.ROOT_VIEW: "root      /  <- host /, read-only, nosuid, nodev",
    _K.DENY_PATH: "deny      {op.target}  <- hidden as what it is at launch: an empty directory or "
    "file ({op.why})",
    _K.BIND_RW: "rw bind   {op.target}  ({op.why})",
    _K.BIND_RO: "ro bind   {op.target}  ({op.why})",
    _K.BIND_DEV: "device    {op.target}",
    _K.DEVPTS: "devpts    {op.target}  (new instance)",
    _K.SYMLINK: "symlink   {op.target} -> {op.source}",
    _K.DENY_FILE: "deny      {op.target}  <- an empty mode-000 file: EACCES ({op.why})",
    _K.PROC: "proc      {op.target}  ({op.why})",
    _K.SHADOW: "shadow    {op.target}  <- a read-only tmpfs, its entries bound back ({op.why})",
    _K.MIRROR: "mirror    {op.target}  <- {op.source} as inside ({op.why})",
}


def _mount_line(op: MountOp) -> str:
    if op.kind in (_K.BIND_RW, _K.BIND_RO) and op.source and op.source != op.target:
        rw = "rw" if op.kind is _K.BIND_RW else "ro"
        return f"{rw} bind   {op.target}  <- host {op.source} ({op.why})"
    if op.kind in _LINES:
        return _LINES[op.kind].format(op=op)
    if op.kind is _K.OVERLAY:
        return f"root      /  <- overlay of {', '.join(op.layers)} (topmost first) ({op.why})"
    if op.kind is _K.REVIEW:
        return f"overlay   {op.target}  <- host {op.source}, read-only, under {op.layers[0]} ({op.why})"
    if op.kind is _K.MASK:
        return f"mask ro   {op.target}/*  except {', '.join(op.keep)}"
    if op.kind is _K.TMPFS:
        state = "read-only, empty" if op.readonly else f"mode {op.mode:o}" if op.mode is not None else ""
        if op.size is not None:
            state += f", size={show_size(op.size)}"
        return f"tmpfs     {op.target}  [{state}]  ({op.why})"
    if op.kind is _K.DIR:
        return f"dir       {op.target}  [mode {op.mode or 0o755:o}]  ({op.why})"
    if op.kind is _K.SEED:
        return f"file      {op.target}  (if missing: {op.why})"
    return f"ro        {op.target}  ({op.why})"


def _degraded(plan: Plan) -> list[str]:
    lines = ["mode: DEGRADED (no namespaces on this host; the command runs in the host's view)"]
    lines.append("  held: Landlock (below), seccomp and the broker, no_new_privs, no capabilities, limits")
    lines.append("  not held here:")
    for protection, instead in plan.not_held:
        lines.append(f"    {protection}: {instead}")
    lines.append(
        "  refuse instead: --require-namespaces (or require_namespaces = true); why: `warren doctor`"
    )
    lines.append(f"identity: your own (uid {plan.uid}, gid {plan.gid}); no mounts")
    return lines


def render(plan: Plan) -> str:
    lines: list[str] = []
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    lines.extend(f"note: {n}" for n in plan.notes)
    if not plan.namespaces:
        lines.extend(_degraded(plan))
    else:
        lines.append("identity")
        lines.append(f"  uid_map {plan.uid_map}   gid_map {plan.gid_map}   setgroups deny")
        lines.append(
            "  namespaces: user mount pid ipc uts net cgroup; hostname "
            + (plan.hostname or "the host's (changes inside stay inside)")
        )
        lines.append("mounts (in order)")
        lines.extend(f"  {_mount_line(op)}" for op in plan.mounts)
    if plan.groups and plan.namespaces:
        lines.append("writable roots by mount")
        for at, roots in plan.groups:
            lines.append(f"  {at}: {', '.join(roots)}")
    if plan.guarded:
        lines.append(
            "ancestor directories on a shared mount (the broker refuses changes to their metadata; "
            "a last line: mode and times restored, with a warning)"
        )
        lines.append(f"  {', '.join(plan.guarded)}")
    if plan.git or plan.git_files:
        lines.append("git repositories (no host git runs what a sandbox writes)")
        for git in plan.git:
            lines.append(f"  {git.path}: its top level inside (config, hooks, HEAD, index) is {git.tree}")
            lines.append(f"    shared with the host: {', '.join(git.shared)}")
        for path in plan.git_files:
            lines.append(f"  {path}: read-only (it names the git directory host git uses)")
        lines.append(
            "    synced back: data files (HEAD checked, an index naming an unprotected submodule held) and"
        )
        lines.append(
            "    of the config only naming keys (remotes, branches, user.*); repositories made inside"
        )
        lines.append("    are adopted (config and hooks into warren's store) when the sandbox ends")
    if plan.unshare:
        lines.append(
            "hard links to files outside the writable roots (each workspace name gets a copy of "
            "its own before launch; the outside file is left as it is)"
        )
        lines.extend(f"  own inode {path}" for path, _dev, _ino in plan.unshare[:SHOWN])
        if len(plan.unshare) > SHOWN:
            lines.append(f"  ... and {len(plan.unshare) - SHOWN} more (--json lists all)")
    if plan.landlock is not None:
        ll = plan.landlock
        lines.append(f"landlock (ABI {ll.abi}; handles {len(right_names(ll.handled))} rights)")
        for rule in ll.rules:
            lines.append(f"  {rule.path}: {' '.join(right_names(rule.access & ll.handled))}")
            if rule.excluding:
                lines.append(f"    except (unreadable even if created later): {', '.join(rule.excluding)}")
        if ll.scoped:
            lines.append("  scoped: abstract unix sockets, signals")
        if ll.handled_net:
            lines.append("  TCP: bind and connect handled, no port granted (refused)")
    else:
        lines.append("landlock: not used")
    lines.append(f"seccomp ({len(plan.seccomp.program)} BPF instructions)")
    lines.extend(f"  {line}" for line in plan.seccomp.summary())
    lines.append("syscall broker (PID 1 answers these, by the object reached: seccomp user notification)")
    if plan.namespaces:
        lines.append(
            "  unix sockets: connect/sendto/sendmsg to a pathname socket only inside the writable roots or "
            "the private /tmp, /dev/shm (else EACCES); abstract ones stay in the sandbox's network namespace"
        )
    else:
        lines.append(
            "  unix sockets: connect/sendto/sendmsg to a pathname socket only inside the writable roots "
            "(else EACCES); to an abstract address never (EACCES: the host's are in the same namespace)"
        )
    lines.append(
        "  metadata: chmod, utimensat, xattrs only inside the writable roots or the private tmpfs (else "
        "EPERM, EROFS on a read-only mount): ancestors of a shared mount stay as they are"
    )
    if plan.renames:
        lines.append(
            "  renames of directories on the image's root: where the overlay says EXDEV (a directory of "
            "the image), a move of the tree (same result, not atomic for an observer of the source)"
        )
    if plan.limits is not None:
        lines.extend(render_limits(plan.limits))
    lines.append("process")
    lines.append(
        "  each command: own session (a pty made inside when you are on a terminal), no_new_privs, "
        "all capabilities dropped, fds > 2 closed, its own Landlock domain (it cannot signal or "
        "trace PID 1 or warren's helpers)"
    )
    lines.append(f"  cwd {plan.cwd}   (workspace {plan.workspace})")
    if plan.create_dirs:
        lines.append(f"  create if missing: {', '.join(plan.create_dirs)}")
    lines.append(f"  TMPDIR {plan.env.get('TMPDIR', '')}")
    if plan.scratch:
        lines.append(
            "    made outside the workspace on its mount (the host's TMPDIR shares that mount, so renames "
            "into the workspace work as there), mode 0700, removed when the sandbox ends"
        )
    else:
        lines.append("    the private tmpfs /tmp")
    if plan.repository:
        lines.append(
            f"  note: the workspace lies in the git repository {plan.repository}, whose .git is read-only "
            f"here: git reads it, commits fail; use --workspace {plan.repository}, or "
            f"--write {plan.repository}/.git if you mean it"
        )
    lines.append(f"network: {plan.net.mode}")
    if not plan.namespaces:
        lines.append("  the host's network namespace (the degraded mode):")
        if plan.net.mode == "none":
            lines.append("  no IP socket (seccomp), no TCP bind or connect (Landlock, the broker)")
        elif plan.net.mode == "allow":
            lines.append(
                f"  only warren's proxy on 127.0.0.1:{plan.net.proxy_port} (the broker refuses every other "
                "address; no TCP bind), which connects to:"
            )
            lines.extend(f"    {host}" for host in plan.net.hosts or ("(nothing: no host allowed)",))
        else:
            lines.append("  outbound as the host, its loopback included")
    elif plan.net.mode == "none":
        lines.append("  only lo, in the sandbox's own network namespace")
    elif plan.net.mode == "allow":
        lines.append("  only lo; warren's proxy listens on 127.0.0.1:3128 inside and connects to:")
        lines.extend(f"    {host}" for host in plan.net.hosts or ("(nothing: no host allowed)",))
        lines.append("  never: link-local/metadata addresses; names resolving to internal addresses")
        if plan.net.ask_timeout is not None:
            lines.append(
                f"  ask: a connection to another host waits up to {plan.net.ask_timeout:g} s for "
                "`warren net NAME approve` (a one-shot run asks on its terminal, else refuses at once)"
            )
        lines.extend(f"  resolve {name} -> {addr}" for name, addr in plan.net.resolve)
        for s in plan.net.secrets:
            lines.append(
                f"  secret {s.name} (from {s.source}): put in by the proxy for {', '.join(s.hosts)} only, "
                "over HTTPS; inside, a placeholder"
            )
        lines.extend(f"  http rule: {r.text}" for r in plan.net.http_rules)
        if plan.net.intercepts:
            hosts = sorted(
                {*(h for s in plan.net.secrets for h in s.hosts), *(r.host for r in plan.net.http_rules)}
            )
            lines.append(
                f"  TLS intercepted for {', '.join(hosts)} with this sandbox's own CA "
                f"(trusted inside through {plan.net.bundle_target} and the tools' variables)"
            )
    else:
        lines.append("  pasta (user-mode stack) outbound; no port forwarding; host loopback not mapped")
    lines.append("environment")
    lines.extend(f"  {k}={v}" for k, v in sorted(plan.env.items()))
    return "\n".join(lines)
