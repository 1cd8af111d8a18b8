"""When a group goes down to zero workers, and how long its cold starts take. Pure: time is passed in.

Scale to zero (``min_workers: 0``): a group with no user on the surface, nothing open on its workers and no
request for ``idle_timeout`` retires its workers; its next request starts its reception again (a cold start:
the request waits in the front). A group that is neither the default nor the canary (the old one of a blue/green
switch) keeps no worker once its last user has left: new users no longer go there, so there is nothing to wait
for. An active group with ``min_workers`` above 0 never goes to zero.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

__all__ = ["COLD_BOUNDS", "ColdStarts", "idle_stop"]

# Seconds: a Python worker's start (interpreter, imports, the app) is tenths of a second to several seconds.
COLD_BOUNDS: Final[tuple[float, ...]] = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def idle_stop(*, now: float, floor: int, active: bool, workers: int, users: int, open_requests: int,
              last_active: float, idle_timeout: float) -> str | None:
    """Why the group's workers should all go now, or None. ``floor``: the workers it keeps however idle (0 for a
    group at ``min_workers: 0`` or not active); ``active``: new users go to it (default or canary);
    ``last_active``: when a request to it was last seen."""
    if floor > 0 or workers == 0 or users or open_requests:
        return None
    if not active:
        return "no user left on a group new users no longer go to"
    idle = now - last_active
    if idle < idle_timeout:
        return None
    return f"no user and no request for {idle:.0f}s (idle_timeout {idle_timeout:g}s): down to zero workers"


class ColdStarts:
    """A group's cold starts: how many, and how long each took from the first request to a routable worker
    (a histogram of per-bucket counts, cumulated when exposed)."""

    __slots__ = ("buckets", "count", "last", "sum")

    def __init__(self) -> None:
        self.count = 0
        self.sum = 0.0
        self.last: float | None = None
        self.buckets = [0] * (len(COLD_BOUNDS) + 1)

    def observe(self, seconds: float) -> None:
        self.count += 1
        self.sum += seconds
        self.last = seconds
        self.buckets[bisect_left(COLD_BOUNDS, seconds)] += 1
