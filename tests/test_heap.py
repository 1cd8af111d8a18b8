"""The daemon's heap frozen out of the collector's full passes (elasticd/heap.py): when a settle may run, and what
one does to the real collector."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from collections.abc import Iterator

import pytest

from elasticd.heap import HOLD_MOST, Heap, full_passes_held, full_settle_delay, hold_full_passes


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # (this test process collects everything again, whatever a test left)


@pytest.mark.parametrize(("now", "last_full", "lights", "delay"), [
    (100.0, None, 0, 0.0),  # never settled (the start): now
    (100.0, 90.0, 0, None),  # no light settle since the last full one: nothing could have died frozen
    (100.0, 90.0, 1, 3590.0),  # one reload since: an hour after the last
    (5000.0, 90.0, 1, 0.0),  # ... long past
    (100.0, 90.0, 99, 3590.0),
    (100.0, 90.0, 100, 50.0),  # a panel's hundredth change: as soon as SETTLE_EVERY allows
    (200.0, 90.0, 150, 0.0),
])
def test_full_settle_delay(now: float, last_full: float | None, lights: int, delay: float | None) -> None:
    got = full_settle_delay(now, last_full, lights, every=60.0, after=3600.0, most=100)
    assert got == (None if delay is None else pytest.approx(delay))


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def _cycle() -> weakref.ref[_Node]:
    a, b = _Node(), _Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_a_settle_freezes_what_lives_and_collects_what_a_reload_left_in_cycles() -> None:
    heap = Heap()
    kept = _Node()
    heap.settle()
    assert gc.get_freeze_count() > 0
    # A configuration replaced by a reload, in a cycle, frozen with the rest: a full pass no longer sees it...
    garbage = _cycle()
    gc.freeze()
    gc.collect()
    assert garbage() is not None
    # ...until the next settle, which thaws and collects before it freezes again.
    heap.settle()
    assert garbage() is None
    assert heap.settles == 2
    assert gc.get_freeze_count() > 0
    del kept


def test_a_full_pass_after_a_settle_walks_only_what_was_made_since() -> None:
    long_lived = [[n] for n in range(200_000)]  # a daemon's configuration and books
    heap = Heap()
    heap.settle()
    assert gc.get_freeze_count() >= len(long_lived)
    assert len(gc.get_objects(generation=2)) < len(long_lived) // 10
    del long_lived


def test_a_light_settle_freezes_what_was_made_since_and_leaves_the_frozen_alone() -> None:
    heap = Heap()
    heap.settle()
    frozen = gc.get_freeze_count()
    died_frozen = _cycle()  # made before the settle below, dead by its end
    gc.freeze()
    new_garbage = _cycle()  # a reload's cycle, never frozen
    made = [[n] for n in range(10_000)]  # what a reload made and keeps
    heap.settle_light()
    assert new_garbage() is None  # collected: what is not frozen is walked
    assert died_frozen() is not None  # the frozen are not (the full settle frees them)
    assert gc.get_freeze_count() >= frozen + len(made) and not gc.get_objects(generation=2)
    assert (heap.lights, heap.settles) == (1, 1)
    heap.settle()
    assert died_frozen() is None and heap.lights == 0


def test_reloads_settle_lightly_and_the_full_settle_comes_when_due() -> None:
    async def main() -> Heap:
        heap = Heap(every=0.2, after=1.0, most=4)
        loop = asyncio.get_running_loop()
        heap.settle_soon(loop)  # the start: a full settle now
        assert (heap.settles, heap.lights) == (1, 0)
        heap.settle_soon(loop)  # a reload: light now, the full one `after` later
        assert (heap.settles, heap.lights) == (1, 1)
        await asyncio.sleep(0.3)
        assert heap.settles == 1  # (0.7 s before it is due: a loaded machine's late loop too)
        await asyncio.sleep(0.85)  # (its timer comes first, whatever the loop's lateness)
        assert (heap.settles, heap.lights) == (2, 0)
        for _ in range(4):  # a panel's changes, one after another: the fourth brings the full one to `every`
            heap.settle_soon(loop)
        assert (heap.settles, heap.lights) == (2, 4)
        await asyncio.sleep(0.3)
        assert (heap.settles, heap.lights) == (3, 0)
        heap.settle_soon(loop)  # another reload: its full settle is scheduled...
        heap.stop()  # ...and dropped at the daemon's stop, the heap thawed
        await asyncio.sleep(0.6)
        assert heap.settles == 3
        assert gc.get_freeze_count() == 0
        return heap

    asyncio.run(main())


@pytest.mark.parametrize("level", [logging.INFO, logging.DEBUG])
def test_a_settle_counts_the_frozen_only_for_a_debug_log(level: int, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    # gc.get_freeze_count() walks every frozen object with the interpreter held (~28 ms at 10,000 apps): as a log
    # argument it held the front's loop at every reload whether the line was logged or not.
    counted: list[int] = []
    real = gc.get_freeze_count

    def counting() -> int:
        counted.append(1)
        return real()

    monkeypatch.setattr(gc, "get_freeze_count", counting)
    caplog.set_level(level, logger="elasticd.heap")
    heap = Heap()
    heap.settle()
    heap.settle_light()
    assert len(counted) == (2 if level == logging.DEBUG else 0)
    assert ("frozen" in caplog.text) == (level == logging.DEBUG)


def test_full_passes_are_held_from_the_start_until_its_full_settle() -> None:
    # daemon.main() holds them before the start builds everything; the start's settle collects once, freezes, and
    # gives the collector its thresholds back. The young generations collect all along.
    before = gc.get_threshold()
    try:
        hold_full_passes()
        hold_full_passes()  # (twice is once: the thresholds kept are the operator's, not the held ones)
        held = gc.get_threshold()
        assert held[:2] == before[:2] and held[2] >= 1 << 30
        heap = Heap()
        heap.settle_light()
        assert gc.get_threshold() == held  # (a light settle never comes first in the daemon; it leaves them)
        heap.settle()
        assert gc.get_threshold() == before
        hold_full_passes()
        heap.stop()  # a daemon that stops before its first settle leaves its process collecting as before
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)


def test_a_scrapes_hold_and_the_starts_let_go_in_any_order() -> None:
    before = gc.get_threshold()
    try:
        hold_full_passes()
        with full_passes_held():
            Heap().settle()  # the start's settle comes while a scrape is under way: the scrape still holds
            assert gc.get_threshold()[2] >= 1 << 30
            with full_passes_held():  # (two scrapes at once)
                pass
            assert gc.get_threshold()[2] >= 1 << 30
        assert gc.get_threshold() == before
        with full_passes_held():
            hold_full_passes()
        assert gc.get_threshold()[2] >= 1 << 30  # the start's, until its settle
        Heap().settle()
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)


def test_scrapes_overlapping_without_a_gap_make_the_full_pass_they_held_off_once_every_hold_most(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Two scrapers at short intervals: each scrape's hold begins before the other's ends, and without a bound no
    # automatic full pass would come as long as they go on (old cycles kept meanwhile).
    passes: list[int] = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda generation=2: passes.append(generation) or real(generation))
    before = gc.get_threshold()
    try:
        first = full_passes_held(now=100.0)
        first.__enter__()
        for step in range(1, 8):  # a new scrape every 10 s, each until the next has begun
            following = full_passes_held(now=100.0 + 10 * step)
            following.__enter__()
            first.__exit__(None, None, None)
            first = following
            assert gc.get_threshold()[2] >= 1 << 30
        first.__exit__(None, None, None)
        assert passes == [2, 2]  # at 130 s and 160 s: one full pass each HOLD_MOST, not one per scrape
        assert gc.get_threshold() == before
        with full_passes_held(now=500.0), full_passes_held(now=529.0):  # (a gap began the count anew)
            pass
        assert passes == [2, 2]
        hold_full_passes()  # the start holds: its own settle is the pass to come
        with full_passes_held(now=time.monotonic() + HOLD_MOST * 2):
            pass
        assert passes == [2, 2]
        Heap().settle()  # (a pass itself, and the count begins again from it)
        assert gc.get_threshold() == before
    finally:
        gc.set_threshold(*before)
