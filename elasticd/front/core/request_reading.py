"""The reading half of a client connection's relay (pure, no I/O): bytes the client sent → the requests queued, each
an ``Exchange`` with its head read and its body as it comes; what the parser refuses answered in its turn; the raw
bytes after an upgrade request's head; a method the parser does not know read by the front (``methods.py``); a
chunked body read by the front where the parser would refuse what RFC 9112 allows (``chunked.py``).
``connection.ClientRelay`` is the whole relay: it serves what this reads.
"""

from __future__ import annotations

from collections import deque
from typing import Final

import httptools

from elasticd.front.core import http1, methods
from elasticd.front.core.chunked import DONE, ChunkedBody
from elasticd.front.core.exchange import NO_HEAD, Exchange, Link
from elasticd.front.core.relay import PHASE_DONE, PHASE_FORWARDING, PHASE_QUEUED, RelayError

__all__ = ["CLOSE", "CROWDED", "DISPATCH", "FAIL", "MAX_PENDING", "MAX_QUEUE", "SERVE", "TO_WORKER", "RequestReading"]

MAX_QUEUE: Final = 16  # pipelined requests read ahead of the one being served
MAX_PENDING: Final = 256 << 10  # request body bytes buffered before reading from the client pauses

# ``receive``'s effects (a bitmask; 0: nothing to do).
SERVE: Final = 1  # the first request can move: dispatch it (``next_request``) or send its body on (``body_bytes``)
CROWDED: Final = 2  # the queue or the buffered body is over its bound: once served, ask ``pause_if_crowded``
TO_WORKER: Final = 4  # the bytes were raw (after an upgrade): write them, as they are, to ``link``
FAIL: Final = 8  # the request under way broke inside its body: close ``link``, answer ``failure`` in its turn
CLOSE: Final = 16  # close the client connection at once (a request broke mid-answer: its entry ends as it is lost)
DISPATCH: Final = 32  # alone: the one request queued waits to be dispatched (``queue[0]``); nothing else to do

# httptools >= 0.2 (llhttp) refuses versions other than 1.0 and 1.1 itself; 0.1.x (http-parser, Debian bookworm's)
# reads "HTTP/1.2" as a keep-alive 1.x, so there every request's version is asked and checked.
_PARSER_CHECKS_VERSION: Final = tuple(int(part) for part in httptools.__version__.split(".")[:2]) >= (0, 2)
# llhttp (the same >= 0.2) refuses BWS in a chunk extension: there the front reads chunked bodies itself (chunked.py).
_FRONT_READS_CHUNKS: Final = _PARSER_CHECKS_VERSION
# "#" as an int: ``0x23 in url`` is a memchr. ``b"#" in url`` is the same answer at a cost: CPython's bytes.__contains__
# first tries its argument as an integer, and a bytes one raises (and formats, and clears) a TypeError before the
# substring search: 1 % of the compiled front's CPU in perf, once a request.
_HASH: Final = 0x23


def _head_end(data: bytes, at: int) -> int:
    """Where the head that goes on at ``at`` ends: past its empty line, or -1 when it does not end in ``data``.
    llhttp ends every line with CRLF; http-parser (Debian's 0.1.x) takes a bare LF too, so there the first empty
    line is the first LF after a line's LF, with or without its CR."""
    if _PARSER_CHECKS_VERSION:
        end = data.find(b"\r\n\r\n", at)
        return end + 4 if end >= 0 else -1
    crlf, lf = data.find(b"\n\r\n", at), data.find(b"\n\n", at)
    if lf >= 0 and (crlf < 0 or lf < crlf):
        return lf + 2
    return crlf + 3 if crlf >= 0 else -1


class _ChunkedBodyFollows(Exception):
    """Raised out of the parser's ``on_headers_complete`` to stop it after a chunked request's head: the front reads
    the body (``RequestReading._take_over_body``)."""


class RequestReading:
    """A client connection's requests as they are read, for ``ClientRelay`` to serve."""

    __slots__ = ("after_body", "body_read", "chunks", "closing", "cur", "draining", "failure", "head_bytes",
                 "head_tail", "link", "max_header_bytes", "method", "on_header", "parser", "pending", "queue", "reader",
                 "started", "tunnel", "unparsed", "upgrading")

    def __init__(self, max_header_bytes: int) -> None:
        self.max_header_bytes = max_header_bytes
        self.reader = http1.RequestReader()
        self.on_header = self.reader.header  # the parser calls the pure reader directly: one call per header
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()
        self.cur: Exchange | None = None  # the request being parsed
        self.head_bytes = 0  # bytes of the current head read so far
        self.pending = 0  # request body bytes read and not yet handed out for a worker
        self.draining = False  # answered and closing: what the client still sends is dropped
        self.closing = False  # the front's last answers (a drained stop): each says Connection: close, then closes
        self.upgrading: Exchange | None = None  # an upgrade request: what follows its head is raw
        self.tunnel: Link | None = None  # the worker's connection once the upgrade went through
        self.link: Link | None = None  # with TO_WORKER or FAIL: the worker connection meant
        self.failure: tuple[Exchange, int, str] | None = None  # with FAIL: the request and its answer
        # A method the parser does not know (core/methods.py): the method of the request read in its place, the
        # bytes of one whose method is not whole yet, and the first bytes of a head that began a read and is not
        # whole yet (its method may be a known one's prefix).
        self.method: bytes | None = None
        self.unparsed = b""
        self.started: bytes | None = None
        # Where the reads stand, for the rare request whose body the front reads itself (``chunks``): the body bytes
        # of the current request read so far, and the last bytes of a head not whole yet.
        self.chunks: ChunkedBody | None = None
        self.body_read = 0
        self.head_tail = b""
        self.after_body = b""  # the bytes of a read after such a body: the next requests', for a fresh parser

    def receive(self, data: bytes) -> int:
        """Bytes the client sent. Returns the effects (0, DISPATCH, or SERVE | CROWDED | TO_WORKER | FAIL | CLOSE)."""
        effects = self._read(data)
        while self.after_body:  # (a loop, not a recursion: one read may hold any number of chunked requests)
            data, self.after_body = self.after_body, b""
            effects = self._read(data)
        return effects

    def _read(self, data: bytes) -> int:
        if self.draining:
            return 0
        if self.upgrading is not None or self.tunnel is not None:
            return self._raw(data)
        if self.chunks is not None:
            return self._chunked(data)
        if self.unparsed:
            return self._unknown_method(self.unparsed + data)
        entered = self.cur
        between = entered is None  # (at a request's first byte; and no head read whole in this read, below)
        queued = len(self.queue)
        body_read = self.body_read  # (of ``entered``'s body, before this read: where this read's part of it ends)
        stopped: Exception | None = None
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
            stopped = exc
        if stopped is not None:  # (handled out of the except clause: see _parser_stopped)
            return self._parser_stopped(stopped, data, entered, queued, body_read)
        cur = self.cur
        if cur is not None and cur.head is NO_HEAD:
            if cur is entered:  # the head goes on from the reads before
                size = len(data)
                before = self.started
                if before is not None:
                    started = before + data
                    self.started = started if len(started) <= methods.MAX_METHOD else None
            else:
                # The head began in this read: at its first byte, or where the requests before it in this read
                # ended (found by the walk: rare, a pipelined head cut by the read's end). Its size counts from
                # there, not the bodies before it.
                at = 0 if between and len(self.queue) == queued else self._past_requests(
                    data, entered, queued, body_read, True)
                size = len(data) - at if at >= 0 else len(data)
                self.started = data[at:] if at >= 0 and size <= methods.MAX_METHOD else None
            self.head_bytes += size
            self.head_tail = data[-3:] if len(data) >= 3 else (self.head_tail + data)[-3:]
            limit = self.max_header_bytes
            if self.head_bytes > limit:
                return self._parse_error(*http1.oversize_status(len(cur.url), self.reader.size, limit))
        queue = self.queue  # (_effects(), inlined on the common path)
        if not queue:
            return 0
        if len(queue) > MAX_QUEUE or self.pending > MAX_PENDING:
            return SERVE | CROWDED
        if len(queue) == 1 and queue[0].phase is PHASE_QUEUED:
            return DISPATCH
        return SERVE

    def _effects(self) -> int:
        """What the queue asks of the shell after a read."""
        queue = self.queue
        if not queue:
            return 0
        if len(queue) > MAX_QUEUE or self.pending > MAX_PENDING:
            return SERVE | CROWDED
        if len(queue) == 1 and queue[0].phase is PHASE_QUEUED:
            return DISPATCH  # the common case, said so that the shell need not ask next_request
        return SERVE

    def _parser_stopped(self, stopped: Exception, data: bytes, entered: Exchange | None, queued: int,
                        body_read: int) -> int:
        """The parser stopped inside ``data``: at a method it does not know, after an upgrade's or a chunked body's
        head, or at bytes it refuses (or at a bug of ours: a ``RelayError`` out of a callback).

        Handled here, after the ``except`` clause and not in it: the paths below may feed a fresh parser, and an
        exception raised while another is being handled gets that one as its ``__context__``, where httptools puts
        what a callback raised (a chunked body's head, read by the fresh parser, would look like a failure)."""
        if isinstance(stopped, httptools.HttpParserUpgrade):
            return self._after_upgrade_head(data[stopped.args[0]:]) or self._effects()
        if isinstance(stopped, httptools.HttpParserInvalidMethodError):
            if len(self.queue) == queued:
                if entered is None:  # the request began at data's first byte
                    return self._unknown_method(data)
                if self.started is not None:  # ... or at the first byte of the reads kept
                    return self._unknown_method(self.started + data)
            # ... or behind requests that ended in this read: where the last of them ended, found by the walk
            at = self._past_requests(data, entered, queued, body_read, True)
            if at < 0:
                return self._parse_error(501, "a request method the front does not know, behind another request "
                                              "whose end the front lost")
            return self._unknown_method(data[at:])
        if isinstance(stopped.__context__, _ChunkedBodyFollows):
            return self._take_over_body(data, entered, queued, body_read)
        if isinstance(stopped.__context__, RelayError):  # httptools wraps what a callback raised: ours, a bug
            raise stopped.__context__ from None
        # Over the head's limit only while in a head: a malformed chunk-size line in a body is a 400.
        cur = self.cur
        limit = self.max_header_bytes
        if cur is not None and cur.head is NO_HEAD and self.head_bytes + len(data) > limit:
            return self._parse_error(*http1.oversize_status(len(cur.url), self.reader.size, limit))
        return self._parse_error(400, f"bad request: {stopped}")

    def _unknown_method(self, data: bytes) -> int:
        """``data`` begins with a request whose method the parser does not know: read again by a fresh parser with
        a method it knows in its place (core/methods.py says why that reads the same request)."""
        status, method, end, why = methods.read_method(data)
        if status == methods.MORE:
            self.unparsed = data  # (under MAX_METHOD bytes: read_method answers 501 past it)
            return 0
        self.unparsed = b""
        if status:
            return self._parse_error(status, why)
        self.parser = httptools.HttpRequestParser(self)  # (the other stays in its error state)
        self.cur = None
        self.method = method
        return self.receive(methods.PLACEHOLDER + data[end:])

    def _take_over_body(self, data: bytes, entered: Exchange | None, queued: int, body_read: int) -> int:
        """The parser stopped after a chunked request's head (``_ChunkedBodyFollows``): the rest of ``data`` from
        where that head ended is the body's, read here (``chunked.py``); the parser is done with this connection's
        bytes until the body ends (then a fresh one reads on)."""
        at = self._past_requests(data, entered, queued, body_read, False)
        if at < 0 or len(self.queue) == queued or self.cur is not self.queue[-1]:  # (the walk and the parser disagree)
            return self._parse_error(400, "bad request: the front lost the framing of a chunked body")
        self.chunks = ChunkedBody(self.max_header_bytes)
        return self._chunked(data[at:])

    def _past_requests(self, data: bytes, entered: Exchange | None, queued: int, body_read: int,
                       last_body: bool) -> int:
        """Where in ``data`` the heads read whole in this read end, with the last one's body when ``last_body``
        (the parser stopped at the next request's unknown method) and without it when not (it stopped after a
        chunked head); -1 when no head or body ended in this read, or when the walk and the parser disagree.

        httptools does not say where in ``data`` it stopped, so that is found again from what the reads know: a read
        begins between requests, inside a head (its end is the first empty line), or inside a Content-Length body
        (``body_read`` of it came before); each head read whole in this read ends at its empty line and its body, if
        any, is its Content-Length (a chunked one would have stopped the parser itself, an upgrade too). The walk
        costs only the rare requests that need it."""
        heads = list(self.queue)[queued:]  # the heads read whole in this read
        in_head = bool(heads) and entered is heads[0]  # the read began inside the first one's head
        at = 0
        if entered is not None and not in_head:  # the read began inside a body
            if entered.head is NO_HEAD:
                return -1
            at = int(entered.head.length or b"0") - body_read
        elif not heads:
            return -1
        for n, ex in enumerate(heads):
            if n or not in_head:
                while at < len(data) and data[at] in b"\r\n":  # the empty lines a request may follow
                    at += 1
                end = _head_end(data, at)
                if end < 0:
                    return -1
                at = end
            else:  # the read began inside this head: its end may straddle the reads
                tail = self.head_tail
                end = _head_end(tail + data, 0)
                if end < 0:
                    return -1
                at = end - len(tail)
            if last_body or ex is not heads[-1]:
                at += int(ex.head.length or b"0")
        return at if 0 <= at <= len(data) else -1

    def _chunked(self, data: bytes) -> int:
        """Bytes of a chunked body the front reads itself: its data handed on as the parser's would be; the bytes
        after its end to a fresh parser."""
        chunks = self.chunks
        assert chunks is not None
        pieces: list[bytes] = []
        took = chunks.feed(data, pieces)
        for piece in pieces:
            self.on_body(piece)
        if took < 0:
            self.chunks = None
            return self._parse_error(400, f"bad request: {chunks.error}")
        if chunks.state != DONE:
            return self._effects()
        self.chunks = None
        self.parser = httptools.HttpRequestParser(self)
        self.on_message_complete()
        self.after_body = data[took:]  # (read by ``receive``'s loop)
        return self._effects()

    def _after_upgrade_head(self, tail: bytes) -> int:
        """The parser stopped after a head it will not read past: an upgrade request (what follows is the new
        protocol), or a CONNECT (refused in its turn; what follows is not HTTP, and is dropped)."""
        ex = self.queue[-1] if self.queue else None
        if ex is not None and ex.head.upgrade is not None:
            self.upgrading = ex
            if tail:
                ex.body.append(tail)
                self.pending += len(tail)
            return 0
        if ex is not None and ex.phase is PHASE_QUEUED:
            self.draining = True
            if ex.error is None:
                ex.error = ((501, "CONNECT is not supported") if ex.method == b"CONNECT"
                            else (400, "malformed request"))
            return 0
        return self._parse_error(400, "malformed request")

    def _raw(self, data: bytes) -> int:
        """Bytes after an upgrade request's head: relayed as they are, or kept until its connection is up."""
        if self.tunnel is not None:
            self.link = self.tunnel
            return TO_WORKER
        ex = self.upgrading
        assert ex is not None
        if ex.conn is not None and ex.conn.transport is not None:
            self.link = ex.conn
            return TO_WORKER
        if ex.phase is not PHASE_DONE:
            ex.body.append(data)
            self.pending += len(data)
        return 0

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self.cur = Exchange()  # the reader is ready: its finish() readied it for this head
        self.reader.between = False  # headers again, not the last body's trailer
        self.head_bytes = 0
        self.body_read = 0

    def on_url(self, url: bytes) -> None:
        cur = self.cur
        assert cur is not None
        cur.url += url

    def on_headers_complete(self) -> None:
        cur = self.cur
        assert cur is not None
        parser = self.parser
        cur.method = parser.get_method()
        if self.method is not None:  # (read with methods.PLACEHOLDER in its place)
            cur.method, self.method = self.method, None
        self.started = None
        reader = self.reader
        tokens, size = reader.tokens, reader.size  # before finish(), which readies the reader for the next head
        # is_http11's common case inlined: keep-alive without a Connection header is HTTP/1.1.
        cur.http11 = http11 = (tokens is None and parser.should_keep_alive()) or http1.is_http11(parser, tokens)
        # The parser's upgrade flag matters only to a head with an Upgrade field (finish() drops it otherwise): a call
        # to the parser, which mypyc makes by name, saved on every other request.
        cur.head = reader.finish(http11, reader.head.upgrade is not None and parser.should_upgrade())
        if self.closing:
            cur.head.keep_alive = False
        limit = self.max_header_bytes
        body_follows = False
        if size + len(cur.url) > limit:
            cur.error = http1.oversize_status(len(cur.url), size, limit)
        elif (not http11 or cur.head.host is None or not cur.url.startswith(b"/") or cur.head.chunked is not None
              or _HASH in cur.url or not _PARSER_CHECKS_VERSION):
            # Anything but the common HTTP/1.1, Host and origin-form request without Transfer-Encoding goes through
            # RFC 9112's checks.
            version = None if http11 and _PARSER_CHECKS_VERSION else parser.get_http_version()
            status, why, cur.url = http1.head_refusal(cur.head, cur.method, cur.url, http11, version)
            if status:
                cur.error = (status, why)
            else:
                body_follows = _FRONT_READS_CHUNKS and cur.head.chunked is not None
        self.queue.append(cur)
        if body_follows:
            raise _ChunkedBodyFollows

    def on_body(self, body: bytes) -> None:
        cur = self.cur
        self.body_read += len(body)
        if cur is not None and cur.phase is not PHASE_DONE:
            cur.body.append(body)
            self.pending += len(body)

    def on_message_complete(self) -> None:
        cur = self.cur
        if cur is not None:
            cur.body_done = True
            self.cur = None

    def _parse_error(self, status: int, text: str) -> int:
        """The parser gave up: what it could not read is answered in its turn, then the connection closes."""
        self.draining = True  # nothing after the error can be framed: what still comes is dropped
        ex = self.cur if self.cur is not None else Exchange()
        self.cur = None
        if ex.head is NO_HEAD:
            ex.head = http1.RequestHead()
        ex.head.keep_alive = False
        if ex.in_flight and ex in self.queue:  # broken inside the body of the request under way
            ex.body_done = True
            if ex.phase is PHASE_FORWARDING:
                self.link, ex.conn = ex.conn, None
                self.failure = (ex, status, text)
                return FAIL
            return CLOSE  # mid-answer: cut (its entry is closed as the connection is lost)
        ex.error = (status, text)
        if ex not in self.queue:
            self.queue.append(ex)
        return SERVE
