"""The sensor report: the fixed shape a worker pushes every occupancy interval (seed 000, "The sensor report").

The worker is a sensor: it reads raw quantities and passes no judgement. ``parse_report`` validates a
report received over the channel (refusing, with a reason, anything of the wrong shape) into a ``Report``.
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
    queue_depth: int = 0


@dataclass(frozen=True, slots=True)
class Report:
    users: int = 0  # drift sentinels only: decisions use the front's surface, which is fresher
    pages: int = 0
    connections: int = 0
    active_users: int = 0  # users with a non-system request within the window
    executor: Executor | None = None  # the saturation signal
    cpu: float | None = None  # process CPU as a fraction of one core since the last tick (None on the first)
    rss: int | None = None  # bytes (None where /proc is absent)
    backlog: int = 0  # drain sentinel
    load: float | None = None  # getloadavg: machine-level, diagnostic only
    # Seconds since the worker's event loop last ran its heartbeat (the library reports from a thread of its
    # own, so a handler holding the loop cannot silence it; this says whether the loop itself is stuck).
    # None: the worker has no heartbeat. An addition to seed 000's shape, for telling busy from wedged.
    loop_lag: float | None = None


_COUNTS = ("users", "pages", "connections", "active_users", "backlog")


def _count(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ReportError(f"{key}: {value!r} is not a count (a whole number ≥ 0)")
    return value


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
    unknown = set(data) - {*_COUNTS, "executor", "cpu", "rss", "load", "loop_lag"}
    if unknown:
        raise ReportError(f"unknown fields: {', '.join(sorted(map(str, unknown)))}")
    executor = None
    if data.get("executor") is not None:
        raw = data["executor"]
        if not isinstance(raw, dict):
            raise ReportError("executor: not an object {busy, total, queue_depth}")
        busy, total, depth = (_count(raw, k) for k in ("busy", "total", "queue_depth"))
        if total == 0:
            raise ReportError("executor.total: must be at least 1")
        executor = Executor(busy=busy, total=total, queue_depth=depth)
    rss = data.get("rss")
    if rss is not None and (isinstance(rss, bool) or not isinstance(rss, int) or rss < 0):
        raise ReportError(f"rss: {rss!r} is not a byte count")
    # A process tree may use more than one core; 1024 cores is a sanity bound, not a model.
    return Report(**{k: _count(data, k) for k in _COUNTS}, executor=executor,
                  cpu=_fraction(data, "cpu", upper=1024.0), rss=rss, load=_fraction(data, "load"),
                  loop_lag=_fraction(data, "loop_lag"))
