"""An aiohttp middleware that feeds the sensor: the executor's busy count, each user's activity, and the
connections open (responses streaming, WebSockets).

A response that is prepared — its head sent — while its handler still runs is a stream: a WebSocket, a
``StreamResponse`` the handler writes to, server-sent events. aiohttp prepares a plain ``Response`` only
after the handler returned, so the app's ``on_response_prepare`` signal, seen while the middleware still
waits for the handler, tells the two apart with no guess about types. The stream counts as one open
connection (the sensor's ``connections``, and its user's) until its handler returns.

Routes marked with ``@system_route`` (health checks, monitors) never count as a user's activity.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from elasticd.worker.sensor import Sensor

__all__ = ["USER_HEADER", "sensor_middleware", "stream_watch", "system_route"]

USER_HEADER = "X-Elastic-User-Id"
_SYSTEM = "__elastic_system_route__"
# Request keys (a Request is a mapping for exactly this): RequestKeys where aiohttp has them (a plain string warns
# there), strings on Debian bookworm's 3.8.
# One mutable holder per request, [in its handler, streaming]: a request an inner middleware clones
# (request.clone(), as aiohttp-remotes does) shares its state's values with the original, so the flag the
# response's prepare sets on the clone is the one this middleware reads.
_WATCH: Any = web.RequestKey("elastic_watch", list) if hasattr(web, "RequestKey") else "elastic_watch"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def system_route(handler: Handler) -> Handler:
    setattr(handler, _SYSTEM, True)
    return handler


def sensor_middleware(sensor: Sensor, clock: Callable[[], float] = time.monotonic) -> Any:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        target = getattr(request.match_info, "handler", handler)
        if not getattr(target, _SYSTEM, False):
            sensor.touch(request.headers.get(USER_HEADER), clock())
        sensor.request_started()
        watch = request[_WATCH] = [True, False]
        try:
            return await handler(request)
        finally:
            watch[0] = False
            sensor.request_finished()
            if watch[1]:
                sensor.stream_closed(request.headers.get(USER_HEADER), clock())

    return middleware


def stream_watch(sensor: Sensor, clock: Callable[[], float] = time.monotonic) -> Any:
    """The ``on_response_prepare`` handler that counts a stream opened (see the module's note)."""

    async def on_prepare(request: web.Request, response: web.StreamResponse) -> None:
        watch = request.get(_WATCH)
        if watch is not None and watch[0] and not watch[1]:
            watch[1] = True
            sensor.stream_opened(request.headers.get(USER_HEADER), clock())

    return on_prepare
