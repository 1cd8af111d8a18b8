"""The requests held for users being moved (a live move, pool/move.py): each user's in the order they came, to
be dispatched again, in that order, when the move ends. No I/O; time is passed in.

The move's own deadline releases them (``server.move_timeout`` after its flag). ``overdue`` is the front's
guard behind it: whatever became of the move, no request waits much past that deadline.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from elasticd.front.core.exchange import Exchange

__all__ = ["Holds"]

C = TypeVar("C")  # the client connection a request came on (the shell's)


class Holds(Generic[C]):
    __slots__ = ("_held", "_since", "_times")

    def __init__(self) -> None:
        self._held: dict[str, list[tuple[C, Exchange]]] = {}
        self._since: dict[str, float] = {}  # when each user's first held request came
        self._times: dict[str, list[float]] = {}  # when each of them came (``release_older``)

    def __len__(self) -> int:
        return sum(len(held) for held in self._held.values())

    def __contains__(self, user: object) -> bool:
        return user in self._held

    def hold(self, user: str, client: C, ex: Exchange, now: float) -> None:
        held = self._held.get(user)
        if held is None:
            held = self._held[user] = []
            self._since[user] = now
            self._times[user] = []
        held.append((client, ex))
        self._times[user].append(now)

    def release(self, user: str) -> list[tuple[C, Exchange]]:
        """The user's held requests, oldest first; none are held for it afterwards."""
        self._since.pop(user, None)
        self._times.pop(user, None)
        return self._held.pop(user, [])

    def release_older(self, user: str, before: float) -> list[tuple[C, Exchange]]:
        """The user's requests held since before ``before``, oldest first; the later ones stay held (each request
        waits its own time, not its first neighbour's)."""
        held, times = self._held.get(user), self._times.get(user)
        if held is None or times is None:
            return []
        n = 0
        while n < len(times) and times[n] < before:
            n += 1
        if n == len(held):
            return self.release(user)
        out, self._held[user], self._times[user] = held[:n], held[n:], times[n:]
        self._since[user] = times[n]
        return out

    def overdue(self, now: float, limit: float) -> list[str]:
        """The users whose first request has been held longer than ``limit``."""
        return [user for user, since in self._since.items() if now - since > limit]

    def users(self) -> list[str]:
        return list(self._held)
