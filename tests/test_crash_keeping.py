"""What the crash state's keeping writes, and when: on change only, past the bound never (said once), and spaced by
its own cost."""

from __future__ import annotations

import logging

import pytest

from elasticd.crash import keeping
from elasticd.crash.keeping import MIN_INTERVAL, StateKeeping, next_interval
from elasticd.crash.stored_state import StoredState


@pytest.mark.parametrize(("cost", "interval"), [(0.0, MIN_INTERVAL), (0.01, MIN_INTERVAL), (0.05, 1.0), (0.08, 1.6),
                                                (1.0, 20.0)])
def test_a_write_costs_at_most_a_twentieth_of_the_time(cost, interval):
    assert next_interval(cost) == pytest.approx(interval)


def test_written_on_change_only_and_never_past_the_bound(monkeypatch, caplog):
    stored = StoredState.made()
    state = {"mark": 1, "body": b'{"users": 1}'}
    kept = StateKeeping(stored, lambda: state["body"], lambda: state["mark"])
    try:
        assert kept.write() and stored.read().body == b'{"users": 1}'
        state["body"] = b'{"users": 2}'
        assert not kept.write()  # (the mark did not move: nothing changed that the state holds)
        assert kept.write(force=True) and stored.read().body == b'{"users": 2}'
        monkeypatch.setattr(keeping, "BOUND", 10)
        state.update(mark=2, body=b'{"users": 3, "more": "than the bound"}')
        with caplog.at_level(logging.ERROR, "elasticd.crash"):
            assert not kept.write() and not kept.write(force=True)
        assert stored.read().body == b'{"users": 2}'  # the record before it stays
        assert sum("over the 10 kept for a crash" in r.getMessage() for r in caplog.records) == 1  # said once
        assert kept.writes == 2
    finally:
        stored.close()
