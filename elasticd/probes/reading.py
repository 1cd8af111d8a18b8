"""Capacity readings: what a worker or a node said about its own capacity, and for how long that may be believed.

Pure: time is passed in (wall-clock seconds: a registry snapshot's ``generated_at`` is another host's wall clock,
so every reading is kept in that clock). Seed 001's two rules meet here:

- *report nothing rather than something old*: a reading is believed until ``max_age`` after it was taken
  (0: until replaced) or its own ``expires_at``, whichever comes first; after that it reads as no reading at
  all, and admission falls back to the open-request count;
- a probe forgets only readings of *its own* source: a back-off the passive rate-limit source recorded (a 429
  with ``Retry-After``) outlives a prometheus probe that went blind, and a tighter reading of another source
  holds while it is fresh.

Admission only ever narrows: a node is refused while any fresh reading of it says full (``used >= limit``);
a reading that says there is room never admits what something else refused.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

__all__ = ["BACKOFF", "MAX_BACKOFF", "Reading", "Readings", "Refusal", "backoff_reading", "parse_retry_after"]

BACKOFF: Final = "ratelimit"  # the passive source: a 429 answer with Retry-After
MAX_BACKOFF: Final = 300.0  # seconds: a Retry-After longer than this is believed for this long only


@dataclass(frozen=True, slots=True)
class Reading:
    """``used`` of ``limit`` at ``at``; ``expires_at``: its own end (a snapshot's ttl, a back-off's end);
    ``retry_after``: a back-off (what a refused client is told to wait)."""

    source: str
    used: float
    limit: float
    at: float
    expires_at: float | None = None
    retry_after: float | None = None

    @property
    def full(self) -> bool:
        return self.limit <= 0 or self.used >= self.limit

    @property
    def ratio(self) -> float:
        """used / limit in [0, 1] (the pool's ``capacity`` component)."""
        if self.limit <= 0:
            return 1.0
        return min(max(self.used / self.limit, 0.0), 1.0)

    def deadline(self, max_age: float) -> float:
        """When it stops being believed (``math.inf``: never, ``max_age`` 0 and no ``expires_at``). A back-off ends
        when it said it would: ``max_age`` is how long a measurement may grow old, and a back-off is none."""
        end = self.at + max_age if max_age > 0 and self.retry_after is None else math.inf
        return end if self.expires_at is None else min(end, self.expires_at)

    def fresh(self, now: float, max_age: float) -> bool:
        return now < self.deadline(max_age)

    def as_json(self, now: float) -> dict[str, object]:
        out: dict[str, object] = {"source": self.source, "used": self.used, "limit": self.limit, "at": self.at,
                                  "age": round(max(now - self.at, 0.0), 3)}
        if self.expires_at is not None:
            out["expires_at"] = self.expires_at
        if self.retry_after is not None:
            out["retry_after"] = self.retry_after
        return out


@dataclass(frozen=True, slots=True)
class Refusal:
    """A node refuses until ``until`` (the latest deadline of the fresh readings that say full); a client is
    told to retry after ``retry_after`` seconds."""

    until: float
    retry_after: int
    reading: Reading


class Readings:
    """node id → source → its latest reading; and each node's ``max_age`` (from its capacity block).

    Expired readings are dropped when next looked at, not by a timer: ``fresh``/``refusal``/``tightest`` take
    ``now``. Every change moves ``version``, which the shells' caches key on."""

    __slots__ = ("_by_node", "_max_age", "version")

    def __init__(self) -> None:
        self._by_node: dict[str, dict[str, Reading]] = {}
        self._max_age: dict[str, float] = {}
        self.version = 0

    def describe(self, node: str, max_age: float) -> None:
        """``node``'s readings are believed ``max_age`` seconds (0: until replaced)."""
        self._max_age[node] = max_age

    def max_age(self, node: str) -> float:
        return self._max_age.get(node, 5.0)

    def set(self, node: str, reading: Reading) -> None:
        self._by_node.setdefault(node, {})[reading.source] = reading
        self.version += 1

    def forget(self, node: str, source: str | None) -> bool:
        """Drop ``node``'s reading of ``source`` (None: every source). True when there was one."""
        readings = self._by_node.get(node)
        if not readings:
            return False
        if source is None:
            del self._by_node[node]
        elif readings.pop(source, None) is None:
            return False
        elif not readings:
            del self._by_node[node]
        self.version += 1
        return True

    def drop(self, node: str) -> None:
        """The node is gone (a worker stopped, a node removed by a reload): its readings and its block."""
        self.forget(node, None)
        self._max_age.pop(node, None)

    def fresh(self, node: str, now: float) -> list[Reading]:
        """``node``'s readings still believed at ``now``, expired ones dropped."""
        readings = self._by_node.get(node)
        if not readings:
            return []
        max_age = self.max_age(node)
        stale = [source for source, r in readings.items() if not r.fresh(now, max_age)]
        for source in stale:
            self.forget(node, source)
        return list(readings.values())  # (the same dict, less what was just forgotten)

    def tightest(self, node: str, now: float) -> Reading | None:
        """The fresh reading that leaves the least room (a back-off first), None without one."""
        readings = self.fresh(node, now)
        if not readings:
            return None
        return max(readings, key=lambda r: (r.retry_after is not None, r.ratio))

    def refusal(self, node: str, now: float) -> Refusal | None:
        """Why ``node`` takes no request now, None when nothing fresh says it is full."""
        full = [r for r in self.fresh(node, now) if r.full]
        if not full:
            return None
        max_age = self.max_age(node)
        until = max(r.deadline(max_age) for r in full)
        backoffs = [r.deadline(max_age) - now for r in full if r.retry_after is not None]
        wait = max(backoffs) if backoffs else 1.0
        tightest = max(full, key=lambda r: (r.retry_after is not None, r.ratio))
        return Refusal(until, max(1, math.ceil(min(wait, MAX_BACKOFF))), tightest)

    def next_deadline(self, node: str, now: float) -> float | None:
        """When the first of ``node``'s fresh readings stops being believed (None: none will by itself)."""
        max_age = self.max_age(node)
        ends = [r.deadline(max_age) for r in self.fresh(node, now)]
        ends = [end for end in ends if end != math.inf]
        return min(ends) if ends else None

    def nodes(self) -> Iterator[str]:
        return iter(list(self._by_node))


def parse_retry_after(value: bytes | str | None, now: float) -> float | None:
    """A Retry-After header's seconds from ``now``: delta-seconds or an HTTP-date; None when absent or not
    one of those. Capped at ``MAX_BACKOFF``: a node saying "a day" is believed for five minutes, then asked
    again."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isascii() and text.isdigit():
        seconds = float(int(text[:12]))
    else:
        from email.utils import parsedate_to_datetime  # (rare: most servers send delta-seconds)

        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - now
    if seconds <= 0:
        return None
    return min(seconds, MAX_BACKOFF)


def backoff_reading(seconds: float, now: float) -> Reading:
    """The passive source's reading for a 429 with ``Retry-After: seconds``: full until it ends."""
    return Reading(BACKOFF, 1.0, 1.0, now, expires_at=now + seconds, retry_after=seconds)
