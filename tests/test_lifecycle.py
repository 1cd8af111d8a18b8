"""A worker's life as a table: which transitions exist, that any other fails closed, and the named sets."""

from __future__ import annotations

import pytest

from elasticd.supervisor.lifecycle import (
    COMING,
    COUNTED,
    GONE,
    TRANSITIONS,
    WILL_SERVE,
    IllegalTransition,
    WorkerState,
    transition,
)

S = WorkerState

# Every legal (from, to), as the run loop, stop and kill take them (worker.py).
LEGAL = {
    (S.NEW, S.STARTING),  # the run loop's first start
    (S.NEW, S.FAILED),  # it cannot start at all (its command not runnable as its user)
    (S.STARTING, S.RUNNING),  # its socket accepts
    (S.STARTING, S.EXITED),  # its process ended before that
    (S.STARTING, S.BACKOFF), (S.STARTING, S.FAILED),  # its process could not be created
    (S.STARTING, S.STOPPING), (S.RUNNING, S.STOPPING),  # stop or kill while its process lives
    (S.RUNNING, S.EXITED),
    (S.EXITED, S.BACKOFF), (S.EXITED, S.FAILED),  # the restart policy's verdict
    (S.BACKOFF, S.STARTING), (S.BACKOFF, S.FAILED),
    *((state, S.STOPPED) for state in S if state is not S.STOPPED),  # a stop ends it wherever it is
}


@pytest.mark.parametrize(("current", "target"), [(a, b) for a in S for b in S])
def test_the_table_allows_exactly_the_lives_a_worker_has(current, target):
    if current is target or (current, target) in LEGAL:
        assert transition(current, target, "w1") is target
    else:
        with pytest.raises(IllegalTransition, match=f"worker w1: {current} → {target} is not a transition"):
            transition(current, target, "w1")


def test_stopped_is_the_end_and_every_state_has_its_row():
    assert set(TRANSITIONS) == set(S)
    assert TRANSITIONS[S.STOPPED] == frozenset()
    assert {(a, b) for a, targets in TRANSITIONS.items() for b in targets} == LEGAL


@pytest.mark.parametrize(("state", "coming", "will_serve", "gone", "counted"), [
    (S.NEW, True, True, False, True),
    (S.STARTING, True, True, False, True),
    (S.BACKOFF, True, True, False, True),
    (S.RUNNING, False, True, False, True),
    (S.EXITED, False, False, True, True),  # between its exit and the policy's verdict: still the group's
    (S.STOPPING, False, False, False, True),  # a draining or retiring worker still holds its process
    (S.STOPPED, False, False, True, False),
    (S.FAILED, False, False, True, False),
])
def test_the_named_sets(state, coming, will_serve, gone, counted):
    assert (state in COMING, state in WILL_SERVE, state in GONE, state in COUNTED) == (coming, will_serve, gone,
                                                                                      counted)


def test_the_values_are_the_apis_strings():
    assert [s.value for s in S] == ["new", "starting", "running", "exited", "backoff", "stopping", "stopped", "failed"]
    assert f"{S.RUNNING}" == "running" and "failed" in GONE  # what GET /v1/status and the logs have always shown
