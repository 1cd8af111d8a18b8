"""The event loop's heartbeat: a ``call_later`` chain on the app's loop that stamps ``Sensor.beat``.

The channel reports from a thread of its own, so a report arrives even while a handler holds the loop. On its
own that hides a wedged loop (deadlocked while idle) as well as it shows a busy one; the heartbeat is what tells
them apart: the report's ``loop_lag`` grows only while the loop runs no callback, and the daemon reads it
together with the CPU the worker burns (busy: CPU advancing; wedged: none).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from elasticd.worker.sensor import Sensor

__all__ = ["Heartbeat", "heartbeat_period"]


def heartbeat_period(interval: float) -> float:
    """A quarter of the report interval, at most 0.25 s: ``loop_lag`` stays well under an interval."""
    return min(interval / 4, 0.25)


class Heartbeat:
    __slots__ = ("_clock", "_handle", "_loop", "period", "sensor")

    def __init__(self, sensor: Sensor, period: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.sensor = sensor
        self.period = period
        self._clock = clock
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    @property
    def running(self) -> bool:
        return self._loop is not None

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Beat now, then every ``period`` on ``loop`` (the running loop by default). Idempotent."""
        if self._loop is None:
            self._loop = loop or asyncio.get_running_loop()
            self._beat()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._loop = None

    def _beat(self) -> None:
        if self._loop is None:
            return
        self.sensor.beat(self._clock())
        self._handle = self._loop.call_later(self.period, self._beat)
