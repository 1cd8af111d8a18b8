"""The relay of one worker connection's answers (``front.core.answer``) driven by bytes alone, with no socket:
which answers free the connection for the next request and which close it, what the client gets (framing,
interim answers, the login and cookie headers), tunnels, answers out of turn, and failures."""

from __future__ import annotations

import pytest
from test_front_connection import forward

from elasticd.front.core.answer import (
    ANSWERED,
    CLOSE,
    FAILED,
    RELEASE,
    TUNNEL,
    TUNNEL_CLOSED,
    UPGRADED,
    WRITE,
    AnswerRelay,
)
from elasticd.front.core.connection import ClientRelay
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import Phase, RelayError

OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello"


def forwarded(request: bytes = b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", reused: bool = True
              ) -> tuple[AnswerRelay, Exchange]:
    client = ClientRelay(32 << 10)
    client.receive(request)
    ex, _ = forward(client)
    client.request_bytes(ex, None)
    relay = AnswerRelay()
    relay.start(ex, reused)
    return relay, ex


def test_a_whole_answer_in_one_read_frees_the_connection():
    relay, ex = forwarded()
    assert relay.receive(OK) == WRITE | ANSWERED | RELEASE
    assert relay.to_client == OK
    assert relay.close_after is False and ex.phase is Phase.ANSWERING and ex.status == 200


def test_an_answer_in_pieces():
    relay, _ = forwarded()
    assert relay.receive(OK[:30]) == 0  # not even the head yet
    assert relay.receive(OK[30:-2]) == WRITE  # the head and part of the body
    assert relay.to_client == OK[:-2]
    assert relay.receive(OK[-2:]) == WRITE | ANSWERED | RELEASE
    assert relay.to_client == b"lo"


@pytest.mark.parametrize(("request_head", "answer", "effects", "close_after"), [
    # the worker closes after it: the connection cannot be reused; the client's stays
    (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", OK.replace(b"Content-Type", b"Connection: close\r\nContent-Type"),
     WRITE | ANSWERED | CLOSE, False),
    # an HTTP/1.0 worker without keep-alive
    (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n", OK.replace(b"HTTP/1.1", b"HTTP/1.0"), WRITE | ANSWERED | CLOSE, False),
    # the client said close: its connection closes after; the worker's is reused
    (b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", OK, WRITE | ANSWERED | RELEASE, True),
    # a request body not read whole: nothing after it could be framed on the worker's connection
    (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\nabc", OK, WRITE | ANSWERED | CLOSE, True),
])
def test_reuse_and_close(request_head, answer, effects, close_after):
    relay, _ = forwarded(request_head)
    assert relay.receive(answer) == effects
    assert relay.close_after is close_after


def test_chunked_answers_are_rechunked_for_http11_and_closed_for_http10():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    relay, _ = forwarded()
    assert relay.receive(chunked) == WRITE | ANSWERED | RELEASE
    out = relay.to_client
    assert out.endswith(b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
    relay, _ = forwarded(b"GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
    assert relay.receive(chunked) == WRITE | ANSWERED | RELEASE
    out = relay.to_client
    assert b"chunked" not in out and b"Connection: close\r\n" in out and out.endswith(b"\r\n\r\nhello")
    assert relay.close_after is True  # the end of the body is the end of the client's connection


def test_a_body_delimited_by_the_worker_closing_ends_when_it_closes():
    relay, _ = forwarded()
    assert relay.receive(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nsome") == WRITE
    assert relay.to_client.endswith(b"Transfer-Encoding: chunked\r\n\r\n4\r\nsome\r\n")  # re-chunked for HTTP/1.1
    assert relay.lost(None) == WRITE | ANSWERED
    assert relay.to_client == b"0\r\n\r\n"


def test_a_head_answer_is_complete_at_its_head_and_the_parser_is_replaced_before_the_next():
    relay, _ = forwarded(b"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n")
    parser = relay.parser
    assert relay.receive(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n") == WRITE | ANSWERED | RELEASE
    assert relay.to_client.endswith(b"Content-Length: 5\r\n\r\n")
    relay.detach()
    _, ex2 = forwarded()
    relay.start(ex2, True)
    assert relay.parser is not parser
    assert relay.receive(OK) == WRITE | ANSWERED | RELEASE


@pytest.mark.parametrize(("version", "passed_on"), [(b"HTTP/1.1", True), (b"HTTP/1.0", False)])
def test_an_interim_answer_goes_to_an_http11_client_only(version, passed_on):
    relay, _ = forwarded(b"GET / " + version + b"\r\nHost: a\r\nConnection: keep-alive\r\n\r\n")
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n"
    assert relay.receive(early + OK) == WRITE | ANSWERED | RELEASE
    out = relay.to_client
    assert (b"103 Early Hints" in out) is passed_on and out.endswith(b"hello")


def test_the_login_header_is_read_and_stripped_and_a_new_users_cookie_added():
    relay, ex = forwarded()
    ex.cookie_line = b"Set-Cookie: elastic_uid=u1; Path=/\r\n"
    relay.receive(OK.replace(b"Content-Type", b"X-Elastic-Login: alice\r\nContent-Type"))
    out = relay.to_client
    assert ex.login == b"alice" and b"X-Elastic-Login" not in out and b"Set-Cookie: elastic_uid=u1" in out


def test_an_upgrade_becomes_a_tunnel():
    relay, _ = forwarded(b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    assert relay.receive(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
                         b"\x81\x02hi") == WRITE | UPGRADED
    assert b"101 Switching Protocols" in relay.to_client and relay.tail == b"\x81\x02hi"
    assert relay.receive(b"\x81\x02yo") == TUNNEL  # relayed as it is
    assert relay.lost(None) == TUNNEL_CLOSED


def test_a_second_answer_in_the_same_read_is_dropped_with_the_connection():
    relay, _ = forwarded()
    assert relay.receive(OK + b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad") == WRITE | ANSWERED | CLOSE
    assert relay.to_client == OK


@pytest.mark.parametrize(("answer", "why"), [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello", "sent a malformed answer"),
    (b"SPDY/3 200 OK\r\n\r\n", "sent a malformed answer"),
])
def test_a_malformed_answer_fails_the_request(answer, why):
    relay, _ = forwarded()
    effects = relay.receive(answer)
    assert effects & (FAILED | CLOSE) == FAILED | CLOSE and relay.why.startswith(why)
    assert relay.received


def test_a_connection_lost_before_any_answer_fails_the_request_and_says_whether_it_was_reused():
    relay, _ = forwarded(reused=True)
    assert relay.lost(None) == FAILED and relay.why == "closed the connection"
    assert relay.reused and not relay.received  # what retry-once asks (relay.upstream_lost)


def test_an_illegal_step_inside_the_parser_is_raised_not_taken_for_a_malformed_answer():
    relay, ex = forwarded()
    ex.rid = 0
    ex.phase = Phase.DONE  # answered already: an answer head is not legal now
    with pytest.raises(RelayError, match="ANSWER_HEAD is not legal while DONE"):
        relay.receive(OK)


def test_a_chunked_answers_trailer_is_dropped_and_never_reaches_the_next_answer():
    relay, ex = forwarded()
    answer = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
              b"0\r\nX-Elastic-Login: mallory\r\nX-Tr: 1\r\n\r\n")
    assert relay.receive(answer) == WRITE | ANSWERED | RELEASE
    assert relay.to_client.endswith(b"\r\n\r\n3\r\nabc\r\n0\r\n\r\n") and ex.login is None
    relay.detach()
    _, following = forwarded()
    relay.start(following, True)
    assert relay.receive(OK) == WRITE | ANSWERED | RELEASE
    assert b"X-Tr" not in relay.to_client and following.login is None
