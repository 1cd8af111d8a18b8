"""Per-user consumption (front/core/consumption.py) and its crediting by the exchange: tables, time passed in."""

from __future__ import annotations

import pytest

from elasticd.front.core.consumption import EPOCH, EPOCHS, Consumption, Newcomers
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import (
    EVENT_ANSWER_END,
    EVENT_CLIENT_LEFT,
    EVENT_CUT,
    EVENT_FAIL,
    EVENT_UPGRADE,
    PHASE_ANSWERING,
    Event,
)
from elasticd.front.core.sticky import Surface


@pytest.mark.parametrize(("credits", "now", "ring"), [
    # (seconds, at) credited, read at `now` → the ring, the oldest epoch first
    ([(0.1, 0.0)], 0.0, [(0, 0.0)] * 5 + [(1, 0.1)]),
    ([(0.1, 0.0), (0.2, 4.9)], 4.9, [(0, 0.0)] * 5 + [(2, pytest.approx(0.3))]),
    ([(0.1, 0.0), (0.2, 5.0)], 5.0, [(0, 0.0)] * 4 + [(1, 0.1), (1, 0.2)]),
    ([(0.1, 0.0)], 29.9, [(1, 0.1)] + [(0, 0.0)] * 5),  # the oldest epoch still held
    ([(0.1, 0.0)], 30.0, [(0, 0.0)] * 6),  # idle for the whole ring: nothing recent, without a roll
    ([(0.1, 0.0), (0.2, 12.0)], 12.0, [(0, 0.0)] * 3 + [(1, 0.1), (0, 0.0), (1, 0.2)]),  # one epoch skipped
    ([(0.1, 0.0), (0.2, 100.0)], 100.0, [(0, 0.0)] * 5 + [(1, 0.2)]),  # a gap past the ring clears it
    ([(0.1, 100.0), (0.2, 50.0)], 100.0, [(0, 0.0)] * 6),  # a clock that went back starts over
])
def test_the_epoch_ring(credits: list[tuple[float, float]], now: float, ring: list[tuple[int, float]]) -> None:
    used = Consumption()
    for seconds, at in credits:
        used.add(seconds, at)
    assert used.ring(now) == ring
    assert used.requests == len(credits) and used.seconds == pytest.approx(sum(s for s, _ in credits))
    requests, seconds = used.recent(now)
    assert requests == sum(r for r, _ in ring)
    assert seconds == pytest.approx(sum(s if isinstance(s, float) else s.expected for _, s in ring))


def test_the_ring_spans_six_epochs_of_five_seconds() -> None:
    assert (EPOCH, EPOCHS) == (5.0, 6)
    used = Consumption()
    for second in range(40):  # one request a second for 40 s
        used.add(0.01, float(second))
    assert used.recent(39.0) == (30, pytest.approx(0.3))  # epochs 2..7: seconds 10..39
    assert used.requests == 40


def test_newcomers_are_bounded_in_two_generations_claimed_once_and_expire() -> None:
    table = Newcomers(capacity=4)  # two generations of two
    table.credit("a", 0.1, 1.0)
    table.credit("b", 0.2, 2.0)
    table.credit("c", 0.3, 3.0)  # the newer generation was full: it becomes the older one
    assert len(table) == 3 and table.snapshot() == {"a": (0.1, 1.0, ""), "b": (0.2, 2.0, ""), "c": (0.3, 3.0, "")}
    table.credit("d", 0.4, 4.0)
    table.credit("e", 0.5, 5.0)  # full again: a and b go whole
    assert sorted(table.snapshot()) == ["c", "d", "e"]
    assert table.claim("c") == (0.3, 3.0, "") and table.claim("c") is None  # once, from either generation
    assert table.claim("e") == (0.5, 5.0, "")
    table.expire(horizon=4.5)  # the older generation (d) stopped taking ids at 5.0: kept
    assert sorted(table.snapshot()) == ["d"]
    table.expire(horizon=5.5)
    assert len(table) == 0


def test_a_first_request_lands_in_the_ring_at_its_own_time() -> None:
    surface = Surface(ttl=60.0)
    surface.newcomers.credit("u1", 0.5, 1.0)
    entry = surface.assign("u1", "w1", 2.0)
    entry.add(0.25, 2.0)
    assert (entry.requests, entry.seconds) == (2, 0.75) and entry.recent(2.0) == (2, 0.75)
    surface.newcomers.credit("u2", 0.5, 1.0)
    late = surface.assign("u2", "w1", 40.0)  # came back long after: its first request is past the ring
    late.add(0.25, 40.0)
    assert (late.requests, late.seconds) == (2, 0.75) and late.recent(40.0) == (1, 0.25)


def test_a_user_entering_the_surface_takes_its_first_request_along() -> None:
    surface = Surface(ttl=60.0)
    surface.newcomers.credit("u1", 0.2, 1.0)
    entry = surface.assign("u1", "w1", 2.0)
    assert (entry.requests, entry.seconds) == (1, 0.2) and len(surface.newcomers) == 0
    surface.newcomers.credit("u2", 0.3, 1.0)
    assert surface.login("u2", "alice", "w1", 2.0).requests == 1  # a login on the first request
    surface.newcomers.credit("u3", 0.3, 1.0)
    assert surface.expire(100.0) == ["u1", "u2"] and len(surface.newcomers) == 0  # forgotten with the surface


def _ended(event: Event, *, new_user: bool, surface: Surface, forwards: ForwardCounters) -> Exchange:
    ex = Exchange()
    ex.user, ex.worker, ex.ts = "u1", "w1", 10.0
    ex.counters, ex.stats = forwards.worker("w1"), forwards.route("acme", "shop")
    if new_user:
        ex.cookie_line = b"Set-Cookie: elastic_uid=u1\r\n"
    else:
        ex.entry = surface.assign("u1", "w1", 10.0)
    ex.forward(forwards)
    if event in (EVENT_ANSWER_END, EVENT_CUT, EVENT_UPGRADE):
        ex.phase = PHASE_ANSWERING
    ex.end(event, 200, 10.5, forwards, surface)
    return ex


@pytest.mark.parametrize(("event", "credited"), [
    (EVENT_ANSWER_END, True),
    (EVENT_UPGRADE, True),
    (EVENT_CLIENT_LEFT, True),  # the worker worked for it; the user left first
    (EVENT_FAIL, False),  # the front's own 502/504: the worker's failure
    (EVENT_CUT, False),  # the worker cut its answer: a transport failure
])
def test_only_answers_from_the_worker_are_credited_to_the_user(event: Event, credited: bool) -> None:
    for new_user in (False, True):
        surface, forwards = Surface(ttl=60.0), ForwardCounters()
        _ended(event, new_user=new_user, surface=surface, forwards=forwards)
        assert forwards.workers["w1"].requests == 1  # the worker counts it whatever happened
        if new_user:
            assert (surface.newcomers.snapshot().get("u1") == (0.5, 10.5, "")) is credited, event
        else:
            used = surface.users["u1"]
            assert (used.requests == 1 and used.seconds == 0.5) is credited, event


def test_a_first_request_whose_cookie_came_back_before_it_ended_goes_to_the_entry() -> None:
    """A browser keeps the cookie from the answer's head: while a long first page still streams, its assets come
    with the cookie and put the user on the surface. The first request, ending later, is credited there."""
    surface, forwards = Surface(ttl=60.0), ForwardCounters()
    first = Exchange()
    first.user, first.worker, first.ts = "u1", "w1", 10.0
    first.counters, first.stats = forwards.worker("w1"), forwards.route("acme", "shop")
    first.cookie_line = b"Set-Cookie: elastic_uid=u1\r\n"
    first.forward(forwards)
    first.phase = PHASE_ANSWERING
    entry = surface.assign("u1", "w1", 11.0)  # an asset with the cookie, meanwhile
    entry.add(0.1, 11.0)
    first.end(EVENT_ANSWER_END, 200, 12.0, forwards, surface)
    assert (entry.requests, entry.seconds) == (2, pytest.approx(2.1)) and len(surface.newcomers) == 0


def test_a_newcomer_comes_back_to_the_group_its_first_request_went_to() -> None:
    surface = Surface(ttl=60.0)
    surface.newcomers.credit("u1", 0.5, 1.0, "green")
    assert surface.newcomers.group_of("u1") == "green" and surface.newcomers.group_of("u2") == ""
    assert surface.assign("u1", "w1", 2.0).group == "green"  # (a reload made blue the default meanwhile)
