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
import time
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


class _Visitor:
    """One user in the worker's register: its last activity, its open streams, the pages the app says it has."""

    __slots__ = ("connections", "pages", "seen")

    def __init__(self, seen: float) -> None:
        self.seen = seen
        self.connections = 0
        self.pages: int | None = None


class Sensor:
    """The worker's registers and its report.

    Measured by the library itself: ``busy`` (requests in a handler), ``connections`` (responses streaming or
    WebSockets open: prepared while their handler still runs, see ``middleware``), each user's last activity;
    ``queue_depth`` once the app uses the library's executor (``executor.WorkerExecutor``). Reported by the app
    through this API, else left out of the report (a field that is always 0 is not a reading): ``pages(user,
    n)``, the pages a user has open (what a page is, the app knows: GenroPy's page instances, open documents),
    and ``backlog(n)``, work the app has queued of its own.
    """

    __slots__ = ("_backlog", "_beat", "_last_cpu", "_last_tick", "_lock", "_pages_reported", "_users", "busy",
                 "connections", "executor", "total", "window")

    def __init__(self, total: int, window: float = 5.0) -> None:
        self.total = max(int(total), 1)  # the executor's capacity: requests this worker serves at once
        self.window = window  # "active" = a non-system request within this many seconds
        self.busy = 0
        self.connections = 0
        self.executor: Any = None  # a WorkerExecutor (its ``waiting`` and ``used``), once setup() made one
        self._backlog: int | None = None
        self._pages_reported = False
        self._users: dict[str, _Visitor] = {}  # user → its register entry
        self._last_cpu: float | None = None
        self._last_tick: float | None = None
        self._beat: float | None = None  # the event loop's last heartbeat (monotonic); None: no heartbeat runs
        self._lock = threading.Lock()  # the loop's thread touches, the channel's thread reports

    # ------------------------------------------------------------------ registers

    def touch(self, user: str | None, now: float) -> None:
        if user:
            with self._lock:
                visitor = self._users.get(user)
                if visitor is None:
                    self._users[user] = _Visitor(now)
                else:
                    visitor.seen = now

    def forget(self, user: str) -> None:
        with self._lock:
            self._users.pop(user, None)

    def beat(self, now: float) -> None:
        """The event loop is alive at ``now``: called from the loop by the heartbeat."""
        self._beat = now

    def request_started(self) -> None:
        self.busy += 1

    def request_finished(self) -> None:
        self.busy = max(self.busy - 1, 0)

    def stream_opened(self, user: str | None, now: float) -> None:
        """A response began streaming (or a WebSocket opened) while its handler runs on: an open connection."""
        with self._lock:
            self.connections += 1
            if user:
                visitor = self._users.get(user)
                if visitor is None:
                    visitor = self._users[user] = _Visitor(now)
                visitor.connections += 1

    def stream_closed(self, user: str | None, now: float) -> None:
        with self._lock:
            self.connections = max(self.connections - 1, 0)
            visitor = self._users.get(user) if user else None
            if visitor is not None:
                visitor.connections = max(visitor.connections - 1, 0)
                visitor.seen = now  # a stream that just ended was activity until now

    # ------------------------------------------------------------------ what the app reports

    def pages(self, user: str, count: int) -> None:
        """The app says ``user`` has ``count`` pages open (0 when it closed its last). From then on, the report
        carries ``pages`` (their sum over the users) and the population each user's."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"pages: {count!r} is not a count (a whole number >= 0)")
        with self._lock:
            visitor = self._users.get(user)
            if visitor is None:
                visitor = self._users[user] = _Visitor(time.monotonic())
            visitor.pages = count
            self._pages_reported = True

    def backlog(self, count: int) -> None:
        """The app says it has ``count`` units of work queued of its own (a job queue, pending emails): the
        report carries it as ``backlog`` from then on."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ValueError(f"backlog: {count!r} is not a count (a whole number >= 0)")
        self._backlog = count

    # ------------------------------------------------------------------ the report and the register

    def _sweep(self, now: float) -> None:
        # Users idle for ten windows are dropped from the register (the front forgets them on its own TTL);
        # one with a stream still open is not idle, and one the app says has pages open (a page left in a
        # background tab) is kept until the app says 0. (Called under the lock.)
        horizon = now - 10 * self.window
        for user in [u for u, v in self._users.items() if v.seen < horizon and not v.connections and not v.pages]:
            del self._users[user]

    def report(self, now: float, cpu_seconds: float | None = None, rss: int | None = None,
               load: float | None = None) -> dict[str, Any]:
        """The fixed shape. ``cpu`` is the CPU-time delta over the wall-time delta since the last report
        (None on the first: there is no delta yet). ``loop_lag`` is the seconds since the event loop's last
        heartbeat (None when no heartbeat was ever started). ``pages``, ``backlog`` and the executor's
        ``queue_depth`` are there only once something measures them."""
        cpu_now = _cpu_seconds() if cpu_seconds is None else cpu_seconds
        beat = self._beat
        loop_lag = None if beat is None else round(max(now - beat, 0.0), 3)
        with self._lock:
            cpu = None
            if self._last_cpu is not None and self._last_tick is not None and now > self._last_tick:
                cpu = max(cpu_now - self._last_cpu, 0.0) / (now - self._last_tick)
            self._last_cpu, self._last_tick = cpu_now, now
            self._sweep(now)
            users = len(self._users)
            active = sum(1 for v in self._users.values() if v.seen >= now - self.window)
            pages = sum(v.pages or 0 for v in self._users.values()) if self._pages_reported else None
            connections = self.connections
        executor: dict[str, int] = {"busy": self.busy, "total": self.total}
        helper = self.executor
        if helper is not None and helper.used:
            executor["queue_depth"] = helper.waiting
        report: dict[str, Any] = {
            "users": users,
            "connections": connections,
            "active_users": active,
            "executor": executor,
            "cpu": cpu,
            "rss": read_rss() if rss is None else rss,
            "load": os.getloadavg()[0] if load is None else load,
            "loop_lag": loop_lag,
        }
        if pages is not None:
            report["pages"] = pages
        if self._backlog is not None:
            report["backlog"] = self._backlog
        return report

    def register(self, now: float) -> list[dict[str, Any]]:
        """The users this worker holds, for elasticd's population (the ``monitor`` request): each with its open
        connections, its pages (None: the app does not report pages) and how long ago it was last active."""
        with self._lock:
            self._sweep(now)
            # A user with a stream open is active now, however long ago the stream began.
            return [{"user": user, "connections": v.connections, "pages": v.pages,
                     "idle": 0.0 if v.connections else round(max(now - v.seen, 0.0), 3)}
                    for user, v in self._users.items()]
