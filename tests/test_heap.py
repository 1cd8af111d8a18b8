"""The daemon's heap frozen out of the collector's full passes (elasticd/heap.py): when a settle may run, and what
one does to the real collector."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from elasticd.heap import Heap, settle_delay


@pytest.fixture(autouse=True)
def thawed() -> Iterator[None]:
    yield
    gc.unfreeze()  # (this test process collects everything again, whatever a test left)


@pytest.mark.parametrize(("now", "last", "every", "delay"), [
    (100.0, None, 60.0, 0.0),  # never settled: now
    (100.0, 40.0, 60.0, 0.0),  # exactly `every` ago
    (100.0, 10.0, 60.0, 0.0),  # long ago
    (100.0, 70.0, 60.0, 30.0),  # 30 s ago: in 30 s
    (100.0, 100.0, 60.0, 60.0),  # just now
])
def test_settle_delay(now: float, last: float | None, every: float, delay: float) -> None:
    assert settle_delay(now, last, every) == pytest.approx(delay)


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


def test_settles_asked_within_every_are_deferred_to_one() -> None:
    async def main() -> Heap:
        heap = Heap(every=0.2)
        loop = asyncio.get_running_loop()
        heap.settle_soon(loop)  # the start: now
        assert heap.settles == 1
        for _ in range(5):  # a panel's changes, one after another: one settle for all of them, `every` later
            heap.settle_soon(loop)
        assert heap.settles == 1
        await asyncio.sleep(0.4)
        assert heap.settles == 2
        heap.settle_soon(loop)  # another reload, within `every` of that one: deferred again...
        heap.stop()  # ...and dropped at the daemon's stop, the heap thawed
        await asyncio.sleep(0.3)
        assert heap.settles == 2
        assert gc.get_freeze_count() == 0
        return heap

    asyncio.run(main())

