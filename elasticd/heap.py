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
its reference count; only one in a reference cycle stays until the next ``gc.unfreeze()``. So there are two settles:

- a full one (thaw, collect everything once, freeze again: ~170 ms at 10,000 apps, the interpreter stopped) after the
  start, and later only to free the cycles that died frozen. Until the first, the collector makes no full pass of its
  own (``hold_full_passes``, from ``daemon.main``): while the start builds everything, each would walk all of it
  again (ten passes of 10-130 ms at 10,000 apps, ~0.55 s, the last ones with the front answering). The young
  generations' passes go on, and free what the start leaves in cycles as it goes (turned off as well, that garbage
  stayed until the settle: +60 MB of RSS at 10,000 apps, measured);
- a light one (collect what is not frozen, then freeze it: 3-5 ms at 10,000 apps, measured) after each reload, for
  what the reload made: the new configuration's objects leave the full passes at once.

A /metrics scrape's series are not frozen (they die once the page is written), and while they lived they set off
full passes of their own, one after another: ``full_passes_held`` keeps them off for the scrape. Scrapes that overlap
without a gap (several scrapers at short intervals) would keep them off for as long as they go on, and old garbage in
cycles with them: a hold taken when full passes have been held for ``HOLD_MOST`` makes the one they kept off first.

A reload leaves little in cycles among what was frozen (92 objects per one-tenant change at 10,000 apps, counted with
``gc.collect()``'s answer: the replaced configuration is freed by reference counts), so the full settle that frees
them waits: ``FULL_SETTLE_AFTER`` after the last, or, for a hosting panel that changes tenants one after another,
once ``LIGHT_SETTLES`` light ones have been made and ``SETTLE_EVERY`` has passed (``full_settle_delay``). What waits
frozen meanwhile is bounded by that count: about a megabyte. Before, each reload asked for a full settle (at most one
a minute): a panel's stream of changes held every tenant's requests ~170 ms each minute.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Iterator
from typing import Final

__all__ = ["FULL_SETTLE_AFTER", "HOLD_MOST", "LIGHT_SETTLES", "SETTLE_EVERY", "Heap", "full_passes_held",
           "full_settle_delay", "hold_full_passes"]

log = logging.getLogger("elasticd.heap")

SETTLE_EVERY: Final = 60.0  # seconds: two full settles are never closer (each one full pass)
FULL_SETTLE_AFTER: Final = 3600.0  # seconds after the last full settle, one is made if light ones froze anything since
LIGHT_SETTLES: Final = 100  # light settles after which a full one is due as soon as SETTLE_EVERY allows
HOLD_MOST: Final = 30.0  # seconds scrapes' overlapping holds may keep full passes off before one is made


# Who holds the collector's full passes now (the start, until its settle; each /metrics scrape under way), and its
# thresholds from before the first hold, given back when the last lets go; and since when (monotonic) full passes have
# been held without one made. Only the event loop's thread holds.
_holds = 0
_thresholds: tuple[int, int, int] = (0, 0, 0)
_start_held = False
_held_since = 0.0


def _hold(now: float) -> None:
    global _holds, _thresholds, _held_since
    if _holds == 0:
        _thresholds = gc.get_threshold()
        gc.set_threshold(_thresholds[0], _thresholds[1], 1 << 30)  # (the third out of reach: no automatic full pass)
        _held_since = now
    elif not _start_held and now - _held_since >= HOLD_MOST:
        # Holds overlapping for HOLD_MOST without a gap: the full pass they kept off, once, before this one's series
        # exist (what it walks is what is not frozen: ~10 ms at 10,000 apps, with another scrape's series more).
        gc.collect()
        _held_since = now
    _holds += 1


def _let_go() -> None:
    global _holds
    if _holds > 0:
        _holds -= 1
        if _holds == 0:
            gc.set_threshold(*_thresholds)


def hold_full_passes() -> None:
    """The start's hold: no automatic full (generation 2) pass until the next full settle."""
    global _start_held
    if not _start_held:
        _start_held = True
        _hold(time.monotonic())


def _settled(now: float) -> None:
    """A full settle was made (a full pass): the start's hold ends, and holds still under way count from now."""
    global _start_held, _held_since
    _held_since = now
    if _start_held:
        _start_held = False
        _let_go()


@contextlib.contextmanager
def full_passes_held(now: float | None = None) -> Iterator[None]:
    """No automatic full pass while the block runs: for a /metrics scrape, whose tens of thousands of series (62,000 at
    10,000 apps) set off one full pass after another while they live (nine of 9-23 ms in five scrapes, measured),
    each walking them all for nothing (0 freed), and die by their reference counts once the page is written. Held
    for ``HOLD_MOST`` already by blocks that overlapped (the start's aside), one full pass is made first."""
    _hold(time.monotonic() if now is None else now)
    try:
        yield
    finally:
        _let_go()


def full_settle_delay(now: float, last_full: float | None, lights: int, every: float = SETTLE_EVERY,
                      after: float = FULL_SETTLE_AFTER, most: int = LIGHT_SETTLES) -> float | None:
    """Seconds until the next full settle: 0 when there never was one; None when none is needed (no light settle
    since the last: nothing was frozen that could have died in a cycle)."""
    if last_full is None:
        return 0.0
    if lights <= 0:
        return None
    return max(0.0, last_full + (every if lights >= most else after) - now)


class Heap:
    """The settles of one process's heap: ``settle_soon`` after the start and each reload (on the event loop)."""

    __slots__ = ("_due", "_handle", "_last_full", "after", "every", "lights", "most", "settles")

    def __init__(self, every: float = SETTLE_EVERY, after: float = FULL_SETTLE_AFTER,
                 most: int = LIGHT_SETTLES) -> None:
        self.every, self.after, self.most = every, after, most  # (full_settle_delay's)
        self.settles = 0  # full settles made (for tests and the log)
        self.lights = 0  # light settles since the last full one
        self._last_full: float | None = None  # monotonic instant of the last full settle
        self._handle: asyncio.TimerHandle | None = None  # the full settle to come, when one is due
        self._due = 0.0  # and when (loop time)

    def settle_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """After the start: a full settle now. After a reload: a light one now, and the full one scheduled when due."""
        if self._last_full is None:
            self.settle()
            return
        self.settle_light()
        delay = full_settle_delay(time.monotonic(), self._last_full, self.lights, self.every, self.after, self.most)
        if delay is None:
            return
        due = loop.time() + delay
        if self._handle is not None:
            if self._due <= due:
                return  # (one comes sooner already)
            self._handle.cancel()
        self._due = due
        self._handle = loop.call_later(delay, self._deferred)

    def _deferred(self) -> None:
        self._handle = None
        try:
            self.settle()
        except Exception:  # never the loop's problem: the collector keeps working unfrozen
            log.exception("settling the heap failed")

    def settle(self) -> None:
        """Full: thaw, collect once (the cycles that died frozen go now), freeze what lives."""
        began = time.monotonic()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        self._last_full = time.monotonic()
        _settled(self._last_full)  # (the start's hold, from daemon.main, ends)
        self.settles += 1
        self.lights = 0
        if log.isEnabledFor(logging.DEBUG):  # (the count walks every frozen object: see settle_light)
            log.debug("heap settled in %.0f ms: %d objects in dead cycles freed, %d frozen",
                      (self._last_full - began) * 1000, found, gc.get_freeze_count())

    def settle_light(self) -> None:
        """Light: collect what is not frozen (what was made since the last settle), freeze what of it lives."""
        began = time.monotonic()
        found = gc.collect()
        gc.freeze()
        self.lights += 1
        # gc.get_freeze_count() walks the whole frozen list, one object at a time across the heap: ~28 ms at 10,000
        # apps, with the interpreter held (no other thread runs, the front's loop waits). As a log argument it was
        # counted at every reload, logged or not: the longest stall a hosting panel's change left (37-52 ms answers).
        if log.isEnabledFor(logging.DEBUG):
            log.debug("heap settled lightly in %.1f ms: %d objects in dead cycles freed, %d frozen",
                      (time.monotonic() - began) * 1000, found, gc.get_freeze_count())

    def stop(self) -> None:
        """The daemon stops: a full settle to come is dropped and the heap thawed (a process that goes on after its
        daemon, as a test's, collects everything again)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        gc.unfreeze()
        _settled(time.monotonic())
