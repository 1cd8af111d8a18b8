"""The front: one HTTP listener for every app, routing each request by its Host header to a worker.

A thin shell: the route table and round robin decide, ``workers`` (the supervisor's view) says who is
routable right now, and the relay moves the bytes. Errors it answers itself are short text naming the app.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import hdrs, web, web_server

from elasticd.config import Address
from elasticd.front.relay import Relay, Upstream, UpstreamError, UpstreamTimeout
from elasticd.front.routing import RoundRobin, RouteTable

__all__ = ["Front", "WorkersFn"]

log = logging.getLogger("elasticd.front")

# (tenant, app, group) -> the upstreams routable right now, in a stable order.
WorkersFn = Callable[[str, str, str], Sequence[Upstream]]

# aiohttp 3.9 moved the shutdown grace from the site to the runner (and warns when a site is given one),
# and added handler_cancellation, which 3.8 always does. Bookworm ships 3.8, so ask rather than assume.
_GRACE_ON_RUNNER = "shutdown_timeout" in inspect.signature(web.BaseRunner.__init__).parameters
_HAS_CANCELLATION = "handler_cancellation" in inspect.signature(web_server.Server.__init__).parameters


def _text(status: int, text: str, **headers: str) -> web.Response:
    return web.Response(status=status, text=text + "\n", headers=headers)


class Front:
    __slots__ = ("_address", "_grace", "_relay", "_routes", "_rr", "_runner", "_workers",
                 "on_upstream_failure", "port")

    def __init__(self, address: Address, routes: RouteTable, workers: WorkersFn, relay: Relay,
                 *, grace: float = 10.0) -> None:
        self._address = address
        self._routes = routes
        self._workers = workers
        self._relay = relay
        self._grace = grace  # how long stop() lets requests in flight finish
        self._rr = RoundRobin()
        self._runner: web.AppRunner | None = None
        # Called with a worker id when its socket refused or dropped a request (the supervisor may check it).
        self.on_upstream_failure: Callable[[str], object] | None = None
        self.port: int | None = None  # the bound port once started (useful with port 0)

    def set_routes(self, routes: RouteTable) -> None:
        """Swap the table on reload; requests already routed finish where they are."""
        self._routes = routes
        self._rr.retain({route.key for route in routes.routes()})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # No access log: one line per request on the hot path; metrics count requests instead.
        runner_options: dict[str, Any] = {"access_log": None}
        site_options: dict[str, Any] = {}
        if _GRACE_ON_RUNNER:
            runner_options["shutdown_timeout"] = self._grace
        else:
            site_options["shutdown_timeout"] = self._grace
        if _HAS_CANCELLATION:
            # A client that hangs up should free its worker at once, as on 3.8 (and as nginx does).
            runner_options["handler_cancellation"] = True
        runner = web.AppRunner(app, **runner_options)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._address.host, self._address.port, **site_options)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        log.info("front listening on %s", Address(self._address.host, self.port))

    async def stop(self) -> None:
        """Stop accepting, let requests in flight finish (up to the grace), then close worker connections."""
        runner, self._runner = self._runner, None
        try:
            if runner is not None:
                await runner.cleanup()
        finally:
            await self._relay.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        # The Host header itself: aiohttp's request.host falls back to this machine's name, a wrong answer.
        host = request.headers.get(hdrs.HOST)
        route = self._routes.lookup(host)
        if route is None:
            return _text(404, f"no app for host {host or '(none)'}")
        upstreams = self._workers(route.tenant, route.app, route.group)
        if not upstreams:
            return _text(503, f"{route}: no worker available", **{hdrs.RETRY_AFTER: "1"})
        upstream = self._rr.pick(route.key, upstreams)
        try:
            return await self._relay.forward(request, upstream)
        except UpstreamTimeout as exc:
            log.warning("%s %s %s: %s", route, request.method, request.path, exc)
            return _text(504, f"{route}: the worker did not answer in time")
        except UpstreamError as exc:
            log.warning("%s %s %s: %s", route, request.method, request.path, exc)
            self._report_failure(upstream.worker_id)
            return _text(502, f"{route}: the worker could not be reached")

    def _report_failure(self, worker_id: str) -> None:
        if self.on_upstream_failure is None:
            return
        try:
            self.on_upstream_failure(worker_id)
        except Exception:  # a broken hook must not turn a 502 into a 500
            log.exception("on_upstream_failure(%s) failed", worker_id)
