"""The relay of one worker connection's answers, with no I/O: the worker's bytes go in, and out come the bytes
for the client and the effects for the shell — the answer is complete (settle it), the connection may carry
another request (release it to its pool) or must close, the answer became a tunnel, or the worker failed the
request. The other half of the relay is ``connection`` (the client's side).

A worker connection carries one request at a time (no pipelining toward workers: a worker that dies
mid-answer then costs one request, and an answer is always whole before the connection is reused). The
parser (httptools) calls this object back; what it finds is turned into the client's head by
``http1.ResponseReader`` and the exchange's phase moves through its table (``Exchange.answer_head``).
Everything for the client during one read is joined into one write: a small answer is one send() on each
side.

What a worker sends is bounded (``bounds``): its head in bytes and lines, however it is split across reads (a
head trickled a byte at a time too: ``Exchange.head_began`` starts its clock), its interim heads, and the bytes
of a chunked body that carry no body. Past a bound the request fails with ``refused`` set to the reason: the
client gets 502 (or, once the answer has begun, a cut connection) and this connection is closed.

Why a worker's chunked body stays the parser's, where a client's is read by the front on llhttp (``chunked.py``):
llhttp refuses BWS around a chunk extension's ``;`` (``5 ; a=b``), which RFC 9112 §7.1.1 allows, so on PyPI's
httptools such an answer fails there (a 502, or the client's connection cut once its head went; Debian 12's
http-parser reads it). Reading every chunked answer's body in Python to take that in was built and measured: 0.5 →
4.1 µs per one-chunk answer (the parser stopped and made again) and 0.5 → 1.5 µs per further chunk. Chunked answers
are common (every streamed one: Node's ``res.write``, Starlette's ``StreamingResponse``), where chunked requests are
rare, and httptools does not say where in a read it stopped, so a fallback on the parser's refusal alone cannot find
the line it refused. A worker is its own tenant's: the 502 is its own app's, and the log says why ("sent a malformed
answer (Invalid character in chunk extensions)").
"""

from __future__ import annotations

from typing import Final

import httptools

from elasticd.front.core.bounds import (
    FRAMING,
    HEAD_SIZE,
    INTERIM,
    MALFORMED,
    MAX_FRAMING_BYTES,
    MAX_HEAD_BYTES,
    MAX_INTERIM,
    AnswerRefused,
)
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.http1 import CHUNK, NONE, ResponseHead, ResponseReader, chunk, is_http11
from elasticd.front.core.relay import RelayError

__all__ = ["ANSWERED", "CLOSE", "FAILED", "RELEASE", "TUNNEL", "TUNNEL_CLOSED", "UPGRADED", "WRITE", "AnswerRelay"]

# Effects of ``receive`` and ``lost`` (a bitmask).
WRITE: Final = 1  # bytes for the client: ``to_client``
ANSWERED: Final = 2  # the answer is complete: settle the exchange (``close_after`` says whether the client's closes)
RELEASE: Final = 4  # the worker connection may carry another request: back to its pool
CLOSE: Final = 8  # close the worker connection
UPGRADED: Final = 16  # 101 went to the client: from here both connections are a tunnel (``tail``: what followed)
FAILED: Final = 32  # the connection failed the request before its answer ended (``why``; ``refused``: a bound's)
TUNNEL: Final = 64  # tunnelled bytes: relay the input as it is to the client
TUNNEL_CLOSED: Final = 128  # the worker closed the tunnel


class _OutOfTurn(Exception):
    """Raised from a parser callback to stop parsing bytes a worker sent after its complete answer."""


class AnswerRelay:
    """One worker connection's answers, one request at a time."""

    __slots__ = ("close_after", "done", "ex", "fed_body", "framing_bytes", "head_bytes", "interim", "interims",
                 "on_header", "out", "parser", "reader", "reason", "received", "refused", "response", "reused",
                 "stale_parser", "tail", "to_client", "tunnel", "whole", "why")

    def __init__(self) -> None:
        self.reader = ResponseReader()
        self.on_header = self.reader.header  # the parser calls the pure reader directly: one call per header
        self.parser = httptools.HttpResponseParser(self)
        self.stale_parser = False  # a bodiless answer was cut short of the parser's idea of its body
        self.ex: Exchange | None = None
        self.reused = False
        self.tunnel = False
        self.reason: bytes | None = None
        self.response: ResponseHead | None = None
        self.interim = False
        self.done = False
        self.whole = 0  # how much of ``out`` belongs to the complete answer: anything after is out of turn
        self.received = False  # any byte of the answer came
        self.out: list[bytes] = []  # pieces for the client, joined into ``to_client`` at the end of an input
        self.to_client = b""  # with WRITE: the bytes for the client (one write)
        # Whether the client connection closes after this answer, as its head said (None: no head came).
        self.close_after: bool | None = None
        self.tail = b""
        self.why = ""
        self.refused = ""  # with FAILED: the bound the answer passed (a ``bounds`` reason), "" for a transport failure
        self.head_bytes = 0  # bytes read while the head was still to come whole (interim heads included)
        self.interims = 0  # interim (1xx) heads of this answer
        self.framing_bytes = 0  # bytes read since the last that carried a body byte (chunk-size lines, the trailer)
        self.fed_body = False  # the read being parsed carried a body byte

    def start(self, ex: Exchange, reused: bool) -> None:
        """Carry ``ex`` (which took this connection already: ``Exchange.forward`` or ``.attach``)."""
        if self.stale_parser:
            self.parser = httptools.HttpResponseParser(self)
            self.stale_parser = False
        # The reader is ready: its finish() readied it (a head cut short fails its request, and that connection
        # closes, so none carries another request with a reader half full).
        self.reader.expect_head()  # headers again, not the last answer's trailer
        self.reason = None
        self.response = None
        self.close_after = None
        self.interim = self.done = self.received = False
        self.refused = ""
        self.head_bytes = self.interims = self.framing_bytes = 0
        self.out = []
        self.ex = ex
        self.reused = reused

    def detach(self) -> None:
        """The exchange leaves this connection (answered, failed, or the connection closes)."""
        self.ex = None

    def _gathered(self, effects: int) -> int:
        """``out`` joined into ``to_client``, with WRITE, when there is anything for the client."""
        if self.out:
            self.to_client = b"".join(self.out)
            self.out = []
            return effects | WRITE
        return effects

    # ------------------------------------------------------------------ inputs

    def receive(self, data: bytes, now: float = 0.0) -> int:
        """Bytes from the worker, at ``now`` (the head's clock starts at its first byte). RelayError (a step the
        table refuses) propagates: the shell fails closed."""
        if self.tunnel:
            return TUNNEL
        self.received = True
        in_head = self.response is None
        self.fed_body = False
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self.tunnel = True
            self.tail = data[exc.args[0]:]
            return self._gathered(UPGRADED)
        except httptools.HttpParserError as exc:
            cause = exc.__context__  # httptools wraps what a callback raised
            if isinstance(cause, RelayError):  # a step of ours, inside a parser callback: not the worker's fault
                raise cause from None
            if isinstance(cause, _OutOfTurn) and self.done:
                # The answer was whole: the client goes on as its head said; what followed closes the connection.
                del self.out[self.whole:]  # the next answer's header lines, if the reader shares ``out``
                return self._gathered(ANSWERED | CLOSE)
            if isinstance(cause, AnswerRefused):
                return self._refuse(cause.reason, cause.why)
            return self._refuse(MALFORMED, f"sent a malformed answer ({exc})")
        if self.response is None:
            # The head is still to come whole: what the parser holds of it (a line it has not finished, the reason
            # phrase) grows with every read, so the reads are counted, and its clock started.
            self.head_bytes += len(data)
            if self.head_bytes > MAX_HEAD_BYTES:
                return self._refuse(HEAD_SIZE, f"sent an answer head over {MAX_HEAD_BYTES} bytes")
            ex = self.ex
            if ex is not None and ex.head_began == 0.0:
                ex.head_began = now
        elif self.fed_body:
            self.framing_bytes = 0
        elif not in_head and not self.done:
            # A read after the head that carried no body: a chunk-size line (extensions and all) or the trailer.
            self.framing_bytes += len(data)
            if self.framing_bytes > MAX_FRAMING_BYTES:
                return self._refuse(FRAMING, f"sent more than {MAX_FRAMING_BYTES} bytes of chunked framing with "
                                             "no body (a chunk-size line or the trailer)")
        effects = 0
        if self.done:
            # Complete: back to the pool when the worker keeps it alive and the request went whole; else it closes.
            response = self.response
            ex = self.ex
            reusable = response is not None and response.reusable and ex is not None and ex.sent
            effects = ANSWERED | RELEASE if reusable else ANSWERED | CLOSE
        out = self.out
        if out:  # _gathered(), inlined: once per read
            self.to_client = b"".join(out)
            self.out = []
            effects |= WRITE
        return effects

    def _refuse(self, reason: str, why: str) -> int:
        """The answer passed a bound (or is no HTTP): the request fails, and this connection closes."""
        self.refused = reason
        self.why = why
        return self._gathered(FAILED | CLOSE)

    def lost(self, exc: Exception | None) -> int:
        """The worker's connection closed (``exc``: why, None for a plain close)."""
        if self.tunnel:
            return TUNNEL_CLOSED
        response = self.response
        if response is not None and response.upstream_eof and not self.done:
            # A body delimited by the worker closing: this is its end.
            if response.framing == CHUNK:
                self.out.append(b"0\r\n\r\n")
            self.done = True
            return self._gathered(ANSWERED)
        self.why = "closed the connection" if exc is None else str(exc)
        return self._gathered(FAILED)

    # ------------------------------------------------------------------ httptools callbacks

    def on_status(self, reason: bytes) -> None:
        self.reason = reason if self.reason is None else self.reason + reason

    def on_headers_complete(self) -> None:
        ex = self.ex
        assert ex is not None
        if self.done:
            # Another answer in the same read, after a complete one: the worker speaks out of turn. What it
            # sent for this request stands; the rest is dropped with the connection (see receive).
            raise _OutOfTurn
        parser = self.parser
        status = parser.get_status_code()
        tokens = self.reader.tokens
        upstream11 = (tokens is None and parser.should_keep_alive()) or is_http11(parser, tokens)  # common case first
        if 100 <= status < 200 and status != 101:
            # An interim answer (103 Early Hints...): passed on to an HTTP/1.1 client; the final one follows.
            self.interims += 1
            if self.interims > MAX_INTERIM:
                raise AnswerRefused(INTERIM, f"sent more than {MAX_INTERIM} interim (1xx) answers")
            self.interim = True
            interim = self.reader.finish(status, self.reason, upstream11, False, True, True)
            if ex.http11:
                self.out.extend(interim.parts)
            return
        head = ex.head
        if status == 429:  # a worker or node says "too many": its Retry-After may be a back-off (seed 001)
            ex.backoff = self.reader.retry_after or b""
        response = self.reader.finish(status, self.reason, upstream11, ex.method == b"HEAD", ex.http11,
                                      # an upgrade the worker refused, or a body not read whole: closed after
                                      head.keep_alive and ex.body_done and head.upgrade is None, ex.cookie_line)
        self.response = response
        self.close_after = response.close
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
        self.fed_body = True
        if response.framing == CHUNK:
            self.out.extend(chunk(body))
        else:
            self.out.append(body)

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False  # the reader was readied for the final head by its finish()
            self.reader.expect_head()  # the final answer's headers follow
            self.reason = None
            ex = self.ex
            if ex is not None:
                ex.head_began = 0.0  # the next head's clock starts at its own first byte (MAX_INTERIM bounds how often)
            return
        if self.done:
            return
        if self.response is not None and self.response.framing == CHUNK:
            self.out.append(b"0\r\n\r\n")
        self.done = True
        self.whole = len(self.out)
