"""Busy is not hung: the rule that calls a worker hung, and the evidence it leaves. Pure: time is passed in.

A worker at 100 % CPU inside a synchronous handler is the busiest worker there is, and killing it kills the
requests it is serving. So *silence* alone proves nothing; a worker is hung only when it is silent AND makes
no progress, both for ``hung_after``:

- silent: a worker that reports (the library) sent no report, or its reports say its event loop has not run
  (``loop_lag``), for ``hung_after``; a worker that does not report is silent while a request has been open
  on it for ``hung_after`` (someone is waiting for it, and it says nothing);
- progress: its process tree's CPU time advanced by more than ``CPU_PROGRESS`` seconds, or the front saw it
  answer a request, since the last progress.

A handler burning CPU makes progress; a handler awaiting a slow database keeps reporting (the library reports
from a thread of its own, its loop keeps beating). What is left is what should be killed: a SIGSTOPped
process (no reports, no CPU), a deadlock while idle (the loop stalled, no CPU, no answers).

CPU progress needs a floor, in amount and in rate: the library's reporting thread itself uses a little CPU
(about 0.02 ms a report), a clock-tick-resolution counter (10 ms) that moved once is not a worker working, and
a wedged loop beside a background thread creeps forward forever — so progress is more than ``CPU_PROGRESS``
seconds of CPU AND more than ``CPU_PROGRESS_RATE`` of a core since the last mark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["CPU_PROGRESS", "CPU_PROGRESS_RATE", "Hung", "Progress", "observe", "reporting", "verdict"]

CPU_PROGRESS = 0.05  # seconds of CPU since the last progress mark that count as progress...
CPU_PROGRESS_RATE = 0.02  # ...when they are also more than this share of one core over the same time


def reporting(now: float, last_report: float | None, loop_lag: float | None, interval: float) -> bool:
    """A worker that reports is plainly alive while its reports come and its loop beats (within one and a
    half intervals): then its process tree's CPU need not be read at all (a walk of /proc per worker per
    tick), and its progress mark simply follows the clock."""
    if last_report is None:
        return False
    return now - last_report < 1.5 * interval and (loop_lag or 0.0) < 1.5 * interval


@dataclass(frozen=True, slots=True)
class Progress:
    at: float  # when the worker last made progress (or was first observed)
    cpu: float | None  # its tree's CPU seconds at that moment
    answered: int  # the front's count of its answers at that moment


@dataclass(frozen=True, slots=True)
class Hung:
    reason: str
    numbers: dict[str, Any]


def observe(previous: Progress | None, now: float, cpu: float | None, answered: int) -> Progress:
    """Fold one tick's readings into the worker's progress mark."""
    if previous is None:
        return Progress(now, cpu, answered)
    used = cpu - previous.cpu if cpu is not None and previous.cpu is not None else 0.0
    elapsed = now - previous.at
    advanced = answered > previous.answered or (
        used > CPU_PROGRESS and (elapsed <= 0 or used / elapsed > CPU_PROGRESS_RATE))
    if advanced or (previous.cpu is None and cpu is not None):
        return Progress(now, cpu, answered)
    return previous


def verdict(now: float, progress: Progress, *, hung_after: float, reports: bool, last_report: float | None,
            loop_lag: float | None, oldest_open: float | None, open_requests: int) -> Hung | None:
    """``reports``: the worker announced itself on the channel; ``last_report``: when its last report came
    (None: none yet); ``loop_lag``: what that report said of its event loop; ``oldest_open``: when the oldest
    request open on it was sent (None: none open)."""
    if reports:
        since_report = now - last_report if last_report is not None else 0.0
        silent = max(since_report, loop_lag or 0.0)
        what = (f"no report for {since_report:.1f}s" if since_report >= (loop_lag or 0.0)
                else f"its event loop has not run for {loop_lag:.1f}s")
    else:
        silent = now - oldest_open if oldest_open is not None else 0.0
        what = f"a request open on it for {silent:.1f}s with no answer"
    still = now - progress.at
    if silent < hung_after or still < hung_after:
        return None
    numbers = {"silent_seconds": round(silent, 3), "no_progress_seconds": round(still, 3),
               "cpu_seconds": None if progress.cpu is None else round(progress.cpu, 3),
               "answered": progress.answered, "open_requests": open_requests, "hung_after": hung_after,
               "loop_lag": loop_lag}
    return Hung(f"{what}, and neither its CPU time nor its answers advanced for {still:.1f}s", numbers)
