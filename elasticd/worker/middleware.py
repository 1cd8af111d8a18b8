"""An aiohttp middleware that feeds the sensor: the executor's busy count and each user's activity.

Routes marked with ``@system_route`` (health checks, monitors) never count as a user's activity.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from elasticd.worker.sensor import Sensor

__all__ = ["USER_HEADER", "sensor_middleware", "system_route"]

USER_HEADER = "X-Elastic-User-Id"
_SYSTEM = "__elastic_system_route__"

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
        try:
            return await handler(request)
        finally:
            sensor.request_finished()

    return middleware
