"""Each logged-in user's share of its worker's occupancy (what the capacity ledger moves users by), with no
I/O: from the forward seconds each user consumed since the last check.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from elasticd.pool.policy import WorkerView
from elasticd.pool.ports import PoolUser

__all__ = ["loads_for", "user_loads"]


def user_loads(views: Sequence[WorkerView], users_on: Callable[[str], Iterable[tuple[str, PoolUser]]],
               seconds_before: Mapping[str, float]) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """(worker → {logged-in user → its share of the worker's occupancy}, user → cumulative seconds now, for the
    next check). Shares are over every user of the worker (evenly when none consumed anything: an idle user
    costs little, but is not free); only the logged-in ones are given, to move. Guests never move: when their
    worker goes, the front re-places them on the reception."""
    loads: dict[str, dict[str, float]] = {}
    seen: dict[str, float] = {}
    for view in views:
        deltas: dict[str, float] = {}
        logged_in: set[str] = set()
        for user, record in users_on(view.id):
            seen[user] = record.seconds
            deltas[user] = max(record.seconds - seconds_before.get(user, 0.0), 0.0)
            if record.login is not None:
                logged_in.add(user)
        if deltas:
            loads[view.id] = {u: share for u, share in loads_for(view.occupancy, deltas).items() if u in logged_in}
    return loads, seen


def loads_for(worker_occupancy: float, deltas: Mapping[str, float]) -> dict[str, float]:
    """Split a worker's occupancy among its users in proportion to what each consumed."""
    total = sum(deltas.values())
    return {u: worker_occupancy * (d / total if total else 1 / len(deltas)) for u, d in deltas.items()}
