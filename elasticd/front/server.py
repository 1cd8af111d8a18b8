"""The front: one HTTP listener for every app — routes by Host, enforces tenant quotas, keeps users sticky,
clocks every forward, and relays bytes to the workers' Unix sockets.

The decisions are front.core's (dispatch, relay, exchange, routing, quota, sticky, counters, http1). The shell is
a few parts, each with one job, and ``Front`` is their composition: it makes them, hands each the books they share
(the forward counters, the surface, the quotas) and the parts it calls, and owns what is the whole front's — the
reloadable settings and one periodic tick for timeouts and expiry (no timer per request).

- ``listening.Listening``: the listener, the client connections, the stop (and a re-exec's hand-over of them);
- ``forwarding.Forwarding``: the request path — dispatch, the forward, an exchange's end;
- ``waiting.WaitingRequests``: requests that wait in the front (a move, a cold start, no room, the group queue);
- ``worker_links.WorkerLinks``: the connection pools to the workers, and opening connections;
- ``worker_health.WorkerHealth``: the workers found dead (probed until they accept again) or full.

A request walks client connection → ``Forwarding.dispatch`` → pool → (``WorkerLinks.open_or_wait`` → connect) →
``ClientConn.send_head``, part to part: none of it comes back here.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Final, cast

from elasticd.config.model import Address, Quotas
from elasticd.front import serving
from elasticd.front.core.bounds import MAX_HEAD_BYTES
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.quota import QuotaBook
from elasticd.front.core.routing import RouteTable
from elasticd.front.core.sticky import Surface
from elasticd.front.forwarding import Forwarding
from elasticd.front.listening import Listening
from elasticd.front.request_metrics import FrontCollector
from elasticd.front.upstream import Upstream
from elasticd.front.waiting import WaitingRequests
from elasticd.front.worker_health import WorkerHealth
from elasticd.front.worker_links import WorkerLinks

__all__ = ["Front", "WorkersFn"]

log = logging.getLogger("elasticd.front")

# (tenant, app, group) -> the upstreams routable right now, in the group's stable order (first: reception).
WorkersFn = Callable[[str, str, str], Sequence[Upstream]]

STALE_MARGIN: Final = 10.0  # seconds past request_timeout before a dead open-requests entry is swept


class Front:
    __slots__ = (
        "_next_expiry",
        "_timer",
        "_workers",
        "clock",
        "forwarding",
        "forwards",
        "health",
        "keepalive_timeout",
        "listening",
        "move_timeout",
        "quotas",
        "request_timeout",
        "stale_after",
        "surface",
        "tunnel_timeout",
        "waiting",
        "worker_links",
    )

    def __init__(self, address: Address, routes: RouteTable, workers: WorkersFn, *,
                 quotas: Mapping[str, Quotas] | None = None, request_timeout: float = 60.0,
                 user_ttl: float = 1800.0, clock: Callable[[], float] = time.monotonic,
                 max_header_bytes: int = MAX_HEAD_BYTES, keepalive_timeout: float = 75.0,
                 tunnel_timeout: float = 3600.0, move_timeout: float = 10.0) -> None:
        self._workers = workers
        self.clock = clock
        self.request_timeout = request_timeout  # connect, wait for the answer's head, any pause in a body
        self.keepalive_timeout = keepalive_timeout  # an idle client connection between requests
        self.tunnel_timeout = tunnel_timeout  # an idle upgraded (WebSocket) connection
        self.move_timeout = move_timeout  # a live move's hard deadline: no request is parked (much) longer
        # An open-requests entry idle past the request timeout (plus a margin for the tick) can only be a leak.
        self.stale_after = request_timeout + STALE_MARGIN
        self.quotas = QuotaBook(quotas or {}, clock())
        self.surface = Surface(user_ttl)
        self.forwards = ForwardCounters()
        # The parts, each made with the ones it calls; two calls go the other way, wired below.
        self.worker_links = WorkerLinks(self.forwards)
        self.health = WorkerHealth(self.worker_links, self.forwards, clock)
        self.waiting = WaitingRequests(workers, self.forwards, self.surface, self.health.unroutable,
                                       self.health.full, clock)
        self.forwarding = Forwarding(routes, workers, self.forwards, self.surface, self.quotas, clock,
                                     self.worker_links, self.health, self.waiting)
        self.listening = Listening(address, self.forwarding, clock, max_header_bytes)
        # A request the links cannot send, or a parked one answered, goes back to the request path; a worker
        # found alive again lets its group's waiting requests go.
        self.worker_links.forwarding = self.waiting.forwarding = self.forwarding
        self.health.on_alive = self.waiting.woke
        self._timer: asyncio.TimerHandle | None = None
        self._next_expiry = 0.0

    # ------------------------------------------------------------------ configuration (reload)

    @property
    def routes(self) -> RouteTable:
        return self.forwarding.routes

    def set_routes(self, routes: RouteTable) -> None:
        """Swap the table; requests already routed finish where they are (those waiting for a group at zero that
        the new table no longer has are decided again at the next tick: ``WaitingRequests.tick``)."""
        self.forwarding.set_routes(routes)
        self.forwards.retain_routes(routes.routes_app)

    def set_quotas(self, quotas: Mapping[str, Quotas]) -> None:
        """New limits apply to the next request; requests in flight stay counted."""
        self.quotas.update(quotas, self.clock())
        self.forwarding.forget_targets()
        self.forwards.retain_tenants(set(quotas))

    def configure(self, *, request_timeout: float, user_ttl: float, move_timeout: float = 10.0,
                  trusts: Callable[[tuple[str, int], tuple[str, int]], bool] | None = None,
                  keep_underscored: bool = False) -> None:
        """The reloadable settings (a connection made already keeps the trust it was given)."""
        self.listening.trusts = trusts
        self.listening.keep_underscored = keep_underscored
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
        return FrontCollector(self.forwards, lambda: list(self.quotas.tenants), self.waiting.queue.depths, groups)

    def groups(self) -> list[tuple[str, str, str]]:
        """Every routed group, as (tenant, app, group)."""
        return [(r.tenant, r.app, g) for r in self.routes.routes() for g in sorted(r.groups or {r.group})]

    def workers_of(self, tenant: str, app: str, group: str) -> Sequence[Upstream]:
        """The group's routable workers (the supervisor's view: those the front found dead are in
        ``health.unroutable``)."""
        return self._workers(tenant, app, group)

    # ------------------------------------------------------------------ life

    @property
    def port(self) -> int | None:
        return self.listening.port

    def start(self, sockets: Sequence[socket.socket] | None = None) -> Coroutine[Any, Any, None]:
        """Serve on the listening sockets (the daemon's ``listeners.Listeners`` holds them: bound, or the previous
        image's; none given: bound here) (awaitable)."""
        return self.listening.start(sockets, self._listening)

    def _listening(self) -> None:
        if self._timer is None:  # the first time (again after a re-exec that failed, it ticks already)
            self._timer = asyncio.get_running_loop().call_later(self._tick_interval(), self._tick)
            log.info("front listening on %s", Address(self.listening.address.host, self.port or 0))

    def close_after_answers(self) -> None:
        """A drained stop's first step (``Listening.close_after_answers``)."""
        self.listening.close_after_answers()

    def stop(self, grace: float = 10.0) -> Coroutine[Any, Any, None]:
        """Stop accepting; let answers under way finish (up to ``grace``); close every connection
        (awaitable)."""
        self.listening.stop()
        return serving.drain(self.listening.busy, grace, self._stopped)

    def _stopped(self) -> None:
        self.listening.abort()
        if self._timer is not None:
            self._timer.cancel()
        self.health.stop()
        self.worker_links.stop()

    # ------------------------------------------------------------------ the daemon's view of its workers and users

    def tunnels_by_worker(self) -> dict[str, int]:
        """Open WebSocket tunnels per worker (``Listening.tunnels_by_worker``: the pool's view of its workers)."""
        return self.listening.tunnels_by_worker()

    def tunnels_of(self, user: str) -> int:
        """The user's open WebSocket tunnels (``Listening.tunnels_of``: what a live move waits for)."""
        return self.listening.tunnels_of(user)

    def open_requests_of(self, user: str) -> int:
        """The user's requests in flight, from the open-requests dict (what a live move quiesces on)."""
        return len(self.forwards.open_of(user))

    def release(self, user: str) -> int:
        """A move of ``user`` ended (``WaitingRequests.release``)."""
        return self.waiting.release(user)

    def forget_worker(self, worker_id: str) -> None:
        """A worker gone for good (retired, removed): its forward counters end with it, and what was said of it."""
        self.close_upstream(worker_id)
        self.forwards.forget_worker(worker_id)
        self.health.said.forget(worker_id)

    def close_upstream(self, worker_id: str) -> None:
        """The worker is gone (the supervisor saw it exit): close its pooled connections, re-place its users
        at their next request, and forget it was unroutable (a restarted worker is the supervisor's to call
        routable again)."""
        self.worker_links.drop_pool(worker_id)
        self.surface.release(worker_id)
        self.health.clear(worker_id)

    # ------------------------------------------------------------------ the tick

    def _tick_interval(self) -> float:
        return max(0.01, min(1.0, self.request_timeout / 4, self.keepalive_timeout / 4))

    def _tick(self) -> None:
        try:
            now = self.clock()
            if self.waiting.parked:  # (first: a parked request is answered before its connection's idle limit)
                self.waiting.tick(now, self.request_timeout, self.move_timeout)
            self.listening.time_out(now, self.keepalive_timeout, self.request_timeout, self.tunnel_timeout)
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
