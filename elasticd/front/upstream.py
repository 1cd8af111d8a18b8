"""The worker side of the relay: a pool of kept-alive connections per worker, each an asyncio Protocol that
parses the worker's answer with httptools and streams it to the client connection that asked.

A connection carries one request at a time (no pipelining toward workers: a worker that dies mid-answer then
costs one request, and an answer is always whole before the connection is reused). Everything written toward
the client during one read is joined into one write: a small answer is one send() on each side.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httptools

from elasticd.front.core.counters import WorkerCounters
from elasticd.front.core.http1 import CHUNK, NONE, ResponseHead, ResponseReader, chunk, is_http11
from elasticd.front.core.relay import RelayError

if TYPE_CHECKING:
    from elasticd.front.core.exchange import Exchange
    from elasticd.front.links import ClientSide

__all__ = ["MAX_IDLE", "ConnectionPool", "Upstream", "UpstreamConn"]

MAX_IDLE = 1024  # kept-alive connections per worker beyond which a released one is closed


@dataclass(frozen=True, slots=True)
class Upstream:
    worker_id: str
    socket_path: str


class _OutOfTurn(Exception):
    """Raised from a parser callback to stop parsing bytes a worker sent after its complete answer."""


class UpstreamConn(asyncio.Protocol):
    __slots__ = ("client", "closed", "done", "ex", "interim", "on_header", "out", "parser", "paused", "pool",
                 "reader", "reason", "received", "response", "reused", "stale_parser", "transport", "tunnel",
                 "whole")

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader()
        self.on_header = self.reader.header  # the parser calls the pure reader directly: one call per header
        self.parser = httptools.HttpResponseParser(self)
        self.stale_parser = False  # a bodiless answer was cut short of the parser's idea of its body
        self.ex: Exchange | None = None
        self.client: ClientSide | None = None
        self.closed = False
        self.reused = False
        self.tunnel = False
        self.paused = False
        self._reset()

    def _reset(self) -> None:
        self.reader.start()
        self.reason: bytes | None = None
        self.response: ResponseHead | None = None
        self.interim = False
        self.done = False
        self.whole = 0
        self.received = False  # any byte of the answer came
        self.out: list[bytes] = []

    # ------------------------------------------------------------------ driven by the client side

    def attach(self, ex: Exchange, client: ClientSide, reused: bool) -> None:
        """Carry ``ex`` (which took this connection already: ``Exchange.forward`` or ``.attach``)."""
        if self.stale_parser:
            self.parser = httptools.HttpResponseParser(self)
            self.stale_parser = False
        self.reader.start()  # _reset, inlined: once per request
        self.reason = None
        self.response = None
        self.interim = self.done = self.received = False
        self.out = []
        self.ex = ex
        self.client = client
        self.reused = reused

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def release(self) -> None:
        """The answer is complete and the request was sent whole: back to the pool (or closed)."""
        self.ex = None
        self.client = None
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self.pool.put(self)

    def close(self) -> None:
        self.ex = None
        self.client = None
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def pause(self) -> None:
        if not self.paused and self.transport is not None and not self.closed:
            self.paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused and self.transport is not None and not self.closed:
            self.paused = False
            self.transport.resume_reading()

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        client, ex = self.client, self.ex
        self.client = self.ex = None
        self.pool.lost(self)
        if client is None or ex is None:
            return
        try:
            if self.tunnel:
                client.tunnel_closed()
            elif self.response is not None and self.response.upstream_eof and not self.done:
                # A body delimited by the worker closing: this is its end.
                if self.response.framing == CHUNK:
                    client.write(b"0\r\n\r\n")
                self.pool.counters.answered += 1
                client.answered(ex, self.response.close)
            else:
                client.upstream_failed(ex, self.reused, self.received, self.pool.path,
                                       "closed the connection" if exc is None else str(exc))
        except RelayError as error:
            client.fail_closed(error)

    def pause_writing(self) -> None:
        if self.client is not None:
            self.client.pause_reading_for_upstream()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.resume_reading_for_upstream()

    def data_received(self, data: bytes) -> None:
        client, ex = self.client, self.ex
        if client is None or ex is None:
            self.close()  # nobody asked: a worker speaking out of turn gets its connection closed
            return
        client.active_at = client.clock()
        if self.tunnel:
            client.write(data)
            return
        self.received = True
        try:
            self.parser.feed_data(data)
            if self.out:
                transport = client.transport  # client.write(), inlined: once per read
                if transport is not None:
                    transport.write(b"".join(self.out))
                self.out = []
            if self.done:
                # The answer is complete: this connection goes back to its pool when the worker keeps it alive
                # and the request went whole (else it closes), then the client side is told.
                response = self.response
                pool = self.pool
                pool.counters.answered += 1  # the worker's own answer: the pool's evidence of progress
                if response is not None and response.reusable and ex.sent:
                    self.ex = self.client = None  # release(), inlined
                    if self.paused or pool.closed or len(pool.idle) >= MAX_IDLE:
                        self.release()
                    else:
                        pool.idle.append(self)
                else:
                    self.close()
                client.answered(ex, None if response is None else response.close)
        except RelayError as error:
            self.close()
            client.fail_closed(error)
        except httptools.HttpParserUpgrade as exc:
            self._flush(client)
            self.tunnel = True
            try:
                self.pool.counters.answered += 1
                client.became_tunnel(ex, self, data[exc.args[0]:])
            except RelayError as error:
                self.close()
                client.fail_closed(error)
        except httptools.HttpParserError as exc:
            self.closed = True
            if self.transport is not None:
                self.transport.close()
            self.client = self.ex = None
            cause = exc.__context__  # httptools wraps what a callback raised
            if isinstance(cause, _OutOfTurn) and self.done:
                del self.out[self.whole:]  # the next answer's header lines, if the reader shares ``out``
                self._flush(client)
                self.pool.counters.answered += 1
                # The answer was whole: the client goes on as its head said; this connection is closed above.
                client.answered(ex, None if self.response is None else self.response.close)
                return
            if isinstance(cause, RelayError):  # a step of ours, inside a parser callback: not the worker's fault
                client.fail_closed(cause)
                return
            self._flush(client)
            try:
                client.upstream_failed(ex, self.reused, self.received, self.pool.path,
                                       f"sent a malformed answer ({exc})")
            except RelayError as error:
                client.fail_closed(error)

    def _flush(self, client: ClientSide) -> None:
        if self.out:
            client.write(b"".join(self.out))
            self.out = []

    # ------------------------------------------------------------------ httptools callbacks

    def on_status(self, reason: bytes) -> None:
        self.reason = reason if self.reason is None else self.reason + reason

    def on_headers_complete(self) -> None:
        ex = self.ex
        assert ex is not None
        if self.done:
            # Another answer in the same read, after a complete one: the worker speaks out of turn. What it
            # sent for this request stands; the rest is dropped with the connection (see data_received).
            raise _OutOfTurn
        parser = self.parser
        status = parser.get_status_code()
        tokens = self.reader.tokens
        upstream11 = (tokens is None and parser.should_keep_alive()) or is_http11(parser, tokens)  # common case first
        if 100 <= status < 200 and status != 101:
            # An interim answer (103 Early Hints...): passed on to an HTTP/1.1 client; the final one follows.
            self.interim = True
            interim = self.reader.finish(status, self.reason, upstream11, False, True, True)
            if ex.http11:
                self.out.extend(interim.parts)
            return
        head = ex.head
        response = self.reader.finish(status, self.reason, upstream11, ex.method == b"HEAD", ex.http11,
                                      # an upgrade the worker refused, or a body not read whole: closed after
                                      head.keep_alive and ex.body_done and head.upgrade is None, ex.cookie_line)
        self.response = response
        ex.answer_head(status, response.login)
        if self.out:
            self.out.extend(response.parts)
        else:
            self.out = response.parts  # the body is appended to the head's pieces: one join, one write
        if response.framing == NONE:
            # Complete at its head. httptools cannot be told to skip a HEAD answer's announced body (nor, in
            # 0.1.x, a 304's), so the parser is replaced before this connection carries another request.
            self.done = True
            self.whole = len(self.out)
            self.stale_parser = True

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is None or self.done:
            return
        if response.framing == CHUNK:
            self.out.extend(chunk(body))
        else:
            self.out.append(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            self.reader.start()
            self.reason = None
            return
        if self.done:
            return
        if self.response is not None and self.response.framing == CHUNK:
            self.out.append(b"0\r\n\r\n")
        self.done = True
        self.whole = len(self.out)  # what ``out`` holds of this answer: anything after is out of turn


class ConnectionPool:
    """The kept-alive connections to one worker, and its forward counters."""

    __slots__ = ("closed", "conns", "counters", "idle", "path", "worker_id")

    def __init__(self, upstream: Upstream, counters: WorkerCounters) -> None:
        self.worker_id = upstream.worker_id
        self.path = upstream.socket_path
        self.counters = counters
        self.idle: list[UpstreamConn] = []
        self.conns: set[UpstreamConn] = set()  # every open one, busy or idle, so closing the pool closes all
        self.closed = False

    def take(self) -> UpstreamConn | None:
        idle = self.idle
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be still open on the worker's side
            if not conn.closed:
                return conn
        return None

    async def connect(self) -> UpstreamConn:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_unix_connection(lambda: UpstreamConn(self), self.path)
        if self.closed:
            conn.close()
            raise ConnectionAbortedError("the worker's connections were closed meanwhile")
        self.conns.add(conn)
        return conn

    def put(self, conn: UpstreamConn) -> None:
        if self.closed or conn.closed or len(self.idle) >= MAX_IDLE:
            conn.close()
        else:
            self.idle.append(conn)

    def lost(self, conn: UpstreamConn) -> None:
        self.conns.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)

    def close(self) -> None:
        """The worker is gone: close idle connections now, busy ones as their request fails or ends."""
        self.closed = True
        self.idle.clear()
        for conn in list(self.conns):
            if conn.ex is None:
                conn.close()
