"""The relay of one client connection, with no I/O: bytes the client sent go in, and out come the bytes for the
client and for the worker and a small set of effects for the shell to carry out (h11's model: the shell owns
the socket, this owns the state).

It holds what a connection's requests share: the pipelined queue (requests read ahead of the one being
served, their bodies buffered), the request being parsed, the bytes buffered and why reading is paused, the
upgrade under way and the tunnel it became, and whether the connection is draining (answered and closing:
what the client still sends is dropped). Each request in it is an ``Exchange``, whose phase only the relay's
table moves (``relay.TRANSITIONS``). The parser (httptools, a C library: no I/O) calls this object back.

Inputs (socket events, as the shell sees them): ``receive`` (bytes from the client), ``client_eof``,
``client_lost``, and from the worker's side ``worker_answered``, ``worker_lost``, ``worker_gone``, ``upgraded``;
``timeout`` for a connection idle past its limit (the shell's one periodic tick asks ``idle_limit``). Outputs:
the methods return an effect (``receive``: ``DISPATCH``, or a bitmask of ``SERVE``/``CROWDED``/``TO_WORKER``/
``FAIL``/``CLOSE``; the others a ``CloseMode``, a ``Failure``, a ``Timeout``, or whether reading resumes) and
the bytes to write (``request_bytes``, ``body_bytes``, ``own_answer``, ``continue_bytes``). Anything the table
does not allow raises ``RelayError``; the shell then fails closed (``abandon``).

The effects are ints and the bytes are returned, not wrapped: this runs for every request, and an object per
effect would cost more than the step it describes.
"""

from __future__ import annotations

from typing import Final

from elasticd.front.core import http1
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.exchange import NO_HEAD, Exchange, Link
from elasticd.front.core.relay import (
    CLOSEMODE_KEEP,
    CLOSEMODE_LINGER,
    FAILURE_LATE,
    PHASE_DONE,
    PHASE_FORWARDING,
    PHASE_PARKED,
    PHASE_QUEUED,
    TIMEOUT_CLOSE,
    CloseMode,
    Failure,
    Timeout,
    after_own_answer,
    client_left,
    timed_out,
    upstream_lost,
)
from elasticd.front.core.request_reading import (
    CLOSE,
    CROWDED,
    DISPATCH,
    FAIL,
    MAX_PENDING,
    MAX_QUEUE,
    SERVE,
    TO_WORKER,
    RequestReading,
)

__all__ = ["CLOSE", "CONTINUE", "CROWDED", "DISPATCH", "FAIL", "MAX_PENDING", "MAX_QUEUE", "SERVE", "TO_WORKER",
           "ClientRelay"]

# A parked request (a live move, a cold start, no room) is answered by the front's own deadline for it; the connection's
# idle limit stays this much behind, so the lot's answer (a 503 with Retry-After) is sent, not a silent close.
PARKED_MARGIN: Final = 5.0

# Why reading from the client is paused (both may hold).
FOR_QUEUE: Final = 1
FOR_UPSTREAM: Final = 2

CONTINUE: Final = b"HTTP/1.1 100 Continue\r\n\r\n"


class ClientRelay(RequestReading):
    """One client connection's requests, from their bytes to their answers' ends (``RequestReading`` reads them)."""

    __slots__ = ("eof", "paused")

    def __init__(self, max_header_bytes: int) -> None:
        super().__init__(max_header_bytes)
        self.paused = 0  # FOR_QUEUE | FOR_UPSTREAM
        self.eof = False  # the client stopped sending

    def close_after_answers(self) -> None:
        """From now on every answer announces ``Connection: close`` and ends its connection, those of requests read
        already too. A server that closes a kept-alive connection while it is idle races the client's next request
        on it (RFC 9112 9.6: the request is lost, a balancer answers 502); one that closes after an answer it
        announced so leaves nothing to race."""
        self.closing = True
        for ex in self.queue:
            if ex.head is not NO_HEAD:  # (the shared placeholder is never written)
                ex.head.keep_alive = False

    # ------------------------------------------------------------------ input: the client's end

    def client_eof(self) -> None:
        """The client stopped sending. As nginx: a half-close cannot be told from a close, so the client has
        left; the shell lets the connection close (``client_lost`` follows)."""
        self.eof = True

    def client_lost(self) -> tuple[list[Link], Exchange | None, int]:
        """The client connection is gone: (the worker connections to close, the exchange to settle as
        CLIENT_LEFT or None, its status — 499 while nothing of the answer was sent, as nginx)."""
        links: list[Link] = []
        if self.tunnel is not None:
            links.append(self.tunnel)
            self.tunnel = None
        settle: Exchange | None = None
        status = 0
        if self.queue:
            ex = self.queue[0]
            left = client_left(ex.phase, ex.status)
            if left is not None:
                if ex.conn is not None:  # free the worker at once
                    links.append(ex.conn)
                    ex.conn = None
                settle, status = ex, left
            self.queue.clear()
        return links, settle, status

    # ------------------------------------------------------------------ serving the queue

    def next_request(self) -> Exchange | None:
        """The first request when it waits to be dispatched (answered ones leave the queue here); None when
        the first is under way or there is none."""
        queue = self.queue
        while queue:
            ex = queue[0]
            phase = ex.phase
            if phase is PHASE_QUEUED:
                return ex
            if phase is not PHASE_DONE:
                return None
            queue.popleft()
        return None

    def continue_bytes(self, ex: Exchange) -> bytes:
        """What the client gets as ``ex`` is forwarded: 100 Continue when it waits for one before its body."""
        if ex.head.expect and not ex.body_done and ex.http11:
            return CONTINUE
        return b""

    def request_bytes(self, ex: Exchange, peer: bytes | None) -> bytes:
        """``ex`` has its worker connection: the head, with whatever body already came, as one write."""
        assert ex.user is not None
        parts = http1.upstream_head(ex.method, ex.url, ex.head, peer, ex.user.encode())
        if ex.cookie_line and ex.worker is not None and "@" in ex.worker:
            # A new user's first request to a node (``config.model.node_id``: another host's elasticd front, say)
            # carries the id it was just given: that front knows the user by the same id, and sets no cookie of
            # its own (a browser would keep whichever Set-Cookie came last, and lose the first request's state).
            parts.insert(4, b"Cookie: elastic_uid=" + ex.user.encode() + b"\r\n")
        if ex.body or not ex.body_done or self.upgrading is ex:
            self._body_parts(ex, parts)
        else:
            ex.sent = True  # no body: the head is the whole request
        return b"".join(parts)

    def body_bytes(self) -> tuple[Link | None, bytes]:
        """More of the body of the request under way, for its worker connection (b"" when none is due)."""
        ex = self.queue[0] if self.queue else None
        if ex is None or ex.phase is PHASE_QUEUED or ex.phase is PHASE_DONE:  # not under way
            return None, b""
        conn = ex.conn
        if conn is None or conn.transport is None or not (ex.body or (ex.body_done and not ex.sent)):
            return None, b""
        parts: list[bytes] = []
        self._body_parts(ex, parts)
        return conn, b"".join(parts)

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

    def pause_if_crowded(self) -> bool:
        """After serving what ``receive`` said was CROWDED: True when reading must stop now (the queue or the
        buffer is still over its bound, and reading was not paused already). Asked after serving, not before:
        serving may have relieved it, and a resume must never come before the pause it undoes."""
        if len(self.queue) > MAX_QUEUE or self.pending > MAX_PENDING:
            return self.pause(FOR_QUEUE)
        return False

    def relieved(self) -> bool:
        """After body bytes went out or a request left the queue: True when reading resumes (it was paused
        for the queue, and the queue and the buffer are back under their bounds)."""
        if self.paused & FOR_QUEUE and self.pending <= MAX_PENDING and len(self.queue) <= MAX_QUEUE:
            return self.resume(FOR_QUEUE)
        return False

    def worker_gone(self) -> bool:
        """The worker connection no longer carries this client's request (answered, or lost): its back-pressure
        no longer holds. True when reading must start again (it was paused for it, and for nothing else)."""
        if self.paused & FOR_UPSTREAM:
            return self.resume(FOR_UPSTREAM)
        return False

    def pause(self, why: int) -> bool:
        """True when reading must stop now (it was not paused for another reason)."""
        was = self.paused
        self.paused = was | why
        return not was

    def resume(self, why: int) -> bool:
        """True when reading must start again (no other reason holds it)."""
        was = self.paused
        self.paused = was & ~why
        return bool(was) and not self.paused

    # ------------------------------------------------------------------ answers

    def own_answer(self, ex: Exchange, status: int, text: str, *, retry_after: int | None, close: bool,
                   stopping: bool) -> tuple[bytes, CloseMode]:
        """An answer of the front's own to ``ex``, in its turn (its phase is the caller's to advance): the bytes
        for the client and how the connection goes on. A lingering close starts draining here."""
        mode = after_own_answer(close=close, keep_alive=ex.head.keep_alive, client_eof=self.eof, stopping=stopping,
                                upgrading=self.upgrading is ex, body_done=ex.body_done, expect=ex.head.expect,
                                parse_error=ex.error is not None)
        data = http1.plain(status, text, close=mode is not CLOSEMODE_KEEP, retry_after=retry_after,
                           head_request=ex.method == b"HEAD")
        self._drop_body(ex)
        queue = self.queue
        if queue and queue[0] is ex:
            queue.popleft()
        if mode is not CLOSEMODE_KEEP:
            # The connection closes after this answer: the requests read behind it (never forwarded, so with
            # nothing open) are not served — a worker's answer to one could only meet a closed connection.
            for behind in queue:
                self._drop_body(behind)
            queue.clear()
        if mode is CLOSEMODE_LINGER:
            self.draining = True
        return data, mode

    def _drop_body(self, ex: Exchange) -> None:
        """What was buffered of ``ex``'s body will never be sent: it leaves the buffer's count."""
        if ex.body:
            self.pending -= sum(map(len, ex.body))
            ex.body.clear()

    def worker_answered(self, ex: Exchange, close_after: bool | None, stopping: bool) -> bool:
        """The worker's answer to ``ex`` is complete and relayed, and ``ex`` settled: True when the client
        connection closes now, False when the next request may be served. ``close_after``: what the answer's
        head said (None: no head came, which cannot happen on a complete answer, and closes). It closes too
        when the request's body was not read whole (nothing after it could be framed), when the client stopped
        sending or the front is stopping, and after an upgrade the worker refused."""
        ex.conn = None
        queue = self.queue
        if queue and queue[0] is ex:
            queue.popleft()
        return (close_after is None or close_after or not ex.body_done or self.eof or stopping
                or self.upgrading is ex)

    def worker_lost(self, ex: Exchange, *, reused: bool, received: bool) -> Failure:
        """The worker's connection ended before the answer did: RETRY (the shell sends ``ex`` again:
        ``Exchange.retry`` undoes its forward), BAD_GATEWAY, CUT (the shell settles and cuts) or LATE (nothing to
        do)."""
        failure = upstream_lost(ex.phase, reused=reused, received=received, retried=ex.retried,
                                has_body=ex.head.has_body, method=ex.method, upgrading=self.upgrading is ex)
        if failure is not FAILURE_LATE:
            ex.conn = None
        return failure

    def upgraded(self, ex: Exchange, link: Link) -> bytes:
        """101 went to the client (``ex`` settled as UPGRADE): both connections now carry the new protocol.
        Returns what the client already sent past the head, for the worker."""
        ex.conn = None
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
        self.tunnel = link
        self.upgrading = None
        data = b"".join(ex.body)
        self.pending -= len(data)
        ex.body.clear()
        return data

    # ------------------------------------------------------------------ time and failure

    @property
    def idle(self) -> bool:
        """Between requests: nothing queued, being parsed or tunnelled."""
        return not self.queue and self.cur is None and self.tunnel is None

    def idle_limit(self, keepalive: float, request: float, tunnel: float) -> float:
        """How long this connection may go without a byte moving either way."""
        if self.tunnel is not None:
            return tunnel
        if self.idle:
            return keepalive
        queue = self.queue
        return request + PARKED_MARGIN if queue and queue[0].phase is PHASE_PARKED else request

    def head_overdue(self, now: float, request: float) -> bool:
        """The worker's answer head began more than ``request`` seconds ago and is still not whole: a worker that
        trickles its head moves bytes, so ``idle_limit`` alone would never end it (``timeout`` answers 504)."""
        queue = self.queue
        if not queue:
            return False
        ex = queue[0]
        began = ex.head_began
        return began > 0.0 and ex.phase is PHASE_FORWARDING and now - began > request

    def timeout(self) -> tuple[Timeout, Exchange | None, Link | None]:
        """No byte moved for ``idle_limit``: CLOSE (idle, or a head that never completed), GATEWAY_TIMEOUT (the
        shell answers 504 and closes) or CUT (the shell settles and cuts); with the worker connection to close."""
        ex = self.queue[0] if self.queue else None
        decision = timed_out(ex.phase if ex is not None else None)
        if ex is None or decision is TIMEOUT_CLOSE:
            return TIMEOUT_CLOSE, None, None
        link, ex.conn = ex.conn, None
        return decision, ex, link

    def abandon(self, now: float, forwards: ForwardCounters) -> list[Link]:
        """Fail closed (a transition the table does not have: a bug of ours): every exchange is over, its
        counters entry closed and quota slot given back. Returns the worker connections to close."""
        links = [ex.conn for ex in self.queue if ex.conn is not None]
        for ex in self.queue:
            ex.abandon(now, forwards)
        self.queue.clear()
        if self.tunnel is not None:
            links.append(self.tunnel)
            self.tunnel = None
        self.draining = True
        return links
