"""INTERPRET: each worker's window of readings becomes one number, its occupancy in [0, 1] (seed 000).

Per row the components are memory = rss / memory_limit (only when both exist), cpu = min(cpu / wall, 1) and
executor = busy / total. The CPU wall is what the worker's cgroup can give it: one core (the GIL) or the
tenant's cpu.max in cores when that is less (``budget.cpu_wall``) — a worker at 0.5 core under a 0.5-core
quota is saturated. Each component is FIRST averaged over the
last ``SMOOTHING_ROWS`` rows (about 30 s: transient spikes dominate a naive read), THEN the occupancy is the
MAX of the averages: the bottleneck answers "can I take another user?"; an average across incommensurable
resources does not. A worker with no rows (just born) reads 0: it admits. Anti-flapping IS the window.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice

from elasticd.pool.report import Report

__all__ = ["METRICS_WINDOW", "SMOOTHING_ROWS", "ForwardSnapshot", "Rates", "Row", "Window", "components_of",
           "history_of", "occupancy", "rates_of", "row_components"]

METRICS_WINDOW = 60
SMOOTHING_ROWS = 6


@dataclass(frozen=True, slots=True)
class ForwardSnapshot:
    """The front's cumulative counters for one worker, snapshotted when a report is archived."""

    requests: int
    errors: int
    seconds: float


@dataclass(frozen=True, slots=True)
class Row:
    ts: float
    report: Report
    forward: ForwardSnapshot | None = None


class Window:
    """A worker's archive: the last ``METRICS_WINDOW`` rows."""

    __slots__ = ("rows",)

    def __init__(self, maxlen: int = METRICS_WINDOW) -> None:
        self.rows: deque[Row] = deque(maxlen=maxlen)

    def add(self, row: Row) -> None:
        self.rows.append(row)

    def last_ts(self) -> float | None:
        return self.rows[-1].ts if self.rows else None


def row_components(row: Row, memory_limit: int | None, cpu_wall: float = 1.0) -> dict[str, float]:
    report = row.report
    parts: dict[str, float] = {}
    if report.rss is not None and memory_limit:
        parts["memory"] = min(report.rss / memory_limit, 1.0)
    if report.cpu is not None:
        parts["cpu"] = min(report.cpu / cpu_wall, 1.0)
    if report.executor is not None:
        parts["executor"] = min(report.executor.busy / report.executor.total, 1.0)
    return parts


def components_of(rows: Sequence[Row], memory_limit: int | None, smoothing: int = SMOOTHING_ROWS,
                  cpu_wall: float = 1.0) -> dict[str, float]:
    """Each component averaged over the last ``smoothing`` rows that carry it."""
    recent = islice(reversed(rows), smoothing)  # no copy of the whole window
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in recent:
        for name, value in row_components(row, memory_limit, cpu_wall).items():
            sums[name] = sums.get(name, 0.0) + value
            counts[name] = counts.get(name, 0) + 1
    return {name: sums[name] / counts[name] for name in sums}


def occupancy(rows: Sequence[Row], memory_limit: int | None, smoothing: int = SMOOTHING_ROWS,
              cpu_wall: float = 1.0) -> float:
    parts = components_of(rows, memory_limit, smoothing, cpu_wall)
    return max(parts.values(), default=0.0)


def history_of(rows: Sequence[Row], memory_limit: int | None, cpu_wall: float = 1.0) -> list[float]:
    """Per-row occupancy (no smoothing) across the whole window: the monitor's histogram."""
    return [max(row_components(row, memory_limit, cpu_wall).values(), default=0.0) for row in rows]


@dataclass(frozen=True, slots=True)
class Rates:
    rps: float
    latency: float | None  # mean seconds per request over the window; None without requests
    error_rate: float  # errors per second


def rates_of(rows: Sequence[Row]) -> Rates | None:
    """Request rate and latency from the forward-counter deltas between the window's first and last rows."""
    marked = [row for row in rows if row.forward is not None]
    if len(marked) < 2:
        return None
    first, last = marked[0], marked[-1]
    span = last.ts - first.ts
    assert first.forward is not None and last.forward is not None
    requests = last.forward.requests - first.forward.requests
    if span <= 0 or requests < 0:  # a counter reset (new front) reads as no data, not a negative rate
        return None
    seconds = last.forward.seconds - first.forward.seconds
    errors = last.forward.errors - first.forward.errors
    return Rates(rps=requests / span, latency=seconds / requests if requests else None,
                 error_rate=max(errors, 0) / span)
