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

A spot (reason, key) remembers when each request came: ``release_older`` lets each wait its own time, ``overdue``
counts from the spot's first. The bursts' queue will park here too.
"""

from __future__ import annotations

import enum
from typing import Final, Generic, TypeVar

from elasticd.front.core.exchange import Exchange

__all__ = ["PARKED_FULL", "PARKED_MOVE", "PARKED_WAKE", "Parked", "ParkingLot"]

C = TypeVar("C")  # the client connection a request came on (the shell's)


class Parked(enum.IntEnum):
    """(An IntEnum, as relay.py's phases: bookworm's mypyc 1.0.1 compiles a module with a StrEnum into one whose
    import fails with a metaclass conflict.)"""

    MOVE = 0
    WAKE = 1
    FULL = 2


# The compiled front reads these constants, never a member: Debian bookworm's mypyc (1.0.1) names a C static for a
# member read that it never defines (see relay.py, which does the same for its phases).
PARKED_MOVE: Final[Parked] = Parked["MOVE"]
PARKED_WAKE: Final[Parked] = Parked["WAKE"]
PARKED_FULL: Final[Parked] = Parked["FULL"]


class _Spot(Generic[C]):
    __slots__ = ("requests", "retry_after", "times", "wait")

    def __init__(self) -> None:
        self.requests: list[tuple[C, Exchange]] = []
        self.times: list[float] = []  # when each came, oldest first
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

    def park(self, reason: Parked, key: str, client: C, ex: Exchange, now: float, *, retry_after: int = 0,
             wait: float = 0.0) -> None:
        spots = self._spots[reason]
        spot = spots.get(key)
        if spot is None:
            spot = spots[key] = _Spot()
        spot.requests.append((client, ex))
        spot.times.append(now)
        spot.retry_after = max(spot.retry_after, retry_after)
        spot.wait = wait

    def keys(self, reason: Parked) -> list[str]:
        return list(self._spots[reason])

    def terms(self, reason: Parked, key: str) -> tuple[int, float]:
        """(the longest Retry-After, the latest wait) said for the spot; (0, 0.0) for none."""
        spot = self._spots[reason].get(key)
        return (spot.retry_after, spot.wait) if spot is not None else (0, 0.0)

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
        return out

    def overdue(self, reason: Parked, now: float, limit: float) -> list[str]:
        """The keys whose first parked request has waited longer than ``limit``."""
        return [key for key, spot in self._spots[reason].items() if now - spot.times[0] > limit]
