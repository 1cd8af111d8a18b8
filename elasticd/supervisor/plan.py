"""What a reload does to the running groups: a pure diff of what runs against what the config asks for.

Data in (the running specs and counts, the desired ones), a ``Plan`` out. The supervisor carries it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elasticd.supervisor.spawn import WorkerSpec

__all__ = ["Desired", "GroupKey", "Plan", "plan"]

GroupKey = tuple[str, str, str]  # (tenant, app, group)


@dataclass(frozen=True, slots=True)
class Desired:
    spec: WorkerSpec
    count: int


@dataclass(slots=True)
class Plan:
    start: list[GroupKey] = field(default_factory=list)  # new groups
    stop: list[GroupKey] = field(default_factory=list)  # groups no longer configured
    replace: list[GroupKey] = field(default_factory=list)  # spec changed: new workers, then old ones go
    resize: list[GroupKey] = field(default_factory=list)  # same spec, other count
    keep: list[GroupKey] = field(default_factory=list)  # untouched: same processes

    def removed_apps(self, desired: Mapping[GroupKey, Desired]) -> set[tuple[str, str]]:
        """(tenant, app) pairs whose every group goes away: their leaves can be removed once drained."""
        remaining = {(t, a) for t, a, _ in desired}
        return {(t, a) for t, a, _ in self.stop if (t, a) not in remaining}


def plan(running: Mapping[GroupKey, Desired], desired: Mapping[GroupKey, Desired]) -> Plan:
    result = Plan()
    for key, want in desired.items():
        have = running.get(key)
        if have is None:
            result.start.append(key)
        elif have.spec != want.spec:
            result.replace.append(key)
        elif have.count != want.count:
            result.resize.append(key)
        else:
            result.keep.append(key)
    result.stop.extend(key for key in running if key not in desired)
    return result
