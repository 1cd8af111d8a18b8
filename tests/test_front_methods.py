"""Methods the parser does not know (``front.core.methods``): the token read by the front, the relay reading the
request again with a known method in its place, and a worker getting the method the client sent (RFC 9110 §9.1)."""

from __future__ import annotations

import pytest

from elasticd.front.core.connection import DISPATCH, ClientRelay
from elasticd.front.core.methods import MAX_METHOD, MORE, WHOLE, read_method


@pytest.mark.parametrize(("data", "expected"), [
    (b"FOO / HTTP/1.1\r\n", (WHOLE, b"FOO", 3)),
    (b"-BLARGH /x HTTP/1.1\r\n", (WHOLE, b"-BLARGH", 7)),
    (b"\r\n\r\nBREW /pot HTTP/1.1\r\n", (WHOLE, b"BREW", 8)),  # empty lines before a request (RFC 9112 §2.2)
    (b"FO", (MORE, b"", 0)),  # the token is not whole yet
    (b"FOO", (MORE, b"", 0)),
    (b"x" * MAX_METHOD, (MORE, b"", 0)),
    (b"x" * (MAX_METHOD + 1), (501, b"", 0)),
    (b"F{O / HTTP/1.1\r\n", (400, b"", 0)),  # "{" is no tchar
    (b"\x16\x03\x01\x02\x00", (400, b"", 0)),  # a TLS ClientHello on the plain-text port
    (b" / HTTP/1.1\r\n", (400, b"", 0)),  # an empty method
])
def test_the_method_token(data: bytes, expected: tuple[int, bytes, int]) -> None:
    status, token, end, why = read_method(data)
    assert (status, token, end) == expected
    assert bool(why) == (status not in (WHOLE, MORE))


def _relay_read(*pieces: bytes) -> tuple[ClientRelay, list[int]]:
    relay = ClientRelay(32 << 10)
    return relay, [relay.receive(piece) for piece in pieces]


def test_an_unknown_method_is_read_and_forwarded_as_sent() -> None:
    relay, effects = _relay_read(b"FOO /x HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello")
    assert effects == [DISPATCH]
    ex = relay.queue[0]
    assert (ex.method, ex.url, ex.error, ex.body_done, b"".join(ex.body)) == (b"FOO", b"/x", None, True, b"hello")


@pytest.mark.parametrize("pieces", [
    (b"FO", b"O /d HTTP/1.1\r\nHost: a.test\r\n\r\n"),  # no method begins so: waits for the token
    (b"PR", b"OPF", b"INDX /d HTTP/1.1\r\nHost: a.test\r\n\r\n"),  # PROPFIND's prefix: the reads are kept
    (b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", b"PROPFINDX /d HTTP/1.1\r\nHost: a.test\r\n\r\n"),
])
def test_a_method_split_across_reads_is_read_whole(pieces: tuple[bytes, ...]) -> None:
    relay, effects = _relay_read(*pieces)
    assert relay.queue[-1].method in (b"FOO", b"PROPFINDX") and relay.queue[-1].error is None, effects
    assert not relay.draining


def test_requests_after_it_on_the_connection_are_read_by_the_new_parser() -> None:
    relay, effects = _relay_read(b"FOO / HTTP/1.1\r\nHost: a.test\r\n\r\n", b"GET /b HTTP/1.1\r\nHost: a.test\r\n\r\n",
                                 b"BAR /c HTTP/1.1\r\nHost: a.test\r\n\r\n")
    assert [ex.method for ex in relay.queue] == [b"FOO", b"GET", b"BAR"]
    assert all(ex.error is None for ex in relay.queue) and effects[0] == DISPATCH


@pytest.mark.parametrize(("pieces", "methods", "bodies"), [
    # behind another request in the same read
    ((b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\nFOO / HTTP/1.1\r\nHost: a.test\r\n\r\n",),
     [b"GET", b"FOO"], [b"", b""]),
    # behind a request with a body, and the empty lines RFC 9112 §2.2 lets a request follow
    ((b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n\r\nbody\r\n"
      b"BREW /pot HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\ntea",),
     [b"POST", b"BREW"], [b"body", b"tea"]),
    # the read begins inside the first one's body
    ((b"POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n\r\nbo", b"dyFOO /x HTTP/1.1\r\nHost: a.test\r\n\r\n"),
     [b"POST", b"FOO"], [b"body", b""]),
    # ... inside the first one's head, its end split across the reads
    ((b"GET / HTTP/1.1\r\nHost: a.test\r\n\r",
      b"\nGET /2 HTTP/1.1\r\nHost: a.test\r\n\r\nFOO /x HTTP/1.1\r\nHost: a.test\r\n\r\n"),
     [b"GET", b"GET", b"FOO"], [b"", b"", b""]),
    # three unknown ones, one read
    ((b"FOO /1 HTTP/1.1\r\nHost: a.test\r\n\r\nBAR /2 HTTP/1.1\r\nHost: a.test\r\n\r\nBAZ /3 HTTP/1.1\r\nHost: a.test"
      b"\r\n\r\n",),
     [b"FOO", b"BAR", b"BAZ"], [b"", b"", b""]),
    # the token cut at the read's end
    ((b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\nFO", b"O /x HTTP/1.1\r\nHost: a.test\r\n\r\n"),
     [b"GET", b"FOO"], [b"", b""]),
])
def test_one_behind_another_is_read_where_the_other_ended(pieces: tuple[bytes, ...], methods: list[bytes],
                                                          bodies: list[bytes]) -> None:
    relay, effects = _relay_read(*pieces)
    assert [ex.method for ex in relay.queue] == methods, effects
    assert [ex.error for ex in relay.queue] == [None] * len(methods)
    assert [b"".join(ex.body) for ex in relay.queue] == bodies
    assert [ex.url for ex in relay.queue][-1] in (b"/", b"/x", b"/3", b"/pot")
    assert not relay.draining and all(ex.body_done for ex in relay.queue)


@pytest.mark.parametrize("stream", [
    b"GET /a HTTP/1.1\r\nHost: a.test\r\n\r\nFOO /b HTTP/1.1\r\nHost: a.test\r\n\r\n",
    b"POST /a HTTP/1.1\r\nHost: a.test\r\nContent-Length: 150\r\n\r\n" + b"x" * 150
    + b"FOO /b HTTP/1.1\r\nHost: a.test\r\nContent-Length: 3\r\n\r\nabc\r\nBAR /c HTTP/1.1\r\nHost: a.test\r\n\r\n",
])
def test_unknown_methods_read_alike_however_the_stream_is_cut(stream: bytes) -> None:
    def read(*pieces: bytes) -> list[tuple[bytes, bytes, bytes, object]]:
        relay, _ = _relay_read(*pieces)
        assert not relay.draining
        return [(ex.method, ex.url, b"".join(ex.body), ex.error) for ex in relay.queue]

    whole = read(stream)
    assert all(error is None for *_, error in whole) and whole[1][:2] == (b"FOO", b"/b"), whole
    for cut in range(1, len(stream)):
        assert read(stream[:cut], stream[cut:]) == whole, cut


def test_a_request_after_it_in_the_same_read_is_read_too() -> None:
    relay, _ = _relay_read(b"GET /a HTTP/1.1\r\nHost: a.test\r\n\r\nFOO /b HTTP/1.1\r\nHost: a.test\r\n\r\n"
                           b"GET /c HTTP/1.1\r\nHost: a.test\r\n\r\n")
    assert [(ex.method, ex.url, ex.error) for ex in relay.queue] == [
        (b"GET", b"/a", None), (b"FOO", b"/b", None), (b"GET", b"/c", None)]


@pytest.mark.parametrize(("data", "status"), [(b"F{O / HTTP/1.1\r\n\r\n", 400), (b"y" * 80, 501)])
def test_what_is_no_method_is_refused(data: bytes, status: int) -> None:
    relay, _ = _relay_read(data)
    (ex,) = relay.queue
    assert ex.error is not None and ex.error[0] == status and relay.draining
