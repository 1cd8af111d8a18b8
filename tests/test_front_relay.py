"""The relay's state machine and its edge decisions, as tables with no socket (h11's test_state.py is the
model): every (phase, event) pair is either a row of the table or refused, and each failure's outcome —
retry once, 502, cut, 499, 504, lingering close — is checked from the facts alone."""

from __future__ import annotations

import itertools

import pytest

from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import (
    TRANSITIONS,
    CloseMode,
    Event,
    Failure,
    Phase,
    RelayError,
    Timeout,
    after_own_answer,
    client_left,
    step,
    timed_out,
    upstream_lost,
)

Q, F, A, D, H = Phase.QUEUED, Phase.FORWARDING, Phase.ANSWERING, Phase.DONE, Phase.PARKED

LEGAL = {
    (Q, Event.REFUSE): D, (Q, Event.FORWARD): F,
    (Q, Event.PARK): H, (H, Event.RELEASE): Q,  # a live move of its user: held in the front, then dispatched again
    (F, Event.ATTACH): F, (F, Event.RETRY): Q, (F, Event.ANSWER_HEAD): A, (F, Event.FAIL): D,
    (F, Event.CLIENT_LEFT): D,
    (A, Event.ANSWER_END): D, (A, Event.UPGRADE): D, (A, Event.CUT): D, (A, Event.CLIENT_LEFT): D,
}


def test_the_table_is_exactly_the_legal_transitions():
    assert dict(TRANSITIONS) == LEGAL


@pytest.mark.parametrize(("phase", "event"), list(itertools.product(Phase, Event)))
def test_every_pair_moves_by_the_table_or_fails_closed(phase, event):
    if (phase, event) in LEGAL:
        assert step(phase, event) is LEGAL[(phase, event)]
    else:
        with pytest.raises(RelayError, match=f"{event.name} is not legal while {phase.name}"):
            step(phase, event)


def _forwarded() -> Exchange:
    """An exchange forwarded: open in real counters, entry id 1 (a fresh ForwardCounters' first)."""
    ex = Exchange()
    ex.forward(ForwardCounters())
    return ex


class _Link:
    transport = None

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def test_a_request_answered_by_its_worker():
    ex = _forwarded()
    assert (ex.phase, ex.rid, ex.started, ex.in_flight) == (F, 1, False, True)
    ex.attach(_Link())
    assert ex.live
    ex.answer_head(200, b"alice")
    assert (ex.phase, ex.status, ex.login, ex.started) == (A, 200, b"alice", True)
    ex.advance(Event.ANSWER_END)
    assert ex.finished and not ex.in_flight and not ex.live


def test_retry_undoes_the_forward_once_then_never_again():
    forwards = ForwardCounters()
    counters = forwards.worker("w1")
    counters.concurrency = 1
    ex = Exchange()
    ex.counters = counters
    ex.forward(forwards)
    assert (counters.in_flight, forwards.saturated, len(forwards.open)) == (1, {"w1"}, 1)
    ex.attach(_Link())
    ex.retry(forwards)
    # dispatched again from QUEUED: nothing of the first forward is counted, its worker's slot is free again
    assert (ex.phase, ex.retried, ex.conn, ex.rid, ex.counters) == (Q, True, None, 0, None)
    assert (counters.in_flight, counters.requests, forwards.saturated, forwards.open) == (0, 0, set(), {})
    ex.counters = counters
    ex.forward(forwards)
    ex.attach(_Link())
    with pytest.raises(RelayError, match="at most once"):
        ex.retry(forwards)
    ex.answer_head(200, None)
    with pytest.raises(RelayError):  # the answer began: no retry can follow, whatever the shell asks
        ex.advance(Event.RETRY)


def test_a_websocket_upgrade_ends_the_exchange_and_nothing_more_can_happen_to_it():
    ex = _forwarded()
    ex.attach(_Link())
    ex.answer_head(101, None)
    ex.advance(Event.UPGRADE)
    assert ex.finished
    for event in Event:
        with pytest.raises(RelayError):
            ex.advance(event)


def test_pipelined_requests_each_have_their_own_phase():
    first, second = _forwarded(), Exchange()
    first.answer_head(200, None)
    assert (first.phase, second.phase) == (A, Q)
    with pytest.raises(RelayError):  # the second cannot be answered before it is forwarded
        second.answer_head(200, None)
    second.advance(Event.REFUSE)  # e.g. 404: answered by the front in its turn
    assert second.finished and second.rid == 0


@pytest.mark.parametrize(("phase", "facts", "expected"), [
    (F, dict(reused=True, received=False, retried=False, has_body=False, method=b"GET", upgrading=False),
     Failure.RETRY),
    (F, dict(reused=True, received=False, retried=True, has_body=False, method=b"GET", upgrading=False),
     Failure.BAD_GATEWAY),  # once only
    (F, dict(reused=False, received=False, retried=False, has_body=False, method=b"GET", upgrading=False),
     Failure.BAD_GATEWAY),  # a fresh connection that failed: the worker is the problem
    (F, dict(reused=True, received=True, retried=False, has_body=False, method=b"GET", upgrading=False),
     Failure.BAD_GATEWAY),  # something came back: it may have acted
    (F, dict(reused=True, received=False, retried=False, has_body=True, method=b"PUT", upgrading=False),
     Failure.BAD_GATEWAY),  # a body was sent (and is gone)
    (F, dict(reused=True, received=False, retried=False, has_body=False, method=b"POST", upgrading=False),
     Failure.BAD_GATEWAY),  # not idempotent
    (F, dict(reused=True, received=False, retried=False, has_body=False, method=b"GET", upgrading=True),
     Failure.BAD_GATEWAY),
    (A, dict(reused=True, received=True, retried=False, has_body=False, method=b"GET", upgrading=False),
     Failure.CUT),  # mid-answer: a truncated answer, never a complete-looking wrong one
    (D, dict(reused=True, received=True, retried=False, has_body=False, method=b"GET", upgrading=False),
     Failure.LATE),
])
def test_upstream_lost(phase, facts, expected):
    assert upstream_lost(phase, **facts) is expected


@pytest.mark.parametrize(("phase", "expected"), [
    (None, Timeout.CLOSE), (Q, Timeout.CLOSE), (F, Timeout.GATEWAY_TIMEOUT), (A, Timeout.CUT), (D, Timeout.CLOSE)])
def test_504_before_the_answer_a_cut_after_it(phase, expected):
    assert timed_out(phase) is expected


@pytest.mark.parametrize(("phase", "status", "expected"), [
    (Q, 0, None), (F, 0, 499), (A, 206, 206), (D, 200, None)])
def test_a_client_that_leaves(phase, status, expected):
    assert client_left(phase, status) == expected


_CALM = dict(close=False, keep_alive=True, client_eof=False, stopping=False, upgrading=False, body_done=True,
             expect=False, parse_error=False)


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, CloseMode.KEEP),
    ({"close": True}, CloseMode.CLOSE),
    ({"keep_alive": False}, CloseMode.CLOSE),  # Connection: close, or HTTP/1.0 without keep-alive
    ({"stopping": True}, CloseMode.CLOSE),
    ({"client_eof": True}, CloseMode.CLOSE),
    ({"keep_alive": False, "body_done": False}, CloseMode.LINGER),  # the client may still be sending its body
    ({"body_done": False, "expect": True}, CloseMode.LINGER),  # refused before 100-continue: the body never comes
    ({"body_done": False}, CloseMode.KEEP),  # the rest of its body is read and dropped, the connection kept
    ({"close": True, "parse_error": True}, CloseMode.LINGER),  # what follows cannot be framed: drop it a moment
    ({"upgrading": True, "body_done": False}, CloseMode.LINGER),
])
def test_the_lingering_close(changes, expected):
    assert after_own_answer(**{**_CALM, **changes}) is expected


def test_forward_with_a_pooled_connection_attaches_it_in_the_same_step():
    ex, link = Exchange(), _Link()
    ex.forward(ForwardCounters(), link)
    assert (ex.phase, ex.rid, ex.conn) == (F, 1, link)


def test_forward_is_checked_before_anything_is_opened():
    ex = _forwarded()
    forwards = ForwardCounters()
    with pytest.raises(RelayError):
        ex.forward(forwards)
    assert ex.rid == 1 and forwards.open == {}  # nothing opened by the refused step


def test_end_closes_the_counters_entry_and_the_quota_slot_once():
    from elasticd.config.model import Quotas
    from elasticd.front.core.quota import QuotaBook

    forwards = ForwardCounters()
    quota = QuotaBook({"acme": Quotas(max_concurrent_requests=2)}, 0.0).get("acme")
    assert quota is not None and quota.admit(0.0) is None
    ex = Exchange()
    ex.quota, ex.counters, ex.stats, ex.ts = quota, forwards.worker("w1"), forwards.route("acme", "shop"), 1.0
    ex.forward(forwards)
    ex.answer_head(200, None)
    ex.end(Event.ANSWER_END, 200, 1.5, forwards)
    assert (ex.phase, ex.rid, ex.quota, quota.gate.in_flight, forwards.open) == (D, 0, None, 0, {})
    assert forwards.workers["w1"].requests == 1 and forwards.routes[("acme", "shop")].codes == {200: 1}
    with pytest.raises(RelayError):  # a second end is refused before anything is counted twice
        ex.end(Event.ANSWER_END, 200, 2.0, forwards)
    assert forwards.workers["w1"].requests == 1


def test_end_refuses_an_exchange_that_has_no_open_entry():

    forwards = ForwardCounters()
    queued = Exchange()
    with pytest.raises(RelayError):  # (QUEUED, REFUSE) is a row, but REFUSE opens and closes nothing
        queued.end(Event.REFUSE, 404, 1.0, forwards)
    assert forwards.workers == {} and queued.phase is Q


def test_abandon_fails_closed_whatever_the_phase_and_gives_everything_back():
    from elasticd.config.model import Quotas
    from elasticd.front.core.quota import QuotaBook

    forwards = ForwardCounters()
    quota = QuotaBook({"acme": Quotas(max_concurrent_requests=1)}, 0.0).get("acme")
    assert quota is not None and quota.admit(0.0) is None
    ex = Exchange()
    ex.quota, ex.counters, ex.stats = quota, forwards.worker("w1"), forwards.route("acme", "shop")
    ex.forward(forwards, _Link())
    ex.abandon(1.0, forwards)
    assert (ex.phase, ex.rid, ex.conn, quota.gate.in_flight, forwards.open) == (D, 0, None, 0, {})
    assert forwards.routes[("acme", "shop")].codes == {502: 1}
    ex.abandon(2.0, forwards)  # idempotent: nothing counted twice
    assert forwards.routes[("acme", "shop")].codes == {502: 1}
