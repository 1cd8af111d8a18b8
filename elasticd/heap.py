"""The daemon's long-lived heap, kept out of the cyclic garbage collector's full passes (``gc.freeze``).

Why: CPython's collector walks every object it tracks in a full (generation 2) pass, with the interpreter stopped,
and the front proxies every tenant's requests on this process's event loop. At a hosting host's scale the daemon holds
about half a million tracked objects (the configuration of 10,000 apps, the supervisor's and the pool's books): a full
pass takes ~140 ms on this project's 2-core machine (``benchmarks/density_bench.py``). And passes came often: one is
due whenever the objects that survived the younger generations reach a quarter of the long-lived ones, and a /metrics
scrape at that scale builds 62,000 series, which survive while the page is made — each scrape set one off (five
scrapes, five passes of 134-148 ms), every tenant's requests held meanwhile.

``gc.freeze()`` moves every object tracked now into a permanent generation that no pass walks; what is made after it
is collected as before, in passes that walk only that (~10 ms measured). A frozen object that dies is still freed by
its reference count; only one in a reference cycle would stay until the next ``gc.unfreeze()``. So the heap is settled
(thawed, collected once, frozen again) after the start and after each reload, when the configuration it replaced has
just become garbage; at most once a ``SETTLE_EVERY`` (a hosting panel that changes tenants one after another must not
buy a full pass with each change: the settle is deferred until then instead, and happens once for all of them).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Final

__all__ = ["SETTLE_EVERY", "Heap", "settle_delay"]

log = logging.getLogger("elasticd.heap")

# Seconds between two settles (each one full pass: ~140 ms at 10,000 apps).
SETTLE_EVERY: Final = 60.0


def settle_delay(now: float, last: float | None, every: float) -> float:
    """Seconds until the heap may be settled again: none when it never was or was ``every`` ago."""
    if last is None:
        return 0.0
    return max(0.0, last + every - now)


class Heap:
    """The settles of one process's heap: ``settle_soon`` after the start and each reload (on the event loop)."""

    __slots__ = ("_handle", "_last", "every", "settles")

    def __init__(self, every: float = SETTLE_EVERY) -> None:
        self.every = every
        self.settles = 0  # how many were made (for tests and the log)
        self._last: float | None = None  # monotonic instant of the last settle
        self._handle: asyncio.TimerHandle | None = None  # a deferred settle, when one is due

    def settle_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """Settle now, or when ``every`` has passed since the last (once, however many ask meanwhile)."""
        if self._handle is not None:
            return
        delay = settle_delay(time.monotonic(), self._last, self.every)
        if delay <= 0.0:
            self.settle()
        else:
            self._handle = loop.call_later(delay, self._deferred)

    def _deferred(self) -> None:
        self._handle = None
        try:
            self.settle()
        except Exception:  # never the loop's problem: the collector keeps working unfrozen
            log.exception("settling the heap failed")

    def settle(self) -> None:
        """Thaw, collect once (what a reload left in cycles goes now), freeze what lives."""
        began = time.monotonic()
        gc.unfreeze()
        gc.collect()
        gc.freeze()
        self._last = time.monotonic()
        self.settles += 1
        log.debug("heap settled in %.0f ms: %d objects frozen", (self._last - began) * 1000, gc.get_freeze_count())

    def stop(self) -> None:
        """The daemon stops: a deferred settle is dropped and the heap thawed (a process that goes on after its
        daemon, as a test's, collects everything again)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        gc.unfreeze()
