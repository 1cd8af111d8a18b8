"""Live moves end to end: a real front, real demo workers running the library on a real channel, the Mover.
A user's /counter goes on from where it was on the other worker; requests sent during the move are held and
answered, none reaching the target before the install; every failure leaves the user on its worker with its
state."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from test_demo import DemoWorker
from test_front import front
from test_pool_channel_server import Registry, serve_channel

from elasticd.frames import encode
from elasticd.front import Front, Upstream
from elasticd.pool.channel_server import ChannelServer
from elasticd.pool.move_machine import Move, MoveSummary, Outcome
from elasticd.pool.mover import Mover

USER = "0123456789abcdef0123456789abcdef"


class Setup:
    def __init__(self, f: Front, mover: Mover, channel: ChannelServer, registry: Registry,
                 workers: dict[str, DemoWorker], ended: list[MoveSummary]) -> None:
        self.front, self.mover, self.channel, self.registry = f, mover, channel, registry
        self.workers, self.ended = workers, ended

    async def counter(self, session: aiohttp.ClientSession, user: str = USER) -> dict[str, Any]:
        async with session.get(f"http://127.0.0.1:{self.front.port}/counter",
                               headers={"Host": "shop.localhost", "Cookie": f"elastic_uid={user}"}) as resp:
            assert resp.status == 200, await resp.text()
            return json.loads(await resp.text())


@asynccontextmanager
async def live(tmp_path: Path, names: tuple[str, ...] = ("w1", "w2"), sensorless: bool = False,
               package_limit: int = 16 << 20) -> AsyncIterator[Setup]:
    registry = Registry()
    channel = await serve_channel(tmp_path, registry)
    workers: dict[str, DemoWorker] = {}
    try:
        for name in names:
            token = f"token-{name}"
            worker = DemoWorker(name, f"unix:{tmp_path}/{name}.sock",
                                env={"ELASTIC_CHANNEL": f"unix:{channel.path('t')}", "ELASTIC_WORKER_ID": name,
                                     "ELASTIC_TOKEN": token, "ELASTIC_OCCUPANCY_INTERVAL": "0.5",
                                     "DEMO_SENSORLESS": "1" if sensorless else "0"})
            registry.workers[name] = (token, worker.proc.pid)
            workers[name] = worker
        for _ in range(0 if sensorless else 500):
            if all(channel.capabilities(name) for name in names):
                break
            await asyncio.sleep(0.02)
        upstreams = [Upstream(name, w.socket_path or "") for name, w in workers.items()]
        ended: list[MoveSummary] = []
        async with front(upstreams) as f:
            mover = Mover(f, channel, on_end=lambda move, summary: ended.append(summary),
                          package_limit=lambda worker_id: package_limit)
            yield Setup(f, mover, channel, registry, workers, ended)
    finally:
        for worker in workers.values():
            worker.stop()
        await channel.stop()


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())


async def test_a_users_counter_goes_on_from_the_other_worker(tmp_path: Path) -> None:
    async with live(tmp_path) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        for _ in range(5):
            last = await s.counter(session)
        assert (last["worker"], last["count"]) == ("w1", 5)
        move = await s.mover.move(USER, "w1", "w2", 5.0)
        assert isinstance(move, Move) and move.outcome is Outcome.MOVED
        after = await s.counter(session)
        assert (after["worker"], after["count"]) == ("w2", 6)
        summary = s.ended[0]
        assert summary.outcome is Outcome.MOVED and summary.package_bytes and summary.seconds < 1.0
        assert s.front.surface.get(USER).worker == "w2" and not s.front.surface.get(USER).moving
        # The old worker forgot the user: moving it back starts from what w2 has, not a stale copy.
        back = await s.mover.move(USER, "w2", "w1", 5.0)
        assert isinstance(back, Move) and back.outcome is Outcome.MOVED
        again = await s.counter(session)
        assert (again["worker"], again["count"]) == ("w1", 7)


async def test_a_package_over_the_groups_limit_aborts_the_move_and_the_user_keeps_its_state(tmp_path: Path) -> None:
    async with live(tmp_path, package_limit=16) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        for _ in range(3):
            await s.counter(session)
        move = await s.mover.move(USER, "w1", "w2", 5.0)
        assert isinstance(move, Move) and move.outcome is Outcome.SOURCE_REFUSED
        assert "is over the 16 allowed" in move.summary().why
        assert s.channel.refusals()[("t", "", "answer-too-big")] == 1
        # The user is where it was, with its state: w1's channel reconnects and the counter goes on.
        after = await s.counter(session)
        assert (after["worker"], after["count"]) == ("w1", 4)


async def test_a_worker_without_the_library_is_moved_by_re_pointing_after_the_quiesce(tmp_path: Path) -> None:
    async with live(tmp_path, sensorless=True) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        assert (await s.counter(session))["worker"] == "w1"
        move = await s.mover.move(USER, "w1", "w2", 5.0)
        assert isinstance(move, Move) and move.outcome is Outcome.MOVED and not move.stateful
        assert move.summary().package_bytes is None
        after = await s.counter(session)
        assert after["worker"] == "w2" and after["count"] == 1  # its in-process state stayed behind: no library


async def test_requests_sent_during_the_move_are_all_answered_and_none_races_it(tmp_path: Path) -> None:
    async with live(tmp_path) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        for _ in range(5):
            await s.counter(session)

        async def slow() -> int:  # open on w1 when the move begins: the quiesce waits for it, never cuts it
            async with session.get(f"http://127.0.0.1:{s.front.port}/sleep?ms=300",
                                   headers={"Host": "shop.localhost", "Cookie": f"elastic_uid={USER}"}) as resp:
                return resp.status

        sleeping = asyncio.create_task(slow())
        await asyncio.sleep(0.1)
        moving = asyncio.create_task(s.mover.move(USER, "w1", "w2", 5.0))
        during = await asyncio.gather(*(s.counter(session) for _ in range(20)))
        move = await moving
        assert isinstance(move, Move) and move.outcome is Outcome.MOVED
        assert await sleeping == 200 and move.summary().seconds >= 0.15
        # One count each, 6 to 25, whichever worker answered: a request that reached w2 before the install
        # would have counted from 1 there.
        assert sorted(a["count"] for a in during) == list(range(6, 26))
        on_w1 = [a["count"] for a in during if a["worker"] == "w1"]
        on_w2 = [a["count"] for a in during if a["worker"] == "w2"]
        assert on_w2 and max(on_w1, default=5) < min(on_w2)  # w1's before the move, w2's after
        print(f"during the move: {len(on_w1)} answered by w1, {len(on_w2)} held and answered by w2")
        assert (await s.counter(session))["count"] == 26


async def _fake_worker(channel: ChannelServer, registry: Registry, name: str, behave: str) -> asyncio.StreamWriter:
    """A peer on the channel (this test process) that announces the move capabilities, then on an install
    either never answers (``silent``) or closes its connection (``dies``)."""
    registry.workers[name] = ("t", os.getpid())
    reader, writer = await asyncio.open_unix_connection(channel.path("t"))
    writer.write(encode({"type": "announce", "worker": name, "token": "t",
                         "capabilities": ["occupancy", "snapshot", "install"]}))
    await writer.drain()
    await reader.readline()

    async def serve() -> None:
        while line := await reader.readline():
            message = json.loads(line)
            if "bytes" in message:
                await reader.readexactly(message["bytes"])
            if message.get("type") == "install" and behave == "dies":
                writer.close()
                return

    asyncio.get_running_loop().create_task(serve())
    return writer


@pytest.mark.parametrize(("behave", "outcome"), [("silent", Outcome.TARGET_TIMEOUT),
                                                 ("dies", Outcome.TARGET_REFUSED)])
async def test_a_target_that_fails_leaves_the_user_on_its_worker_with_its_counter(tmp_path: Path, behave: str,
                                                                                   outcome: Outcome) -> None:
    async with live(tmp_path, ("w1",)) as s, _session() as session:
        writer = await _fake_worker(s.channel, s.registry, "w9", behave)
        s.front.surface.assign(USER, "w1", s.front.clock())
        for _ in range(3):
            await s.counter(session)
        held = asyncio.create_task(s.mover.move(USER, "w1", "w9", 0.5))
        await asyncio.sleep(0.05)
        during = asyncio.create_task(s.counter(session))  # held while the move lasts, then served by w1
        move = await held
        assert isinstance(move, Move) and move.outcome is outcome and move.release_to == "w1"
        assert (await during)["count"] == 4 and (await during)["worker"] == "w1"
        assert (await s.counter(session))["count"] == 5
        assert s.front.surface.get(USER).worker == "w1" and not s.front.surface.get(USER).moving
        writer.close()


async def test_a_source_that_dies_mid_move_places_the_user_anew(tmp_path: Path) -> None:
    async with live(tmp_path) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        await s.counter(session)
        s.front.forwards.open[999] = _Open(USER)  # an open request keeps the move quiescing
        moving = asyncio.create_task(s.mover.move(USER, "w1", "w2", 5.0))
        await asyncio.sleep(0.1)
        s.mover.worker_died("w1")  # the supervisor saw it exit
        move = await moving
        assert isinstance(move, Move) and move.outcome is Outcome.SOURCE_DIED and move.release_to is None
        assert s.front.surface.get(USER).worker == ""  # placed anew at its next request
        del s.front.forwards.open[999]


class _Before:
    """The real channel, with ``before(message)`` run as each request goes out (to kill a worker at that moment)."""

    def __init__(self, channel: ChannelServer, before: Callable[[dict[str, Any]], None]) -> None:
        self.channel, self.before = channel, before
        self.capabilities, self.tell = channel.capabilities, channel.tell

    async def request(self, worker_id: str, message: dict[str, Any], timeout: float,
                      payload: bytes | None = None, **options: Any) -> tuple[dict[str, Any], bytes | None]:
        self.before(message)
        return await self.channel.request(worker_id, message, timeout, payload, **options)


class _Open:
    def __init__(self, user: str) -> None:
        self.user, self.worker, self.ts = user, "w1", 0.0
        self.started = self.live = True


async def test_a_second_move_of_a_moving_user_and_a_user_off_the_surface_are_refused(tmp_path: Path) -> None:
    async with live(tmp_path) as s:
        assert await s.mover.move(USER, "w1", "w2", 1.0) == f"{USER} is not on the surface"
        s.front.surface.assign(USER, "w1", s.front.clock())
        # A move planned from where the user was is refused once it is elsewhere: nothing stale is installed.
        assert await s.mover.move(USER, "w2", "w1", 1.0) == f"{USER} is on w1, not on w2"
        s.front.forwards.open[999] = _Open(USER)  # keeps the first move quiescing
        first = asyncio.create_task(s.mover.move(USER, "w1", "w2", 0.3))
        await asyncio.sleep(0.05)
        assert await s.mover.move(USER, "w1", "w2", 1.0) == f"{USER} is already being moved (w1 to w2)"
        move = await first
        assert isinstance(move, Move) and move.outcome is Outcome.QUIESCE_TIMEOUT
        del s.front.forwards.open[999]


async def test_a_target_killed_as_it_is_sent_the_package_leaves_the_user_on_its_worker(tmp_path: Path) -> None:
    """The target demo worker is SIGKILLed at the moment the install goes out: the move aborts (the target's
    channel closes, or it never answers), and the user goes on on its worker with its counter."""
    async with live(tmp_path, ("w1", "w2")) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        for _ in range(4):
            await s.counter(session)
        def kill_target(message: dict[str, Any]) -> None:
            if message.get("type") == "install":
                s.workers["w2"].proc.kill()
                s.workers["w2"].proc.wait()

        mover = Mover(s.front, _Before(s.channel, kill_target))
        move = await mover.move(USER, "w1", "w2", 2.0)
        assert isinstance(move, Move) and move.outcome in (Outcome.TARGET_REFUSED, Outcome.TARGET_TIMEOUT)
        assert move.release_to == "w1"
        after = await s.counter(session)
        assert (after["worker"], after["count"]) == ("w1", 5)


async def test_a_source_killed_as_it_is_asked_for_the_package_places_its_user_anew(tmp_path: Path) -> None:
    """The source's channel closes (it was SIGKILLed) a moment before its exit is seen: the move ends as the
    source's death, and the user, with its held requests, is placed anew rather than sent to a dead worker."""
    async with live(tmp_path, ("w1", "w2")) as s, _session() as session:
        s.front.surface.assign(USER, "w1", s.front.clock())
        await s.counter(session)
        loop = asyncio.get_running_loop()
        mover: Mover

        def gone(worker_id: str) -> None:  # what the daemon does when the supervisor sees a worker exit
            routable = s.front.workers_of("acme", "shop", "green")
            routable[:] = [u for u in routable if u.worker_id != worker_id]  # type: ignore[index]
            s.front.close_upstream(worker_id)
            mover.worker_died(worker_id)

        def kill_source(message: dict[str, Any]) -> None:  # its exit is seen 50 ms after its channel closed
            if message.get("type") == "snapshot":
                s.workers["w1"].proc.kill()
                s.workers["w1"].proc.wait()
                loop.call_later(0.05, gone, "w1")

        mover = Mover(s.front, _Before(s.channel, kill_source))
        move = await mover.move(USER, "w1", "w2", 2.0)
        assert isinstance(move, Move) and move.outcome is Outcome.SOURCE_DIED and move.release_to is None
        after = await s.counter(session)
        assert after["worker"] == "w2" and after["count"] == 1  # placed anew; its state died with w1

