"""A request's policy, resolved for a sandbox booted ahead and reused by the run that
takes it while the kernel says nothing it was resolved from changed.

A run given a booted sandbox plans its request again, to know the sandbox is the one a
launch would make now (``ahead``); resolving the policy is about half of that (the
config files read and parsed, every path of the default deny list and of the places
the host runs programs from resolved), a few milliseconds on the run's path. What a
resolution reads of the host goes through ``policy.lookups``: paths looked up, deny
globs' directories listed, config files read. So, at the boot, the policy is resolved
once to learn those, they are watched (``markwatch``: each name looked up, in its
directory, links followed; each listed directory's new entries; the mount table), and
the policy is resolved again under the watch: equal, and resting on the same lookups,
it is kept. A change after the watch began is queued there.

At the run, the kept policy stands for a fresh resolution only where the request's own
words and its caller are equal (the spec, the environment, home, cwd, the config and
profile asked), nothing of the watch is queued or lost, every config file read then
reads the same bytes now (an edit in place changes no name), and the machine's CPU
count and memory are the same; else the policy is resolved again, as before. The host
facts are gathered afresh either way (``planning.host_facts``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import WarrenError
from ..plan import CallerFacts
from ..policy import Policy, config, lookups
from ..policy.limits import cpu_count, mem_total
from .markwatch import MarkWatch, lookups_of

Key = tuple[object, ...]


def key(spec: dict[str, object], caller: CallerFacts, config: bool, profile: str | None) -> Key:
    """Everything of a request a resolution takes besides the host."""
    return (json.dumps(spec, sort_keys=True, default=str), caller, config, profile)


@dataclass
class PolicyMemo:
    key: Key
    policy: Policy
    read: dict[str, bytes | None]  # the config files read, as read (None: absent)
    machine: tuple[int, int]  # cpu_count, mem_total
    watch: MarkWatch

    def policy_for(self, asked: Key) -> Policy | None:
        """The kept policy, where a resolution of ``asked`` now would make it; else None."""
        if asked != self.key or not self.watch.unchanged():
            return None
        if (cpu_count(), mem_total()) != self.machine:
            return None
        for path, then in self.read.items():
            try:
                now = lookups.read_file(Path(path), config.MAX_CONFIG)
            except OSError:
                return None
            if now != then:
                return None
        return self.policy

    def close(self) -> None:
        self.watch.close()


def make(asked: Key, resolve: Callable[[], Policy]) -> PolicyMemo | None:
    """Resolve (``resolve``) twice, the second time under a watch of what the first
    looked at; the memo where both agree, else None (nothing kept, nothing raised: the
    run resolves as before)."""
    try:
        with lookups.recording() as first:
            policy = resolve()
    except WarrenError:
        return None
    if first.loose:
        return None
    watch = MarkWatch.over(lookups_of(first.paths, first.listed))
    if watch is None:
        return None
    machine = (cpu_count(), mem_total())
    try:
        with lookups.recording() as second:
            again = resolve()
    except WarrenError:
        watch.close()
        return None
    same = (second.paths, second.listed, second.read) == (first.paths, first.listed, first.read)
    if not same or again != policy:
        watch.close()
        return None
    return PolicyMemo(asked, again, dict(second.read), machine, watch)
