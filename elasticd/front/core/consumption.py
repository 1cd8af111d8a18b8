"""Per-user consumption: what the front's forwards cost for each user. Pure: times are passed in.

Every forward the front clocks is credited to the user of its sticky cookie: cumulative ``requests`` and
``seconds`` (of forwarding), plus a ring of the last ``EPOCHS`` epochs of ``EPOCH`` seconds each, so the
monitor can show what a user does *now* (the last half minute), not only since it arrived. The ring is rolled
when a request is credited and read against the reader's clock, so an idle user's old epochs read as nothing
without any timer touching them.

A brand-new user (no cookie yet) is not on the surface: clients that keep no cookie (curl, load generators)
would otherwise add an entry per request. Its first request is still credited, to a bounded ``Newcomers``
table under the id its cookie carries; when the user comes back with that cookie and enters the surface, its
entry takes that request over. Ids that never come back are dropped, the oldest first, past ``capacity`` or
past the surface's TTL.

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

    The epoch under way is two plain attributes (``now_requests``, ``now_seconds``): ``add``, once per request,
    compares one float and adds to four numbers, nothing boxed in an array. The epochs before it are one array
    of doubles (each epoch's request count in ``[slot]``, its seconds in ``[EPOCHS + slot]``), written when the
    epoch changes: the surface holds one of these per user, and one fixed block (176 bytes) is a third of what
    two lists of boxed numbers cost."""

    __slots__ = ("ends", "epoch", "now_requests", "now_seconds", "requests", "ring_counts", "seconds")

    def __init__(self) -> None:
        self.requests = 0
        self.seconds = 0.0
        self.epoch = 0  # the epoch under way; slot ``e % EPOCHS`` of the ring holds each earlier one of the last EPOCHS
        self.ends = EPOCH  # when the epoch under way ends
        self.now_requests = 0  # the epoch under way's
        self.now_seconds = 0.0
        self.ring_counts = array("d", _EMPTY)

    def add(self, seconds: float, now: float) -> None:
        """Credit one forward of ``seconds``, ended at ``now``."""
        if now >= self.ends or now < self.ends - EPOCH:
            self._roll(int(now // EPOCH))
        self.now_requests += 1
        self.now_seconds += seconds
        self.requests += 1
        self.seconds += seconds

    def _roll(self, epoch: int) -> None:
        """Move to ``epoch``: the one that was under way goes into the ring, the slots of the epochs skipped
        (and of the one entered) start empty."""
        gap = epoch - self.epoch
        recent = self.ring_counts
        if gap <= 0 or gap >= EPOCHS:  # (gap < 0 only if the clock went back: start over rather than mix)
            for slot in range(2 * EPOCHS):
                recent[slot] = 0.0
        else:
            slot = self.epoch % EPOCHS
            recent[slot] = float(self.now_requests)
            recent[EPOCHS + slot] = self.now_seconds
            for skipped in range(self.epoch + 1, epoch + 1):
                slot = skipped % EPOCHS
                recent[slot] = 0.0
                recent[EPOCHS + slot] = 0.0
        self.epoch = epoch
        self.ends = (epoch + 1) * EPOCH
        self.now_requests = 0
        self.now_seconds = 0.0

    def ring(self, now: float) -> list[tuple[int, float]]:
        """(requests, seconds) of each of the last ``EPOCHS`` epochs up to ``now``'s, the oldest first; an epoch
        no longer held (the user was idle since) reads (0, 0.0)."""
        current = int(now // EPOCH)
        out: list[tuple[int, float]] = []
        for epoch in range(current - EPOCHS + 1, current + 1):
            if epoch == self.epoch:
                out.append((self.now_requests, self.now_seconds))
            elif self.epoch - EPOCHS < epoch < self.epoch:
                slot = epoch % EPOCHS
                out.append((int(self.ring_counts[slot]), self.ring_counts[EPOCHS + slot]))
            else:
                out.append((0, 0.0))
        return out

    def recent(self, now: float) -> tuple[int, float]:
        """Requests and seconds over the last ``EPOCHS`` epochs (the one under way included)."""
        ring = self.ring(now)
        return sum(r for r, _ in ring), sum(s for _, s in ring)

    def totals(self) -> str:
        """``requests=N, seconds=S``, for this and its subclasses' reprs. (A subclass's own method reading
        ``self.seconds`` crashes some builds of mypyc 1.15, trixie's among them, depending on the hash seed: an
        inherited float attribute's definedness bit is looked up in the subclass's own bitmap. Read here, in the
        class that defines it, it compiles.)"""
        return f"requests={self.requests}, seconds={self.seconds:.6f}"

    def __repr__(self) -> str:
        return f"Consumption({self.totals()})"


class Newcomers:
    """The first request of users given a cookie and not seen back yet: id → (seconds, when it ended, the group
    it was routed to — where the user stays when it comes back, whatever a reload changed meanwhile).

    Bounded without a scan: two generations of at most ``capacity / 2`` ids each; when the newer one is full
    it becomes the older and the older is dropped whole. (A dict emptied from its oldest end one key at a time
    would make finding its oldest key a walk over every deleted slot: with load generators that keep no
    cookie, that is every request.) A user who comes back finds its first request in either."""

    __slots__ = ("current", "half", "previous", "rotated_at")

    def __init__(self, capacity: int = NEWCOMERS) -> None:
        self.half = max(capacity // 2, 1)
        self.current: dict[str, tuple[float, float, str]] = {}
        self.previous: dict[str, tuple[float, float, str]] = {}
        self.rotated_at = 0.0  # when ``previous`` stopped taking ids: its newest entry is no younger

    def __len__(self) -> int:
        return len(self.current) + len(self.previous)

    def credit(self, user: str, seconds: float, now: float, group: str = "") -> None:
        current = self.current
        if len(current) >= self.half:
            self.previous = current
            self.current = current = {}
            self.rotated_at = now
        current[user] = (seconds, now, group)

    def group_of(self, user: str) -> str:
        """The group a newcomer's first request went to ("" when the id is not waiting)."""
        first = self.current.get(user)
        if first is None:
            first = self.previous.get(user)
        return first[2] if first is not None else ""

    def claim(self, user: str) -> tuple[float, float, str] | None:
        """The user came back with its cookie: its first request (seconds, when, group), handed over and
        forgotten here."""
        first = self.current.pop(user, None)
        if first is None:
            first = self.previous.pop(user, None)
        return first

    def snapshot(self) -> dict[str, tuple[float, float, str]]:
        """Every id waiting, with its first request (a copy, for the population)."""
        return {**self.previous, **self.current}

    def expire(self, horizon: float) -> None:
        """Drop what is older than ``horizon``: the older generation once its newest is, and each id of the
        newer one that is (it holds at most ``capacity / 2``, and this runs at the front's expiry tick)."""
        if self.previous and self.rotated_at < horizon:
            self.previous = {}
        stale = [user for user, (_, at, _) in self.current.items() if at < horizon]
        for user in stale:
            del self.current[user]
