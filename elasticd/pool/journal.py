"""The decision journal: every pool decision with its reason and the numbers behind it, for the operator.

Bounded per group (a deque), counted per kind for ``elasticd_pool_decisions_total{decision}``.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from elasticd.pool.policy import PoolDecision

__all__ = ["Entry", "Journal"]


@dataclass(frozen=True, slots=True)
class Entry:
    at: float  # wall-clock seconds (time.time), for people
    decision: PoolDecision

    def as_json(self) -> dict[str, Any]:
        d = self.decision
        return {"at": self.at, "decision": d.kind, "worker": d.worker, "reason": d.reason, "numbers": dict(d.numbers)}


class Journal:
    __slots__ = ("counts", "entries")

    def __init__(self, size: int = 200) -> None:
        self.entries: deque[Entry] = deque(maxlen=size)
        self.counts: Counter[str] = Counter()

    def record(self, at: float, decision: PoolDecision) -> None:
        self.entries.append(Entry(at, decision))
        self.counts[decision.kind] += 1

    def last(self, n: int = 50) -> list[dict[str, Any]]:
        return [entry.as_json() for entry in list(self.entries)[-n:]]
