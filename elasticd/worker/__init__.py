"""The library for Python apps run by elasticd: the occupancy sensor and its channel (seed 000, MEASURE), and
per-user state that a live move carries to another worker.

    from elasticd.worker import setup, user_state, run_sync, sensor
    app = web.Application()
    setup(app, concurrency=8)   # middleware + channel client + loop heartbeat, started and stopped with the app
    ...
    user_state(request)["cart"] = cart    # this user's own dict: moved with the user (worker/user_state.py)
    rows = await run_sync(request, query, sql)   # blocking work in the worker's executor: its queue is measured
    sensor(request.app).pages(user, 2)           # what the app alone knows: a user's open pages, its backlog

The channel client reports from a thread of its own, so a handler that holds the event loop cannot silence the
sensor; the heartbeat on the app's loop puts the loop's lag in each report, so elasticd tells a loop that is
busy (CPU advancing) from one that is wedged (deadlocked while idle).

A worker that does not use it is sensed by elasticd itself (process-tree cpu and rss, open requests).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from typing import Any, TypeVar

from aiohttp import web

from elasticd.worker.channel import ChannelClient
from elasticd.worker.executor import WorkerExecutor
from elasticd.worker.heartbeat import Heartbeat, heartbeat_period
from elasticd.worker.middleware import USER_HEADER, sensor_middleware, stream_watch, system_route
from elasticd.worker.moves import MoveHandler
from elasticd.worker.sensor import Sensor
from elasticd.worker.user_state import UserStates

__all__ = ["EXECUTOR_KEY", "SENSOR_KEY", "STATES_KEY", "USER_HEADER", "ChannelClient", "Heartbeat", "Sensor",
           "UserStates", "WorkerExecutor", "executor", "on_move", "run_sync", "sensor", "sensor_middleware", "setup",
           "system_route", "user_state"]

T = TypeVar("T")

# Where setup() leaves the app's sensor and user states: AppKeys on aiohttp >= 3.9 (a plain string key warns
# there), strings on Debian bookworm's 3.8, which has no AppKey.
SENSOR_KEY: Any = web.AppKey("elastic_sensor", Sensor) if hasattr(web, "AppKey") else "elastic_sensor"
STATES_KEY: Any = web.AppKey("elastic_user_states", UserStates) if hasattr(web, "AppKey") else "elastic_user_states"
EXECUTOR_KEY: Any = web.AppKey("elastic_executor", WorkerExecutor) if hasattr(web, "AppKey") else "elastic_executor"


def sensor(app: web.Application) -> Sensor:
    """The app's sensor (``setup``): where the app reports what only it knows, ``pages(user, n)`` and
    ``backlog(n)``."""
    found: Sensor = app[SENSOR_KEY]
    return found


def executor(app: web.Application) -> WorkerExecutor:
    """The app's executor (``setup``): ``concurrency`` threads whose waiting calls are the report's
    ``queue_depth``."""
    found: WorkerExecutor = app[EXECUTOR_KEY]
    return found


async def run_sync(request: web.Request, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the worker's executor, awaited (the event loop serves others meanwhile)."""
    call = functools.partial(fn, *args, **kwargs)
    pool: WorkerExecutor = request.config_dict[EXECUTOR_KEY]  # (config_dict: a sub-application's too)
    return await asyncio.get_running_loop().run_in_executor(pool, call)


def user_state(request: web.Request) -> dict[str, Any]:
    """The dict of the user this request is for (``X-Elastic-User-Id``, set by elasticd's front), which a live
    move carries to the user's next worker. Needs ``setup(app)``; a request that came around the front (no
    user header) has no user: LookupError."""
    user = request.headers.get(USER_HEADER)
    if not user:
        raise LookupError(f"the request has no {USER_HEADER} header: it did not come through elasticd's front")
    states: UserStates = request.config_dict[STATES_KEY]  # (config_dict: a sub-application's too)
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
    made = Sensor(total, window=interval)
    app.middlewares.append(sensor_middleware(made))
    app.on_response_prepare.append(stream_watch(made))
    pool = made.executor = WorkerExecutor(total)
    states = UserStates()
    client = ChannelClient(made.report, interval=interval, moves=MoveHandler(states, on_forget=made.forget),
                           register=made.register)
    heartbeat = Heartbeat(made, heartbeat_period(interval))

    async def start(_app: web.Application) -> None:
        if client.configured:  # no channel, no report: a heartbeat would beat for nobody
            heartbeat.start()  # before the client, so the first report has a lag
        client.start()

    async def stop(_app: web.Application) -> None:
        client.stop()  # the join is prompt: stop() wakes the thread from any wait
        heartbeat.stop()
        pool.shutdown(wait=False, cancel_futures=True)  # a call still running finishes in its thread

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app[SENSOR_KEY] = made
    app[STATES_KEY] = states
    app[EXECUTOR_KEY] = pool
    return made
