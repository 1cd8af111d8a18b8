"""The client side of the relay: one asyncio Protocol per client connection, parsing requests with httptools.

Requests are served one at a time in the order they came (pipelined ones wait in ``queue``, their bodies
buffered, reading paused past a bound). For each: route by Host, ask the tenant's quota, resolve the sticky
user, pick the worker (``dispatch.decide``), open the counters entry, send the head (and the body as it
arrives) on a pooled connection; the worker's answer streams back through the worker side (``links``).
Decisions are front.core's; this module only moves bytes and keeps per-connection state.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING

import httptools

from elasticd.front.core import http1
from elasticd.front.core.exchange import NO_HEAD, Exchange
from elasticd.front.core.relay import (
    CloseMode,
    Event,
    Failure,
    Phase,
    RelayError,
    Timeout,
    after_own_answer,
    after_worker_answer,
    client_left,
    timed_out,
    upstream_lost,
)

if TYPE_CHECKING:
    from elasticd.front.links import FrontSide, WorkerSide

__all__ = ["ClientConn"]

log = logging.getLogger("elasticd.front")

_MAX_QUEUE = 16  # pipelined requests read ahead of the one being served
_MAX_PENDING = 256 << 10  # request body bytes buffered before reading from the client pauses
_FOR_QUEUE, _FOR_UPSTREAM = 1, 2  # why reading is paused (both may hold)
_LINGER = 2.0  # seconds a closing connection still reads (and drops) what the client sends


_QUEUED, _FORWARDING, _DONE = Phase.QUEUED, Phase.FORWARDING, Phase.DONE
# httptools >= 0.2 (llhttp) refuses versions other than 1.0 and 1.1 itself; 0.1.x (http-parser, Debian bookworm's)
# reads "HTTP/1.2" as a keep-alive 1.x, so there every request's version is asked and checked.
_PARSER_CHECKS_VERSION = tuple(int(part) for part in httptools.__version__.split(".")[:2]) >= (0, 2)
_ANSWER_END, _CUT, _UPGRADE, _CLIENT_LEFT = Event.ANSWER_END, Event.CUT, Event.UPGRADE, Event.CLIENT_LEFT


class ClientConn(asyncio.Protocol):
    __slots__ = ("active_at", "clock", "cur", "draining", "eof", "front", "head_bytes", "on_header", "parser",
                 "paused", "peer", "pending", "queue", "reader", "transport", "tunnel", "upgrading")

    def __init__(self, front: FrontSide) -> None:
        self.front = front
        self.clock = front.clock
        self.transport: asyncio.Transport | None = None
        self.reader = http1.RequestReader()
        self.on_header = self.reader.header  # the parser calls the pure reader directly: one call per header
        self.parser = httptools.HttpRequestParser(self)
        self.peer: bytes | None = None
        self.queue: deque[Exchange] = deque()
        self.cur: Exchange | None = None  # the request being parsed
        self.upgrading: Exchange | None = None  # an upgrade request: what follows its head is raw
        self.tunnel: WorkerSide | None = None
        self.head_bytes = 0
        self.pending = 0  # request body bytes read and not yet written to a worker
        self.paused = 0
        self.eof = False
        self.draining = False  # answered and closing: what the client still sends is dropped
        self.active_at = front.clock()

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0]).encode()
        self.front.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.conns.discard(self)
        self.transport = None
        if self.tunnel is not None:
            self.tunnel.close()
            self.tunnel = None
        if self.queue:
            ex = self.queue[0]
            status = client_left(ex.phase, ex.status)
            if status is not None:
                # The client left first: free the worker at once, as nginx does (499 in the counters).
                if ex.conn is not None:
                    ex.conn.close()
                    ex.conn = None
                self.front.settle(ex, status, _CLIENT_LEFT)
            self.queue.clear()

    def eof_received(self) -> bool:
        # As nginx: a client that stops sending has left (a half-close cannot be told from a close); what it
        # was waiting for is given up and the worker freed (499 in the counters, via connection_lost).
        self.eof = True
        return False

    def pause_writing(self) -> None:
        conn = self.tunnel or (self.queue[0].conn if self.queue else None)
        if conn is not None:
            conn.pause()

    def resume_writing(self) -> None:
        self.touch()
        conn = self.tunnel or (self.queue[0].conn if self.queue else None)
        if conn is not None:
            conn.resume()

    def data_received(self, data: bytes) -> None:
        self.active_at = self.clock()
        if self.draining:
            return
        if self.upgrading is not None or self.tunnel is not None:
            self._raw(data)
            return
        try:  # a RelayError from a step of ours outside the parser's callbacks: fail closed
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as exc:
                ex = self.queue[-1] if self.queue else None
                if ex is not None and ex.head.upgrade is not None:
                    self.upgrading = ex
                    tail = data[exc.args[0]:]
                    if tail:
                        ex.body.append(tail)
                        self.pending += len(tail)
                elif ex is not None and ex.phase is _QUEUED:
                    # The parser stops after a CONNECT's head (or an odd upgrade): that request is refused in its
                    # turn, and what follows its head is not HTTP, so it is dropped.
                    self.draining = True
                    if ex.error is None:
                        ex.error = ((501, "CONNECT is not supported") if ex.method == b"CONNECT"
                                    else (400, "malformed request"))
                else:
                    self._parse_error(400, "malformed request")
            except httptools.HttpParserError as exc:
                if isinstance(exc.__context__, RelayError):  # httptools wraps what a callback raised
                    self.fail_closed(exc.__context__)
                    return
                # Over the head's limit only while in a head: a malformed chunk-size line in a body is a 400.
                cur = self.cur
                limit = self.front.max_header_bytes
                if cur is not None and cur.head is NO_HEAD and self.head_bytes + len(data) > limit:
                    self._parse_error(*http1.oversize_status(len(cur.url), self.reader.size, limit))
                else:
                    self._parse_error(400, f"bad request: {exc}")
                return
            cur = self.cur
            if cur is not None and cur.head is NO_HEAD:
                self.head_bytes += len(data)
                limit = self.front.max_header_bytes
                if self.head_bytes > limit:
                    self._parse_error(*http1.oversize_status(len(cur.url), self.reader.size, limit))
                    return
            self._pump()
            if self.transport is not None and (len(self.queue) > _MAX_QUEUE or self.pending > _MAX_PENDING):
                self._pause(_FOR_QUEUE)
        except RelayError as exc:
            self.fail_closed(exc)

    def touch(self) -> None:
        self.active_at = self.clock()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    # ------------------------------------------------------------------ httptools callbacks

    def on_message_begin(self) -> None:
        self.cur = Exchange()
        self.reader.start()
        self.head_bytes = 0

    def on_url(self, url: bytes) -> None:
        cur = self.cur
        assert cur is not None
        cur.url += url

    def on_headers_complete(self) -> None:
        cur = self.cur
        assert cur is not None
        parser = self.parser
        cur.method = parser.get_method()
        tokens = self.reader.tokens
        # is_http11's common case inlined: keep-alive without a Connection header is HTTP/1.1.
        cur.http11 = http11 = (tokens is None and parser.should_keep_alive()) or http1.is_http11(parser, tokens)
        cur.head = self.reader.finish(http11, parser.should_upgrade())
        limit = self.front.max_header_bytes
        if self.reader.size + len(cur.url) > limit:
            cur.error = http1.oversize_status(len(cur.url), self.reader.size, limit)
        elif not http11 or cur.head.host is None or cur.url[:1] != b"/" or not _PARSER_CHECKS_VERSION:
            # Anything but the common HTTP/1.1, Host and origin-form request goes through RFC 9112's checks.
            version = None if http11 and _PARSER_CHECKS_VERSION else parser.get_http_version()
            status, why, cur.url = http1.head_refusal(cur.head, cur.method, cur.url, http11, version)
            if status:
                cur.error = (status, why)
        self.queue.append(cur)

    def on_body(self, body: bytes) -> None:
        cur = self.cur
        if cur is not None and not cur.finished:
            cur.body.append(body)
            self.pending += len(body)

    def on_message_complete(self) -> None:
        cur = self.cur
        if cur is not None:
            cur.body_done = True
            self.cur = None

    # ------------------------------------------------------------------ serving the queue

    def serve_next(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._pump()

    def _pump(self) -> None:
        """Start the first request if it is new; move its body along if it is under way."""
        while self.queue and self.transport is not None:
            ex = self.queue[0]
            phase = ex.phase
            if phase is _DONE:
                self.queue.popleft()
                continue
            if phase is not _QUEUED:  # under way: move its body along
                if ex.conn is not None and ex.conn.transport is not None:
                    self._send_body(ex)
                return
            self.front.dispatch(self, ex)
            if ex.phase is not _DONE:
                return

    def send_head(self, ex: Exchange) -> None:
        """``ex.conn`` is ready: the head, with whatever body already came, in one write."""
        conn = ex.conn
        assert conn is not None and ex.user is not None
        parts = http1.upstream_head(ex.method, ex.url, ex.head, self.peer, ex.user.encode())
        if ex.body or not ex.body_done or self.upgrading is ex:
            self._body_parts(ex, parts)
        else:
            ex.sent = True  # no body: the head is the whole request
        conn.write(b"".join(parts))

    def _send_body(self, ex: Exchange) -> None:
        if ex.body or (ex.body_done and not ex.sent):
            parts: list[bytes] = []
            self._body_parts(ex, parts)
            if parts and ex.conn is not None:
                ex.conn.write(b"".join(parts))

    def _body_parts(self, ex: Exchange, parts: list[bytes]) -> None:
        chunked = ex.head.chunked is not None and self.upgrading is not ex
        for data in ex.body:
            self.pending -= len(data)
            if chunked:
                parts.extend(http1.chunk(data))
            else:
                parts.append(data)
        ex.body.clear()
        if ex.body_done and not ex.sent:
            ex.sent = True
            if chunked:
                parts.append(b"0\r\n\r\n")
        if self.paused & _FOR_QUEUE and self.pending <= _MAX_PENDING and len(self.queue) <= _MAX_QUEUE:
            self._resume(_FOR_QUEUE)

    def _raw(self, data: bytes) -> None:
        """Bytes after an upgrade request's head: relayed as they are."""
        if self.tunnel is not None:
            self.tunnel.write(data)
            return
        ex = self.upgrading
        assert ex is not None
        if ex.conn is not None and ex.conn.transport is not None:
            ex.conn.write(data)
        elif not ex.finished:
            ex.body.append(data)
            self.pending += len(data)

    def answer(self, ex: Exchange, status: int, text: str, retry_after: int | None = None,
               close: bool = False) -> None:
        """An answer of the front's own, in the request's turn (its phase is the caller's to advance)."""
        mode = after_own_answer(close=close, keep_alive=ex.head.keep_alive, client_eof=self.eof,
                                stopping=self.front.stopping, upgrading=self.upgrading is ex,
                                body_done=ex.body_done, expect=ex.head.expect, parse_error=ex.error is not None)
        self.write(http1.plain(status, text, close=mode is not CloseMode.KEEP, retry_after=retry_after,
                               head_request=ex.method == b"HEAD"))
        self._drop_body(ex)
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
        if self.transport is not None:
            if mode is CloseMode.CLOSE:
                self.transport.close()
            elif mode is CloseMode.LINGER:
                self._linger()

    def _drop_body(self, ex: Exchange) -> None:
        if ex.body:
            self.pending -= sum(map(len, ex.body))
            ex.body.clear()
        if self.paused & _FOR_QUEUE and self.pending <= _MAX_PENDING and len(self.queue) <= _MAX_QUEUE:
            self._resume(_FOR_QUEUE)

    def _linger(self) -> None:
        """Close after an answer given while the client may still be sending: end our side, drop what still
        comes for a moment, then close. Closing at once would reset the connection, and a reset can destroy
        the answer in the client's receive buffer before it is read (nginx's lingering close)."""
        transport = self.transport
        assert transport is not None
        self.draining = True
        if transport.can_write_eof():
            transport.write_eof()
        asyncio.get_running_loop().call_later(_LINGER, transport.close)

    def _parse_error(self, status: int, text: str) -> None:
        """The parser gave up: what it could not read is answered in its turn, then the connection closes."""
        self.draining = True  # nothing after the error can be framed: what still comes is dropped
        ex = self.cur if self.cur is not None else Exchange()
        self.cur = None
        if ex.head is NO_HEAD:
            ex.head = http1.RequestHead()
        ex.head.keep_alive = False
        if ex.in_flight and ex in self.queue:  # broken inside the body of the request under way
            ex.body_done = True
            if ex.phase is _FORWARDING:
                if ex.conn is not None:
                    ex.conn.close()
                    ex.conn = None
                self.front.relay_failed(self, ex, status, text)
            elif self.transport is not None:
                self.transport.close()  # mid-answer: cut (its entry is closed as the connection is lost)
            return
        ex.error = (status, text)
        if ex not in self.queue:
            self.queue.append(ex)
        self._pump()

    # ------------------------------------------------------------------ driven by the worker side

    def answered(self, ex: Exchange, close_after: bool | None) -> None:
        """The worker's answer is complete and was relayed (its connection went back to its pool or closed)."""
        ex.conn = None
        self.front.settle(ex, ex.status, _ANSWER_END)
        queue = self.queue
        if queue and queue[0] is ex:
            queue.popleft()
        if after_worker_answer(close_after, ex.body_done, self.eof, self.front.stopping, self.upgrading is ex):
            if self.transport is not None:
                self.transport.close()
            return
        self._pump()

    def upstream_failed(self, ex: Exchange, reused: bool, received: bool, path: str, why: str) -> None:
        failure = upstream_lost(ex.phase, reused=reused, received=received, retried=ex.retried,
                                has_body=ex.head.has_body, method=ex.method, upgrading=self.upgrading is ex)
        if failure is Failure.LATE or self.transport is None:
            return
        if failure is Failure.RETRY:
            # A kept-alive connection the worker closed while idle: safe to send once more.
            ex.retry()
            self.front.retry(self, ex)
            return
        ex.conn = None
        if failure is Failure.CUT:
            # The answer had started: the client can only be told by a cut connection (a truncated answer,
            # never a complete-looking wrong one).
            log.warning("%s %s: worker %s %s mid-answer; cutting the client connection",
                        ex.method.decode(), ex.url.decode(errors="replace"), ex.worker, why)
            self.front.settle(ex, ex.status, _CUT)
            self.transport.close()
            return
        log.warning("%s %s: worker %s %s", ex.method.decode(), ex.url.decode(errors="replace"), ex.worker, why)
        self.front.worker_failed(ex.worker, path)
        self.front.relay_failed(self, ex, 502, "the worker could not be reached")

    def became_tunnel(self, ex: Exchange, conn: WorkerSide, tail: bytes) -> None:
        """101 Switching Protocols went to the client: both connections now carry the new protocol."""
        if tail:
            self.write(tail)
        ex.conn = None
        self.front.settle(ex, 101, _UPGRADE)
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
        self.tunnel = conn
        self.upgrading = None
        for data in ex.body:
            conn.write(data)
        self._drop_body(ex)

    def tunnel_closed(self) -> None:
        self.tunnel = None
        if self.transport is not None:
            self.transport.close()

    def pause_reading_for_upstream(self) -> None:
        self._pause(_FOR_UPSTREAM)

    def resume_reading_for_upstream(self) -> None:
        self._resume(_FOR_UPSTREAM)

    def _pause(self, why: int) -> None:
        if not self.paused and self.transport is not None:
            self.transport.pause_reading()
        self.paused |= why

    def _resume(self, why: int) -> None:
        was = self.paused
        self.paused &= ~why
        if was and not self.paused and self.transport is not None:
            self.transport.resume_reading()

    # ------------------------------------------------------------------ timeouts and shutdown

    def timed_out(self) -> None:
        """No byte moved either way for the timeout: 504 when the worker's answer has not started."""
        transport = self.transport
        if transport is None:
            return
        ex = self.queue[0] if self.queue else None
        decision = timed_out(ex.phase if ex is not None else None)
        if ex is None or decision is Timeout.CLOSE:
            transport.close()  # an idle keep-alive connection, or a head that never completed
            return
        if ex.conn is not None:
            ex.conn.close()
            ex.conn = None
        if decision is Timeout.CUT:
            log.warning("%s %s: worker %s stalled mid-answer; cutting the client connection",
                        ex.method.decode(), ex.url.decode(errors="replace"), ex.worker)
            self.front.settle(ex, ex.status, _CUT)
            transport.close()
            return
        log.warning("%s %s: worker %s did not answer within %gs", ex.method.decode(),
                    ex.url.decode(errors="replace"), ex.worker, self.front.request_timeout)
        self.front.relay_failed(self, ex, 504, "the worker did not answer in time", close=True)

    def fail_closed(self, error: BaseException) -> None:
        """A transition the relay's table does not have: a bug of ours. The exchanges of this connection are
        abandoned (their counters entries closed, quota slots given back), the worker's connection closed and
        this one aborted, rather than anything left in a state nobody owns."""
        log.error("front: %s; closing the client connection", error, exc_info=error)
        for ex in self.queue:
            if ex.conn is not None:
                ex.conn.close()
            ex.abandon(self.clock(), self.front.forwards)
        self.queue.clear()
        if self.tunnel is not None:
            self.tunnel.close()
            self.tunnel = None
        if self.transport is not None:
            self.transport.abort()

    @property
    def idle(self) -> bool:
        return not self.queue and self.cur is None and self.tunnel is None
