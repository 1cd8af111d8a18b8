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
from collections import deque
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


class _Entry(Generic[C]):
    """One parked request."""

    __slots__ = ("at", "client", "ex", "seq", "taken", "wants")

    def __init__(self, client: C, ex: Exchange, at: float, wants: str, seq: int) -> None:
        self.client = client
        self.ex = ex
        self.at = at  # when it came
        self.wants = wants  # the worker it wants ("" any: QUEUE)
        self.seq = seq  # its place in the lot's order (times may be equal)
        self.taken = False  # taken out of turn (take_first): still in ``order`` until it reaches its head


class _Spot(Generic[C]):
    """A key's requests, oldest first, and (for ``take_first``) the same requests per the worker each wants.

    Why the second index: the oldest request a freed slot may take is the oldest of those that want any worker or
    that free one. Found by a walk from the oldest, a slot on one worker costs a look at every request ahead that
    wants another (a saturated one): a tenant could queue up to its ``queue.max`` requests of sticky users for one
    worker and have every slot of its other workers pay for all of them, in the daemon every tenant shares. Per
    wanted worker, the oldest of each is at the head of its deque: a take costs a look at one head per worker the
    group's requests want, whatever waits."""

    __slots__ = ("by_wants", "count", "order", "retry_after", "wait")

    def __init__(self) -> None:
        self.order: deque[_Entry[C]] = deque()  # oldest first; those taken out of turn dropped as they reach the head
        self.by_wants: dict[str, deque[_Entry[C]]] = {}  # wanted worker ("" any) → its requests, oldest first
        self.count = 0  # requests parked (not taken)
        self.retry_after = 0  # the longest Retry-After said for the key (FULL)
        self.wait = 0.0  # the latest patience said for the key (FULL: its reading's)

    def first(self) -> _Entry[C] | None:
        """The oldest request still parked (those taken out of turn before it dropped)."""
        order = self.order
        while order and order[0].taken:
            order.popleft()
        return order[0] if order else None

    def unindex(self, entry: _Entry[C]) -> None:
        """``entry`` leaves the per-worker index (it is the oldest of those that want what it wants: its deque's
        head), and is counted out."""
        same = self.by_wants[entry.wants]
        same.popleft()
        if not same:
            del self.by_wants[entry.wants]
        self.count -= 1


class ParkingLot(Generic[C]):
    __slots__ = ("_seq", "_spots")

    def __init__(self) -> None:
        self._spots: dict[Parked, dict[str, _Spot[C]]] = {reason: {} for reason in Parked}
        self._seq = 0

    def __len__(self) -> int:
        return sum(self.count(reason) for reason in Parked)

    def count(self, reason: Parked) -> int:
        return sum(spot.count for spot in self._spots[reason].values())

    def holds(self, reason: Parked, key: str) -> bool:
        return key in self._spots[reason]

    def depth(self, key: str) -> int:
        """Requests waiting for the group "tenant/app/group": for a worker to come (WAKE) or for room (QUEUE)."""
        spots = self._spots
        waking, queued = spots[PARKED_WAKE].get(key), spots[PARKED_QUEUE].get(key)  # (asked for every queued request)
        return (waking.count if waking is not None else 0) + (queued.count if queued is not None else 0)

    def park(self, reason: Parked, key: str, client: C, ex: Exchange, now: float, *, retry_after: int = 0,
             wait: float = 0.0, wants: str = "") -> None:
        spots = self._spots[reason]
        spot = spots.get(key)
        if spot is None:
            spot = spots[key] = _Spot()
        self._seq += 1
        entry = _Entry(client, ex, now, wants, self._seq)
        spot.order.append(entry)
        same = spot.by_wants.get(wants)
        if same is None:
            spot.by_wants[wants] = deque((entry,))
        else:
            same.append(entry)
        spot.count += 1
        if retry_after > spot.retry_after:
            spot.retry_after = retry_after
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
        (every one wants a worker that is still saturated). A look at the oldest of each wanted worker's requests,
        never a walk past those that may not go (``_Spot``)."""
        spot = self._spots[reason].get(key)
        if spot is None:
            return None
        best: _Entry[C] | None = None
        for wants, same in spot.by_wants.items():
            if wants and wants not in free and wants in known:
                continue
            head = same[0]
            if best is None or head.seq < best.seq:
                best = head
        if best is None:
            return None
        spot.unindex(best)
        best.taken = True
        if not spot.count:
            del self._spots[reason][key]
        elif len(spot.order) > 2 * spot.count + 64:
            # Those taken out of turn behind a head that stays (requests for a saturated worker) are dropped from
            # the order once they are half of it: its memory stays within twice what waits, at O(1) a take on average.
            spot.order = deque(entry for entry in spot.order if not entry.taken)
        else:
            spot.first()  # (the order's head kept untaken: the oldest is read at its head)
        return best.client, best.ex, best.at

    def release(self, reason: Parked, key: str) -> list[tuple[C, Exchange]]:
        """The spot's requests, oldest first; none are parked there afterwards."""
        spot = self._spots[reason].pop(key, None)
        if spot is None:
            return []
        return [(entry.client, entry.ex) for entry in spot.order if not entry.taken]

    def release_older(self, reason: Parked, key: str, before: float) -> list[tuple[C, Exchange]]:
        """The spot's requests parked before ``before``, oldest first; the later ones stay (each request waits its
        own time, not its first neighbour's)."""
        spot = self._spots[reason].get(key)
        if spot is None:
            return []
        out: list[tuple[C, Exchange]] = []
        while (entry := spot.first()) is not None and entry.at < before:
            spot.order.popleft()
            spot.unindex(entry)  # (the oldest parked is the oldest of those that want what it wants)
            out.append((entry.client, entry.ex))
        if not spot.count:
            del self._spots[reason][key]
        return out

    def overdue(self, reason: Parked, now: float, limit: float) -> list[str]:
        """The keys whose first parked request has waited longer than ``limit``."""
        late = []
        for key, spot in self._spots[reason].items():
            entry = spot.first()
            if entry is not None and now - entry.at > limit:
                late.append(key)
        return late
