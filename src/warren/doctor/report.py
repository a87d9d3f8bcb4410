"""The doctor's output: one JSON document with a stable schema, and a table for people.

Schema ``warren-doctor/1`` (documented in ``SCHEMA.md`` beside this file). Adding keys
is compatible; renaming or removing one, or changing a cause id, needs a new version.
"""

from __future__ import annotations

import errno as _errno
from collections.abc import Sequence

from .diagnose import Cause, refer_blocked
from .evidence import Evidence
from .limits import LOCATION as LIMITS
from .probes import ProbeResult

SCHEMA = "warren-doctor/1"
STATUSES = ("pass", "fail", "warn", "skip", "error")
_WHYS_SHOWN = 2


def final_status(r: ProbeResult, cause: Cause | None) -> str:
    """``fail`` only when a tool needs it and the environment broke it. A failure of an
    optional probe, or one that a genuinely different filesystem explains (the host
    behaves the same; tools fall back to copying), is a ``warn``."""
    if r.status == "fail" and (not r.required or (cause is not None and cause.id == "cross_device")):
        return "warn"
    if r.status == "error" and not r.required:
        return "warn"
    return r.status


def build(
    evidence: Evidence, results: Sequence[ProbeResult], causes: Sequence[Cause | None]
) -> dict[str, object]:
    probes: list[dict[str, object]] = []
    grouped: dict[str, dict[str, object]] = {}
    for r, cause in zip(results, causes, strict=True):
        status = final_status(r, cause)
        row = r.to_dict()
        row["status"] = status
        row["errno_name"] = None if r.errno is None else _errno.errorcode.get(r.errno)
        row["cause"] = None if cause is None else cause.to_dict()
        probes.append(row)
        if cause is not None:
            entry = grouped.setdefault(
                cause.id,
                {"id": cause.id, "title": cause.title, "fix": cause.fix, "explanations": [], "probes": []},
            )
            probes_of = entry["probes"]
            explanations = entry["explanations"]
            assert isinstance(probes_of, list) and isinstance(explanations, list)
            probes_of.append(f"{r.location}:{r.id}")
            if cause.explanation not in explanations:
                explanations.append(cause.explanation)
    summary = {s: sum(1 for p in probes if p["status"] == s) for s in STATUSES}
    return {
        "schema": SCHEMA,
        "ok": summary["fail"] == 0 and summary["error"] == 0,
        "summary": summary,
        "process": evidence.process.to_dict(),
        "inferred": {"landlock_refer_blocked": refer_blocked(evidence, results)},
        "locations": [loc.to_dict() for loc in evidence.locations],
        "probes": probes,
        "causes": list(grouped.values()),
    }


def _wrap(text: str, indent: str, width: int = 100) -> list[str]:
    lines, line = [], ""
    for word in text.split():
        if line and len(indent) + len(line) + 1 + len(word) > width:
            lines.append(indent + line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    if line:
        lines.append(indent + line)
    return lines


def _shown(status: str) -> str:
    return status.upper() if status in ("fail", "error") else status


def _render_limits(rows: list[dict[str, object]], uid: object) -> list[str]:
    """One entry per mechanism: what was measured and, where it is missing, what that
    means for warren; then each hint once."""
    if not rows:
        return []
    out = [
        "",
        f"{'RESOURCE LIMITS':<18} {'RESULT':<6} WHAT THIS HOST OFFERS UID {uid} (`warren plan` applies it)",
    ]
    indent = " " * 26
    hints: dict[str, str] = {}
    for p in rows:
        cause = p["cause"]
        if isinstance(cause, dict):
            text = str(cause["explanation"])
            hints.setdefault(str(cause["id"]), str(cause["fix"]))
        else:
            text = str(p["message"] or p["detail"])
        lines = _wrap(text, indent) or [indent]
        out.append(f"{p['id']:<18} {_shown(str(p['status'])):<6} {lines[0].strip()}")
        out.extend(lines[1:])
    for cause_id, fix in hints.items():
        out.extend(_wrap(f"hint [{cause_id}]: {fix}", "  "))
    return out


def render(report: dict[str, object]) -> str:
    """The table: one row per probe (pass / FAIL / warn / skip / ERROR, and the cause),
    then each cause once with its evidence and its fix."""
    out: list[str] = []
    proc = report["process"]
    assert isinstance(proc, dict)
    out.append(
        f"warren doctor: uid {proc['uid']}, kernel {proc['kernel']}, Landlock ABI {proc['landlock_abi']}, "
        f"seccomp {proc['seccomp']}, no_new_privs {proc['no_new_privs']}, "
        f"user namespace {'yes (' + str(proc['uid_map']) + ')' if proc['user_namespace'] else 'no'}"
    )
    locations = report["locations"]
    assert isinstance(locations, list)
    for loc in locations:
        where = loc["path"] if loc["exists"] else f"{loc['path']} (absent; probed in {loc['probe_dir']})"
        out.append(
            f"  {loc['role']:<18} {where}  [{loc['fstype']}, mount {loc['mount_id']}, dev {loc['dev']}"
            f"{', ro' if loc['read_only'] else ''}]"
        )
    out.append("")
    all_probes = report["probes"]
    assert isinstance(all_probes, list)
    probes = [p for p in all_probes if p["location"] != LIMITS]
    wid = max([len(str(p["location"])) for p in probes] + [8])
    out.append(f"{'PROBE':<26} {'WHERE':<{wid}} {'RESULT':<6} CAUSE / DETAIL")
    for p in probes:
        status = str(p["status"])
        shown = status.upper() if status in ("fail", "error") else status
        cause = p["cause"]
        if isinstance(cause, dict):
            note = f"{cause['id']}: {p['operation']} -> {p['errno_name'] or p['message']}"
        else:
            note = str(p["message"] or p["detail"] or "")
        out.append(f"{p['id']:<26} {p['location']:<{wid}} {shown:<6} {note}".rstrip())
    out.extend(_render_limits([p for p in all_probes if p["location"] == LIMITS], proc["uid"]))
    causes = report["causes"]
    assert isinstance(causes, list)
    # The limits section already gave each of its causes and hints.
    causes = [c for c in causes if any(not str(where).startswith(LIMITS + ":") for where in c["probes"])]
    if causes:
        out.append("")
        out.append("Causes:")
        for c in causes:
            out.append(f"  [{c['id']}] {c['title']} ({len(c['probes'])} probe(s))")
            whys = c["explanations"]
            for why in whys[:_WHYS_SHOWN]:
                out.extend(_wrap("why: " + why, "      "))
            if len(whys) > _WHYS_SHOWN:
                out.append(f"      (+{len(whys) - _WHYS_SHOWN} more alike: see --json)")
            out.extend(_wrap("fix: " + c["fix"], "      "))
    summary = report["summary"]
    assert isinstance(summary, dict)
    counts = ", ".join(f"{summary[s]} {s}" for s in STATUSES if summary[s])
    verdict = (
        "OK: everything developer tools need works here"
        if report["ok"]
        else "NOT OK: something developer tools need is broken"
    )
    out.append("")
    out.append(f"{verdict} ({counts})")
    return "\n".join(out)
