"""The readings in force and what they change (probes/state.py): the front's ``full`` map, the pool's capacity
callback and room, expiry by the state's own timer, the 429 back-off, and ``sync`` starting and stopping probes.
A real event loop and small numbers; a real aiohttp server where a probe must run."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from email.utils import formatdate
from typing import Any

import pytest
from aiohttp import web

from elasticd.config.model import Capacity
from elasticd.probes.probe import Probe, ProbeTarget
from elasticd.probes.reading import Reading
from elasticd.probes.state import CapacityState

KEY = ("t", "a", "g")


def node(name: str, *, url: str | None = None, limit: int = 4) -> ProbeTarget:
    return ProbeTarget(f"t.a.g@{name}", *KEY, limit, url=url)


async def until(condition: Callable[[], bool], timeout: float = 2.0, what: str = "the condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


class Books:
    """The front's ``full`` map and what the front and the pool were told."""

    def __init__(self) -> None:
        self.full: dict[str, tuple[float, int, float]] = {}
        self.rooms: list[tuple[str, tuple[str, str, str]]] = []
        self.capacity: list[tuple[str, tuple[str, str, str], float | None]] = []

    def on_room(self, worker: str, key: tuple[str, str, str]) -> None:
        self.rooms.append((worker, key))

    def on_capacity(self, worker: str, key: tuple[str, str, str], ratio: float | None) -> None:
        self.capacity.append((worker, key, ratio))

    def last_ratio(self, worker: str) -> float | None:
        return [ratio for w, _, ratio in self.capacity if w == worker][-1]


@pytest.fixture
async def books():
    made = Books()
    state = CapacityState(made.full, made.on_room, made.on_capacity)
    runners: list[web.AppRunner] = []

    async def serve(answer: dict[str, Any]) -> str:
        """A metrics endpoint answering ``answer["status"]`` with ``answer["body"]``: its base URL."""
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=answer["body"], status=answer.get("status", 200), content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield made, state, serve
    await state.aclose()
    for runner in runners:
        await runner.cleanup()


class Fixed(Probe):
    """A custom probe (``custom: tests' test_probes_state:Fixed``): always says 1 of its target's limit."""

    async def poll(self) -> None:
        self.report(1, self.target.limit)


async def test_a_full_reading_fills_the_front_and_tells_the_pool_and_room_frees_it(books) -> None:
    made, state, _ = books
    n1 = node("n1")
    state.sync([(n1, Capacity(probe="ratelimit", max_age=5.0, wait=0.7))])
    now, mono = time.time(), time.monotonic()
    state.set(n1.node, Reading("prometheus", 4, 4, now))
    until_, retry_after, wait = made.full[n1.node]
    assert until_ == pytest.approx(mono + 5.0, abs=0.2) and retry_after == 1 and wait == 0.7
    assert made.capacity[-1] == (n1.node, KEY, 1.0) and made.rooms == []
    # a reading with its own, sooner end: believed until then
    state.set(n1.node, Reading("registry", 10, 8, now, expires_at=now + 2.0))
    assert made.full[n1.node][0] == pytest.approx(mono + 5.0, abs=0.2)  # the latest end of what says full
    state.forget(n1.node, "prometheus")
    assert made.full[n1.node][0] == pytest.approx(mono + 2.0, abs=0.2) and made.rooms == []
    state.forget(n1.node, "registry")
    assert n1.node not in made.full and made.rooms == [(n1.node, KEY)] and made.last_ratio(n1.node) is None

    made.rooms.clear()
    state.set(n1.node, Reading("prometheus", 5, 4, time.time()))
    assert n1.node in made.full and made.last_ratio(n1.node) == 1.0
    state.set(n1.node, Reading("prometheus", 1, 4, time.time()))  # room again
    assert n1.node not in made.full and made.rooms == [(n1.node, KEY)]
    assert made.last_ratio(n1.node) == 0.25
    state.set(n1.node, Reading("prometheus", 2, 4, time.time()))  # still room: said once
    assert made.rooms == [(n1.node, KEY)] and made.last_ratio(n1.node) == 0.5
    state.set("t.a.g@unknown", Reading("prometheus", 9, 4, time.time()))  # a node not described: nothing
    assert "t.a.g@unknown" not in made.full and state.tightest("t.a.g@unknown") is None


async def test_a_full_reading_expires_by_the_states_own_timer(books) -> None:
    made, state, _ = books
    n1 = node("n1")
    state.sync([(n1, Capacity(probe="ratelimit", max_age=0.2))])
    began = time.monotonic()
    state.set(n1.node, Reading("prometheus", 4, 4, time.time()))
    assert n1.node in made.full and made.last_ratio(n1.node) == 1.0
    await until(lambda: n1.node not in made.full, 1.0, "the reading's expiry")  # no new reading: the timer
    assert time.monotonic() - began >= 0.15
    assert made.rooms == [(n1.node, KEY)] and made.last_ratio(n1.node) is None
    assert state.fresh(n1.node) == []


async def test_a_429_backoff(books, caplog) -> None:
    caplog.set_level(logging.INFO, logger="elasticd.probes")
    made, state, serve = books
    answer: dict[str, Any] = {"body": b"vllm:num_requests_running 1\n"}
    base = await serve(answer)
    limited, quiet, probed = node("rl"), node("in"), node("pr", url=base)
    state.sync([(limited, Capacity(probe="ratelimit")), (quiet, Capacity(probe="inflight")),
                (probed, Capacity(probe="prometheus", interval=0.05))])
    assert state.probe_of(limited.node) is None and state.probe_of(quiet.node) is None

    mono = time.monotonic()
    state.backoff(limited.node, b"2")
    until_, retry_after, _ = made.full[limited.node]
    assert retry_after == 2 and until_ == pytest.approx(mono + 2.0, abs=0.2)
    tightest = state.tightest(limited.node)
    assert tightest is not None and (tightest.source, tightest.retry_after) == ("ratelimit", 2.0)
    assert made.last_ratio(limited.node) == 1.0
    state.backoff(limited.node, b"2")  # again: said once
    assert sum("answered 429" in r.getMessage() for r in caplog.records) == 1

    state.backoff(quiet.node, b"2")  # an inflight block: an app's own 429 is not its capacity
    state.backoff("t.a.g@unknown", b"2")
    assert quiet.node not in made.full and "t.a.g@unknown" not in made.full and state.fresh(quiet.node) == []
    for unparsable in (b"", b"soon", b"0", b"-3", b"Mon, 32 Foo 2020"):
        state.backoff(probed.node, unparsable)
    assert probed.node not in made.full

    await until(lambda: bool(state.fresh(probed.node)), what="the prometheus reading")
    assert probed.node not in made.full  # 1 of 4: room
    state.backoff(probed.node, formatdate(time.time() + 3, usegmt=True).encode())  # an HTTP-date
    assert probed.node in made.full and 2 <= made.full[probed.node][1] <= 4
    answer["status"] = 500  # the probe goes blind: it forgets its own reading, not the back-off
    probe = state.probe_of(probed.node)
    assert probe is not None
    await until(lambda: probe.state == "unreachable", what="the failing poll")
    assert [r.source for r in state.fresh(probed.node)] == ["ratelimit"]
    assert probed.node in made.full


async def test_sync_starts_stops_restarts_and_shares(books, caplog) -> None:
    caplog.set_level(logging.INFO, logger="elasticd.probes")
    made, state, serve = books
    full = {"body": b"vllm:num_requests_running 3\nvllm:num_requests_waiting 1\n"}  # 4 of 4
    base, other = await serve(full), await serve(full)
    block = Capacity(probe="prometheus", interval=0.05)
    n1, n2, n4 = node("n1", url=base), node("n2", url=base), node("n4", url=other)
    broken = (node("n3"), Capacity(probe="custom", cls="no_such_module_for_elasticd_tests:Probe"))
    custom = (node("n5", limit=3), Capacity(probe="custom", cls="test_probes_state:Fixed", interval=0.05))
    targets = [(n1, block), (n2, block), broken, (n4, block), custom]
    state.sync(targets)

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if "not started" in r.getMessage()]

    assert len(warned()) == 1 and "no_such_module_for_elasticd_tests" in warned()[0]
    assert state.probe_of(broken[0].node) is None
    probes: dict[str, Probe] = {}
    for t in (n1, n2, n4):
        probe = state.probe_of(t.node)
        assert probe is not None
        probes[t.node] = probe
    assert [probes[t.node].sharing for t in (n1, n2, n4)] == [2, 2, 1]  # one source, two probes: each half as often
    await until(lambda: all(t.node in made.full for t in (n1, n2, n4)), what="the three full readings")
    fixed = state.tightest(custom[0].node)
    assert fixed is not None and (fixed.source, fixed.used, fixed.limit) == ("custom", 1.0, 3.0)

    state.sync(targets)  # the same: nothing restarted, nothing said again
    assert {t.node: state.probe_of(t.node) for t in (n1, n2, n4)} == probes and len(warned()) == 1

    made.rooms.clear()
    state.sync([(n1, block), broken, (n4, block), custom])  # n2 went
    gone = probes[n2.node]
    assert gone.is_stopped and state.probe_of(n2.node) is None
    assert n2.node not in made.full and state.fresh(n2.node) == [] and made.rooms == [(n2.node, KEY)]
    assert made.last_ratio(n2.node) is None
    assert probes[n1.node].sharing == 1  # alone on its source now
    polls = gone.polls
    await asyncio.sleep(0.12)
    assert gone.polls == polls and n2.node not in made.full and state.fresh(n2.node) == []

    slower = Capacity(probe="prometheus", interval=0.08)
    state.sync([(n1, slower), broken, (n4, block), custom])  # n1's block changed: restarted
    old = probes[n1.node]
    assert old.is_stopped
    new = state.probe_of(n1.node)
    assert new is not None and new is not old and not new.is_stopped and new.config is slower
    await until(lambda: n1.node in made.full, what="the restarted probe's reading")
    assert state.probe_of(n4.node) is probes[n4.node] and len(warned()) == 1
