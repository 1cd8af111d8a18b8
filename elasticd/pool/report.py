"""The sensor report: the fixed shape a worker pushes every occupancy interval (seed 000, "The sensor report").

The worker is a sensor: it reads raw quantities and passes no judgement. ``parse_report`` validates a
report received over the channel (refusing, with a reason, anything of the wrong shape) into a ``Report``.
A quantity the worker does not measure is left out of its report, and reads None here, not 0: ``pages`` and
``backlog`` (the app's own, through the library's sensor API), the executor's ``queue_depth`` (the library's
executor helper). A field that is always 0 is not a reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Executor", "Report", "ReportError", "parse_report"]


class ReportError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Executor:
    busy: int
    total: int
    queue_depth: int | None = None  # requests waiting for the executor (None: not measured)


@dataclass(frozen=True, slots=True)
class Report:
    users: int = 0  # drift sentinels only: decisions use the front's surface, which is fresher
    pages: int | None = None  # pages the users have open, as the app counts them (None: not reported)
    connections: int = 0  # responses streaming and WebSockets open
    active_users: int = 0  # users with a non-system request within the window
    executor: Executor | None = None  # the saturation signal
    cpu: float | None = None  # process CPU as a fraction of one core since the last tick (None on the first)
    rss: int | None = None  # bytes (None where /proc is absent)
    backlog: int | None = None  # drain sentinel: the app's own queued work (None: not reported)
    load: float | None = None  # getloadavg: machine-level, diagnostic only
    # Seconds since the worker's event loop last ran its heartbeat (the library reports from a thread of its
    # own, so a handler holding the loop cannot silence it; this says whether the loop itself is stuck).
    # None: the worker has no heartbeat. An addition to seed 000's shape, for telling busy from wedged.
    loop_lag: float | None = None


_COUNTS = ("users", "connections", "active_users")
_OPTIONAL_COUNTS = ("pages", "backlog")


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ReportError(f"{key}: {value!r} is not a count (a whole number ≥ 0)")


def _optional_count(data: dict[str, Any], key: str) -> int | None:
    return None if data.get(key) is None else _count(data, key)


def _fraction(data: dict[str, Any], key: str, *, upper: float | None = None) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ReportError(f"{key}: {value!r} is not a non-negative number")
    if upper is not None and value > upper:
        raise ReportError(f"{key}: {value!r} is over {upper:g}")
    return float(value)


def parse_report(data: Any) -> Report:
    if not isinstance(data, dict):
        raise ReportError("the report is not an object")
    unknown = set(data) - {*_COUNTS, *_OPTIONAL_COUNTS, "executor", "cpu", "rss", "load", "loop_lag"}
    if unknown:
        raise ReportError(f"unknown fields: {', '.join(sorted(map(str, unknown)))}")
    executor = None
    if data.get("executor") is not None:
        raw = data["executor"]
        if not isinstance(raw, dict):
            raise ReportError("executor: not an object {busy, total, queue_depth}")
        unknown = set(raw) - {"busy", "total", "queue_depth"}
        if unknown:
            raise ReportError(f"executor: unknown fields: {', '.join(sorted(map(str, unknown)))}")
        busy, total, depth = _count(raw, "busy"), _count(raw, "total"), _optional_count(raw, "queue_depth")
        if total == 0:
            raise ReportError("executor.total: must be at least 1")
        executor = Executor(busy=busy, total=total, queue_depth=depth)
    rss = data.get("rss")
    if rss is not None and (isinstance(rss, bool) or not isinstance(rss, int) or rss < 0):
        raise ReportError(f"rss: {rss!r} is not a byte count")
    # A process tree may use more than one core; 1024 cores is a sanity bound, not a model.
    return Report(users=_count(data, "users"), connections=_count(data, "connections"),
                  active_users=_count(data, "active_users"), pages=_optional_count(data, "pages"),
                  backlog=_optional_count(data, "backlog"), executor=executor,
                  cpu=_fraction(data, "cpu", upper=1024.0), rss=rss, load=_fraction(data, "load"),
                  loop_lag=_fraction(data, "loop_lag"))
