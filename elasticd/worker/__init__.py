"""The library for Python apps run by elasticd: the occupancy sensor and its channel (seed 000, MEASURE).

    from elasticd.worker import setup
    app = web.Application()
    setup(app, concurrency=8)   # middleware + channel client + loop heartbeat, started and stopped with the app

The channel client reports from a thread of its own, so a handler that holds the event loop cannot silence the
sensor; the heartbeat on the app's loop puts the loop's lag in each report, so elasticd tells a loop that is
busy (CPU advancing) from one that is wedged (deadlocked while idle).

A worker that does not use it is sensed by elasticd itself (process-tree cpu and rss, open requests).
"""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from elasticd.worker.channel import ChannelClient
from elasticd.worker.heartbeat import Heartbeat, heartbeat_period
from elasticd.worker.middleware import USER_HEADER, sensor_middleware, system_route
from elasticd.worker.sensor import Sensor

__all__ = ["SENSOR_KEY", "USER_HEADER", "ChannelClient", "Heartbeat", "Sensor", "sensor_middleware", "setup",
           "system_route"]

# Where setup() leaves the app's sensor: an AppKey on aiohttp >= 3.9 (a plain string key warns there), the
# string on Debian bookworm's 3.8, which has no AppKey.
SENSOR_KEY: Any = web.AppKey("elastic_sensor", Sensor) if hasattr(web, "AppKey") else "elastic_sensor"


def setup(app: web.Application, concurrency: int | None = None) -> Sensor:
    total = concurrency or int(os.environ.get("ELASTIC_CONCURRENCY", "8"))
    interval = float(os.environ.get("ELASTIC_OCCUPANCY_INTERVAL", "5"))
    sensor = Sensor(total, window=interval)
    app.middlewares.append(sensor_middleware(sensor))
    client = ChannelClient(sensor.report, interval=interval)
    heartbeat = Heartbeat(sensor, heartbeat_period(interval))

    async def start(_app: web.Application) -> None:
        if client.configured:  # no channel, no report: a heartbeat would beat for nobody
            heartbeat.start()  # before the client, so the first report has a lag
        client.start()

    async def stop(_app: web.Application) -> None:
        client.stop()  # the join is prompt: stop() wakes the thread from any wait
        heartbeat.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app[SENSOR_KEY] = sensor
    return sensor
