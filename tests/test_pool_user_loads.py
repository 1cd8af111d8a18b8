"""Users' shares of their worker's occupancy (what compaction moves them by), as tables."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from elasticd.pool.policy import WorkerView
from elasticd.pool.user_loads import loads_for, user_loads


@dataclass
class Record:
    seconds: float
    login: str | None


@pytest.mark.parametrize(("occupancy", "deltas", "expected"), [
    (0.8, {"a": 3.0, "b": 1.0}, {"a": 0.6, "b": 0.2}),  # in proportion to what each consumed
    (0.6, {"a": 0.0, "b": 0.0, "c": 0.0}, {"a": 0.2, "b": 0.2, "c": 0.2}),  # none consumed: evenly
    (0.0, {"a": 2.0}, {"a": 0.0}),
])
def test_loads_for(occupancy, deltas, expected):
    assert loads_for(occupancy, deltas) == pytest.approx(expected)


def test_shares_count_every_user_but_only_logged_in_ones_are_given_and_seconds_are_since_the_last_check():
    users = {"w1": [("alice", Record(10.0, "alice")), ("guest", Record(4.0, None))],
             "w2": [("bob", Record(5.0, "bob"))], "w3": []}
    views = [WorkerView("w1", 0.9), WorkerView("w2", 0.5), WorkerView("w3", 0.1)]
    loads, seen = user_loads(views, lambda worker: users[worker], {"alice": 7.0, "bob": 6.0})
    # alice consumed 3 s since the last check, the guest 4 s: alice's share is 3/7 of w1's 0.9; the guest is
    # counted but never moved. bob's counter went back (a restarted worker's users): no negative share.
    assert loads == {"w1": pytest.approx({"alice": 0.9 * 3 / 7}), "w2": {"bob": 0.5}}
    assert seen == {"alice": 10.0, "guest": 4.0, "bob": 5.0}
