"""The client side of the relay, as an asyncio Protocol: socket callbacks go into the connection's relay core
(``core.connection.ClientRelay``) and what it returns is carried out — bytes written, reading paused or
resumed, the connection closed (at once or lingering), a request dispatched or settled through the request path
(``FrontSide``: the front's ``forwarding`` part, called directly).

Requests are served one at a time in the order they came; the worker's answer streams back through the
worker side (``links``). Decisions are front.core's; this module only moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from elasticd.front.core.bounds import HEAD_TIME
from elasticd.front.core.connection import (
    CLOSE,
    CROWDED,
    DISPATCH,
    FAIL,
    FOR_UPSTREAM,
    SERVE,
    TO_WORKER,
    ClientRelay,
)
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import (
    CLOSEMODE_KEEP,
    CLOSEMODE_LINGER,
    EVENT_ANSWER_END,
    EVENT_CLIENT_LEFT,
    EVENT_CUT,
    EVENT_REFUSE,
    EVENT_UPGRADE,
    FAILURE_CUT,
    FAILURE_LATE,
    FAILURE_RETRY,
    PHASE_DONE,
    TIMEOUT_CLOSE,
    TIMEOUT_CUT,
    RelayError,
)
from elasticd.front.links import ClientSide, FrontSide, ListeningSide, WorkerSide

__all__ = ["ClientConn"]

log = logging.getLogger("elasticd.front")

_LINGER: Final = 2.0  # seconds a closing connection still reads (and drops) what the client sends



class ClientConn(ClientSide):
    __slots__ = ("active_at", "front", "listening", "peer", "relay", "tunnel_user")  # (and ClientSide's)

    def __init__(self, listening: ListeningSide, front: FrontSide) -> None:
        self.listening = listening  # the listener that accepted it: its terms, and whether the front stops
        self.front = front  # the request path: where its requests go, and how they end
        self.clock = listening.clock
        self.transport: asyncio.Transport | None = None
        self.relay = ClientRelay(listening.max_header_bytes)
        if listening.closing:
            self.relay.closing = True
        self.peer: bytes | None = None
        self.active_at = listening.clock()
        self.tunnel_user: str | None = None  # whose WebSocket tunnel this connection carries, while it does

    # ------------------------------------------------------------------ asyncio

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        peer = transport.get_extra_info("peername")
        listening = self.listening
        if isinstance(peer, tuple) and peer:
            self.peer = str(peer[0]).encode()
            trusts = listening.trusts
            if trusts is not None:  # (decided once a connection: a proxy keeps its connections to the front)
                own = transport.get_extra_info("sockname")
                # (each end spelled out as (str, int): Debian 12's mypyc types a tuple narrowed by isinstance as
                # Tuple[Any, ...], and refuses it where (str, int) is asked)
                if isinstance(own, tuple) and trusts((str(peer[0]), int(peer[1])), (str(own[0]), int(own[1]))):
                    self.relay.reader.trust(True)
        if listening.keep_underscored:
            self.relay.reader.keep_underscored = True
        listening.conns.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.listening.conns.discard(self)
        self.transport = None
        links, ex, status = self.relay.client_lost()
        for link in links:
            link.close()
        if ex is not None:
            self.front.settle(ex, status, EVENT_CLIENT_LEFT)

    def eof_received(self) -> bool:
        self.relay.client_eof()
        return False  # the transport closes: connection_lost settles what was under way (499)

    def pause_writing(self) -> None:
        link = self._answering_link()
        if link is not None:
            link.pause()

    def resume_writing(self) -> None:
        self.active_at = self.clock()
        link = self._answering_link()
        if link is not None:
            link.resume()

    def stamp(self) -> float:
        self.active_at = now = self.clock()
        return now

    def _answering_link(self) -> WorkerSide | None:
        relay = self.relay
        return relay.tunnel or (relay.queue[0].conn if relay.queue else None)

    def data_received(self, data: bytes) -> None:
        self.active_at = self.clock()
        relay = self.relay
        try:
            effects = relay.receive(data)
            if effects == DISPATCH:  # the common case: one new request, nothing else queued
                ex = relay.queue[0]
                self.front.dispatch(self, ex)
                if ex.phase is PHASE_DONE:  # answered by the front itself: whatever came after it is next
                    self._pump()
            elif effects == SERVE:  # a request (or more of its body) to move along
                self._pump()
            elif effects:
                self._carry_out(effects, data)
        except RelayError as exc:
            self.fail_closed(exc)

    def refuse_released(self, ex: Exchange, status: int, text: str, retry_after: int | None) -> None:
        """``ex`` was held (for a worker that did not come up) and is answered by the front, in its turn."""
        try:
            ex.advance(EVENT_REFUSE)
            self.answer(ex, status, text, retry_after=retry_after)
            self._pump()
        except RelayError as exc:
            self.fail_closed(exc)

    def released(self, ex: Exchange) -> None:
        """``ex`` was held for a move of its user that ended: dispatched now, in its turn."""
        try:
            self.front.dispatch(self, ex)
            if ex.phase is PHASE_DONE:  # answered by the front itself: whatever came after it is next
                self._pump()
        except RelayError as exc:
            self.fail_closed(exc)

    def _carry_out(self, effects: int, data: bytes) -> None:
        relay = self.relay
        if effects & TO_WORKER:
            assert relay.link is not None
            relay.link.write(data)
            relay.link = None
        if effects & FAIL:
            assert relay.failure is not None
            ex, status, text = relay.failure
            relay.failure = None
            if relay.link is not None:
                relay.link.close()
                relay.link = None
            self.front.relay_failed(self, ex, status, text)
        if effects & CLOSE and self.transport is not None:
            self.transport.close()
        if effects & SERVE:
            self._pump()
        if effects & CROWDED and relay.pause_if_crowded() and self.transport is not None:
            self.transport.pause_reading()

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    # ------------------------------------------------------------------ serving the queue

    def serve_next(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.active_at = self.clock()  # dispatch reads its time here
            self._pump()

    def _pump(self) -> None:
        """Dispatch the first request if it is new; move its body along if it is under way."""
        relay = self.relay
        front = self.front
        while self.transport is not None:
            ex = relay.next_request()
            if ex is None:
                break
            front.dispatch(self, ex)
            if ex.phase is not PHASE_DONE:
                return
        if relay.queue and self.transport is not None:
            link, data = relay.body_bytes()
            if data:
                assert link is not None
                link.write(data)
                if relay.paused and relay.relieved() and self.transport is not None:
                    self.transport.resume_reading()

    def send_head(self, ex: Exchange) -> None:
        """``ex`` has its worker connection (``ex.conn``): the head, with whatever body already came."""
        conn = ex.conn
        assert conn is not None
        relay = self.relay
        conn.write(relay.request_bytes(ex, self.peer))
        if relay.paused and relay.relieved() and self.transport is not None:
            self.transport.resume_reading()

    def answer(self, ex: Exchange, status: int, text: str, retry_after: int | None = None,
               close: bool = False) -> None:
        """An answer of the front's own, in the request's turn (its phase is the caller's to advance)."""
        relay = self.relay
        data, mode = relay.own_answer(ex, status, text, retry_after=retry_after, close=close,
                                      stopping=self.listening.stopping)
        transport = self.transport
        if transport is None:
            return
        transport.write(data)
        if relay.paused and relay.relieved():
            transport.resume_reading()
        if mode is CLOSEMODE_LINGER:
            # End our side, drop what still comes for a moment, then close. Closing at once would reset the
            # connection, and a reset can destroy the answer in the client's receive buffer before it is read
            # (nginx's lingering close). The relay drops what still comes.
            if transport.can_write_eof():
                transport.write_eof()
            asyncio.get_running_loop().call_later(_LINGER, transport.close)
        elif mode is not CLOSEMODE_KEEP:
            transport.close()

    # ------------------------------------------------------------------ driven by the worker side

    def answered(self, ex: Exchange, close_after: bool | None) -> None:
        """The worker's answer is complete and was relayed (its connection went back to its pool or closed)."""
        front = self.front
        now = self.active_at  # stamped by the worker side as the answer's last bytes came
        ex.end(EVENT_ANSWER_END, ex.status, now, front.forwards, front.surface)  # front.settle(), inlined
        if ex.login is not None:
            front.logged_in(ex, now)
        if ex.backoff is not None:
            front.backed_off(ex)
        relay = self.relay
        if relay.paused and relay.worker_gone() and self.transport is not None:
            self.transport.resume_reading()  # paused while that worker connection's buffer was full
        if relay.worker_answered(ex, close_after, self.listening.stopping):
            if self.transport is not None:
                self.transport.close()
        elif relay.queue:  # pipelined requests wait (the common keep-alive case has none)
            self._pump()

    def upstream_failed(self, ex: Exchange, reused: bool, received: bool, path: str, why: str,
                        refused: str = "") -> None:
        if self.transport is None:
            return
        relay = self.relay
        failure = relay.worker_lost(ex, reused=reused, received=received)
        if failure is FAILURE_LATE:
            return
        if refused:
            self._count_refusal(ex, refused)
        if relay.paused and relay.worker_gone():
            self.transport.resume_reading()  # paused while that worker connection's buffer was full
        if failure is FAILURE_RETRY:
            # A kept-alive connection the worker closed while idle: safe to send once more.
            self.front.retry(self, ex)
            return
        if failure is FAILURE_CUT:
            # The answer had started: the client can only be told by a cut connection (a truncated answer,
            # never a complete-looking wrong one).
            self.front.tell_of_worker(ex.worker, "cut", "%s %s: worker %s %s mid-answer; cutting the client "
                                      "connection", ex.method.decode(), ex.url.decode(errors="replace"), ex.worker,
                                      why)
            self.front.settle(ex, ex.status, EVENT_CUT)
            self.transport.close()
            return
        self.front.tell_of_worker(ex.worker, "failed", "%s %s: worker %s %s", ex.method.decode(),
                                  ex.url.decode(errors="replace"), ex.worker, why)
        if refused:
            # It answered, past a bound (or not in HTTP): this request fails, the worker stays routable (its users'
            # state lives there), and its connection is closed already.
            self.front.relay_failed(self, ex, 502, f"the worker {why}")
            return
        self.front.worker_failed(ex.worker, path)
        self.front.relay_failed(self, ex, 502, "the worker could not be reached")

    def _count_refusal(self, ex: Exchange, reason: str) -> None:
        route = ex.route
        if route is not None:
            self.front.forwards.upstream_refused(route.tenant, route.app, reason)

    def became_tunnel(self, ex: Exchange, conn: WorkerSide, tail: bytes) -> None:
        """101 Switching Protocols went to the client: both connections now carry the new protocol."""
        if tail:
            self.write(tail)
        self.front.settle(ex, 101, EVENT_UPGRADE)
        self.tunnel_user = ex.user  # a user with a tunnel open is not moved while it is (moving would cut it)
        relay = self.relay
        data = relay.upgraded(ex, conn)
        if data:
            conn.write(data)
        if relay.paused and relay.relieved() and self.transport is not None:
            self.transport.resume_reading()

    def tunnel_closed(self) -> None:
        self.relay.tunnel = None
        self.tunnel_user = None
        if self.transport is not None:
            self.transport.close()

    def pause_reading_for_upstream(self) -> None:
        if self.relay.pause(FOR_UPSTREAM) and self.transport is not None:
            self.transport.pause_reading()

    def resume_reading_for_upstream(self) -> None:
        if self.relay.resume(FOR_UPSTREAM) and self.transport is not None:
            self.transport.resume_reading()

    # ------------------------------------------------------------------ timeouts and shutdown

    def timed_out(self, timeout: float) -> None:
        """No byte moved either way for the timeout (the front's tick says: ``timeout`` is its request timeout):
        504 when the worker's answer has not started."""
        transport = self.transport
        if transport is None:
            return
        decision, ex, link = self.relay.timeout()
        if link is not None:
            link.close()
        if ex is None or decision is TIMEOUT_CLOSE:
            transport.close()  # an idle keep-alive connection, or a head that never completed
            return
        if decision is TIMEOUT_CUT:
            self.front.tell_of_worker(ex.worker, "stalled", "%s %s: worker %s stalled mid-answer; cutting the "
                                      "client connection", ex.method.decode(), ex.url.decode(errors="replace"),
                                      ex.worker)
            self.front.settle(ex, ex.status, EVENT_CUT)
            transport.close()
            return
        if ex.head_began > 0.0:  # its head began and never came whole (trickled): ClientRelay.head_overdue
            self._count_refusal(ex, HEAD_TIME)
            self.front.tell_of_worker(ex.worker, "head-time", "%s %s: worker %s did not send its answer head whole "
                                      "within %gs", ex.method.decode(), ex.url.decode(errors="replace"), ex.worker,
                                      timeout)
            self.front.relay_failed(self, ex, 504, f"the worker did not send its answer head whole within {timeout:g}s",
                                    close=True)
            return
        self.front.tell_of_worker(ex.worker, "timeout", "%s %s: worker %s did not answer within %gs",
                                  ex.method.decode(), ex.url.decode(errors="replace"), ex.worker, timeout)
        self.front.relay_failed(self, ex, 504, "the worker did not answer in time", close=True)

    def fail_closed(self, error: BaseException) -> None:
        """A transition the relay's table does not have: a bug of ours. The exchanges of this connection are
        abandoned (their counters entries closed, quota slots given back), the worker's connections closed and
        this one aborted, rather than anything left in a state nobody owns."""
        log.error("front: %s; closing the client connection", error, exc_info=error)
        for link in self.relay.abandon(self.clock(), self.front.forwards):
            link.close()
        if self.transport is not None:
            self.transport.abort()

    @property
    def idle(self) -> bool:
        return self.relay.idle

    @property
    def tunnel(self) -> WorkerSide | None:
        return self.relay.tunnel
