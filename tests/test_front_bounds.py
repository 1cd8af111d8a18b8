"""The front's bounds on what a worker feeds it (``front.core.bounds``), as tables over the pure core: the
connection bounds and the decision at the bound, and a worker's answer driven byte by byte through its relay
(``core.answer``) past each bound — head bytes (whole, trickled, one endless line, the reason phrase), head lines,
interim heads, chunk-size lines and trailers — and just under it, where nothing is refused. The same bounds
against real sockets: ``test_front_bounds_sockets``."""

from __future__ import annotations

import pytest
from test_front_answer import forwarded
from test_front_connection import forward

from elasticd.front.core.answer import CLOSE, FAILED, WRITE
from elasticd.front.core.bounds import (
    FRAMING,
    HEAD_FIELDS,
    HEAD_SIZE,
    INTERIM,
    MALFORMED,
    MAX_CONNECTIONS,
    MAX_FRAMING_BYTES,
    MAX_HEAD_BYTES,
    MAX_HEAD_FIELDS,
    MAX_INTERIM,
    MAX_WAITING,
    MIN_CONNECTIONS,
    OPEN,
    REFUSE,
    WAIT,
    connection_bound,
    idle_bound,
    next_connection,
)
from elasticd.front.core.connection import ClientRelay
from elasticd.front.core.relay import Phase

HEAD = b"HTTP/1.1 200 OK\r\n"
CHUNKED = HEAD + b"Transfer-Encoding: chunked\r\n\r\n"


def test_the_bounds_are_what_the_readme_says():
    assert (MAX_HEAD_BYTES, MAX_HEAD_FIELDS, MAX_INTERIM, MAX_FRAMING_BYTES) == (32 << 10, 256, 8, 32 << 10)
    assert (MIN_CONNECTIONS, MAX_CONNECTIONS, MAX_WAITING) == (8, 1024, 1024)


# -- connections to one worker ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("concurrency", "bound", "idle"), [
    (1, MIN_CONNECTIONS, MIN_CONNECTIONS // 2),  # a worker of one still gets a few
    (4, 8, 4),
    (8, 16, 8),  # the config's default: twice what it serves at once, as many kept idle as it serves
    (100, 200, 100),
    (512, 1024, 512),
    (100_000, MAX_CONNECTIONS, MAX_CONNECTIONS // 2),  # whatever the concurrency says
])
def test_the_connection_bound_follows_the_groups_concurrency(concurrency, bound, idle):
    assert (connection_bound(concurrency), idle_bound(concurrency)) == (bound, idle)


@pytest.mark.parametrize(("open_conns", "connecting", "waiting", "bound", "decision"), [
    (0, 0, 0, 8, OPEN),
    (7, 0, 0, 8, OPEN),
    (7, 1, 0, 8, WAIT),  # one being opened counts: a burst opens no more than the bound
    (8, 0, 0, 8, WAIT),
    (8, 0, MAX_WAITING - 1, 8, WAIT),
    (8, 0, MAX_WAITING, 8, REFUSE),  # past the line's bound: 503
    (20, 0, 0, 8, WAIT),  # over a bound a reload lowered: no new one until they close
])
def test_a_request_opens_waits_or_is_refused_at_the_bound(open_conns, connecting, waiting, bound, decision):
    assert next_connection(open_conns, connecting, waiting, bound) == decision


# -- a worker's answer, past each bound ----------------------------------------------------------------------


def _lines(count: int, size: int = 10) -> bytes:
    """``count`` header lines of ``size`` bytes each (name, ": ", value, CRLF)."""
    return b"".join(b"X-%04d: %s\r\n" % (i, b"v" * (size - 10)) for i in range(count))


def _feed(reads: list[bytes], request: bytes = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n"):
    """Each read through a fresh relay; the effects of the last, the relay and the exchange."""
    relay, ex = forwarded(request)
    effects = 0
    for data in reads:
        effects = relay.receive(data, 100.0)
        if effects & FAILED:
            break
    return effects, relay, ex


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


ENDLESS_LINE = [HEAD + b"X-Long: "] + [b"v" * 4096] * 9  # one header line that never ends: 36 KiB and counting
ENDLESS_REASON = [b"HTTP/1.1 200 "] + [b"O" * 4096] * 9
ENDLESS_EXTENSION = [CHUNKED + b"5\r\nhello\r\n1;ext="] + [b"e" * 4096] * 9
ENDLESS_ZEROS = [CHUNKED] + [b"0" * 4096] * 9  # a chunk size of endless leading zeros
ENDLESS_TRAILER = [CHUNKED + b"1\r\nx\r\n0\r\n"] + [b"X-T: v\r\n" * 512] * 9


@pytest.mark.parametrize(("name", "reads", "reason", "phase"), [
    ("a head of 33 lines of 1 KiB, in one read", [HEAD + _lines(33, 1024) + b"\r\n"], HEAD_SIZE, Phase.FORWARDING),
    ("the same head, 100 bytes a read", _pieces(HEAD + _lines(33, 1024) + b"\r\n", 100), HEAD_SIZE,
     Phase.FORWARDING),
    ("one header line that never ends", ENDLESS_LINE, HEAD_SIZE, Phase.FORWARDING),
    ("a 40 KiB header value, whole in one read", [HEAD + b"X-Big: " + b"v" * (40 << 10) + b"\r\n\r\n"], HEAD_SIZE,
     Phase.FORWARDING),
    ("a reason phrase that never ends", ENDLESS_REASON, HEAD_SIZE, Phase.FORWARDING),
    ("a 40 KiB reason phrase, whole in one read", [b"HTTP/1.1 200 " + b"O" * (40 << 10) + b"\r\n\r\n"], HEAD_SIZE,
     Phase.FORWARDING),
    ("257 header lines", [HEAD + _lines(MAX_HEAD_FIELDS + 1) + b"\r\n"], HEAD_FIELDS, Phase.FORWARDING),
    ("257 Connection lines (each drops, each counts)", [HEAD + b"Connection: a\r\n" * 257 + b"\r\n"], HEAD_FIELDS,
     Phase.FORWARDING),
    ("nine interim answers", [b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * (MAX_INTERIM + 1)], INTERIM,
     Phase.FORWARDING),
    ("a chunk-size line with an endless extension", ENDLESS_EXTENSION, FRAMING, Phase.ANSWERING),
    ("a chunk size of endless zeros", ENDLESS_ZEROS, FRAMING, Phase.ANSWERING),
    ("an endless trailer", ENDLESS_TRAILER, FRAMING, Phase.ANSWERING),
    ("a trailer of 257 lines, in one read", [CHUNKED + b"1\r\nx\r\n0\r\n" + _lines(257) + b"\r\n"], FRAMING,
     Phase.ANSWERING),
    ("a trailer line of 40 KiB, in one read", [CHUNKED + b"1\r\nx\r\n0\r\nX-T: " + b"v" * (40 << 10) + b"\r\n\r\n"],
     FRAMING, Phase.ANSWERING),
    ("no HTTP at all", [b"SPDY/3 200 OK\r\n\r\n"], MALFORMED, Phase.FORWARDING),
])
def test_past_a_bound_the_request_fails_and_the_connection_closes(name, reads, reason, phase):
    effects, relay, ex = _feed(reads)
    assert effects & (FAILED | CLOSE) == FAILED | CLOSE, name
    assert relay.refused == reason and relay.why.startswith("sent "), (name, relay.why)
    assert ex.phase is phase, name  # FORWARDING: the front answers 502; ANSWERING: the client's connection is cut


@pytest.mark.parametrize(("name", "reads"), [
    ("256 header lines", [HEAD + _lines(MAX_HEAD_FIELDS - 1) + b"Content-Length: 0\r\n\r\n"]),
    ("a head of 30 KiB, 100 bytes a read", _pieces(HEAD + _lines(30, 1024) + b"Content-Length: 0\r\n\r\n", 100)),
    ("eight interim answers", [b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * MAX_INTERIM
                               + b"HTTP/1.1 204 No Content\r\n\r\n"]),
    ("a body of 1-byte chunks, a chunk a read", [CHUNKED] + [b"1\r\nx\r\n"] * 20_000 + [b"0\r\n\r\n"]),
    ("a trailer of 256 lines", [CHUNKED + b"1\r\nx\r\n0\r\n" + _lines(MAX_HEAD_FIELDS) + b"\r\n"]),
])
def test_under_the_bounds_nothing_is_refused(name, reads):
    effects, relay, ex = _feed(reads)
    assert not effects & FAILED and relay.refused == "", (name, relay.why)
    assert ex.phase is Phase.ANSWERING and relay.done, name


@pytest.mark.parametrize(("last", "refused"), [(126, ""), (127, HEAD_SIZE)])
def test_the_exact_bound_of_a_head_is_its_reason_phrase_and_header_lines(last, refused):
    # "OK" and 255 lines of 128 bytes and one of 126: MAX_HEAD_BYTES exactly, accepted; one byte more is refused.
    assert MAX_HEAD_FIELDS * 128 == MAX_HEAD_BYTES
    effects, relay, _ = _feed([HEAD + _lines(MAX_HEAD_FIELDS - 1, 128) + _lines(1, last) + b"\r\n"])
    assert relay.refused == refused and bool(effects & FAILED) is bool(refused)


def test_a_refused_head_still_passes_on_the_interim_answers_already_read():
    early = b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
    effects, relay, _ = _feed([early + HEAD + _lines(MAX_HEAD_FIELDS + 1) + b"\r\n"])
    assert effects == WRITE | FAILED | CLOSE and relay.to_client.startswith(b"HTTP/1.1 103 Early Hints")


def test_the_next_answer_on_a_connection_counts_its_head_from_none():
    relay, _ = forwarded()
    big = HEAD + _lines(200, 100) + b"Content-Length: 0\r\n\r\n"  # 20 KiB: twice would be over
    assert not relay.receive(big) & FAILED
    relay.detach()
    _, following = forwarded()
    relay.start(following, True)
    assert not relay.receive(big) & FAILED and relay.refused == ""


# -- the head's clock -------------------------------------------------------------------------------------------


def test_the_heads_clock_starts_at_its_first_byte_and_restarts_after_an_interim_head():
    relay, ex = forwarded()
    assert ex.head_began == 0.0
    relay.receive(b"HTTP/1.1 20", 10.0)
    assert ex.head_began == 10.0
    relay.receive(b"0 OK\r\nX-A: 1\r\n", 11.0)
    assert ex.head_began == 10.0  # the same head: its clock runs on
    relay.detach()
    relay, ex = forwarded()
    relay.receive(b"HTTP/1.1 103 Early", 5.0)
    assert ex.head_began == 5.0
    relay.receive(b" Hints\r\n\r\n", 10.0)
    assert ex.head_began == 10.0  # the interim head came whole: the final head's clock starts with that read
    relay.receive(b"HTTP/1.1 200 OK\r\n", 20.0)
    assert ex.head_began == 10.0


@pytest.mark.parametrize(("began", "now", "phase", "overdue"), [
    (0.0, 1000.0, Phase.FORWARDING, False),  # no byte of the head yet: the idle limit's, not this
    (100.0, 159.0, Phase.FORWARDING, False),
    (100.0, 160.0, Phase.FORWARDING, False),
    (100.0, 160.5, Phase.FORWARDING, True),  # a minute after its first byte, a head still not whole
    (100.0, 1000.0, Phase.ANSWERING, False),  # the head came whole: a stream's pace is its own
])
def test_a_head_not_whole_a_request_timeout_after_its_first_byte_is_overdue(began, now, phase, overdue):
    relay = ClientRelay(MAX_HEAD_BYTES)
    relay.receive(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
    ex, _ = forward(relay)
    ex.head_began = began
    ex.phase = phase
    assert relay.head_overdue(now, 60.0) is overdue


def test_no_request_no_overdue_head():
    assert ClientRelay(MAX_HEAD_BYTES).head_overdue(1000.0, 60.0) is False
