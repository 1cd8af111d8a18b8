"""A chunked request body read by the front (``front.core.chunked``): RFC 9112 §7.1's grammar as a table, each row
read whole and byte by byte alike; and the relay handing a chunked body to it and the bytes after it to a fresh
parser, on llhttp (where the parser would refuse BWS in a chunk extension)."""

from __future__ import annotations

import pytest

from elasticd.front.core.chunked import DONE, MAX_SIZE_LINE, SIZE, TRAILER, ChunkedBody
from elasticd.front.core.connection import ClientRelay

OK = None


@pytest.mark.parametrize(("data", "body", "rest", "error"), [
    (b"5\r\nhello\r\n0\r\n\r\n", b"hello", b"", OK),
    (b"5; a=b\r\nhello\r\n0\r\n\r\n", b"hello", b"", OK),  # BWS after ';' (RFC 9112 §7.1.1)
    (b"5 ;a = b ; c\t;d=\"x;\\\"y\"\r\nhello\r\n0;e\r\n\r\n", b"hello", b"", OK),  # BWS, a name alone, quoted-string
    (b"A\r\n0123456789\r\n1\r\n!\r\n000\r\n\r\n", b"0123456789!", b"", OK),  # hex, several chunks, 1*("0")
    (b"5\r\nhello\r\n0\r\nX-Trailer: t\r\nVary: *\r\n\r\nGET / HTTP/1.1\r\n", b"hello", b"GET / HTTP/1.1\r\n", OK),
    (b"5\r\nhe", b"he", b"", "more"),  # not over yet
    (b"5\nhello\r\n0\r\n\r\n", b"", b"", "bare LF"),
    (b"5\r\nhello\n0\r\n\r\n", b"hello", b"", "not followed by CRLF"),
    (b"5\r\nhelloX\r\n0\r\n\r\n", b"hello", b"", "not followed by CRLF"),  # a size shorter than its data
    (b"x\r\n", b"", b"", "malformed chunk-size"),
    (b"-5\r\nhello\r\n", b"", b"", "malformed chunk-size"),
    (b"0x5\r\nhello\r\n", b"", b"", "malformed chunk-size"),
    (b"\r\nhello\r\n", b"", b"", "malformed chunk-size"),  # no size
    (b"5;\r\nhello\r\n", b"", b"", "malformed chunk-size"),  # ';' without a name
    (b"5; a=b c\r\nhello\r\n", b"", b"", "malformed chunk-size"),
    (b"5; a=\"b\r\nhello\r\n", b"", b"", "malformed chunk-size"),  # an open quoted-string
    (b"5\rX\nhello\r\n", b"", b"", "bare LF"),  # a lone CR
    (b"1" * 17 + b"\r\n", b"", b"", "malformed chunk-size"),  # past 16 hex digits
    (b"5;" + b"a" * MAX_SIZE_LINE + b"\r\n", b"", b"", "over 4096"),
    (b"0\r\nno colon\r\n\r\n", b"", b"", "malformed field line"),
    (b"0\r\nX: " + b"v" * 200 + b"\r\n\r\n", b"", b"", "trailer section over 128"),
])
def test_the_chunked_grammar(data: bytes, body: bytes, rest: bytes, error: str | None) -> None:
    for pieces in ([data], [data[i:i + 1] for i in range(len(data))]):  # whole, then a byte a read
        chunks = ChunkedBody(max_trailer=128)
        out: list[bytes] = []
        took = 0
        for piece in pieces:
            took = chunks.feed(piece, out)
            if took < 0 or chunks.state == DONE:
                break
        assert b"".join(out) == body
        if error is OK:
            assert chunks.state == DONE and data.endswith(rest) and (len(pieces) > 1 or took == len(data) - len(rest))
        elif error == "more":
            assert took == len(pieces[-1]) and chunks.state not in (DONE, TRAILER) and not chunks.error
        else:
            assert took == -1 and error in chunks.error, chunks.error


def test_a_size_line_in_pieces_is_read_whole() -> None:
    chunks = ChunkedBody(max_trailer=128)
    out: list[bytes] = []
    assert chunks.feed(b"5; a", out) == 4 and chunks.state == SIZE
    assert chunks.feed(b" =b\r", out) == 4 and chunks.error == ""  # (BWS before '=')
    assert chunks.feed(b"\nhello\r\n0\r\n\r\nnext", out) == 13 and chunks.state == DONE and out == [b"hello"]


def _queue(*reads: bytes) -> list[tuple[bytes, bytes, bytes, bool, object]]:
    relay = ClientRelay(32 << 10)
    for data in reads:
        relay.receive(data)
    return [(ex.method, ex.url, b"".join(ex.body), ex.body_done, ex.error) for ex in relay.queue]


GET = b"GET /a HTTP/1.1\r\nHost: a.test\r\n\r\n"
POST = b"POST /b HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\n\r\n\r\n\r\n"  # its body: two CRLFs
BIG = b"POST /d HTTP/1.1\r\nHost: a.test\r\nContent-Length: 150\r\n\r\n" + b"x" * 150  # a body longer than a head
CHUNKED = b"POST /c HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n3; x=1\r\nabc\r\n0\r\n\r\n"


@pytest.mark.parametrize("stream", [
    GET + CHUNKED + GET,
    POST + CHUNKED + CHUNKED + POST,
    b"\r\n" + CHUNKED + b"\r\n" + GET,  # empty lines before a request (RFC 9112 §2.2)
    BIG + CHUNKED + GET,  # a read that begins inside the body before: its part of that body is what came before
])
def test_requests_around_a_chunked_body_read_alike_however_cut(stream: bytes) -> None:
    whole = _queue(stream)
    assert all(error is None and done for *_, done, error in whole), whole
    assert [body for _, _, body, _, _ in whole if body] and b"abc" in [body for _, _, body, _, _ in whole]
    for cut in range(1, len(stream)):
        assert _queue(stream[:cut], stream[cut:]) == whole, cut
    assert _queue(*(stream[i:i + 1] for i in range(len(stream)))) == whole


def test_a_malformed_chunk_is_answered_400_in_its_turn() -> None:
    relay = ClientRelay(32 << 10)
    relay.receive(GET + b"POST /c HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
    first, second = relay.queue
    assert first.error is None and second.error is not None and second.error[0] == 400  # (each parser says why)
    assert relay.draining


def test_many_chunked_requests_in_one_read_are_read_in_a_loop() -> None:
    """A client's read may hold any number of them: each body's end hands the rest on without a recursion (1,500 of
    them took Python past its recursion limit)."""
    assert all(done and error is None for *_, done, error in _queue(CHUNKED * 1500))
    assert len(_queue(CHUNKED * 1500)) == 1500
