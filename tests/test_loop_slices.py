"""The daemon's own work done on the event loop in slices (elasticd/loop_slices.py): a /metrics scrape's collection
lets the loop (the front's) run between its families, and gives the page it gave whole."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.accounting.sampler import Sampler
from elasticd.config.model import Address
from elasticd.loop_slices import gather_in_slices
from elasticd.metrics import MetricsServer


def _made(log: list[str], count: int, each: float, clock: list[float] | None = None) -> Iterator[int]:
    for n in range(count):
        if clock is None:
            time.sleep(each)  # a step's work
        else:
            clock[0] += each  # (a step's work, on the test's clock: the same order on a loaded machine)
        log.append(f"made {n}")
        yield n


async def _other(log: list[str]) -> None:
    while True:
        log.append("other")
        await asyncio.sleep(0)


async def test_the_loop_turns_between_two_steps_once_a_slice_of_work_was_done() -> None:
    log: list[str] = []
    other = asyncio.get_running_loop().create_task(_other(log))
    await asyncio.sleep(0)
    log.clear()
    now = [0.0]
    gathered = await gather_in_slices(_made(log, 4, 0.003, now), slice_seconds=0.005,  # a turn every second step
                                      clock=lambda: now[0])
    other.cancel()
    assert gathered == [0, 1, 2, 3]
    assert log[:5] == ["made 0", "made 1", "other", "made 2", "made 3"]


async def test_short_steps_take_no_turn_of_the_loop() -> None:
    log: list[str] = []
    other = asyncio.get_running_loop().create_task(_other(log))
    await asyncio.sleep(0)
    log.clear()
    gathered = await gather_in_slices(_made(log, 50, 0.0), slice_seconds=10.0)
    other.cancel()
    assert gathered == list(range(50))
    assert "other" not in log


class _Slow(Collector):
    """Families that take 3 ms each to make (a host's thousands of apps), each noted in ``log`` as it is made."""

    def __init__(self, log: list[str]) -> None:
        self.log = log

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for n in range(20):
            time.sleep(0.003)
            self.log.append("family")
            yield GaugeMetricFamily(f"slow_{n}", "A family that took a while.", value=n)


async def test_a_scrape_lets_the_front_run_between_families() -> None:
    log: list[str] = []
    sampler = Sampler(sys_root="/nonexistent")
    server = MetricsServer(Address("127.0.0.1", 0), sampler, lambda: {}, extra_collectors=[_Slow(log)])
    await server.start()
    other = asyncio.get_running_loop().create_task(_other(log))  # the front's work, meanwhile
    try:
        async with aiohttp.ClientSession() as session, \
                session.get(f"http://127.0.0.1:{server.port}/metrics") as answer:
            page = await answer.text()
    finally:
        other.cancel()
        await server.stop()
    assert answer.status == 200
    assert all(f"slow_{n} {n}.0" in page for n in range(20))  # every family, as a whole collection gives it
    assert page.count("# TYPE slow_") == 20
    made = [n for n, entry in enumerate(log) if entry == "family"]
    between = log[made[0]:made[-1]]
    # 60 ms of collection in slices of about LOOP_SLICE (4 ms): the loop turned between families, many times.
    assert between.count("other") >= 5
