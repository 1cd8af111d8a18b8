"""Requests held for a user being moved (a live move): not forwarded while the user is flagged, dispatched in
order to wherever the user is when the move ends; other users are not touched."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from test_front import client, front, no_errors_logged, run, workers

from elasticd.config.model import Quotas
from elasticd.front import Upstream
from elasticd.front.core.counters import ForwardCounters, RouteStats
from elasticd.front.core.dispatch import Moving, Target, decide
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.parking import Parked, ParkingLot
from elasticd.front.core.relay import Event, Phase
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import Surface, place

__all__ = ["no_errors_logged", "workers"]  # fixtures, used by name

USER = "0123456789abcdef0123456789abcdef"
OTHER = "fedcba9876543210fedcba9876543210"


def _cookie(user: str) -> dict[str, str]:
    return {"Cookie": f"elastic_uid={user}"}


async def _worker_of(request, user: str) -> str:  # type: ignore[no-untyped-def]
    async with request("/", headers=_cookie(user)) as resp:
        assert resp.status == 200
        return (await resp.text()).split()[1]


# ------------------------------------------------------------------ the core: decide and the book


class _W:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id


def _workers(*ids: str):
    """A WorkersFn: the same routable workers for every group."""
    return lambda tenant, app, group: [_W(i) for i in ids]


def _head(cookie: bytes | None) -> RequestHead:
    head = RequestHead()
    head.cookie = cookie
    return head


def test_decide_holds_a_moving_users_request_before_asking_the_quota():
    surface = Surface(60.0)
    surface.assign(USER, "w1", 0.0)
    surface.assign(OTHER, "w1", 0.0)
    target = Target(AppRoute("acme", "shop", "green"), RouteStats(), None)
    forwards = ForwardCounters()
    assert surface.flag(USER) and not surface.flag(USER) and surface.moving == 1
    assert decide(target, _head(b"elastic_uid=" + USER.encode()), 1.0, _workers("w1"), (), surface, place,
                  forwards) == Moving(USER)
    other = decide(target, _head(b"elastic_uid=" + OTHER.encode()), 1.0, _workers("w1"), (), surface, place, forwards)
    assert not isinstance(other, Moving)
    surface.unflag(USER)
    assert surface.moving == 0
    assert not isinstance(decide(target, _head(b"elastic_uid=" + USER.encode()), 1.0, _workers("w1"), (), surface,
                                 place, forwards), Moving)


def test_a_user_off_the_surface_cannot_be_flagged_and_a_flagged_one_does_not_expire():
    surface = Surface(10.0)
    assert not surface.flag(USER)
    surface.assign(USER, "w1", 0.0)
    surface.flag(USER)
    assert surface.expire(100.0) == []  # moving: kept whatever its age
    surface.unflag(USER)
    assert surface.expire(100.0) == [USER]
    surface.assign(OTHER, "w1", 0.0)
    surface.flag(OTHER)
    surface.forget(OTHER)
    assert surface.moving == 0


def test_the_lot_keeps_each_users_requests_in_order_and_says_who_waited_too_long():
    lot: ParkingLot[str] = ParkingLot()
    a, b, c = Exchange(), Exchange(), Exchange()
    lot.park(Parked.MOVE, USER, "conn1", a, 1.0)
    lot.park(Parked.MOVE, OTHER, "conn2", b, 2.0)
    lot.park(Parked.MOVE, USER, "conn3", c, 3.0)
    assert len(lot) == 3 and lot.holds(Parked.MOVE, USER) and lot.keys(Parked.MOVE) == [USER, OTHER]
    assert lot.overdue(Parked.MOVE, 11.5, 10.0) == [USER]  # counted from its first held request
    assert lot.release(Parked.MOVE, USER) == [("conn1", a), ("conn3", c)]
    assert lot.release(Parked.MOVE, USER) == [] and not lot.holds(Parked.MOVE, USER) and len(lot) == 1


def test_one_key_under_two_reasons_is_two_spots_with_their_own_terms():
    lot: ParkingLot[str] = ParkingLot()
    lot.park(Parked.FULL, "acme/shop/green", "conn1", Exchange(), 1.0, retry_after=2, wait=0.5)
    lot.park(Parked.FULL, "acme/shop/green", "conn2", Exchange(), 1.5, retry_after=1, wait=0.25)
    lot.park(Parked.WAKE, "acme/shop/green", "conn3", Exchange(), 2.0)
    assert lot.terms(Parked.FULL, "acme/shop/green") == (2, 0.25)  # the longest Retry-After, the latest wait
    assert (lot.count(Parked.FULL), lot.count(Parked.WAKE), lot.count(Parked.MOVE)) == (2, 1, 0)
    assert [conn for conn, _ in lot.release(Parked.WAKE, "acme/shop/green")] == ["conn3"]
    assert lot.count(Parked.FULL) == 2 and lot.terms(Parked.WAKE, "acme/shop/green") == (0, 0.0)



@pytest.mark.parametrize(("before", "released", "left", "since"), [
    (1.0, [], ["conn1", "conn2", "conn3"], 1.0),  # none held before 1.0
    (1.5, ["conn1"], ["conn2", "conn3"], 2.0),  # each waits its own time: the later ones stay
    (3.0, ["conn1", "conn2"], ["conn3"], 3.0),
    (9.0, ["conn1", "conn2", "conn3"], [], None),  # all of them: the key is gone
])
def test_release_older_lets_each_request_wait_its_own_time(before, released, left, since):
    lot: ParkingLot[str] = ParkingLot()
    for n, at in enumerate((1.0, 2.0, 3.0), 1):
        lot.park(Parked.FULL, "w1", f"conn{n}", Exchange(), at)
    assert [conn for conn, _ in lot.release_older(Parked.FULL, "w1", before)] == released
    assert ([conn for conn, _ in lot.release(Parked.FULL, "w1")] == left if left
            else not lot.holds(Parked.FULL, "w1"))
    if since is not None:  # the key's first request is the oldest still held
        again: ParkingLot[str] = ParkingLot()
        for n, at in enumerate((1.0, 2.0, 3.0), 1):
            again.park(Parked.FULL, "w1", f"conn{n}", Exchange(), at)
        again.release_older(Parked.FULL, "w1", before)
        assert (again.overdue(Parked.FULL, since + 0.5, 0.4) == ["w1"]
                and again.overdue(Parked.FULL, since + 0.3, 0.4) == [])
    assert lot.release_older(Parked.FULL, "nobody", 5.0) == []


# ------------------------------------------------------------------ the front, over sockets


def test_a_moving_users_requests_wait_and_go_in_order_to_its_new_worker(workers: list[Upstream],
                                                                          no_errors_logged: None) -> None:
    async def scenario() -> tuple[list[str], int, list[str], str]:
        async with front(workers) as f, client(f) as request:
            f.surface.assign(USER, "w1", f.clock())
            f.surface.assign(OTHER, "w1", f.clock())
            assert await _worker_of(request, USER) == "w1"
            f.surface.flag(USER)
            waiting = [asyncio.create_task(_worker_of(request, USER)) for _ in range(5)]
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 5
            while f.waiting.parked.count(Parked.MOVE) < 5 and loop.time() < deadline:  # (all five arrived)
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.1)  # (and stay held)
            held = f.waiting.parked.count(Parked.MOVE)
            assert not any(t.done() for t in waiting)  # none was forwarded
            others = await _worker_of(request, OTHER)  # another user is served meanwhile
            f.surface.assign(USER, "w2", f.clock())  # SWITCH
            released = f.release(USER)
            return [await t for t in waiting], held, [others], str(released)

    answered, held, others, released = run(scenario())
    assert answered == ["w2"] * 5 and held == 5 and others == ["w1"] and released == "5"


def test_an_aborted_move_sends_the_held_requests_to_the_old_worker(workers: list[Upstream]) -> None:
    async def scenario() -> list[str]:
        async with front(workers) as f, client(f) as request:
            f.surface.assign(USER, "w1", f.clock())
            f.surface.flag(USER)
            waiting = [asyncio.create_task(_worker_of(request, USER)) for _ in range(3)]
            await asyncio.sleep(0.2)
            f.release(USER)  # the move aborted: the user is where it was
            return [await t for t in waiting]

    assert run(scenario()) == ["w1"] * 3


def test_pipelined_requests_behind_a_held_one_wait_with_it(workers: list[Upstream]) -> None:
    async def scenario() -> tuple[bytes, bytes]:
        async with front(workers) as f:
            f.surface.assign(USER, "w1", f.clock())
            f.surface.flag(USER)
            reader, writer = await asyncio.open_connection("127.0.0.1", f.port)
            one = (f"GET /echo?n=%d HTTP/1.1\r\nHost: shop.localhost\r\nCookie: elastic_uid={USER}\r\n\r\n")
            writer.write((one % 1 + one % 2).encode())
            early = b""
            with contextlib.suppress(TimeoutError):
                early = await asyncio.wait_for(reader.read(100), 0.3)
            f.surface.assign(USER, "w2", f.clock())
            f.release(USER)
            data = b""
            while data.count(b"HTTP/1.1 200") < 2:
                chunk = await asyncio.wait_for(reader.read(65536), 5)
                assert chunk
                data += chunk
            writer.close()
            return early, data

    early, data = run(scenario())
    assert early == b"" and data.count(b"HTTP/1.1 200") == 2


def test_held_requests_take_no_quota_slot_and_a_client_that_left_is_skipped(workers: list[Upstream],
                                                                            no_errors_logged: None) -> None:
    async def scenario() -> tuple[int, int, list[str]]:
        async with front(workers, quotas={"acme": Quotas(max_concurrent_requests=2)}) as f, client(f) as request:
            f.surface.assign(USER, "w1", f.clock())
            f.surface.flag(USER)
            gone = asyncio.create_task(_worker_of(request, USER))
            waiting = [asyncio.create_task(_worker_of(request, USER)) for _ in range(2)]
            await asyncio.sleep(0.2)
            in_flight = f.quotas.get("acme").gate.in_flight
            gone.cancel()  # its client gives up while held
            await asyncio.sleep(0.1)
            f.surface.assign(USER, "w2", f.clock())
            released = f.release(USER)
            return in_flight, released, [await task for task in waiting]

    in_flight, released, got = run(scenario())
    assert in_flight == 0 and released in (2, 3) and got == ["w2", "w2"]


def test_requests_held_past_the_move_timeout_are_released_by_the_front(workers: list[Upstream],
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> tuple[str, float]:
        async with front(workers, move_timeout=0.2) as f, client(f) as request:
            f.surface.assign(USER, "w1", f.clock())
            f.surface.flag(USER)  # and the move never ends
            started = f.clock()
            worker = await _worker_of(request, USER)
            return worker, f.clock() - started

    with caplog.at_level(logging.WARNING, logger="elasticd.front"):
        worker, waited = run(scenario())
    assert worker == "w1" and 1.0 < waited < 3.5
    assert any("parked past the move timeout" in r.getMessage() for r in caplog.records)


def test_a_held_exchange_is_held_in_the_table_and_released_to_be_dispatched_again():
    ex = Exchange()
    ex.advance(Event.PARK)
    assert ex.phase is Phase.PARKED
    ex.advance(Event.RELEASE)
    assert ex.phase is Phase.QUEUED


def test_a_user_pinned_to_a_worker_being_emptied_is_served_there_until_its_move():
    surface = Surface(60.0)
    surface.assign(USER, "w2", 0.0)
    surface.assign(OTHER, "w2", 0.0)
    surface.pin(USER)  # waits its turn to be moved off w2, which takes no one new
    target = Target(AppRoute("acme", "shop", "green"), RouteStats(), None)
    kept = {"w2": _W("w2")}
    pinned = decide(target, _head(b"elastic_uid=" + USER.encode()), 1.0, _workers("w1"), (), surface, place,
                    ForwardCounters(), kept.get)
    assert not isinstance(pinned, Moving) and pinned[0].worker_id == "w2"
    other = decide(target, _head(b"elastic_uid=" + OTHER.encode()), 1.0, _workers("w1"), (), surface, place,
                   ForwardCounters(), kept.get)
    assert not isinstance(other, Moving) and other[0].worker_id == "w1"  # not pinned: re-placed
    dead = decide(target, _head(b"elastic_uid=" + USER.encode()), 1.0, _workers("w1"), ("w2",), surface, place,
                  ForwardCounters(), kept.get)
    assert not isinstance(dead, Moving) and dead[0].worker_id == "w1"  # a kept worker found dead is not used
    surface.assign(USER, "w1", 2.0)
    assert not surface.get(USER).pinned  # moved: no longer pinned
