"""The front's one parking lot: requests that wait in the front, unforwarded, each under a reason and a key, in the
order they came, until their reason is over or their patience runs out. No I/O; time is passed in.

Three reasons park a request (``dispatch.decide`` says which):

- ``MOVE``: its user is being moved (a live move, pool/move_machine.py); key: the user. The move's end releases them, to
  wherever the user is then; the move's own deadline (``server.move_timeout``) should come first, and the front's
  tick is only the guard behind it.
- ``WAKE``: its group is at zero workers and one is starting; key: "tenant/app/group". The worker's coming up
  releases them; a start that fails, or takes longer than ``request_timeout``, has them answered 503.
- ``FULL``: every worker it may go to says it is full (a capacity reading, seed 001); key: the full worker's id (a
  sticky user's) or "tenant/app/group" (a new user's). A reading that no longer refuses releases them; each
  request that waited its reading's ``wait`` is answered 503 with the longest Retry-After said for the key.

- ``QUEUE``: every routable worker it may go to has as many requests in flight as its group's ``concurrency``
  (``ForwardCounters.saturated``); key: "tenant/app/group", and each request says the worker it ``wants`` (a
  sticky user's: its state lives there) or "" (any worker of the group). A slot coming free on a worker gives it
  to the oldest request that wants that worker or any (``take_first``); a request that waited the group's
  ``queue.timeout`` is answered 503 with Retry-After, and one that finds ``queue.max`` waiting (WAKE and QUEUE
  together: ``depth``) is answered so at once.

A spot (reason, key) remembers when each request came: ``release_older`` lets each wait its own time, ``overdue``
counts from the spot's first.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Final, Generic, TypeVar

from elasticd.front.core.exchange import Exchange

__all__ = ["PARKED_FULL", "PARKED_MOVE", "PARKED_QUEUE", "PARKED_WAKE", "Parked", "ParkingLot"]

C = TypeVar("C")  # the client connection a request came on (the shell's)


class Parked(enum.IntEnum):
    """(An IntEnum, as relay.py's phases: bookworm's mypyc 1.0.1 compiles a module with a StrEnum into one whose
    import fails with a metaclass conflict.)"""

    MOVE = 0
    WAKE = 1
    FULL = 2
    QUEUE = 3


# The compiled front reads these constants, never a member: Debian bookworm's mypyc (1.0.1) names a C static for a
# member read that it never defines (see relay.py, which does the same for its phases).
PARKED_MOVE: Final[Parked] = Parked["MOVE"]
PARKED_WAKE: Final[Parked] = Parked["WAKE"]
PARKED_FULL: Final[Parked] = Parked["FULL"]
PARKED_QUEUE: Final[Parked] = Parked["QUEUE"]


class _Spot(Generic[C]):
    __slots__ = ("requests", "retry_after", "times", "wait", "wants")

    def __init__(self) -> None:
        self.requests: list[tuple[C, Exchange]] = []
        self.times: list[float] = []  # when each came, oldest first
        self.wants: list[str] = []  # the worker each wants ("" any: QUEUE)
        self.retry_after = 0  # the longest Retry-After said for the key (FULL)
        self.wait = 0.0  # the latest patience said for the key (FULL: its reading's)


class ParkingLot(Generic[C]):
    __slots__ = ("_spots",)

    def __init__(self) -> None:
        self._spots: dict[Parked, dict[str, _Spot[C]]] = {reason: {} for reason in Parked}

    def __len__(self) -> int:
        return sum(self.count(reason) for reason in Parked)

    def count(self, reason: Parked) -> int:
        return sum(len(spot.requests) for spot in self._spots[reason].values())

    def holds(self, reason: Parked, key: str) -> bool:
        return key in self._spots[reason]

    def depth(self, key: str) -> int:
        """Requests waiting for the group "tenant/app/group": for a worker to come (WAKE) or for room (QUEUE)."""
        spots = self._spots
        waking, queued = spots[PARKED_WAKE].get(key), spots[PARKED_QUEUE].get(key)  # (asked for every queued request)
        return (len(waking.requests) if waking is not None else 0) + (len(queued.requests) if queued is not None else 0)

    def park(self, reason: Parked, key: str, client: C, ex: Exchange, now: float, *, retry_after: int = 0,
             wait: float = 0.0, wants: str = "") -> None:
        spots = self._spots[reason]
        spot = spots.get(key)
        if spot is None:
            spot = spots[key] = _Spot()
        spot.requests.append((client, ex))
        spot.times.append(now)
        spot.wants.append(wants)
        spot.retry_after = max(spot.retry_after, retry_after)
        spot.wait = wait

    def keys(self, reason: Parked) -> list[str]:
        return list(self._spots[reason])

    def terms(self, reason: Parked, key: str) -> tuple[int, float]:
        """(the longest Retry-After, the latest wait) said for the spot; (0, 0.0) for none."""
        spot = self._spots[reason].get(key)
        return (spot.retry_after, spot.wait) if spot is not None else (0, 0.0)

    def take_first(self, reason: Parked, key: str, free: Collection[str],
                   known: Collection[str]) -> tuple[C, Exchange, float] | None:
        """The oldest request of the spot that may take a slot on one of the ``free`` workers (the caller's: at
        least one): one that wants any (""), one whose wanted worker is free, or one whose wanted worker is no longer
        ``known`` (it went: dispatch places the request again); taken out, with when it came. None when none may
        (every one wants a worker that is still saturated). The common spot, every request wanting any, is
        answered by its first: no scan."""
        spot = self._spots[reason].get(key)
        if spot is None:
            return None
        for i, wants in enumerate(spot.wants):
            if not wants or wants in free or wants not in known:
                client, ex = spot.requests.pop(i)
                came = spot.times.pop(i)
                del spot.wants[i]
                if not spot.requests:
                    del self._spots[reason][key]
                return client, ex, came
        return None

    def release(self, reason: Parked, key: str) -> list[tuple[C, Exchange]]:
        """The spot's requests, oldest first; none are parked there afterwards."""
        spot = self._spots[reason].pop(key, None)
        return spot.requests if spot is not None else []

    def release_older(self, reason: Parked, key: str, before: float) -> list[tuple[C, Exchange]]:
        """The spot's requests parked before ``before``, oldest first; the later ones stay (each request waits its
        own time, not its first neighbour's)."""
        spot = self._spots[reason].get(key)
        if spot is None:
            return []
        times = spot.times
        n = 0
        while n < len(times) and times[n] < before:
            n += 1
        if n == len(times):
            return self.release(reason, key)
        out, spot.requests, spot.times = spot.requests[:n], spot.requests[n:], times[n:]
        spot.wants = spot.wants[n:]
        return out

    def overdue(self, reason: Parked, now: float, limit: float) -> list[str]:
        """The keys whose first parked request has waited longer than ``limit``."""
        return [key for key, spot in self._spots[reason].items() if now - spot.times[0] > limit]
