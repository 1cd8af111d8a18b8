"""The front: one HTTP listener for every app — routes by Host, enforces tenant quotas, keeps users sticky,
clocks every forward, and relays bytes to the workers' Unix sockets.

The decisions are front.core's (dispatch, relay, exchange, routing, quota, sticky, counters, http1); this
shell owns the listener, the per-worker connection pools, the workers it found dead (unroutable until their
socket accepts again), and one periodic tick for timeouts and expiry (no timer per request).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from functools import partial
from typing import Any, Final, cast

from elasticd.background import watch
from elasticd.config.model import Address, Quotas
from elasticd.front import serving
from elasticd.front.client import ClientConn
from elasticd.front.core.bounds import CONNECTIONS, MAX_HEAD_BYTES, MAX_WAITING, OPEN, WAIT, next_connection
from elasticd.front.core.counters import QUEUE_NO_WORKER, ForwardCounters
from elasticd.front.core.dispatch import Moving, NoRoom, Queued, Refuse, Target, Wake, decide, has_room
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.parking import PARKED_FULL, PARKED_MOVE, PARKED_QUEUE, PARKED_WAKE, Parked, ParkingLot
from elasticd.front.core.quota import QuotaBook
from elasticd.front.core.relay import (
    EVENT_FAIL,
    EVENT_PARK,
    EVENT_REFUSE,
    EVENT_RELEASE,
    PHASE_FORWARDING,
    PHASE_PARKED,
    Event,
    RelayError,
)
from elasticd.front.core.routing import AppRoute, RouteTable
from elasticd.front.core.sticky import PlaceFn, Surface, place
from elasticd.front.links import ClientSide
from elasticd.front.queueing import FrontQueue
from elasticd.front.request_metrics import FrontCollector
from elasticd.front.upstream import ConnectionPool, Upstream, UpstreamConn
from elasticd.listeners import bind_tcp
from elasticd.refusal_log import RefusalLog

__all__ = ["Front", "WorkersFn"]

log = logging.getLogger("elasticd.front")

# (tenant, app, group) -> the upstreams routable right now, in the group's stable order (first: reception).
WorkersFn = Callable[[str, str, str], Sequence[Upstream]]

_MISS: Final = object()
_MAX_HOSTS: Final = 1024  # Host header values remembered with their route (a flood of odd names only resets it)
STALE_MARGIN: Final = 10.0  # seconds past request_timeout before a dead open-requests entry is swept
_WAKE_RETRY_AFTER: Final = 5  # seconds a client is told to wait after a cold start that did not come up
_CROWDED_RETRY_AFTER: Final = 1  # seconds a client is told to wait when too many requests wait for its worker


_ANSWERED_HERE: Final = (Refuse, Moving, Wake, NoRoom, Queued)  # what dispatch.decide answers but a forward
_TICKED: Final = (PARKED_WAKE, PARKED_FULL)  # the reasons the tick may end (a move's end is the move's to say)


def _group_name(key: tuple[str, str, str]) -> str:
    return f"{key[0]}/{key[1]}/{key[2]}"


class Front:
    __slots__ = (
        "_address",
        "_connecting",
        "_next_expiry",
        "_pools",
        "_probes",
        "_routes",
        "_servers",
        "_targets",
        "_timer",
        "_workers",
        "carried",
        "clock",
        "closing",
        "conns",
        "forwards",
        "full",
        "keep_underscored",
        "keepalive_timeout",
        "kept",
        "max_header_bytes",
        "move_timeout",
        "on_backoff",
        "on_login",
        "on_queued",
        "parked",
        "place",
        "port",
        "queue",
        "quotas",
        "request_timeout",
        "said",
        "stale_after",
        "stopping",
        "surface",
        "trusts",
        "tunnel_timeout",
        "unroutable",
        "wake",
    )

    def __init__(self, address: Address, routes: RouteTable, workers: WorkersFn, *,
                 quotas: Mapping[str, Quotas] | None = None, request_timeout: float = 60.0,
                 user_ttl: float = 1800.0, clock: Callable[[], float] = time.monotonic,
                 max_header_bytes: int = MAX_HEAD_BYTES, keepalive_timeout: float = 75.0,
                 tunnel_timeout: float = 3600.0, move_timeout: float = 10.0) -> None:
        self._address = address
        self._routes = routes
        self._workers = workers
        self.clock = clock
        self.request_timeout = request_timeout  # connect, wait for the answer's head, any pause in a body
        self.keepalive_timeout = keepalive_timeout  # an idle client connection between requests
        self.tunnel_timeout = tunnel_timeout  # an idle upgraded (WebSocket) connection
        self.max_header_bytes = max_header_bytes  # request line + headers; over it: 431
        self.move_timeout = move_timeout  # a live move's hard deadline: no request is parked (much) longer
        # Forwarding headers: who may state them (None: nobody; ``client.ClientConn`` asks at each connection), and
        # whether request header names with "_" pass (server.trusted_proxies, trusted_proxy_users,
        # underscored_headers; see core/http1.py).
        self.trusts: Callable[[tuple[str, int], tuple[str, int]], bool] | None = None
        self.keep_underscored = False
        # Requests that wait in the front: of users being moved, for a group at zero, for room (core/parking.py).
        self.parked: ParkingLot[ClientConn] = ParkingLot()
        self.queue = FrontQueue(self)  # the group queues' bounds, hand-overs and timeouts
        # Asked when a request's group has no routable worker: True when one is starting (the pool's cold
        # start); None: such a request is answered 503 at once.
        self.wake: Callable[[tuple[str, str, str]], bool] | None = None
        # Admission by capacity readings (probes/): the workers and nodes whose own reading says they are full,
        # by id → (until, Retry-After, how long a request may wait for room). Written by the probes' shell only.
        self.full: dict[str, tuple[float, int, float]] = {}
        # A 429 answer: (the worker or node, its Retry-After value, b"" for none, the instant) → the back-off
        # it means, if any (the probes' shell decides whose 429 is one).
        self.on_backoff: Callable[[str, bytes, float], None] | None = None
        # A worker being emptied by live moves, by id, while it still serves its pinned users (the daemon's;
        # None: no worker is ever kept out of the routable list with users on it).
        self.kept: Callable[[str], Upstream | None] | None = None
        # An open-requests entry idle past the request timeout (plus a margin for the tick) can only be a leak.
        self.stale_after = request_timeout + STALE_MARGIN
        self.quotas = QuotaBook(quotas or {}, clock())
        # What a worker did wrong, said once a minute per worker and kind: a hostile worker failing every request
        # would otherwise make each one a line of elasticd's log (the counters count every one).
        self.said = RefusalLog()
        self.surface = Surface(user_ttl)
        self.forwards = ForwardCounters()
        self.forwards.on_free = self.queue.slot_free
        self.place: PlaceFn = place  # where a new (or re-placed) user goes: the reception
        # At a login (X-Elastic-Login: <name>): (group key, user, the worker that logged it in, whether it was
        # logged in already) → the worker the user lives on from now on, or None to leave it where it is. The
        # pool's reception-first keep/pass policy plugs in here.
        self.on_login: Callable[[tuple[str, str, str], str, str, bool], str | None] | None = None
        # A request was queued for a group (every routable worker at its concurrency): the pool's burst check.
        self.on_queued: Callable[[tuple[str, str, str]], None] | None = None
        self.unroutable: set[str] = set()  # workers found dead, until their socket accepts again
        self.conns: set[ClientConn] = set()
        self.stopping = False
        self.closing = False  # a drained stop: every answer closes its connection (close_after_answers)
        self.port: int | None = None
        self._targets: dict[bytes | None, Target | None] = {}
        self._pools: dict[str, ConnectionPool] = {}
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._connecting: set[asyncio.Task[tuple[asyncio.BaseTransport, UpstreamConn]]] = set()
        self._servers: list[asyncio.AbstractServer] = []
        # Tunnels carried over from the image before a re-exec (front/carried.py), until they close.
        self.carried: set[Any] = set()
        self._timer: asyncio.TimerHandle | None = None
        self._next_expiry = 0.0

    # ------------------------------------------------------------------ configuration (reload)

    @property
    def routes(self) -> RouteTable:
        return self._routes

    def set_routes(self, routes: RouteTable) -> None:
        """Swap the table; requests already routed finish where they are (those waiting for a group at zero that
        the new table no longer has are decided again at the next tick: ``_tick_waking``)."""
        self._routes = routes
        self._targets.clear()
        self.forwards.retain_routes({(r.tenant, r.app) for r in routes.routes()})

    def set_quotas(self, quotas: Mapping[str, Quotas]) -> None:
        """New limits apply to the next request; requests in flight stay counted."""
        self.quotas.update(quotas, self.clock())
        self._targets.clear()
        self.forwards.retain_tenants(set(quotas))

    def configure(self, *, request_timeout: float, user_ttl: float, move_timeout: float = 10.0,
                  trusts: Callable[[tuple[str, int], tuple[str, int]], bool] | None = None,
                  keep_underscored: bool = False) -> None:
        """The reloadable settings (a connection made already keeps the trust it was given)."""
        self.trusts = trusts
        self.keep_underscored = keep_underscored
        self.move_timeout = move_timeout
        self.request_timeout = request_timeout
        self.stale_after = request_timeout + STALE_MARGIN
        self.surface.ttl = user_ttl

    def collector(self, shown: Callable[[str, str], bool] | None = None) -> FrontCollector:
        """For the metrics server's registry: requests, latency and quota refusals. ``shown``: the apps whose idle
        groups still show their (zero) queue series; a group that queued anything always does."""
        groups = self.groups
        if shown is not None:
            show = shown  # (bookworm's mypy 1.0 does not carry the narrowing into the lambda)
            groups = lambda: [g for g in self.groups() if show(g[0], g[1])]  # noqa: E731
        return FrontCollector(self.forwards, lambda: list(self.quotas.tenants), self.queue.depths, groups)

    def groups(self) -> list[tuple[str, str, str]]:
        """Every routed group, as (tenant, app, group)."""
        return [(r.tenant, r.app, g) for r in self._routes.routes() for g in sorted(r.groups or {r.group})]

    def workers_of(self, tenant: str, app: str, group: str) -> Sequence[Upstream]:
        """The group's routable workers (the supervisor's view: those the front found dead are in ``unroutable``)."""
        return self._workers(tenant, app, group)

    # ------------------------------------------------------------------ life

    def start(self, sockets: Sequence[socket.socket] | None = None) -> Coroutine[Any, Any, None]:
        """Serve on the listening sockets (the daemon's ``listeners.Listeners`` holds them: bound, or the previous
        image's; none given: bound here) (awaitable; the coroutine is serving.py's, see there why)."""
        if sockets is None:
            sockets = bind_tcp(self._address.host, self._address.port, serving.BACKLOG)
        return serving.listen(self.connection, sockets, self._listening)

    def connection(self) -> ClientConn:
        """A client connection's protocol (accepted here, or carried over a re-exec)."""
        return ClientConn(self)

    def _listening(self, servers: list[asyncio.AbstractServer]) -> None:
        first = not self._servers and self._timer is None
        self._servers = servers
        # (through Any: uvloop's server is no asyncio.Server, and its sockets are a list where asyncio's are a
        # tuple; a compiled front checks the declared type when it reads the attribute, and would refuse it)
        listening: Any = servers[0]
        port: int = listening.sockets[0].getsockname()[1]
        self.port = port
        if first:
            self._timer = asyncio.get_running_loop().call_later(self._tick_interval(), self._tick)
            log.info("front listening on %s", Address(self._address.host, port))

    def stop_accepting(self) -> None:
        """Close the servers: their sockets stay open in ``Listeners`` (connections wait in the backlog)."""
        servers, self._servers = self._servers, []
        for server in servers:
            server.close()

    def close_after_answers(self) -> None:
        """A drained stop's first step: each connection closes after its next answer, announced, so that at the stop
        itself none is left kept alive for a balancer to send a request on as it closes (ClientRelay's)."""
        self.closing = True
        for conn in list(self.conns):
            conn.relay.close_after_answers()

    def stop(self, grace: float = 10.0) -> Coroutine[Any, Any, None]:
        """Stop accepting; let answers under way finish (up to ``grace``); close every connection
        (awaitable)."""
        self.stopping = True
        self.stop_accepting()
        for conn in list(self.conns):
            if conn.idle and conn.transport is not None:
                conn.transport.close()
        return serving.drain(self._busy, grace, self._stopped)

    def _busy(self) -> bool:
        return any(not c.idle for c in self.conns)

    def _stopped(self) -> None:
        for conn in list(self.conns):
            if conn.transport is not None:
                conn.transport.abort()
        if self._timer is not None:
            self._timer.cancel()
        for task in [*self._probes.values(), *self._connecting]:
            task.cancel()
        for worker_id in list(self._pools):
            self._drop_pool(worker_id)
        for tunnel in list(self.carried):
            tunnel.close()

    def tunnels_by_worker(self) -> dict[str, int]:
        """Open WebSocket tunnels per worker: counted from the connections themselves, so it cannot drift."""
        counts: dict[str, int] = {}
        for carried in list(self.carried):
            counts[carried.worker] = counts.get(carried.worker, 0) + 1
        for conn in list(self.conns):
            tunnel = cast("UpstreamConn | None", conn.tunnel)  # the listener made it: an UpstreamConn
            if tunnel is not None and not tunnel.closed:
                worker = tunnel.pool.worker_id
                counts[worker] = counts.get(worker, 0) + 1
        return counts

    def tunnels_of(self, user: str) -> int:
        """The user's open WebSocket tunnels (a live move waits until there are none: moving would cut them)."""
        return (sum(1 for conn in list(self.conns) if conn.tunnel_user == user and conn.tunnel is not None)
                + sum(1 for carried in list(self.carried) if carried.user == user))

    def in_flight(self, worker_id: str) -> int:
        """Requests on their way to or from a worker or node now: its pooled connections that are busy (O(1): a
        nodes: group's placement reads it for each new user)."""
        pool = self._pools.get(worker_id)
        return len(pool.conns) - len(pool.idle) if pool is not None else 0

    def open_requests_of(self, user: str) -> int:
        """The user's requests in flight, from the open-requests dict (what a live move quiesces on)."""
        return len(self.forwards.open_of(user))

    def forget_worker(self, worker_id: str) -> None:
        """A worker gone for good (retired, removed): its forward counters end with it, and what was said of it."""
        self.close_upstream(worker_id)
        self.forwards.forget_worker(worker_id)
        self.said.forget(worker_id)

    def close_upstream(self, worker_id: str) -> None:
        """The worker is gone (the supervisor saw it exit): close its pooled connections, re-place its users
        at their next request, and forget it was unroutable (a restarted worker is the supervisor's to call
        routable again)."""
        self._drop_pool(worker_id)
        self.surface.release(worker_id)
        self.unroutable.discard(worker_id)
        probe = self._probes.pop(worker_id, None)
        if probe is not None:
            probe.cancel()

    def _drop_pool(self, worker_id: str) -> None:
        pool = self._pools.pop(worker_id, None)
        if pool is not None:
            waiting = pool.close()
            if waiting:  # answered in a later turn of the loop: this may be a dispatch under way
                asyncio.get_running_loop().call_soon(self._unreachable, waiting)

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
            self.relay_failed(client, ex, 502, "the worker could not be reached")
        else:
            self.retry(client, ex)

    def _tick_parked(self, now: float) -> None:
        """Every parked request whose reason is over goes (a cold start's worker that joined its group after a
        reload's launch, a reading whose time ran out: a release that no event named); one whose patience ran out
        is answered, or released, by its reason's rule."""
        parked = self.parked
        for reason in _TICKED:
            for key in parked.keys(reason):
                if self._may_go(reason, key, now):
                    self._dispatch_parked(parked.release(reason, key), key)
                    continue
                if reason is PARKED_FULL:  # each request after its reading's own wait
                    retry_after, wait = parked.terms(reason, key)
                    overdue = parked.release_older(reason, key, now - wait)
                    if overdue:
                        what = f"group {key}: every worker" if "/" in key else f"{key}"
                        self.answer_parked(overdue, key, 503, f"{what} says it is full (its capacity reading)",
                                           retry_after)
        for name in parked.overdue(PARKED_WAKE, now, self.request_timeout):
            tenant, app, group = name.split("/")
            log.warning("front: group %s did not get a routable worker within the request timeout (%gs): "
                        "its waiting requests are answered 503", name, self.request_timeout)
            self.wake_failed((tenant, app, group), f"no worker came up within {self.request_timeout:g}s")
        for user in parked.overdue(PARKED_MOVE, now, self.move_timeout + 1.0):
            # The move's own deadline should have released them: whatever became of it, they go on.
            log.warning("front: requests of %s parked past the move timeout (%gs): released", user, self.move_timeout)
            self.release(user)
        if parked.count(PARKED_QUEUE):
            self.queue.tick(now)

    def _may_go(self, reason: Parked, key: str, now: float) -> bool:
        """Whether the requests parked under (``reason``, ``key``) may be decided again now (a MOVE's end is the
        move's to say, never the tick's)."""
        if reason is PARKED_WAKE:
            tenant, app, group = key.split("/")
            if not any(group in (r.groups or {r.group}) for r in self._routes.routes()
                       if (r.tenant, r.app) == (tenant, app)):
                return True  # a reload removed the group: decided again under the table in force
            return any(w.worker_id not in self.unroutable for w in self._workers(tenant, app, group))
        if "/" in key:  # FULL, a new user's: any worker of the group with room
            tenant, app, group = key.split("/")
            return any(w.worker_id not in self.unroutable and has_room(self.full, w.worker_id, now)
                       for w in self._workers(tenant, app, group))
        return has_room(self.full, key, now)

    def room(self, worker_id: str, group: tuple[str, str, str]) -> int:
        """A worker (or node) of ``group`` takes requests again: its waiting users' requests, and those of new
        users waiting for any worker of the group, are dispatched, oldest first."""
        released = 0
        for key in (worker_id, _group_name(group)):
            if self.parked.holds(PARKED_FULL, key):
                released += self._dispatch_parked(self.parked.release(PARKED_FULL, key), key)
        return released

    def backed_off(self, ex: Exchange) -> None:
        """The answer to ``ex`` was a 429: the probes' shell may read its Retry-After as a back-off."""
        if self.on_backoff is not None and ex.worker is not None and ex.backoff is not None:
            try:
                self.on_backoff(ex.worker, ex.backoff, self.clock())
            except Exception:  # the answer went out already; a broken hook must not break the connection
                log.exception("front: reading a 429's back-off failed")

    def _tick_interval(self) -> float:
        return max(0.01, min(1.0, self.request_timeout / 4, self.keepalive_timeout / 4))

    def _tick(self) -> None:
        try:
            now = self.clock()
            if self.parked:  # (first: a parked request is answered before its connection's idle limit)
                self._tick_parked(now)
            for conn in list(self.conns):
                relay = conn.relay
                limit = relay.idle_limit(self.keepalive_timeout, self.request_timeout, self.tunnel_timeout)
                if now - conn.active_at > limit or relay.head_overdue(now, self.request_timeout):
                    try:
                        conn.timed_out()
                    except RelayError as exc:
                        conn.fail_closed(exc)
            for carried in list(self.carried):
                if now - carried.active_at > self.tunnel_timeout:
                    carried.close()
            if now >= self._next_expiry:
                self.surface.expire(now)
                for request in self.forwards.sweep(now - self.stale_after):
                    # A leaked entry (only a bug leaves one): its quota slot goes with it.
                    swept = cast(Exchange, request)
                    if swept.quota is not None:
                        swept.quota.leave()
                    if swept.counters is not None:
                        self.forwards.ended(swept.counters)
                self._next_expiry = now + min(60.0, self.surface.ttl / 4, self.stale_after / 2)
        except Exception:  # the next tick must come whatever failed in this one: timeouts depend on it
            log.exception("front: the periodic tick failed")
        finally:
            self._timer = asyncio.get_running_loop().call_later(self._tick_interval(), self._tick)

    # ------------------------------------------------------------------ the request path (from ClientConn)

    def target(self, host: bytes | None) -> Target | None:
        found = self._targets.get(host, _MISS)
        if found is not _MISS:
            return found  # type: ignore[return-value]
        route = self._routes.lookup(host.decode("latin-1") if host is not None else None)
        target = None if route is None else Target(route, self.forwards.route(route.tenant, route.app),
                                                   self.quotas.get(route.tenant))
        if len(self._targets) >= _MAX_HOSTS:
            self._targets.clear()
        self._targets[host] = target
        return target

    def _refuse(self, client: ClientConn, ex: Exchange, status: int, text: str, retry_after: int | None = None,
                close: bool = False) -> None:
        ex.advance(EVENT_REFUSE)
        client.answer(ex, status, text, retry_after=retry_after, close=close)

    def dispatch(self, client: ClientConn, ex: Exchange) -> None:
        if ex.error is not None:
            self._refuse(client, ex, *ex.error, close=True)
            return
        host = ex.head.host
        try:
            target = self._targets[host]  # target(), its cache hit inlined
        except KeyError:
            target = self.target(host)
        # The callback that led here (bytes from the client, or the end of the answer before) stamped this
        # instant on the connection: no second clock read per request.
        now = client.active_at
        decision = decide(target, ex.head, now, self._workers, self.unroutable, self.surface, self.place,
                          self.forwards, self.kept, self.wake, self.full, self.forwards.saturated)
        if isinstance(decision, _ANSWERED_HERE):  # (one C call for a forward, the common case)
            if isinstance(decision, Refuse):
                self._refuse(client, ex, decision.status, decision.text, retry_after=decision.retry_after)
            elif isinstance(decision, Queued):
                assert target is not None
                self.queue.enqueue(decision, target, client, ex, now)
            else:
                self._park(decision, target, client, ex, now)
            return
        assert target is not None
        upstream, ex.user, ex.entry, ex.cookie_line, ex.quota, ex.group = decision
        ex.route = target.route
        ex.stats = target.stats
        ex.ts = now
        ex.worker = upstream.worker_id
        pool = self.pool_of(upstream, target.route, ex.group)
        ex.counters = pool.counters
        idle = pool.idle  # pool.take(), its common case inlined: the most recently used, still open
        conn = idle.pop() if idle else None
        if conn is not None and conn.closed:
            conn = pool.take()
        ex.forward(self.forwards, conn)  # FORWARD, and ATTACH of a pooled connection, in one step
        if ex.head.expect:  # the relay says whether the client waits for a 100 Continue
            continue_line = client.relay.continue_bytes(ex)
            if continue_line:
                client.write(continue_line)
        if conn is not None:
            conn.attach(ex, client, True)  # reused
            client.send_head(ex)
        else:
            self._open_or_wait(client, ex, pool)

    def new_pool(self, upstream: Upstream, route: AppRoute, group: str) -> ConnectionPool:
        """The connection pool to ``upstream`` (of ``route``'s ``group``), made anew: one to an older socket of the
        same worker id is dropped first."""
        self._drop_pool(upstream.worker_id)
        counters = self.forwards.worker(upstream.worker_id)
        concurrency = route.concurrency_of(group)
        pool = self._pools[upstream.worker_id] = ConnectionPool(upstream, counters, concurrency)
        pool.on_room = self._room_in
        counters.group = f"{route.tenant}/{route.app}/{group}"
        self.forwards.bound(counters, concurrency)
        return pool

    def pool_of(self, upstream: Upstream, route: AppRoute, group: str) -> ConnectionPool:
        """The pool to ``upstream``: its worker's, unless that one is to an older socket (a restart), then anew."""
        pool = self._pools.get(upstream.worker_id)
        if pool is None or pool.path != upstream.socket_path:
            pool = self.new_pool(upstream, route, group)
        return pool

    def _park(self, decision: Moving | Wake | NoRoom, target: Target | None, client: ClientConn, ex: Exchange,
              now: float) -> None:
        if isinstance(decision, Wake):
            name = _group_name(decision.key)
            assert target is not None
            if self.queue.admits(name, target, decision.key[2], client, ex):
                ex.advance(EVENT_PARK)
                ex.ts = now  # (its wait is counted from here; a forward sets ts anew)
                self.parked.park(PARKED_WAKE, name, client, ex, now)
            return
        ex.advance(EVENT_PARK)
        if isinstance(decision, Moving):
            self.parked.park(PARKED_MOVE, decision.user, client, ex, now)
        else:
            self.parked.park(PARKED_FULL, decision.key, client, ex, now, retry_after=decision.retry_after,
                             wait=decision.wait)

    def release(self, user: str) -> int:
        """A move of ``user`` ended: it is forwarded again, and its parked requests are dispatched, oldest first,
        to wherever it is now (its new worker, or its old one after an abort). Returns how many went."""
        self.surface.unflag(user)
        return self._dispatch_parked(self.parked.release(PARKED_MOVE, user), user)

    def woke(self, key: tuple[str, str, str]) -> int:
        """A worker of the group became routable: the requests waiting for one (a cold start, a restart) are
        dispatched, oldest first, and the group's queue gets the new worker's slots."""
        name = _group_name(key)
        woken = self.parked.release(PARKED_WAKE, name)
        if woken:
            stats, now = self.forwards.queue(name), self.clock()
            for _, ex in woken:
                stats.waited(now - ex.ts)
        went = self._dispatch_parked(woken, name)
        if self.parked.holds(PARKED_QUEUE, name):
            went += self.queue.drain(name)
        return went

    def wake_failed(self, key: tuple[str, str, str], why: str) -> int:
        """The group's worker did not come up (its start failed, or not within ``request_timeout``): each
        request waiting for it is answered 503 with a Retry-After."""
        name = _group_name(key)
        waited = self.parked.release(PARKED_WAKE, name)
        if waited:
            stats, now = self.forwards.queue(name), self.clock()
            for _, ex in waited:
                stats.waited(now - ex.ts)
                stats.refuse(QUEUE_NO_WORKER)
        return self.answer_parked(waited, name, 503, f"{key[0]}/{key[1]}: group {key[2]}: {why}", _WAKE_RETRY_AFTER)

    def answer_parked(self, parked: list[tuple[ClientConn, Exchange]], what: str, status: int, text: str,
                     retry_after: int) -> int:
        """Parked requests answered by the front (with ``status``), oldest first."""
        answered = 0
        for client, ex in parked:
            if client.transport is None or ex.phase is not PHASE_PARKED:
                continue  # the client left meanwhile
            try:
                ex.advance(EVENT_RELEASE)
                target = self.target(ex.head.host)
                if target is not None:
                    target.stats.answered(status)  # (answered now: a parked request was counted nowhere yet)
                client.refuse_released(ex, status, text, retry_after)
            except Exception as exc:  # a bug of ours with one request must not strand the others
                log.exception("front: answering a request waiting for %s failed", what)
                client.fail_closed(exc)
                continue
            answered += 1
        return answered

    def _dispatch_parked(self, parked: list[tuple[ClientConn, Exchange]], what: str) -> int:
        released = 0
        for client, ex in parked:
            if client.transport is None or ex.phase is not PHASE_PARKED:
                continue  # the client left meanwhile
            try:
                ex.advance(EVENT_RELEASE)
                client.released(ex)
            except Exception as exc:  # a bug of ours with one request must not strand the others
                log.exception("front: releasing a parked request of %s failed", what)
                client.fail_closed(exc)
                continue
            released += 1
        return released

    def retry(self, client: ClientConn, ex: Exchange) -> None:
        """Send ``ex`` once more (its relay allowed it, or it was never sent): its forward undone and the request
        decided again, so it goes to a worker that is routable now — its own again after a kept-alive connection
        closed while idle, another (or a wait for one coming) after its worker was found dead."""
        ex.retry(self.forwards)
        client.released(ex)

    def _open_or_wait(self, client: ClientConn, ex: Exchange, pool: ConnectionPool) -> None:
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
            self.connect(client, ex, pool)
        elif decision == WAIT:
            pool.wait(client, ex)
        else:
            if route is not None:
                self.forwards.upstream_refused(route.tenant, route.app, CONNECTIONS)
            self.tell_of_worker(ex.worker, "crowded", "%s %s: worker %s: its %d connections are busy and %d requests "
                                "wait already: refused", ex.method.decode(), ex.url.decode(errors="replace"),
                                ex.worker, pool.limit, waiting)
            self.relay_failed(client, ex, 503, f"worker {ex.worker} has {waiting} requests waiting already",
                              retry_after=_CROWDED_RETRY_AFTER)

    def tell_of_worker(self, worker: str | None, kind: str, message: str, *args: object) -> None:
        """A warning about what ``worker`` did, said when it was not said for that worker and kind within the
        last minute (``RefusalLog``), with the count of those left unsaid since."""
        saying = self.said.note(worker or "", kind, self.clock())
        if saying is None:
            return
        if saying.unsaid:
            message += f" ({saying.unsaid} more of worker {worker} not logged since, the last: {saying.previous})"
        log.warning(message, *args)

    def _room_in(self, pool: ConnectionPool) -> None:
        """A connection of ``pool`` closed or became a tunnel while requests wait: the first ones get new ones, as
        far as the bound allows."""
        if self._pools.get(pool.worker_id) is not pool:
            return  # a pool dropped meanwhile: its waiting requests were answered with it
        while pool.waiting and pool.open_conns + pool.connecting < pool.limit:
            found = pool.next_waiting()
            if found is None:
                return
            client, ex = found
            self.connect(cast(ClientConn, client), ex, pool)  # (the front's listener made every client side)

    def connect(self, client: ClientConn, ex: Exchange, pool: ConnectionPool) -> None:
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
            self.tell_of_worker(ex.worker, "connect", "%s %s: worker %s: cannot connect: %s", ex.method.decode(),
                                ex.url.decode(errors="replace"), ex.worker, error)
            self.worker_failed(pool.worker_id, pool.path)
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

    def relay_failed(self, client: ClientConn, ex: Exchange, status: int, text: str, close: bool = False,
                     retry_after: int | None = None) -> None:
        """A forwarded request failed before its answer started: the front answers it, in its turn."""
        label = f"{ex.route}: " if ex.route is not None else ""
        self.settle(ex, status, EVENT_FAIL)
        client.answer(ex, status, label + text, retry_after=retry_after, close=close)
        client.serve_next()

    def settle(self, ex: Exchange, status: int, event: Event) -> None:
        """A forwarded exchange ends (``Exchange.end``: its phase, counters and quota), and a login its answer
        carried is handed to the surface and the pool's placement."""
        now = self.clock()
        ex.end(event, status, now, self.forwards, self.surface)
        if ex.login is not None:
            self.logged_in(ex, now)

    def logged_in(self, ex: Exchange, now: float) -> None:
        """The answer to ``ex`` carried X-Elastic-Login: the surface learns it, the pool's placement may move the
        user (``ex`` has ended: called by ``settle``, or by the client side after its own ``Exchange.end``)."""
        login = ex.login
        if login is not None and ex.user is not None and ex.worker is not None:
            name = None if login == b"-" else login.decode("utf-8", "replace")
            before = self.surface.users.get(ex.user)
            placed = before is not None and before.login is not None  # logged in already: placed once
            self.surface.login(ex.user, name, ex.worker, now, ex.group, ex.route.label if ex.route else "")
            if name is not None and self.on_login is not None and ex.route is not None:
                self._placed_at_login(ex.route, ex.group or ex.route.group, ex.user, ex.worker, placed, now)

    def _placed_at_login(self, route: AppRoute, group: str, user: str, worker: str, placed: bool, now: float) -> None:
        """A login: the pool's placement may keep the user where it is or pass it to another worker (of its
        group)."""
        assert self.on_login is not None
        try:
            chosen = self.on_login((route.tenant, route.app, group), user, worker, placed)
        except Exception:  # a broken policy must not break the answer that carried the login
            log.exception("placement at login failed for %s", route)
            return
        if chosen is not None and chosen != worker:
            self.surface.assign(user, chosen, now)

    def worker_failed(self, worker_id: str | None, path: str) -> None:
        """Refused, vanished or dropped a request unanswered (on its socket ``path``): unroutable until that
        socket accepts again."""
        if worker_id is None or worker_id in self.unroutable:
            return
        pool = self._pools.get(worker_id)
        if pool is not None and pool.path != path:
            return  # an old socket's connection failed; the worker's current one is another pool's business
        self.unroutable.add(worker_id)
        self._drop_pool(worker_id)
        probing = serving.probe(path, partial(self._accepting, worker_id))
        self._probes[worker_id] = watch(asyncio.get_running_loop().create_task(probing), log,
                                        f"probing worker {worker_id}'s socket")

    def _accepting(self, worker_id: str) -> None:
        self.unroutable.discard(worker_id)
        self._probes.pop(worker_id, None)
        log.info("worker %s accepts connections again: routable", worker_id)
        counters = self.forwards.workers.get(worker_id)
        if counters is not None and counters.group:  # (requests that waited for it, or for any worker of its group)
            tenant, app, group = counters.group.split("/")
            self.woke((tenant, app, group))

