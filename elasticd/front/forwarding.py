"""The request path: a request read whole on a client connection is decided (``core.dispatch.decide``) and carried
out here — refused, handed to the waiting part, or forwarded on a pooled connection to its worker (a new one
opened by the worker links when none is idle) — and an exchange's end is settled here: its counters, its quota slot,
and a login its answer carried.

Every request comes through ``dispatch``, so it walks part to part without coming back through the ``Front``: the
parts and books it reads (the pools, the unroutable and full workers, the surface, the counters) are bound on this
object once, at the front's making, and are changed in place, never replaced. The client connection calls this
part directly (it is its ``FrontSide``), and so do the parts that hand a request back to it (``retry``,
``relay_failed``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Final

from elasticd.front.client import ClientConn
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.dispatch import Moving, NoRoom, Queued, Refuse, Target, Wake, decide
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.quota import QuotaBook
from elasticd.front.core.relay import EVENT_FAIL, EVENT_REFUSE, Event
from elasticd.front.core.routing import AppRoute, RouteTable
from elasticd.front.core.sticky import PlaceFn, Surface, place
from elasticd.front.links import FrontSide
from elasticd.front.upstream import ConnectionPool, Upstream
from elasticd.front.waiting import WaitingRequests
from elasticd.front.worker_health import WorkerHealth
from elasticd.front.worker_links import WorkerLinks

__all__ = ["Forwarding"]

log = logging.getLogger("elasticd.front")

_MISS: Final = object()
_MAX_HOSTS: Final = 1024  # Host header values remembered with their route (a flood of odd names only resets it)
# What dispatch.decide answers but a forward; Queued first: at the group's concurrency every request is one once,
# and isinstance() of a tuple stops at the first exact type.
_ANSWERED_HERE: Final = (Queued, Refuse, Moving, Wake, NoRoom)


class Forwarding(FrontSide):
    __slots__ = ("_full", "_pools", "_quotas", "_targets", "_unroutable", "_workers", "clock", "forwards", "health",
                 "kept", "on_backoff", "on_login", "place", "routes", "surface", "waiting", "wake", "worker_links")

    def __init__(self, routes: RouteTable, workers: Callable[[str, str, str], Sequence[Upstream]],
                 forwards: ForwardCounters, surface: Surface, quotas: QuotaBook, clock: Callable[[], float],
                 worker_links: WorkerLinks, health: WorkerHealth, waiting: WaitingRequests) -> None:
        self.routes = routes
        self._workers = workers
        self.forwards = forwards
        self.surface = surface
        self._quotas = quotas
        self.clock = clock
        self.worker_links = worker_links
        self.health = health
        self.waiting = waiting
        # What dispatch reads at every request, bound here once (each is changed in place by its owner).
        self._pools: dict[str, ConnectionPool] = worker_links.pools
        self._unroutable: set[str] = health.unroutable
        self._full: dict[str, tuple[float, int, float]] = health.full
        self._targets: dict[bytes | None, Target | None] = {}
        self.place: PlaceFn = place  # where a new (or re-placed) user goes: the reception
        # Asked when a request's group has no routable worker: True when one is starting (the pool's cold
        # start); None: such a request is answered 503 at once.
        self.wake: Callable[[tuple[str, str, str]], bool] | None = None
        # A worker being emptied by live moves, by id, while it still serves its pinned users (the daemon's;
        # None: no worker is ever kept out of the routable list with users on it).
        self.kept: Callable[[str], Upstream | None] | None = None
        # At a login (X-Elastic-Login: <name>): (group key, user, the worker that logged it in, whether it was
        # logged in already) → the worker the user lives on from now on, or None to leave it where it is. The
        # pool's reception-first keep/pass policy plugs in here.
        self.on_login: Callable[[tuple[str, str, str], str, str, bool], str | None] | None = None
        # A 429 answer: (the worker or node, its Retry-After value, b"" for none, the instant) → the back-off
        # it means, if any (the probes' shell decides whose 429 is one).
        self.on_backoff: Callable[[str, bytes, float], None] | None = None

    # ------------------------------------------------------------------ routes (the front's reload)

    def set_routes(self, routes: RouteTable) -> None:
        self.routes = routes
        self._targets.clear()

    def forget_targets(self) -> None:
        """The cached targets hold their tenant's quota: made again at the next request after new quotas."""
        self._targets.clear()

    def target(self, host: bytes | None) -> Target | None:
        found = self._targets.get(host, _MISS)
        if found is not _MISS:
            return found  # type: ignore[return-value]
        route = self.routes.lookup(host.decode("latin-1") if host is not None else None)
        target = None if route is None else Target(route, self.forwards.route(route.tenant, route.app),
                                                   self._quotas.get(route.tenant))
        if len(self._targets) >= _MAX_HOSTS:
            self._targets.clear()
        self._targets[host] = target
        return target

    # ------------------------------------------------------------------ a request, from its client connection

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
        decision = decide(target, ex.head, now, self._workers, self._unroutable, self.surface, self.place,
                          self.forwards, self.kept, self.wake, self._full, self.forwards.saturated)
        if isinstance(decision, _ANSWERED_HERE):  # (one C call for a forward, the common case)
            if isinstance(decision, Refuse):
                self._refuse(client, ex, decision.status, decision.text, retry_after=decision.retry_after)
            else:
                self.waiting.hold(decision, target, client, ex, now)
            return
        assert target is not None
        upstream, ex.user, ex.entry, ex.cookie_line, ex.quota, ex.group = decision
        ex.route = target.route
        ex.stats = target.stats
        ex.ts = now
        ex.worker = upstream.worker_id
        pool = self._pools.get(upstream.worker_id)  # WorkerLinks.pool_of(), its common case inlined
        if pool is None or pool.path != upstream.socket_path:
            pool = self.worker_links.new_pool(upstream, target.route, ex.group)
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
            self.worker_links.open_or_wait(client, ex, pool)

    def _refuse(self, client: ClientConn, ex: Exchange, status: int, text: str, retry_after: int | None = None,
                close: bool = False) -> None:
        ex.advance(EVENT_REFUSE)
        client.answer(ex, status, text, retry_after=retry_after, close=close)

    def retry(self, client: ClientConn, ex: Exchange) -> None:
        """Send ``ex`` once more (its relay allowed it, or it was never sent): its forward undone and the request
        decided again, so it goes to a worker that is routable now — its own again after a kept-alive connection
        closed while idle, another (or a wait for one coming) after its worker was found dead."""
        ex.retry(self.forwards)
        client.released(ex)

    def relay_failed(self, client: ClientConn, ex: Exchange, status: int, text: str, close: bool = False,
                     retry_after: int | None = None) -> None:
        """A forwarded request failed before its answer started: the front answers it, in its turn."""
        label = f"{ex.route}: " if ex.route is not None else ""
        self.settle(ex, status, EVENT_FAIL)
        client.answer(ex, status, label + text, retry_after=retry_after, close=close)
        client.serve_next()

    # (the worker's health is its own part's; the client connection and the worker links tell it through here)

    def worker_failed(self, worker_id: str | None, path: str) -> None:
        self.health.worker_failed(worker_id, path)

    def tell_of_worker(self, worker: str | None, kind: str, message: str, *args: object) -> None:
        self.health.tell_of_worker(worker, kind, message, *args)

    # ------------------------------------------------------------------ an exchange's end

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

    def backed_off(self, ex: Exchange) -> None:
        """The answer to ``ex`` was a 429: the probes' shell may read its Retry-After as a back-off."""
        if self.on_backoff is not None and ex.worker is not None and ex.backoff is not None:
            try:
                self.on_backoff(ex.worker, ex.backoff, self.clock())
            except Exception:  # the answer went out already; a broken hook must not break the connection
                log.exception("front: reading a 429's back-off failed")
