"""MEASURE: the worker side of the elastic pool. A sensor reads raw quantities and passes no judgement.

``Sensor`` keeps the registers a report is built from (users seen, their last activity, the executor's busy
count) and builds the fixed-shape report of seed 000 each tick. Time is passed in, so it is tested as a table.

The report is built on the channel's own thread while the event loop's thread feeds the registers, so the
user register is guarded by a lock. ``beat`` is the event loop's heartbeat (see ``heartbeat``): the report's
``loop_lag`` is how long ago the loop last ran a callback, which tells a loop busy running a handler (CPU
advancing, lag growing only while the handler holds it) from one wedged while idle (no CPU, lag growing).
"""

from __future__ import annotations

import os
import resource
import threading
from typing import Any

__all__ = ["Sensor", "read_rss"]


def read_rss(status_path: str = "/proc/self/status") -> int | None:
    """VmRSS in bytes, or None where /proc is absent."""
    try:
        with open(status_path, encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Sensor:
    __slots__ = ("_beat", "_last_cpu", "_last_tick", "_lock", "_seen", "busy", "connections", "pages",
                 "queue_depth", "total", "window")

    def __init__(self, total: int, window: float = 5.0) -> None:
        self.total = max(int(total), 1)  # the executor's capacity: requests this worker serves at once
        self.window = window  # "active" = a non-system request within this many seconds
        self.busy = 0
        self.queue_depth = 0
        self.connections = 0
        self.pages = 0
        self._seen: dict[str, float] = {}  # user → last activity (monotonic)
        self._last_cpu: float | None = None
        self._last_tick: float | None = None
        self._beat: float | None = None  # the event loop's last heartbeat (monotonic); None: no heartbeat runs
        self._lock = threading.Lock()  # the loop's thread touches, the channel's thread reports

    # ------------------------------------------------------------------ registers

    def touch(self, user: str | None, now: float) -> None:
        if user:
            with self._lock:
                self._seen[user] = now

    def forget(self, user: str) -> None:
        with self._lock:
            self._seen.pop(user, None)

    def beat(self, now: float) -> None:
        """The event loop is alive at ``now``: called from the loop by the heartbeat."""
        self._beat = now

    def request_started(self) -> None:
        self.busy += 1

    def request_finished(self) -> None:
        self.busy = max(self.busy - 1, 0)

    # ------------------------------------------------------------------ the report

    def report(self, now: float, cpu_seconds: float | None = None, rss: int | None = None,
               load: float | None = None) -> dict[str, Any]:
        """The fixed shape. ``cpu`` is the CPU-time delta over the wall-time delta since the last report
        (None on the first: there is no delta yet). ``loop_lag`` is the seconds since the event loop's last
        heartbeat (None when no heartbeat was ever started)."""
        cpu_now = _cpu_seconds() if cpu_seconds is None else cpu_seconds
        beat = self._beat
        loop_lag = None if beat is None else round(max(now - beat, 0.0), 3)
        with self._lock:
            cpu = None
            if self._last_cpu is not None and self._last_tick is not None and now > self._last_tick:
                cpu = max(cpu_now - self._last_cpu, 0.0) / (now - self._last_tick)
            self._last_cpu, self._last_tick = cpu_now, now
            # Users idle for ten windows are dropped from the register (the front forgets them on its own TTL).
            horizon = now - 10 * self.window
            for user in [u for u, ts in self._seen.items() if ts < horizon]:
                del self._seen[user]
            users = len(self._seen)
            active = sum(1 for ts in self._seen.values() if ts >= now - self.window)
        return {
            "users": users,
            "pages": self.pages,
            "connections": self.connections,
            "active_users": active,
            "executor": {"busy": self.busy, "total": self.total, "queue_depth": self.queue_depth},
            "cpu": cpu,
            "rss": read_rss() if rss is None else rss,
            "backlog": 0,
            "load": os.getloadavg()[0] if load is None else load,
            "loop_lag": loop_lag,
        }
