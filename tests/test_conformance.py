"""The front against RFC 9110/9112, as raw bytes in both directions: what a client sends and what the worker then
receives byte for byte (or the front's refusal, and whether the connection ends), and what a worker answers and what
the client then receives. Rows are drawn from the RFCs (section named) and from llhttp's request test corpus
(nodejs/llhttp, test/request/*.md: the shapes, not its text), and run on whichever httptools is installed: PyPI's
(llhttp) in the sources' run, Debian's 0.1.1 (http-parser) in the release's test root, so both parsers answer the
same table. The worker is a raw socket that records every byte; the user id the front adds is random, and is
compared as ``<user>``."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import NamedTuple

import httptools
import pytest
from test_front import front

from elasticd.front import Upstream

LLHTTP = tuple(int(part) for part in httptools.__version__.split(".")[:2]) >= (0, 2)
HOST = b"Host: shop.localhost\r\n"
TAIL = b"X-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Proto: http\r\nX-Forwarded-Host: shop.localhost\r\n" \
       b"X-Elastic-User-Id: <user>\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Worker:
    """A worker by hand: it records each connection's bytes, and answers each request once it came whole (its
    length or its chunked end), with ``answer``."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.answer = OK

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = b""
        with suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                while not _whole(data):
                    more = await reader.read(65536)
                    if not more:
                        return
                    data += more
                self.received.append(data)
                data = b""
                writer.write(self.answer)
                await writer.drain()
        writer.close()


def _whole(data: bytes) -> bool:
    """A request the front sent came whole: it always frames a body by Content-Length or by chunks."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    head, body = data[:end].lower(), data[end + 4:]
    if b"\r\ntransfer-encoding:" in head:
        return body.endswith(b"0\r\n\r\n")
    found = re.search(rb"\r\ncontent-length: *(\d+)", head)
    return len(body) >= (int(found.group(1)) if found else 0)


@asynccontextmanager
async def behind_the_front(tmp: Path) -> AsyncIterator[tuple[Worker, int]]:
    worker = Worker()
    server = await asyncio.start_unix_server(worker.serve, str(tmp / "raw.sock"))
    try:
        async with front([Upstream("raw", str(tmp / "raw.sock"))]) as f:
            yield worker, f.port
    finally:
        server.close()


async def exchange(port: int, data: bytes, wait: float = 0.4) -> tuple[bytes, bool]:
    """Send ``data`` on one connection: (what came back within ``wait`` seconds of quiet, whether the front closed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    got = b""
    closed = False
    try:
        while True:
            more = await asyncio.wait_for(reader.read(65536), wait)
            if not more:
                closed = True
                break
            got += more
    except (TimeoutError, ConnectionError):
        pass
    writer.close()
    return got, closed


def _user(data: bytes) -> bytes:
    return re.sub(rb"(X-Elastic-User-Id: |elastic_uid=)[0-9a-f]{32}", rb"\1<user>", data)


class Row(NamedTuple):
    source: str  # the RFC's section, or the corpus's case
    sent: bytes  # by the client
    forwarded: bytes | list[bytes] | None  # what the worker receives, byte for byte (a list: requests); None: nothing
    status: int  # the client's answer's status (the worker's 200, or the front's own)
    closes: bool  # the front ends the connection after it


def _row(source: str, sent: bytes, forwarded: bytes | list[bytes] | None, status: int = 200, closes: bool = False,
         marks: tuple[pytest.MarkDecorator, ...] = ()) -> object:
    return pytest.param(Row(source, sent, forwarded, status, closes), id=source, marks=marks)


REQUESTS = [
    _row("9112-3 origin-form", b"GET /a?b=1 HTTP/1.1\r\n" + HOST + b"\r\n",
         b"GET /a?b=1 HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-3.2.2 absolute-form wins over Host", b"GET http://shop.localhost/x HTTP/1.1\r\nHost: other\r\n\r\n",
         b"GET /x HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-3.2.2 userinfo in the target", b"GET http://u@shop.localhost/ HTTP/1.1\r\n" + HOST + b"\r\n", None,
         400, True),
    _row("9112-3.2.4 OPTIONS asterisk", b"OPTIONS * HTTP/1.1\r\n" + HOST + b"\r\n",
         b"OPTIONS * HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-3.2 no Host in HTTP/1.1", b"GET / HTTP/1.1\r\n\r\n", None, 400, True),
    _row("9112-3.2 two Host lines", b"GET / HTTP/1.1\r\n" + HOST + HOST + b"\r\n", None, 400, True),
    _row("9112-2.3 HTTP/1.2", b"GET / HTTP/1.2\r\n" + HOST + b"\r\n", None, 400, True),
    _row("9112-2.2 leading empty lines", b"\r\n\r\nGET / HTTP/1.1\r\n" + HOST + b"\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-5.1 whitespace before the colon", b"GET / HTTP/1.1\r\n" + HOST + b"X-A : 1\r\n\r\n", None, 400, True),
    _row("9110-5.5 NUL in a field value", b"GET / HTTP/1.1\r\n" + HOST + b"X-A: a\x00b\r\n\r\n", None, 400, True),
    _row("9112-6.2 Content-Length body", b"POST /p HTTP/1.1\r\n" + HOST + b"Content-Length: 5\r\n\r\nhello",
         b"POST /p HTTP/1.1\r\n" + HOST + b"Content-Length: 5\r\n" + TAIL + b"\r\nhello"),
    _row("9112-6.3 two different Content-Lengths", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", None, 400, True),
    _row("9112-6.3 Content-Length with Transfer-Encoding (llhttp: TE and CL)", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", None, 400, True),
    _row("9112-7.1 chunked body (llhttp: POST with chunked)", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
         b"POST /p HTTP/1.1\r\n" + HOST + TAIL + b"Transfer-Encoding: chunked\r\n\r\n"
         b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"),
    _row("9112-7.1.1 chunk extensions (llhttp: chunk extensions)", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: chunked\r\n\r\n5;ilovew3;somuchlove=aretheseparametersfor\r\nhello\r\n0\r\n\r\n",
         b"POST /p HTTP/1.1\r\n" + HOST + TAIL + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    _row("9112-7.1.1 BWS in a chunk extension", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: chunked\r\n\r\n5; a=b\r\nhello\r\n0\r\n\r\n",
         b"POST /p HTTP/1.1\r\n" + HOST + TAIL + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    _row("9112-7.1.2 trailer fields dropped (llhttp: trailing headers)", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nVary: *\r\n\r\n",
         b"POST /p HTTP/1.1\r\n" + HOST + TAIL + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
    _row("9110-5.3 Transfer-Encoding on two lines is one list", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
         b"POST /p HTTP/1.1\r\n" + HOST + TAIL + b"Transfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"),
    _row("9112-6.1 Transfer-Encoding in HTTP/1.0, kept alive", b"POST /p HTTP/1.0\r\n" + HOST
         + b"Connection: keep-alive\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", None, 400, True),
    _row("9112-6.3 chunked not the last coding", b"POST /p HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: chunked, gzip\r\n\r\n3\r\nabc\r\n0\r\n\r\n", None, 400, True),
    _row("9112-6.3 an unknown coding alone (llhttp: ignoring pigeons)", b"PUT /u HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: pigeons\r\n\r\n", None, 400, True),
    _row("9110-9.1 a method outside the parser's list", b"FOO /m HTTP/1.1\r\n" + HOST + b"\r\n",
         b"FOO /m HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9110-9.1 a method token with '-' (llhttp: invalid method)", b"-BLARGH / HTTP/1.1\r\n" + HOST + b"\r\n",
         b"-BLARGH / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9110-9.1 a method and a body", b"BREW /pot HTTP/1.1\r\n" + HOST + b"Content-Length: 3\r\n\r\ntea",
         b"BREW /pot HTTP/1.1\r\n" + HOST + b"Content-Length: 3\r\n" + TAIL + b"\r\ntea"),
    _row("9110-9.1 not a token", b"G{T / HTTP/1.1\r\n" + HOST + b"\r\n", None, 400, True),
    _row("9110-9.3.6 CONNECT", b"CONNECT shop.localhost:443 HTTP/1.1\r\n" + HOST + b"\r\n", None, 501, True),
    _row("9110-7.6.1 Connection names a field", b"GET / HTTP/1.1\r\n" + HOST
         + b"Connection: X-Drop\r\nX-Drop: 1\r\nX-Keep: 2\r\n\r\n", b"GET / HTTP/1.1\r\n" + HOST + b"X-Keep: 2\r\n"
         + TAIL + b"\r\n"),
    _row("9110-7.6.1 hop-by-hop fields", b"GET / HTTP/1.1\r\n" + HOST
         + b"Keep-Alive: timeout=5\r\nTE: trailers\r\nProxy-Authorization: Basic eA==\r\nUpgrade: h2c\r\n\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-9.6 Connection: close", b"GET / HTTP/1.1\r\n" + HOST + b"Connection: close\r\n\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n", 200, True),
    _row("9112-9.3 HTTP/1.0 without keep-alive", b"GET / HTTP/1.0\r\n" + HOST + b"\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n", 200, True),
    _row("7239 forwarding claims from a client", b"GET / HTTP/1.1\r\n" + HOST
         + b"X-Forwarded-For: 6.6.6.6\r\nX-Forwarded-Proto: https\r\nForwarded: for=6.6.6.6\r\n"
           b"X-Real-IP: 6.6.6.6\r\n\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("underscored names (read as CGI's HTTP_*)", b"GET / HTTP/1.1\r\n" + HOST
         + b"Transfer_Encoding: chunked\r\nX_Plain: 1\r\n\r\n", b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-3 a method is case-sensitive: 'get' is not GET", b"get / HTTP/1.1\r\n" + HOST + b"\r\n",
         b"get / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-3 whitespace-delimited request line", b"GET  / HTTP/1.1\r\n" + HOST + b"\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
    _row("9112-3.2 a target with a fragment", b"GET /a#frag HTTP/1.1\r\n" + HOST + b"\r\n", None, 400, True),
    _row("9112-3.2 a space in the target", b"GET /a b HTTP/1.1\r\n" + HOST + b"\r\n", None, 400, True),
    _row("9112-2.3 a lower-case version", b"GET / http/1.1\r\n" + HOST + b"\r\n", None, 400, True),
    _row("9112-5 a field line without a colon", b"GET / HTTP/1.1\r\n" + HOST + b"X-A 1\r\n\r\n", None, 400, True),
    _row("9110-5.5 obs-text and HTAB in a value pass", b"GET / HTTP/1.1\r\n" + HOST + b"X-A: caf\xe9\tb\r\n\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + b"X-A: caf\xe9\tb\r\n" + TAIL + b"\r\n"),
    _row("9112-2.2 a bare CR", b"GET / HTTP/1.1\r\nHost: shop.localhost\rX-A: 1\r\n\r\n", None, 400, True),
    _row("9112-6.3 Content-Length: +2", b"POST / HTTP/1.1\r\n" + HOST + b"Content-Length: +2\r\n\r\nok", None, 400,
         True),
    _row("9112-7.1 a chunk size past 64 bits", b"POST / HTTP/1.1\r\n" + HOST
         + b"Transfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\nab\r\n0\r\n\r\n", None, 400, True),
    _row("9112-9.3.2 two pipelined requests, in order",
         b"GET /1 HTTP/1.1\r\n" + HOST + b"\r\nGET /2 HTTP/1.1\r\n" + HOST + b"\r\n",
         [b"GET /1 HTTP/1.1\r\n" + HOST + TAIL + b"\r\n", b"GET /2 HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"]),
    _row("9110-9.1 + 9112-9.3.2 an unknown method pipelined behind a body",
         b"POST /1 HTTP/1.1\r\n" + HOST + b"Content-Length: 3\r\n\r\nabcFOO /2 HTTP/1.1\r\n" + HOST + b"\r\n",
         [b"POST /1 HTTP/1.1\r\n" + HOST + b"Content-Length: 3\r\n" + TAIL + b"\r\nabc",
          b"FOO /2 HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"]),
    _row("our user id is ours", b"GET / HTTP/1.1\r\n" + HOST + b"X-Elastic-User-Id: forged\r\n\r\n",
         b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n"),
]


@pytest.mark.parametrize("row", REQUESTS)
def test_client_to_worker(tmp_path: Path, row: Row) -> None:
    async def scenario() -> tuple[list[bytes], bytes, bool]:
        async with behind_the_front(tmp_path) as (worker, port):
            answer, closed = await exchange(port, row.sent)
            return worker.received, answer, closed

    received, answer, closed = asyncio.run(scenario())
    expected = [row.forwarded] if isinstance(row.forwarded, bytes) else row.forwarded or []
    assert [_user(r) for r in received] == expected
    assert answer.startswith(b"HTTP/1.1 %d " % row.status), answer
    assert closed is row.closes, answer


# Where the RFC lets a server refuse or mend, either is right: the row says the mended form.
EITHER = [
    pytest.param(b"GET / HTTP/1.1\r\n" + HOST + b"X-A: a\r\n b\r\n\r\n",
                 b"GET / HTTP/1.1\r\n" + HOST + b"X-A: a b\r\n" + TAIL + b"\r\n",
                 id="9112-5.2 obs-fold: 400, or replaced by SP (llhttp refuses, http-parser mends)"),
    pytest.param(b"GET / HTTP/1.1\n" + HOST.replace(b"\r\n", b"\n") + b"\n",
                 b"GET / HTTP/1.1\r\n" + HOST + TAIL + b"\r\n",
                 id="9112-2.2 bare LF line ends: 400, or read as CRLF (llhttp refuses, http-parser reads)"),
]


@pytest.mark.parametrize(("sent", "mended"), EITHER)
def test_refused_or_mended(tmp_path: Path, sent: bytes, mended: bytes) -> None:
    async def scenario() -> tuple[list[bytes], bytes, bool]:
        async with behind_the_front(tmp_path) as (worker, port):
            answer, closed = await exchange(port, sent)
            return worker.received, answer, closed

    received, answer, closed = asyncio.run(scenario())
    if received:
        assert [_user(r) for r in received] == [mended] and answer.startswith(b"HTTP/1.1 200 ") and not closed
    else:
        assert answer.startswith(b"HTTP/1.1 400 ") and closed, answer


class Answer(NamedTuple):
    source: str
    request: bytes  # the client's
    answer: bytes  # the worker's
    sent: bytes  # what the client receives, byte for byte (<user> for the cookie's value)
    closes: bool


def _answer(source: str, answer: bytes, sent: bytes, closes: bool = False,
            request: bytes = b"GET / HTTP/1.1\r\n" + HOST + b"\r\n") -> object:
    return pytest.param(Answer(source, request, answer, sent, closes), id=source)


COOKIE = b"Set-Cookie: elastic_uid=<user>; Path=/; HttpOnly; SameSite=Lax\r\n"

ANSWERS = [
    _answer("9112-6.2 Content-Length kept", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-A: 1\r\n" + COOKIE + b"\r\nok"),
    _answer("9112-7.1 chunked answer, re-chunked", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2;ext=1\r\nok\r\n0\r\nX-Trailer: t\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n" + COOKIE + b"Transfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"),
    # (answer.py says why the front reads requests' chunk extensions itself and not answers': llhttp refuses them,
    # and as the head went already, the client's connection is cut there)
    _answer("9112-7.1.1 chunk extensions with BWS in an answer: read (http-parser) or cut (llhttp)",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2 ; a = b\r\nok\r\n1;q=\"x y\"\r\n!\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n" + COOKIE + b"Transfer-Encoding: chunked\r\n\r\n"
            + (b"" if LLHTTP else b"2\r\nok\r\n1\r\n!\r\n0\r\n\r\n"), LLHTTP),
    _answer("9110-7.6.1 hop-by-hop fields of an answer", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nKeep-Alive: "
            b"timeout=5\r\nConnection: X-Drop\r\nX-Drop: 1\r\nProxy-Authenticate: Basic\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + COOKIE + b"\r\nok"),
    _answer("9110-15.3.5 204 has no body", b"HTTP/1.1 204 No Content\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\n" + COOKIE + b"\r\n"),
    _answer("9110-15.4.5 304 keeps its Content-Length, sends no body",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n\r\n",
            b"HTTP/1.1 304 Not Modified\r\nContent-Length: 10\r\n" + COOKIE + b"\r\n"),
    _answer("9110-9.3.2 HEAD keeps its Content-Length, sends no body", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + COOKIE + b"\r\n",
            request=b"HEAD / HTTP/1.1\r\n" + HOST + b"\r\n"),
    _answer("9112-9.3 HTTP/1.0 client of a length-less answer: ends by close",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\n" + COOKIE + b"Connection: close\r\n\r\nok", True,
            request=b"GET / HTTP/1.0\r\n" + HOST + b"\r\n"),
    _answer("9112-6.3 two different Content-Lengths from a worker", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
            b"Content-Length: 3\r\n\r\nok!", b"<502>"),  # (the client's connection is sound: kept)
    _answer("the login header is the front's alone", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n"
            b"X-Elastic-Login: alice\r\n\r\nok", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n" + COOKIE + b"\r\nok"),
    _answer("underscored names in an answer pass", b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX_A: 1\r\n\r\nok",
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX_A: 1\r\n" + COOKIE + b"\r\nok"),
]


@pytest.mark.parametrize("row", ANSWERS)
def test_worker_to_client(tmp_path: Path, row: Answer) -> None:
    async def scenario() -> tuple[bytes, bool]:
        async with behind_the_front(tmp_path) as (worker, port):
            worker.answer = row.answer
            return await exchange(port, row.request)

    answer, closed = asyncio.run(scenario())
    if row.sent == b"<502>":
        assert answer.startswith(b"HTTP/1.1 502 "), answer
    else:
        assert _user(answer) == row.sent
    assert closed is row.closes, answer
