"""Per-user consumption: what the front's forwards cost for each user. Pure: times are passed in.

Every forward the front clocks is credited to the user of its sticky cookie: cumulative ``requests`` and
``seconds`` (of forwarding), plus a ring of the last ``EPOCHS`` epochs of ``EPOCH`` seconds each, so the
monitor can show what a user does *now* (the last half minute), not only since it arrived. The ring is rolled
when a request is credited and read against the reader's clock, so an idle user's old epochs read as nothing
without any timer touching them.

A brand-new user (no cookie yet) is not on the surface: clients that keep no cookie (curl, load generators)
would otherwise add an entry per request. Its first request is still credited, to a bounded ``Newcomers``
table under the id its cookie carries; when the user comes back with that cookie and enters the surface, its
entry takes that consumption over. Ids that never come back are dropped, the oldest first, past ``capacity``
or past the surface's TTL.

Transport failures (the front's own 502/504, an answer cut by the worker) are the worker's, never the user's:
the exchange credits a user only for an answer that came from its worker (``exchange.Exchange.end``).
"""

from __future__ import annotations

from array import array
from typing import Final

__all__ = ["EPOCH", "EPOCHS", "Consumption", "Newcomers", "epoch_of"]

EPOCH: Final = 5.0  # seconds per epoch of the ring
EPOCHS: Final = 6  # epochs kept: "recent" is the last 30 s
NEWCOMERS: Final = 4096  # ids waiting for their cookie to come back, at most
_EMPTY: Final = [0.0] * (2 * EPOCHS)


def epoch_of(now: float) -> int:
    return int(now // EPOCH)


class Consumption:
    """One user's requests and seconds: cumulative, and per epoch over the last ``EPOCHS`` epochs.

    The ring is one array of doubles, each epoch's request count in ``[slot]`` and its seconds in
    ``[EPOCHS + slot]``: the surface holds one of these per user, and one fixed block (176 bytes) is a third
    of what two lists of boxed numbers cost."""

    __slots__ = ("epoch", "requests", "ring_counts", "seconds")

    def __init__(self) -> None:
        self.requests = 0
        self.seconds = 0.0
        self.epoch = 0  # the newest epoch the ring holds; slot ``e % EPOCHS`` holds epoch e of the last EPOCHS
        self.ring_counts = array("d", _EMPTY)

    def add(self, seconds: float, now: float) -> None:
        """Credit one forward of ``seconds``, ended at ``now``."""
        epoch = int(now // EPOCH)
        if epoch != self.epoch:
            self._roll(epoch)
        slot = epoch % EPOCHS
        recent = self.ring_counts
        recent[slot] += 1.0
        recent[EPOCHS + slot] += seconds
        self.requests += 1
        self.seconds += seconds

    def _roll(self, epoch: int) -> None:
        """Move the ring to ``epoch``: the slots of the epochs skipped (and of the one entered) start empty."""
        gap = epoch - self.epoch
        recent = self.ring_counts
        if gap <= 0 or gap >= EPOCHS:  # (gap < 0 only if the clock went back: start over rather than mix)
            for slot in range(2 * EPOCHS):
                recent[slot] = 0.0
        else:
            for skipped in range(self.epoch + 1, epoch + 1):
                slot = skipped % EPOCHS
                recent[slot] = 0.0
                recent[EPOCHS + slot] = 0.0
        self.epoch = epoch

    def ring(self, now: float) -> list[tuple[int, float]]:
        """(requests, seconds) of each of the last ``EPOCHS`` epochs up to ``now``'s, the oldest first; an epoch
        the ring no longer holds (the user was idle since) reads (0, 0.0)."""
        current = int(now // EPOCH)
        out: list[tuple[int, float]] = []
        for epoch in range(current - EPOCHS + 1, current + 1):
            if self.epoch - EPOCHS < epoch <= self.epoch:
                slot = epoch % EPOCHS
                out.append((int(self.ring_counts[slot]), self.ring_counts[EPOCHS + slot]))
            else:
                out.append((0, 0.0))
        return out

    def recent(self, now: float) -> tuple[int, float]:
        """Requests and seconds over the last ``EPOCHS`` epochs (the one under way included)."""
        ring = self.ring(now)
        return sum(r for r, _ in ring), sum(s for _, s in ring)

    def absorb(self, other: Consumption) -> None:
        """Take over ``other``'s consumption (a newcomer's first request, when its user enters the surface)."""
        self.requests += other.requests
        self.seconds += other.seconds
        if other.requests and other.epoch > self.epoch:
            self._roll(other.epoch)
        for epoch in range(other.epoch - EPOCHS + 1, other.epoch + 1):
            if self.epoch - EPOCHS < epoch <= self.epoch:
                slot = epoch % EPOCHS
                self.ring_counts[slot] += other.ring_counts[slot]
                self.ring_counts[EPOCHS + slot] += other.ring_counts[EPOCHS + slot]

    def __repr__(self) -> str:
        return f"Consumption(requests={self.requests}, seconds={self.seconds:.6f})"


class Newcomers:
    """Consumption of users given a cookie and not seen back yet, by id: bounded, the oldest dropped first."""

    __slots__ = ("capacity", "seen", "used")

    def __init__(self, capacity: int = NEWCOMERS) -> None:
        self.capacity = capacity
        self.used: dict[str, Consumption] = {}
        self.seen: dict[str, float] = {}  # id → when its first request ended (insertion order is age order)

    def __len__(self) -> int:
        return len(self.used)

    def credit(self, user: str, seconds: float, now: float) -> None:
        used = self.used.get(user)
        if used is None:
            if len(self.used) >= self.capacity:
                oldest = next(iter(self.seen))
                del self.seen[oldest]
                del self.used[oldest]
            used = self.used[user] = Consumption()
            self.seen[user] = now
        used.add(seconds, now)

    def claim(self, user: str) -> Consumption | None:
        """The user came back with its cookie: its consumption so far, handed over (and forgotten here)."""
        used = self.used.pop(user, None)
        if used is not None:
            del self.seen[user]
        return used

    def expire(self, horizon: float) -> int:
        """Drop the ids whose first request ended before ``horizon``; how many went."""
        gone = 0
        for user, at in list(self.seen.items()):
            if at >= horizon:
                break
            del self.seen[user]
            del self.used[user]
            gone += 1
        return gone
