"""The library for Python apps run by elasticd: the occupancy sensor and its channel (seed 000, MEASURE), and
per-user state that a live move carries to another worker.

    from elasticd.worker import setup, user_state
    app = web.Application()
    setup(app, concurrency=8)   # middleware + channel client + loop heartbeat, started and stopped with the app
    ...
    user_state(request)["cart"] = cart    # this user's own dict: moved with the user (worker/user_state.py)

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
from elasticd.worker.moves import MoveHandler
from elasticd.worker.sensor import Sensor
from elasticd.worker.user_state import UserStates

__all__ = ["SENSOR_KEY", "STATES_KEY", "USER_HEADER", "ChannelClient", "Heartbeat", "Sensor", "UserStates",
           "on_move", "sensor_middleware", "setup", "system_route", "user_state"]

# Where setup() leaves the app's sensor and user states: AppKeys on aiohttp >= 3.9 (a plain string key warns
# there), strings on Debian bookworm's 3.8, which has no AppKey.
SENSOR_KEY: Any = web.AppKey("elastic_sensor", Sensor) if hasattr(web, "AppKey") else "elastic_sensor"
STATES_KEY: Any = web.AppKey("elastic_user_states", UserStates) if hasattr(web, "AppKey") else "elastic_user_states"


def user_state(request: web.Request) -> dict[str, Any]:
    """The dict of the user this request is for (``X-Elastic-User-Id``, set by elasticd's front), which a live
    move carries to the user's next worker. Needs ``setup(app)``; a request that came around the front (no
    user header) has no user: LookupError."""
    user = request.headers.get(USER_HEADER)
    if not user:
        raise LookupError(f"the request has no {USER_HEADER} header: it did not come through elasticd's front")
    states: UserStates = request.app[STATES_KEY]
    return states.of(user)


def on_move(app: web.Application, *, snapshot: Any, install: Any) -> None:
    """Add state the app keeps elsewhere to each user's package: ``snapshot(user)`` returns a picklable object
    (called on the user's old worker), ``install(user, obj)`` takes it (on the new one). Both run in the
    library's move thread while no request of that user runs."""
    states: UserStates = app[STATES_KEY]
    states.hooks(snapshot, install)


def setup(app: web.Application, concurrency: int | None = None) -> Sensor:
    total = concurrency or int(os.environ.get("ELASTIC_CONCURRENCY", "8"))
    interval = float(os.environ.get("ELASTIC_OCCUPANCY_INTERVAL", "5"))
    sensor = Sensor(total, window=interval)
    app.middlewares.append(sensor_middleware(sensor))
    states = UserStates()
    client = ChannelClient(sensor.report, interval=interval, moves=MoveHandler(states))
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
    app[STATES_KEY] = states
    return sensor
