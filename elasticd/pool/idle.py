"""When a group goes down to zero workers, and how long its cold starts take. Pure: time is passed in.

Scale to zero (``min_workers: 0``): a group with no user on the surface, nothing open on its workers and no
request for ``idle_timeout`` retires its workers; its next request starts its reception again (a cold start:
the request waits in the front). A group that is neither the default nor the canary (the old one of a blue/green
switch) keeps no worker once its last user has left: new users no longer go there, so there is nothing to wait
for. An active group with ``min_workers`` above 0 never goes to zero.

The cold start (``wake_rule``) answers the front, which has a request for a group with no routable worker: wait
(a worker is coming, or is started now) or refuse (503). Under the one cap (``cap.py``): a request that arrives
while the group's last workers are being retired waits for them to stop, and its cold start begins then.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable
from enum import StrEnum
from typing import Final

from elasticd.pool.cap import may_start
from elasticd.supervisor.lifecycle import COMING, COUNTED, WorkerState

__all__ = ["COLD_BOUNDS", "ColdStarts", "WakeVerdict", "idle_stop", "wake_rule"]

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


class WakeVerdict(StrEnum):
    """What a request for a group with no routable worker does: wait for a worker, or be answered 503."""

    START = "start"  # none is coming: one starts now, and the request waits for it (a cold start)
    COMING = "coming"  # a start is in flight (a cold start's, a restart, a reload's launch): wait for it
    AFTER_RETIRE = "after-retire"  # at the cap only through workers being retired: wait, start once they stopped
    DEAD = "dead"  # routable workers exist, which the front found dead: wait (the exit notice or their socket comes)
    FAILED = "failed"  # its workers failed (a crash loop): 503 until a reload
    AT_CAP = "at-cap"  # max_workers is reached by workers that are staying: 503

    @property
    def waits(self) -> bool:
        return self in _WAITING


# Every verdict but these two has the request wait in the front: a worker is coming, or will be found alive (a
# worker the front found dead is exited, and restarting, by the time the supervisor's exit notice catches up; one
# whose socket accepts again is routable again). Only a crash loop or a cap held by workers that stay answer 503.
_WAITING = frozenset({WakeVerdict.START, WakeVerdict.COMING, WakeVerdict.AFTER_RETIRE, WakeVerdict.DEAD})


def wake_rule(workers: Iterable[tuple[WorkerState, bool, bool]], *, launching: bool, counted: int,
              max_workers: int | None) -> WakeVerdict:
    """``workers``: the group's, each as (state, routable, leaving — being retired or drained away); ``launching``:
    a worker is being started for it outside its list; ``counted``: what the cap counts (the supervisor's)."""
    staying = [(state, routable) for state, routable, leaving in workers if not leaving]
    # (one a retire took out of the list and is stopping is not among ``workers``, but ``counted`` still counts it)
    if any(routable for _, routable in staying):
        return WakeVerdict.DEAD
    # (an exited one is restarting, or failing: the run loop says which in a moment, and a failure answers 503 then)
    if launching or any(state in COMING or state is WorkerState.EXITED for state, _ in staying):
        return WakeVerdict.COMING
    if any(state is WorkerState.FAILED for state, _ in staying):
        return WakeVerdict.FAILED
    if may_start(max_workers, counted):
        return WakeVerdict.START
    if counted > sum(1 for state, _ in staying if state in COUNTED):
        return WakeVerdict.AFTER_RETIRE  # what fills the cap is going: its room comes when it has stopped
    return WakeVerdict.AT_CAP
