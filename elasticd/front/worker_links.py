"""The front's links to its workers: one connection pool per worker (``upstream.ConnectionPool``), the connections
being opened, and what becomes of a request that needs one — a pooled connection free, a new one opened while the
pool is under its bound, a wait in the pool for one to come free, or 503 with too many waiting.

It owns the pools because a pool outlives any one request and dies with its worker (``drop_pool``: the supervisor
saw it exit, or the front found it dead), and because a connection opened for one request may serve the next one
waiting (``_room_in``). What it does not own: where a request goes (``forwarding``), whether a worker is dead
(``worker_health``). A request that cannot be sent is handed back to the request path (``FrontSide``: decided
again once, or answered), so that this part imports nothing of it.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Final, cast

from elasticd.front.client import ClientConn
from elasticd.front.core.bounds import CONNECTIONS, MAX_WAITING, OPEN, WAIT, next_connection
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.relay import PHASE_FORWARDING, RelayError
from elasticd.front.core.routing import AppRoute
from elasticd.front.links import ClientSide, FrontSide
from elasticd.front.upstream import ConnectionPool, Upstream, UpstreamConn

__all__ = ["WorkerLinks"]

_CROWDED_RETRY_AFTER: Final = 1  # seconds a client is told to wait when too many requests wait for its worker


class WorkerLinks:
    __slots__ = ("_connecting", "forwarding", "forwards", "pools")

    # The request path (``forwarding.Forwarding``), given by the front once both exist (each needs the other).
    forwarding: FrontSide

    def __init__(self, forwards: ForwardCounters) -> None:
        self.forwards = forwards
        # By worker id. The request path holds this very dict (a forward's pool is one lookup), so it is never
        # replaced, only changed.
        self.pools: dict[str, ConnectionPool] = {}
        self._connecting: set[asyncio.Task[tuple[asyncio.BaseTransport, UpstreamConn]]] = set()

    # ------------------------------------------------------------------ the pools

    def new_pool(self, upstream: Upstream, route: AppRoute, group: str) -> ConnectionPool:
        """The connection pool to ``upstream`` (of ``route``'s ``group``), made anew: one to an older socket of the
        same worker id is dropped first."""
        self.drop_pool(upstream.worker_id)
        counters = self.forwards.worker(upstream.worker_id)
        concurrency = route.concurrency_of(group)
        pool = self.pools[upstream.worker_id] = ConnectionPool(upstream, counters, concurrency)
        pool.on_room = self._room_in
        counters.group = f"{route.tenant}/{route.app}/{group}"
        self.forwards.bound(counters, concurrency)
        return pool

    def pool_of(self, upstream: Upstream, route: AppRoute, group: str) -> ConnectionPool:
        """The pool to ``upstream``: its worker's, unless that one is to an older socket (a restart), then anew.
        (``Forwarding.dispatch`` has this inlined.)"""
        pool = self.pools.get(upstream.worker_id)
        if pool is None or pool.path != upstream.socket_path:
            pool = self.new_pool(upstream, route, group)
        return pool

    def in_flight(self, worker_id: str) -> int:
        """Requests on their way to or from a worker or node now: its pooled connections that are busy (O(1): a
        nodes: group's placement reads it for each new user)."""
        pool = self.pools.get(worker_id)
        return len(pool.conns) - len(pool.idle) if pool is not None else 0

    def drop_pool(self, worker_id: str) -> None:
        """The worker is gone, or found dead: its idle connections close now, its busy ones as their requests end,
        and the requests waiting for one are decided again (``_unreachable``)."""
        pool = self.pools.pop(worker_id, None)
        if pool is not None:
            waiting = pool.close()
            if waiting:  # answered in a later turn of the loop: this may be a dispatch under way
                asyncio.get_running_loop().call_soon(self._unreachable, waiting)

    def stop(self) -> None:
        """The front stops: connections being opened are abandoned, every pool dropped."""
        for task in list(self._connecting):
            task.cancel()
        for worker_id in list(self.pools):
            self.drop_pool(worker_id)

    def _unreachable(self, waiting: list[tuple[ClientSide, Exchange]]) -> None:
        """Requests that waited for a connection to a worker that is gone: 502, as the request it was carrying."""
        for side, ex in waiting:
            client = cast(ClientConn, side)  # (the front's listener made every client side)
            if client.transport is None or ex.phase is not PHASE_FORWARDING or ex.conn is not None:
                continue  # answered or gone meanwhile
            try:
                self._not_sent(client, ex)
            except RelayError as exc:
                client.fail_closed(exc)

    def _not_sent(self, client: ClientConn, ex: Exchange) -> None:
        """``ex`` never reached its worker (its connection was refused, or it waited for one to a worker found
        gone): nothing of it was sent, so it is decided again, once, whatever its method — another worker, or a
        wait for one that is coming; 502 when it was sent again already."""
        if ex.retried:
            self.forwarding.relay_failed(client, ex, 502, "the worker could not be reached")
        else:
            self.forwarding.retry(client, ex)

    # ------------------------------------------------------------------ a request that needs a new connection

    def open_or_wait(self, client: ClientConn, ex: Exchange, pool: ConnectionPool) -> None:
        """``ex`` needs a new connection to its worker: opened while the pool is under its bound; else it waits in
        the pool for one to come free (its timeout still runs), or, with too many waiting, is answered 503."""
        route = ex.route
        if route is not None:
            concurrency = route.concurrency_of(ex.group)  # (a reload may have changed it)
            pool.bound(concurrency)
            self.forwards.bound(pool.counters, concurrency)
        waiting = len(pool.waiting)
        if waiting >= MAX_WAITING:
            waiting = pool.waiting_count()  # (only the ones still waiting count)
        decision = next_connection(pool.open_conns, pool.connecting, waiting, pool.limit)
        if decision == OPEN:
            self._connect(client, ex, pool)
        elif decision == WAIT:
            pool.wait(client, ex)
        else:
            if route is not None:
                self.forwards.upstream_refused(route.tenant, route.app, CONNECTIONS)
            forwarding = self.forwarding
            forwarding.tell_of_worker(ex.worker, "crowded", "%s %s: worker %s: its %d connections are busy and %d "
                                      "requests wait already: refused", ex.method.decode(),
                                      ex.url.decode(errors="replace"), ex.worker, pool.limit, waiting)
            forwarding.relay_failed(client, ex, 503, f"worker {ex.worker} has {waiting} requests waiting already",
                                    retry_after=_CROWDED_RETRY_AFTER)

    def _room_in(self, pool: ConnectionPool) -> None:
        """A connection of ``pool`` closed or became a tunnel while requests wait: the first ones get new ones, as
        far as the bound allows."""
        if self.pools.get(pool.worker_id) is not pool:
            return  # a pool dropped meanwhile: its waiting requests were answered with it
        while pool.waiting and pool.open_conns + pool.connecting < pool.limit:
            found = pool.next_waiting()
            if found is None:
                return
            client, ex = found
            self._connect(cast(ClientConn, client), ex, pool)  # (the front's listener made every client side)

    def _connect(self, client: ClientConn, ex: Exchange, pool: ConnectionPool) -> None:
        task = asyncio.get_running_loop().create_task(pool.connect())  # (the loop's coroutine: see serving.py)
        self._connecting.add(task)
        pool.connecting += 1
        task.add_done_callback(partial(self._connected, client, ex, pool))

    def _connected(self, client: ClientConn, ex: Exchange, pool: ConnectionPool,
                   task: asyncio.Task[tuple[asyncio.BaseTransport, UpstreamConn]]) -> None:
        self._connecting.discard(task)
        pool.connecting -= 1
        if task.cancelled():
            return
        error = task.exception()
        if error is None and not pool.opened(task.result()[1]):
            error = ConnectionAbortedError("the worker's connections were closed meanwhile")
        late = ex.phase is not PHASE_FORWARDING or client.transport is None
        if error is not None:
            if late:
                self._room_in(pool)  # the connection it would have taken is not coming: the next may try
                return
            forwarding = self.forwarding
            forwarding.tell_of_worker(ex.worker, "connect", "%s %s: worker %s: cannot connect: %s",
                                      ex.method.decode(), ex.url.decode(errors="replace"), ex.worker, error)
            forwarding.worker_failed(pool.worker_id, pool.path)
            self._not_sent(client, ex)  # (refused before a byte was sent: decided again, once)
            self._room_in(pool)  # (a pool still in use: its next waiting request tries in turn)
            return
        conn = task.result()[1]
        if late:
            pool.put(conn)  # the client left or timed out meanwhile: keep the connection for the next one
            return
        try:
            ex.attach(conn)
        except RelayError as exc:
            pool.put(conn)
            client.fail_closed(exc)
            return
        conn.attach(ex, client, reused=False)
        client.send_head(ex)
