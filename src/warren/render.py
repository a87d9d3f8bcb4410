"""Human-readable rendering of a Plan (``warren plan``). Pure string building."""

from __future__ import annotations

from .plan import MountOp, Plan, right_names


def _mount_line(op: MountOp) -> str:
    if op.kind == "root_view":
        return "root      /  <- host /, read-only, nosuid, nodev"
    if op.kind == "bind_rw":
        return f"rw bind   {op.target}  ({op.why})"
    if op.kind == "mask":
        keep = ", ".join(op.keep)
        return f"mask ro   {op.target}/*  except {keep}"
    if op.kind == "tmpfs":
        state = "read-only, empty" if op.readonly else f"mode {op.mode:o}" if op.mode is not None else ""
        return f"tmpfs     {op.target}  [{state}]  ({op.why})"
    if op.kind == "bind_dev":
        return f"device    {op.target}"
    if op.kind == "devpts":
        return f"devpts    {op.target}  (new instance)"
    if op.kind == "symlink":
        return f"symlink   {op.target} -> {op.source}"
    if op.kind == "dir":
        return f"dir       {op.target}  [mode {op.mode:o}]  ({op.why})"
    if op.kind == "bind_ro":
        return f"ro bind   {op.target}  ({op.why})"
    if op.kind == "deny_file":
        return f"deny      {op.target}  <- /dev/null ({op.why})"
    if op.kind == "proc":
        return f"proc      {op.target}  ({op.why})"
    if op.kind == "ro_self":
        return f"ro        {op.target}  ({op.why})"
    return f"{op.kind:9} {op.target}"


def render(plan: Plan) -> str:
    lines: list[str] = []
    for w in plan.warnings:
        lines.append(f"WARNING: {w}")
    lines.append("identity")
    lines.append(f"  uid_map {plan.uid_map}   gid_map {plan.gid_map}   setgroups deny")
    lines.append("  namespaces: user mount pid ipc uts net cgroup; hostname " + plan.hostname)
    lines.append("mounts (in order)")
    lines.extend(f"  {_mount_line(op)}" for op in plan.mounts)
    if plan.groups:
        lines.append("writable roots by mount")
        for at, roots in plan.groups:
            lines.append(f"  {at}: {', '.join(roots)}")
    if plan.landlock is not None:
        ll = plan.landlock
        lines.append(f"landlock (ABI {ll.abi}; handles {len(right_names(ll.handled))} rights)")
        for rule in ll.rules:
            lines.append(f"  {rule.path}: {' '.join(right_names(rule.access & ll.handled))}")
        if ll.scoped:
            lines.append("  scoped: abstract unix sockets, signals")
    else:
        lines.append("landlock: not used")
    lines.append(f"seccomp ({len(plan.seccomp.program)} BPF instructions)")
    lines.extend(f"  {line}" for line in plan.seccomp.summary())
    lines.append("process")
    lines.append(
        "  no_new_privs; all capabilities dropped; fds > 2 closed; parent-death signal"
        + ("; new session" if plan.new_session else "; terminal kept (TIOCSTI denied)")
    )
    lines.append(f"  cwd {plan.cwd}")
    if plan.create_dirs:
        lines.append(f"  create if missing: {', '.join(plan.create_dirs)}")
    lines.append(f"network: {plan.network}")
    if plan.network == "none":
        lines.append("  only lo, in the sandbox's own network namespace")
    elif plan.network == "allow":
        lines.append("  only lo; warren's proxy listens on 127.0.0.1:3128 inside and connects to:")
        lines.extend(f"    {host}" for host in plan.allow_hosts or ("(nothing: no host allowed)",))
        lines.append("  never: link-local/metadata addresses; names resolving to internal addresses")
        lines.extend(f"  resolve {name} -> {addr}" for name, addr in plan.resolve)
    else:
        lines.append("  pasta (user-mode stack) outbound; no port forwarding; host loopback not mapped")
    lines.append("environment")
    lines.extend(f"  {k}={v}" for k, v in sorted(plan.env.items()))
    return "\n".join(lines)
