"""However the bytes are cut into reads, the relay cores make the same of them: a property test over the
split points of a stream of pipelined requests (``ClientRelay``) and of a worker's answers (``AnswerRelay``).
State carried between reads — a head in pieces, a body, a chunk size, a trailer, the reader readied at the end of
a head — is where such code breaks; a whole-stream read is the reference."""

from __future__ import annotations

import httptools
from hypothesis import given, settings
from hypothesis import strategies as st
from test_front_connection import forward

from elasticd.front.core.answer import ANSWERED, AnswerRelay
from elasticd.front.core.connection import ClientRelay
from elasticd.front.core.relay import Event

REQUESTS = (
    b"GET /a?x=1 HTTP/1.1\r\nHost: a.test\r\nCookie: elastic_uid=" + b"c" * 32 + b"\r\nUser-Agent: t\r\n\r\n"
    b"POST /b HTTP/1.1\r\nHost: a.test\r\nContent-Length: 11\r\n\r\nhello world"
    b"POST /c HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"5; a=b\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\nCookie: elastic_uid=" + b"d" * 32 + b"\r\n\r\n"
    b"GET /d HTTP/1.0\r\nHost: b.test\r\nConnection: keep-alive\r\nX-Forwarded-For: 10.0.0.1\r\n\r\n"
    b"GET http://c.test/e HTTP/1.1\r\nHost: a.test\r\n\r\n"
)


def _read_requests(chunks: list[bytes]) -> list[tuple]:
    relay = ClientRelay(32 << 10)
    for data in chunks:
        relay.receive(data)
    seen = []
    for ex in relay.queue:
        head = ex.head
        seen.append((ex.method, ex.url, ex.http11, ex.error, head.host, head.hosts, head.cookie, head.forwarded_for,
                     head.keep_alive, head.chunked, b"".join(head.lines), b"".join(ex.body), ex.body_done))
    return seen


def _cut(data: bytes, points: list[int]) -> list[bytes]:
    cuts = sorted({p % (len(data) + 1) for p in points})
    pieces, start = [], 0
    for cut in cuts:
        pieces.append(data[start:cut])
        start = cut
    pieces.append(data[start:])
    return [piece for piece in pieces if piece]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_pipelined_requests_read_alike_however_they_are_cut(points):
    whole = _read_requests([REQUESTS])
    assert len(whole) == 5 and [seen[6] for seen in whole] == [b"elastic_uid=" + b"c" * 32, None, None, None, None]
    assert [seen[5] for seen in whole] == [1, 1, 1, 1, 1]  # the trailer's Cookie stays out of every head
    assert _read_requests(_cut(REQUESTS, points)) == whole


ANSWERS = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n2\r\nde\r\n0\r\nX-Elastic-Login: mallory\r\n\r\n",
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
    b"HTTP/1.1 204 No Content\r\nX-Elastic-Login: alice\r\nX-A: 1\r\n\r\n",
]


def _read_answers(cut_each: list[list[bytes]]) -> list[tuple[bytes, bytes | None, bool | None]]:
    """Each answer on the same pooled connection, fed in the given pieces: what the client got."""
    relay = AnswerRelay()
    seen = []
    for pieces in cut_each:
        client = ClientRelay(32 << 10)
        client.receive(b"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n")
        ex, _ = forward(client)
        client.request_bytes(ex, None)
        relay.start(ex, True)
        out = []
        effects = 0
        for data in pieces:
            effects = relay.receive(data)
            if effects & 1:  # WRITE
                out.append(relay.to_client)
        assert effects & ANSWERED
        ex.end(Event.ANSWER_END, ex.status, 1.0, _forwards_of(ex))
        seen.append((_decoded(b"".join(out)), ex.login, relay.close_after))
        relay.detach()
    return seen


def _decoded(data: bytes) -> list[tuple[int, list[tuple[bytes, bytes]], bytes]]:
    """The answers in what the client got, as (status, headers, body): chunk boundaries carry no meaning (a
    chunk cut across two reads is re-chunked as two), so they are compared de-chunked."""
    found: list[tuple[int, list[tuple[bytes, bytes]], bytes]] = []
    headers: list[tuple[bytes, bytes]] = []
    body: list[bytes] = []

    class Collect:
        def on_header(self, name: bytes, value: bytes) -> None:
            headers.append((name, value))

        def on_body(self, data: bytes) -> None:
            body.append(data)

        def on_message_complete(self) -> None:
            found.append((parser.get_status_code(), list(headers), b"".join(body)))
            headers.clear()
            body.clear()

    parser = httptools.HttpResponseParser(Collect())
    parser.feed_data(data)
    return found


def _forwards_of(ex):
    from elasticd.front.core.counters import ForwardCounters
    forwards = ForwardCounters()
    ex.rid = forwards.opened(ex)
    return forwards


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(min_value=0, max_value=500), max_size=6), min_size=4, max_size=4))
def test_answers_on_one_connection_read_alike_however_they_are_cut(points):
    whole = _read_answers([[answer] for answer in ANSWERS])
    assert [login for _, login, _ in whole] == [None, None, None, b"alice"]  # the trailer's login is dropped
    assert all(b"X-Elastic-Login" not in name for answer, _, _ in whole for _, headers, _ in answer
               for name, _ in headers)
    assert _read_answers([_cut(answer, p) for answer, p in zip(ANSWERS, points, strict=True)]) == whole
