"""The worker side of the relay: a pool of kept-alive connections per worker, each an asyncio Protocol whose
answers are read by the relay core (``core.answer``) and streamed to the client connection that asked.

A pool holds at most its bound of connections to its worker (``core.bounds.connection_bound``, of its group's
concurrency; tunnels aside) and keeps at most ``idle_bound`` of them idle. A request that finds none idle and the
bound reached waits in the pool (``waiting``) for one to come free — a worker that accepts and never answers
holds its bound's connections, not one per request; the request's own timeout still ends its wait.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from elasticd.front import serving
from elasticd.front.core.answer import (
    ANSWERED,
    CLOSE,
    FAILED,
    RELEASE,
    TUNNEL,
    TUNNEL_CLOSED,
    UPGRADED,
    WRITE,
    AnswerRelay,
)
from elasticd.front.core.bounds import DEFAULT_CONCURRENCY, MAX_WAITING, connection_bound, idle_bound
from elasticd.front.core.counters import WorkerCounters
from elasticd.front.core.relay import PHASE_FORWARDING, RelayError
from elasticd.front.links import ClientSide

if TYPE_CHECKING:
    from elasticd.front.core.exchange import Exchange

__all__ = ["ConnectionPool", "Upstream", "UpstreamConn"]


@dataclass(frozen=True, slots=True)
class Upstream:
    """A worker (``socket_path``: its Unix socket, an absolute path) or a node (``socket_path``: "host:port",
    reached over TCP: ``serving.open_to``)."""

    worker_id: str
    socket_path: str


class UpstreamConn(asyncio.Protocol):
    """One connection to a worker: socket callbacks go into its answer relay (``core.answer.AnswerRelay``) and
    what it returns is carried out — bytes written to the client, the connection released to its pool or
    closed, the client side told the answer ended, failed or became a tunnel."""

    __slots__ = ("client", "closed", "paused", "pool", "relay", "transport")

    def __init__(self, pool: ConnectionPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.relay = AnswerRelay()
        self.client: ClientSide | None = None
        self.closed = False
        self.paused = False

    @property
    def ex(self) -> Exchange | None:
        """The exchange this connection carries, None while idle."""
        return self.relay.ex

    @property
    def tunnel(self) -> bool:
        return self.relay.tunnel

    # ------------------------------------------------------------------ driven by the client side

    def attach(self, ex: Exchange, client: ClientSide, reused: bool) -> None:
        """Carry ``ex`` (which took this connection already: ``Exchange.forward`` or ``.attach``)."""
        self.relay.start(ex, reused)
        self.client = client

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def release(self) -> None:
        """The answer is complete and the request was sent whole: back to the pool (or closed)."""
        self.relay.detach()
        self.client = None
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self.pool.put(self)

    def close(self) -> None:
        self.relay.detach()
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
        client, relay = self.client, self.relay
        ex = relay.ex
        self.client = None
        relay.detach()
        self.pool.lost(self)
        if client is None or ex is None:
            return
        client.stamp()  # an answer that ends with the close ends now
        try:
            self._carry_out(relay.lost(exc), client, ex, b"")
        except RelayError as error:
            client.fail_closed(error)

    def pause_writing(self) -> None:
        if self.client is not None:
            self.client.pause_reading_for_upstream()

    def resume_writing(self) -> None:
        if self.client is not None:
            self.client.resume_reading_for_upstream()

    def data_received(self, data: bytes) -> None:
        client, relay = self.client, self.relay
        ex = relay.ex
        if client is None or ex is None:
            self.close()  # nobody asked: a worker speaking out of turn gets its connection closed
            return
        now = client.stamp()
        try:
            effects = relay.receive(data, now)
            if effects == _ANSWERED_WHOLE:  # the common case, carried out inline: once per request
                transport = client.transport
                if transport is not None:
                    transport.write(relay.to_client)
                pool = self.pool
                pool.counters.answered += 1  # the worker's own answer: the pool's evidence of progress
                close_after = relay.close_after  # (read first: a request waiting for this connection takes it now)
                relay.ex = self.client = None  # release(), inlined
                if pool.waiting or self.paused or pool.closed or len(pool.idle) >= pool.max_idle:
                    self.release()
                else:
                    pool.idle.append(self)
                client.answered(ex, close_after)
            elif effects:
                self._carry_out(effects, client, ex, data)
        except RelayError as error:
            self.close()
            client.fail_closed(error)

    def _carry_out(self, effects: int, client: ClientSide, ex: Exchange, data: bytes) -> None:
        """Every effect but the common whole answer, in the order that keeps the client's bytes in order."""
        relay = self.relay
        if effects & TUNNEL:
            client.write(data)
            return
        if effects & TUNNEL_CLOSED:
            client.tunnel_closed()
            return
        if effects & WRITE:
            client.write(relay.to_client)
        if effects & (ANSWERED | UPGRADED):
            self.pool.counters.answered += 1
        close_after = relay.close_after  # (read first: a request waiting for this connection takes it at release)
        if effects & CLOSE:
            self.close()
        elif effects & RELEASE:
            self.release()
        if effects & UPGRADED:
            tail, relay.tail = relay.tail, b""
            self.pool.tunneled(self)
            client.became_tunnel(ex, self, tail)
        elif effects & ANSWERED:
            client.answered(ex, close_after)
        elif effects & FAILED:
            client.upstream_failed(ex, relay.reused, relay.received, self.pool.path, relay.why, relay.refused)


_ANSWERED_WHOLE: Final = WRITE | ANSWERED | RELEASE


class ConnectionPool:
    """The kept-alive connections to one worker, the requests waiting for one, and its forward counters."""

    __slots__ = ("closed", "connecting", "conns", "counters", "idle", "limit", "max_idle", "on_room", "path",
                 "tunnels", "waiting", "worker_id")

    def __init__(self, upstream: Upstream, counters: WorkerCounters, concurrency: int = DEFAULT_CONCURRENCY) -> None:
        self.worker_id = upstream.worker_id
        self.path = upstream.socket_path
        self.counters = counters
        self.idle: list[UpstreamConn] = []
        self.conns: set[UpstreamConn] = set()  # every open one, busy or idle, so closing the pool closes all
        self.tunnels: set[UpstreamConn] = set()  # those that became a tunnel: outside the bound (one per client)
        self.connecting = 0  # connections being opened
        self.waiting: deque[tuple[ClientSide, Exchange]] = deque()  # requests waiting for a connection, in order
        self.limit = self.max_idle = 0
        self.bound(concurrency)
        # Called when a connection closes or becomes a tunnel while requests wait: the front opens one for the first.
        self.on_room: Callable[[ConnectionPool], None] | None = None
        self.closed = False

    def bound(self, concurrency: int) -> None:
        """The bounds for a group of ``concurrency`` (asked again as connections are opened: a reload may change it)."""
        self.limit = connection_bound(concurrency)
        self.max_idle = idle_bound(concurrency)

    @property
    def open_conns(self) -> int:
        """Connections counted against the bound: open (busy, idle, or closing), tunnels aside."""
        return len(self.conns) - len(self.tunnels)

    def take(self) -> UpstreamConn | None:
        idle = self.idle
        while idle:
            conn = idle.pop()  # the most recently used: the likeliest to be still open on the worker's side
            if not conn.closed:
                return conn
        return None

    def connect(self) -> Coroutine[Any, Any, tuple[asyncio.BaseTransport, UpstreamConn]]:
        """A new connection to the worker, as the loop's own coroutine (no coroutine of ours here: see
        serving.py); its result goes to ``opened``."""
        return serving.open_to(lambda: UpstreamConn(self), self.path)

    def opened(self, conn: UpstreamConn) -> bool:
        """Take a connection ``connect`` made; False, and the connection closed, when the pool closed
        meanwhile."""
        if self.closed:
            conn.close()
            return False
        self.conns.add(conn)
        return True

    def wait(self, client: ClientSide, ex: Exchange) -> None:
        """``ex`` waits for a connection (the bound is reached). Those that stopped waiting (answered 504, their
        client gone) are dropped from the front of the line as it grows, and from all of it at its bound."""
        waiting = self.waiting
        while waiting and not _waits(*waiting[0]):
            waiting.popleft()
        if len(waiting) >= MAX_WAITING:
            self.waiting = waiting = deque(entry for entry in waiting if _waits(*entry))
        waiting.append((client, ex))

    def waiting_count(self) -> int:
        """Requests still waiting (those that stopped are dropped first)."""
        if self.waiting:
            self.waiting = deque(entry for entry in self.waiting if _waits(*entry))
        return len(self.waiting)

    def next_waiting(self) -> tuple[ClientSide, Exchange] | None:
        """The first request still waiting, taken out of the line; None when none waits."""
        waiting = self.waiting
        while waiting:
            client, ex = waiting.popleft()
            if _waits(client, ex):
                return client, ex
        return None

    def put(self, conn: UpstreamConn) -> None:
        """A connection free for another request: to the first one waiting, else kept idle (or closed past the
        idle bound)."""
        if self.closed or conn.closed:
            conn.close()
            return
        found = self.next_waiting()
        if found is not None:
            client, ex = found
            try:
                ex.attach(conn)
            except RelayError as error:  # (a waiting request is FORWARDING: not expected)
                conn.close()
                client.fail_closed(error)
                return
            conn.attach(ex, client, True)  # reused: kept alive, the worker may have closed it meanwhile
            client.send_head(ex)
        elif len(self.idle) >= self.max_idle:
            conn.close()
        else:
            self.idle.append(conn)

    def tunneled(self, conn: UpstreamConn) -> None:
        """``conn`` became a tunnel: it leaves the bound (a request waiting may open a connection now)."""
        self.tunnels.add(conn)
        self._room()

    def lost(self, conn: UpstreamConn) -> None:
        self.conns.discard(conn)
        self.tunnels.discard(conn)
        if conn in self.idle:
            self.idle.remove(conn)
        self._room()

    def _room(self) -> None:
        if self.waiting and not self.closed and self.on_room is not None:
            self.on_room(self)

    def close(self) -> list[tuple[ClientSide, Exchange]]:
        """The worker is gone: close idle connections now, busy ones as their request fails or ends. Returns the
        requests that were waiting for a connection (the front answers them)."""
        self.closed = True
        self.idle.clear()
        for conn in list(self.conns):
            if conn.ex is None:
                conn.close()
        waiting = [entry for entry in self.waiting if _waits(*entry)]
        self.waiting.clear()
        return waiting


def _waits(client: ClientSide, ex: Exchange) -> bool:
    """A request in a pool's line still waits: forwarded, with no connection, and its client still there (one
    answered meanwhile, a 504 after its timeout, or whose client left, is done)."""
    return ex.phase is PHASE_FORWARDING and ex.conn is None and client.transport is not None
