"""The relay of one client connection (``front.core.connection``) driven by bytes alone, with no socket: what
each input returns (effects, bytes for the client or the worker) for pipelining, Expect: 100-continue, the
WebSocket upgrade, keep-alive against close for HTTP/1.0 and 1.1, 499, retry once, the lingering close, 504
against a cut, and what the parser refuses. The socket tests (test_front_*.py) are the functional layer."""

from __future__ import annotations

import pytest

from elasticd.front import COMPILED
from elasticd.front.core import http1
from elasticd.front.core.connection import (
    CLOSE,
    CONTINUE,
    CROWDED,
    DISPATCH,
    FAIL,
    FOR_QUEUE,
    FOR_UPSTREAM,
    MAX_QUEUE,
    SERVE,
    TO_WORKER,
    ClientRelay,
)
from elasticd.front.core.counters import ForwardCounters, RouteStats
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import CloseMode, Event, Failure, Phase, RelayError, Timeout

GET = b"GET /a HTTP/1.1\r\nHost: a.test\r\n\r\n"


class Link:
    """A worker connection as the core holds it: only its identity and whether it is open matter here."""

    def __init__(self) -> None:
        self.transport: object | None = object()

    def write(self, data: bytes) -> None: ...

    def close(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...


def forward(relay: ClientRelay, forwards: ForwardCounters | None = None, link: Link | None = None
            ) -> tuple[Exchange, Link]:
    """What the listener does with the first request: dispatch it to a worker over ``link``."""
    ex = relay.next_request()
    assert ex is not None and ex.phase is Phase.QUEUED
    forwards = forwards or ForwardCounters()
    ex.user, ex.worker, ex.stats = "u1", "acme.shop.green.1", RouteStats()
    ex.counters = forwards.worker("acme.shop.green.1")
    link = link or Link()
    ex.forward(forwards, link)
    return ex, link


def test_a_request_is_read_queued_and_sent_whole_in_one_write():
    relay = ClientRelay(32 << 10)
    assert relay.receive(GET) == DISPATCH
    ex, _ = forward(relay)
    data = relay.request_bytes(ex, b"10.0.0.9")
    assert data.startswith(b"GET /a HTTP/1.1\r\nHost: a.test\r\n")
    assert b"X-Forwarded-For: 10.0.0.9\r\n" in data and b"X-Elastic-User-Id: u1\r\n" in data
    assert data.endswith(b"\r\n\r\n") and ex.sent
    assert relay.body_bytes() == (None, b"")  # nothing more is due


def test_a_head_in_pieces_is_nothing_to_serve_until_it_is_whole():
    relay = ClientRelay(32 << 10)
    assert relay.receive(GET[:10]) == 0
    assert relay.next_request() is None and not relay.idle
    assert relay.receive(GET[10:]) == DISPATCH


def test_pipelined_requests_wait_their_turn():
    relay = ClientRelay(32 << 10)
    assert relay.receive(GET + GET.replace(b"/a", b"/b")) == SERVE
    assert len(relay.queue) == 2
    first, _ = forward(relay)
    assert relay.next_request() is None  # the first is under way: the second waits
    first.answer_head(200, None)
    assert relay.worker_answered(first, close_after=False, stopping=False) is False
    second = relay.next_request()
    assert second is not None and second.url == b"/b"


def test_too_many_pipelined_requests_pause_reading_once_and_resume_when_served():
    relay = ClientRelay(32 << 10)
    assert relay.receive(GET * (MAX_QUEUE + 1)) == SERVE | CROWDED
    assert relay.pause_if_crowded() is True  # still crowded after serving: pause
    assert relay.receive(GET) == SERVE | CROWDED
    assert relay.pause_if_crowded() is False  # paused already
    for left in (MAX_QUEUE + 1, MAX_QUEUE):
        ex = relay.next_request()
        assert ex is not None
        relay.own_answer(ex, 404, "no app", retry_after=None, close=False, stopping=False)
        ex.advance(Event.REFUSE)
        assert len(relay.queue) == left
        assert relay.relieved() is (left <= MAX_QUEUE)
    assert relay.paused == 0


# ------------------------------------------------------------------ keep-alive against close, HTTP/1.0 and 1.1

@pytest.mark.parametrize(("request_line", "connection", "keep"), [
    (b"GET / HTTP/1.1", b"", True),
    (b"GET / HTTP/1.1", b"Connection: close\r\n", False),
    (b"GET / HTTP/1.1", b"Connection: keep-alive\r\n", True),
    (b"GET / HTTP/1.0", b"", False),
    (b"GET / HTTP/1.0", b"Connection: keep-alive\r\n", True),
    (b"GET / HTTP/1.0", b"Connection: close\r\n", False),
])
def test_keep_alive_or_close_after_a_worker_answer_and_after_our_own(request_line, connection, keep):
    relay = ClientRelay(32 << 10)
    relay.receive(request_line + b"\r\nHost: a.test\r\n" + connection + b"\r\n")
    ex, _ = forward(relay)
    relay.request_bytes(ex, None)
    response = http1.read_response(200, b"OK", [(b"Content-Length", b"2")], True, head_request=False,
                                   client11=ex.http11, client_keep_alive=ex.head.keep_alive)
    ex.answer_head(200, None)
    assert relay.worker_answered(ex, response.close, stopping=False) is (not keep)
    # The same request answered by the front itself
    relay = ClientRelay(32 << 10)
    relay.receive(request_line + b"\r\nHost: a.test\r\n" + connection + b"\r\n")
    own = relay.next_request()
    assert own is not None
    data, mode = relay.own_answer(own, 404, "no app", retry_after=None, close=False, stopping=False)
    assert mode is (CloseMode.KEEP if keep else CloseMode.CLOSE)
    assert (b"Connection: close\r\n" in data) is (not keep)


@pytest.mark.parametrize(("close_after", "data", "eof", "stopping", "closes"), [
    (False, GET, False, False, False),
    (True, GET, False, False, True),  # the answer's head said close
    (None, GET, False, False, True),  # no head came
    (False, GET, True, False, True),  # the client stopped sending
    (False, GET, False, True, True),  # the front is stopping
    (False, b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 9\r\n\r\nabc", False, False, True),  # body unread
])
def test_after_a_worker_answer(close_after, data, eof, stopping, closes):
    relay = ClientRelay(32 << 10)
    relay.receive(data)
    if eof:
        relay.client_eof()
    ex, _ = forward(relay)
    ex.answer_head(200, None)
    assert relay.worker_answered(ex, close_after, stopping=stopping) is closes


# ------------------------------------------------------------------ Expect: 100-continue

EXPECT = b"POST /up HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n"


def test_expect_100_continue_is_answered_as_the_request_is_forwarded_and_its_body_follows():
    relay = ClientRelay(32 << 10)
    assert relay.receive(EXPECT) == DISPATCH
    ex, link = forward(relay)
    assert relay.continue_bytes(ex) == CONTINUE
    head = relay.request_bytes(ex, None)
    assert b"Expect" not in head and not ex.sent  # the worker gets no Expect: the front answered it
    assert relay.receive(b"hello") == SERVE
    assert relay.body_bytes() == (link, b"hello") and ex.sent


@pytest.mark.parametrize(("data", "why"), [
    (EXPECT + b"hello", "the body came already"),
    (EXPECT.replace(b"HTTP/1.1", b"HTTP/1.0"), "an HTTP/1.0 client is never sent an interim answer"),
    (EXPECT.replace(b"Expect: 100-continue", b"Expect: something"), "not 100-continue"),
])
def test_no_100_continue(data, why):
    relay = ClientRelay(32 << 10)
    relay.receive(data)
    ex, _ = forward(relay)
    assert relay.continue_bytes(ex) == b"", why


def test_a_refused_expect_request_lingers_instead_of_reading_a_body_nobody_wants():
    relay = ClientRelay(32 << 10)
    relay.receive(EXPECT)
    ex = relay.next_request()
    assert ex is not None
    _, mode = relay.own_answer(ex, 503, "busy", retry_after=1, close=False, stopping=False)
    assert mode is CloseMode.LINGER and relay.draining
    assert relay.receive(b"hello") == 0  # dropped while lingering


# ------------------------------------------------------------------ the lingering close

def test_an_answer_given_before_the_body_was_read_keeps_the_connection_and_drops_the_rest_of_the_body():
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 100\r\n\r\nabc")
    ex = relay.next_request()
    assert ex is not None
    data, mode = relay.own_answer(ex, 429, "slow down", retry_after=2, close=False, stopping=False)
    ex.advance(Event.REFUSE)
    assert mode is CloseMode.KEEP and b"Retry-After: 2\r\n" in data and b"Connection: close" not in data
    assert relay.pending == 0  # the buffered part of the body is dropped with it
    assert relay.receive(b"x" * 97) == 0 and relay.pending == 0  # the rest: read and dropped
    assert relay.receive(GET) == DISPATCH
    following = relay.next_request()
    assert following is not None and following.url == b"/a"


def test_an_answer_to_a_client_that_said_close_lingers_while_its_body_may_still_come():
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\nContent-Length: 100\r\n\r\nabc")
    ex = relay.next_request()
    assert ex is not None
    data, mode = relay.own_answer(ex, 429, "slow down", retry_after=2, close=False, stopping=False)
    assert mode is CloseMode.LINGER and b"Connection: close\r\n" in data and relay.draining


def test_a_parse_error_after_a_whole_head_closes_at_once_when_nothing_more_can_come():
    relay = ClientRelay(32 << 10)
    assert relay.receive(b"GET / HTTP/1.1\r\n\r\n") == DISPATCH  # no Host
    ex = relay.next_request()
    assert ex is not None and ex.error == (400, "an HTTP/1.1 request needs a Host header")
    _, mode = relay.own_answer(ex, *ex.error, retry_after=None, close=True, stopping=False)
    assert mode is CloseMode.LINGER  # a parse error: the client may still be sending


# ------------------------------------------------------------------ 499, retry once, 504 against a cut

def test_the_client_leaving_while_forwarded_is_499_and_frees_the_worker():
    relay = ClientRelay(32 << 10)
    relay.receive(GET)
    ex, link = forward(relay)
    assert relay.client_lost() == ([link], ex, 499)
    assert ex.conn is None and not relay.queue


def test_the_client_leaving_mid_answer_keeps_the_answers_status():
    relay = ClientRelay(32 << 10)
    relay.receive(GET)
    ex, link = forward(relay)
    ex.answer_head(206, None)
    assert relay.client_lost() == ([link], ex, 206)


def test_the_client_leaving_with_nothing_forwarded_settles_nothing():
    relay = ClientRelay(32 << 10)
    relay.receive(GET)
    assert relay.client_lost() == ([], None, 0)


def test_a_reused_connection_that_died_unanswered_is_retried_once_then_502():
    relay = ClientRelay(32 << 10)
    relay.receive(GET)
    ex, _ = forward(relay)
    assert relay.worker_lost(ex, reused=True, received=False) is Failure.RETRY
    assert ex.conn is None and ex.phase is Phase.FORWARDING  # the shell undoes the forward (Exchange.retry)
    ex.retry(ForwardCounters())
    assert ex.retried and ex.phase is Phase.QUEUED
    ex.forward(ForwardCounters())
    ex.attach(Link())
    assert relay.worker_lost(ex, reused=True, received=False) is Failure.BAD_GATEWAY
    assert ex.conn is None


@pytest.mark.parametrize(("data", "reused", "received", "failure"), [
    (GET, False, False, Failure.BAD_GATEWAY),  # a new connection refused: the worker is the problem
    (GET, True, True, Failure.BAD_GATEWAY),  # it had started answering
    (b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\n\r\nx", True, False, Failure.BAD_GATEWAY),
    (b"DELETE / HTTP/1.1\r\nHost: a.test\r\n\r\n", True, False, Failure.RETRY),  # idempotent, no body
    (b"PATCH / HTTP/1.1\r\nHost: a.test\r\n\r\n", True, False, Failure.BAD_GATEWAY),
])
def test_which_lost_connections_are_retried(data, reused, received, failure):
    relay = ClientRelay(32 << 10)
    relay.receive(data)
    ex, _ = forward(relay)
    assert relay.worker_lost(ex, reused=reused, received=received) is failure


def test_a_lost_worker_mid_answer_is_a_cut_and_after_the_end_nothing():
    relay = ClientRelay(32 << 10)
    relay.receive(GET)
    ex, _ = forward(relay)
    ex.answer_head(200, None)
    assert relay.worker_lost(ex, reused=True, received=True) is Failure.CUT
    forwards = ForwardCounters()
    ex.rid = forwards.opened(ex)
    ex.end(Event.CUT, 200, 1.0, forwards)
    assert relay.worker_lost(ex, reused=True, received=True) is Failure.LATE


def test_timeouts_504_before_the_answer_a_cut_within_it_and_a_close_when_idle():
    relay = ClientRelay(32 << 10)
    assert relay.idle_limit(75.0, 60.0, 3600.0) == 75.0 and relay.timeout() == (Timeout.CLOSE, None, None)
    relay.receive(GET[:5])
    assert relay.idle_limit(75.0, 60.0, 3600.0) == 60.0  # a head under way
    assert relay.timeout() == (Timeout.CLOSE, None, None)  # a head that never completed
    relay.receive(GET[5:])
    ex, link = forward(relay)
    assert relay.timeout() == (Timeout.GATEWAY_TIMEOUT, ex, link) and ex.conn is None
    relay = ClientRelay(32 << 10)
    relay.receive(GET)
    ex, link = forward(relay)
    ex.answer_head(200, None)
    assert relay.timeout() == (Timeout.CUT, ex, link)


# ------------------------------------------------------------------ the WebSocket upgrade

UPGRADE = (b"GET /ws HTTP/1.1\r\nHost: a.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")


def test_an_upgrade_relays_raw_bytes_then_becomes_a_tunnel():
    relay = ClientRelay(32 << 10)
    assert relay.receive(UPGRADE + b"early") == DISPATCH  # bytes past the head: kept, not parsed
    ex = relay.queue[0]
    assert relay.upgrading is ex and ex.head.upgrade == b"websocket"
    link = Link()
    link.transport = None  # connecting
    assert relay.receive(b"-more") == 0
    forward(relay, link=link)
    head = relay.request_bytes(ex, None)
    assert b"Connection: upgrade\r\nUpgrade: websocket\r\n" in head and head.endswith(b"early-more")
    link.transport = object()
    assert relay.receive(b"frame") == TO_WORKER and relay.link is link  # the worker connection is up
    ex.answer_head(101, None)
    assert relay.upgraded(ex, link) == b"" and relay.tunnel is link and relay.upgrading is None
    assert relay.receive(b"frame2") == TO_WORKER and relay.link is link
    assert relay.idle_limit(75.0, 60.0, 3600.0) == 3600.0 and not relay.idle
    assert relay.client_lost() == ([link], None, 0)


def test_an_upgrade_the_worker_refuses_closes_after_its_answer():
    relay = ClientRelay(32 << 10)
    relay.receive(UPGRADE)
    ex, _ = forward(relay)
    relay.request_bytes(ex, None)
    ex.answer_head(400, None)
    assert relay.worker_answered(ex, False, stopping=False) is True


def test_connect_is_refused_501_and_what_follows_its_head_dropped():
    relay = ClientRelay(32 << 10)
    assert relay.receive(b"CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\n\r\n\x16\x03\x01") == DISPATCH
    ex = relay.next_request()
    assert ex is not None and ex.error == (501, "CONNECT is not supported") and relay.draining


# ------------------------------------------------------------------ what the parser refuses

@pytest.mark.parametrize(("data", "status"), [
    (b"GET /x\r\n\r\n", 400),  # HTTP/0.9
    (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    (b"GET http://b.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", 0),  # routed by its own authority
    (b"GET ftp://b.test/x HTTP/1.1\r\nHost: a.test\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400),
    (b"GET /" + b"x" * 40_000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 414),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: " + b"x" * 40_000 + b"\r\n\r\n", 431),
])
def test_heads_refused_or_routed(data, status):
    relay = ClientRelay(32 << 10)
    effects = relay.receive(data)
    assert effects in (SERVE, DISPATCH)  # a parse error queues its refusal: served in its turn
    ex = relay.next_request()
    assert ex is not None
    if status:
        assert ex.error is not None and ex.error[0] == status
    else:
        assert ex.error is None and ex.head.host == b"b.test" and ex.url == b"/x"


def test_a_malformed_chunk_inside_a_forwarded_body_fails_that_request_400():
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n")
    ex, link = forward(relay)
    relay.request_bytes(ex, None)
    assert relay.receive(b"zz\r\n") == FAIL
    assert relay.link is link and ex.conn is None and relay.draining
    assert relay.failure is not None and relay.failure[0] is ex and relay.failure[1] == 400


def test_a_malformed_chunk_mid_answer_closes():
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n")
    ex, _ = forward(relay)
    ex.answer_head(200, None)
    assert relay.receive(b"zz\r\n") == CLOSE


def test_a_chunked_body_is_rechunked_for_the_worker_as_it_comes():
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST / HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
    ex, link = forward(relay)
    head = relay.request_bytes(ex, None)
    assert head.endswith(b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n") and not ex.sent
    relay.receive(b"0\r\n\r\n")
    assert relay.body_bytes() == (link, b"0\r\n\r\n") and ex.sent


# ------------------------------------------------------------------ failing closed

class _Broken(ClientRelay):
    __slots__ = ()

    def on_message_complete(self) -> None:
        raise RelayError("ANSWER_END is not legal while QUEUED")


@pytest.mark.skipif(COMPILED, reason="a compiled relay cannot be subclassed from Python (the sources' run has it)")
def test_an_illegal_step_inside_the_parser_is_raised_not_taken_for_a_bad_request():
    relay = _Broken(32 << 10)
    with pytest.raises(RelayError):
        relay.receive(GET)


def test_abandon_closes_every_open_entry_and_gives_the_links_back():
    forwards = ForwardCounters()
    relay = ClientRelay(32 << 10)
    relay.receive(GET + GET)
    ex, link = forward(relay, forwards)
    assert forwards.open_by_worker() == {"acme.shop.green.1": 1}
    assert relay.abandon(2.0, forwards) == [link]
    assert forwards.open_by_worker() == {} and ex.phase is Phase.DONE and not relay.queue and relay.draining
    assert relay.receive(GET) == 0


def test_a_body_over_the_bound_that_serving_sends_on_pauses_nothing():
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 400000\r\n\r\n")
    ex, link = forward(relay)
    relay.request_bytes(ex, None)
    assert relay.receive(b"x" * 300_000) == SERVE | CROWDED  # over MAX_PENDING, until it is sent on
    sent_to, data = relay.body_bytes()
    assert sent_to is link and len(data) == 300_000 and relay.pending == 0
    assert relay.pause_if_crowded() is False and relay.paused == 0


def test_a_chunked_bodys_trailer_is_dropped_and_never_read_into_the_next_request():
    """A trailer read as the next head's headers would give one request's Cookie, Host or X-Forwarded-For to
    the next one on the connection (behind a TLS terminator, another user's)."""
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST /1 HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                  b"3\r\nabc\r\n0\r\nCookie: elastic_uid=" + b"a" * 32 + b"\r\nHost: evil.test\r\n"
                  b"X-Forwarded-For: 6.6.6.6\r\n\r\n"
                  b"GET /2 HTTP/1.1\r\nHost: a.test\r\nCookie: elastic_uid=" + b"b" * 32 + b"\r\n\r\n")
    first, second = relay.queue
    assert first.head.cookie is None and first.head.hosts == 1 and first.head.host == b"a.test"
    assert second.error is None and second.head.hosts == 1 and second.head.cookie == b"elastic_uid=" + b"b" * 32
    assert second.head.forwarded_for is None


def test_requests_read_behind_an_answer_that_closes_are_not_served():
    relay = ClientRelay(32 << 10)
    relay.receive(b"GET /a HTTP/1.1\r\n\r\n" + b"POST /b HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc")
    first = relay.next_request()
    assert first is not None and first.error is not None and len(relay.queue) == 2
    _, mode = relay.own_answer(first, *first.error, retry_after=None, close=True, stopping=False)
    assert mode is CloseMode.LINGER and not relay.queue and relay.pending == 0
    assert relay.next_request() is None


def test_a_pause_for_the_worker_connections_buffer_ends_with_that_request():
    relay = ClientRelay(32 << 10)
    assert relay.pause(FOR_UPSTREAM) is True
    assert relay.worker_gone() is True and relay.paused == 0
    assert relay.worker_gone() is False
    relay.pause(FOR_QUEUE)
    relay.pause(FOR_UPSTREAM)
    assert relay.worker_gone() is False and relay.paused == FOR_QUEUE  # still held for the queue


@pytest.mark.parametrize("split", [19, 30, 45])
def test_a_pipelined_head_is_measured_from_its_own_first_byte(split: int) -> None:
    """A head cut by the read's end, behind a request whose 40,000-byte body came in the same read: its size is
    its own bytes, not the body's before it (those once made it a 431)."""
    second = b"GET /b HTTP/1.1\r\nHost: a.test\r\nX-Some: " + b"y" * 20 + b"\r\n\r\n"
    relay = ClientRelay(32 << 10)
    relay.receive(b"POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 40000\r\n\r\n" + b"x" * 40_000
                  + second[:split])
    relay.receive(second[split:])
    assert [(ex.url, ex.error) for ex in relay.queue] == [(b"/a", None), (b"/b", None)]
    assert not relay.draining
