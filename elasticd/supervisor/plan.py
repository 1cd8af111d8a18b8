"""What a reload does to the running groups: a pure diff of what runs against what the config asks for.

Data in (the running specs and counts, the desired ones), a ``Plan`` out. The supervisor carries it out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from elasticd.supervisor.spawn import WorkerSpec

__all__ = ["Desired", "GroupKey", "Plan", "Running", "plan"]

GroupKey = tuple[str, str, str]  # (tenant, app, group)


@dataclass(frozen=True, slots=True)
class Desired:
    """What the config asks of a group: its spec, and the bounds the elastic pool moves its size within."""

    spec: WorkerSpec
    min_workers: int
    max_workers: int | None = None
    drain_timeout: float = 300.0  # how long workers leaving the group may take to finish what is open

    def clamp(self, count: int) -> int:
        count = max(count, self.min_workers)
        return count if self.max_workers is None else min(count, self.max_workers)


@dataclass(frozen=True, slots=True)
class Running:
    spec: WorkerSpec
    count: int


@dataclass(slots=True)
class Plan:
    start: list[GroupKey] = field(default_factory=list)  # new groups
    stop: list[GroupKey] = field(default_factory=list)  # groups no longer configured
    replace: list[GroupKey] = field(default_factory=list)  # spec changed: new workers, then old ones go
    resize: list[GroupKey] = field(default_factory=list)  # same spec, a size outside the new bounds
    keep: list[GroupKey] = field(default_factory=list)  # untouched: same processes


def plan(running: Mapping[GroupKey, Running], desired: Mapping[GroupKey, Desired]) -> Plan:
    """The pool sizes groups between their bounds; a reload resizes a group only when its size left them."""
    result = Plan()
    for key, want in desired.items():
        have = running.get(key)
        if have is None:
            result.start.append(key)
        elif have.spec != want.spec:
            result.replace.append(key)
        elif want.clamp(have.count) != have.count:
            result.resize.append(key)
        else:
            result.keep.append(key)
    result.stop.extend(key for key in running if key not in desired)
    return result
