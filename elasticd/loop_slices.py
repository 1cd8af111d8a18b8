"""The daemon's own work, done on the event loop in slices: the front proxies every tenant's requests on that loop,
so a long step of anything else (a cgroup sampling pass, a /metrics scrape's collection) holds all of them.

At 10,000 apps a sampling pass held the loop ~40 ms and a scrape's collection ~75 ms (benchmarks/density_bench.py's
front probe: its worst answer). Done in slices of ``LOOP_SLICE`` of work, with a turn of the loop between two, a
request waits about a slice. (A thread would not do it for work on the loop's own data, which it would have to lock.)

What the daemon does in threads (the /metrics page's text, files read and written with ``asyncio.to_thread``) holds
the GIL too, and the interpreter takes it from a thread for another only every switch interval: 5 ms by default, so
each request that came while a scrape's text was written waited about that long (its median, at 10,000 apps, 5.4 ms).
``GIL_SWITCH`` is the daemon's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Final, TypeVar

__all__ = ["GIL_SWITCH", "LOOP_SLICE", "gather_in_slices"]

# Seconds of the daemon's own work between two turns of the event loop.
LOOP_SLICE: Final = 0.004

# The interpreter's switch interval in the daemon (sys.setswitchinterval): how long the loop's thread waits at most
# for the GIL a thread of the daemon holds.
GIL_SWITCH: Final = 0.0005

T = TypeVar("T")


async def gather_in_slices(items: Iterable[T], slice_seconds: float | None = None,
                           clock: Callable[[], float] = time.perf_counter) -> list[T]:
    """``list(items)``, with a turn of the loop whenever making them took ``slice_seconds`` (``LOOP_SLICE`` unless
    said) since the last, by ``clock``: for an iterable that does its work as it goes (a generator), each step of
    which is short."""
    if slice_seconds is None:
        slice_seconds = LOOP_SLICE
    gathered: list[T] = []
    began = clock()
    for item in items:
        gathered.append(item)
        if clock() - began >= slice_seconds:
            await asyncio.sleep(0)
            began = clock()
    return gathered
