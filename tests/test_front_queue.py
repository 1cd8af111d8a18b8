"""The group queue's parts, as tables: dispatch's hold-or-queue decision over saturated workers, the parking
lot's QUEUE spot (who takes a freed slot, who times out: time passed in), the forward counters' saturation, and how
often the queue's shell asks the pool's burst check (on a front never started)."""

from __future__ import annotations

import random

import pytest

from elasticd.config.model import Address, Quotas
from elasticd.front import Front, RouteTable
from elasticd.front.core import sticky
from elasticd.front.core.counters import ForwardCounters, WorkerCounters
from elasticd.front.core.dispatch import Queued, Target, decide
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.parking import PARKED_QUEUE, PARKED_WAKE, ParkingLot
from elasticd.front.core.quota import TenantQuota
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import Surface, place
from elasticd.front.queueing import BURST_ASK_EVERY

USER = "80000000" + "0" * 24


class _W:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id


def _head(cookie: str | None) -> RequestHead:
    head = RequestHead()
    head.cookie = f"elastic_uid={cookie}".encode() if cookie else None
    return head


# (name, the group's workers, the sticky user's worker (None: a new user; "pinned:" one being emptied from it),
#  the saturated ones, what comes: the worker forwarded to, or Queued's wants)
QUEUE = [
    ("nothing saturated: the reception", ["w1", "w2"], None, [], "w1"),
    ("the reception saturated: a new user goes where there is room", ["w1", "w2"], None, ["w1"], "w2"),
    ("all saturated: a new user waits for any", ["w1", "w2"], None, ["w1", "w2"], Queued("acme/shop/green", "")),
    ("a sticky user's worker has room", ["w1", "w2"], "w2", ["w1"], "w2"),
    ("a sticky user waits for its own worker, though another has room", ["w1", "w2"], "w2", ["w2"],
     Queued("acme/shop/green", "w2")),
    ("a sticky user whose worker went: placed where there is room", ["w1", "w2"], "gone", ["w1"], "w2"),
    ("a sticky user whose worker went, all saturated: any", ["w1"], "gone", ["w1"], Queued("acme/shop/green", "")),
    ("saturated workers not of this group change nothing", ["w1"], None, ["other"], "w1"),
]


@pytest.mark.parametrize(("name", "ids", "sticky", "saturated", "outcome"), QUEUE, ids=[row[0] for row in QUEUE])
def test_the_queue_decision(name, ids, sticky, saturated, outcome):
    surface, forwards = Surface(60.0), ForwardCounters()
    quota = TenantQuota(Quotas(max_concurrent_requests=4), 0.0)
    target = Target(AppRoute("acme", "shop", "green", label="acme/shop"), forwards.route("acme", "shop"), quota)
    cookie = None
    if sticky is not None:
        cookie = USER
        surface.assign(USER, sticky, 0.0, "green", "acme/shop")
    workers = [_W(i) for i in ids]
    answer = decide(target, _head(cookie), 1.0, lambda t, a, g: workers, (), surface, place, forwards,
                    saturated=set(saturated))
    if isinstance(outcome, Queued):
        assert answer == outcome
        assert quota.gate.in_flight == 0  # a queued request holds no quota slot while it waits
    else:
        assert type(answer) is tuple and answer[0].worker_id == outcome
        assert quota.gate.in_flight == 1


def test_a_new_user_that_waits_is_given_its_id_once_it_goes():
    """A waiting request is decided again when it leaves the queue: its new user's id is made then, not twice."""
    surface, forwards = Surface(60.0), ForwardCounters()
    target = Target(AppRoute("acme", "shop", "green", label="acme/shop"), forwards.route("acme", "shop"), None)
    workers = [_W("w1")]
    drawn = (sticky._random.block, sticky._random.pos)
    queued = decide(target, _head(None), 1.0, lambda t, a, g: workers, (), surface, place, forwards,
                    saturated={"w1"})
    assert queued == Queued("acme/shop/green", "")
    assert (sticky._random.block, sticky._random.pos) == drawn  # no id drawn for it
    went = decide(target, _head(None), 2.0, lambda t, a, g: workers, (), surface, place, forwards)
    assert type(went) is tuple and len(went[1]) == 32
    assert went[3].startswith(b"Set-Cookie: elastic_uid=" + went[1].encode())


def test_a_pinned_user_goes_to_the_worker_it_is_emptied_from_whatever_is_saturated():
    surface, forwards = Surface(60.0), ForwardCounters()
    target = Target(AppRoute("acme", "shop", "green", label="acme/shop"), forwards.route("acme", "shop"), None)
    surface.assign(USER, "old", 0.0, "green", "acme/shop")
    surface.users[USER].pinned = True
    old = _W("old")
    answer = decide(target, _head(USER), 1.0, lambda t, a, g: [_W("w1")], (), surface, place, forwards,
                    lambda worker: old if worker == "old" else None, saturated={"w1"})
    assert type(answer) is tuple and answer[0] is old


# -- the parking lot's QUEUE spot: who takes a freed slot, who has waited too long (time passed in) --------------

def _parked(lot: ParkingLot[str], rows: list[tuple[str, str, float]]) -> dict[str, Exchange]:
    exchanges = {}
    for name, wants, at in rows:
        exchanges[name] = ex = Exchange()
        lot.park(PARKED_QUEUE, "acme/shop/green", name, ex, at, wants=wants, wait=5.0)
    return exchanges


# (name, parked: (client, wants, when), the freed worker, who takes the slot; the group's workers are w1 and w2)
TAKES = [
    ("the oldest that wants any", [("a", "", 1.0), ("b", "", 2.0)], "w1", "a"),
    ("the oldest that wants this one", [("a", "w2", 1.0), ("b", "w1", 2.0), ("c", "", 3.0)], "w1", "b"),
    ("one that wants any before a later one for this worker", [("a", "w2", 1.0), ("b", "", 2.0),
                                                              ("c", "w1", 3.0)], "w1", "b"),
    ("one whose worker went: placed again, as one that wants any", [("a", "w2", 1.0), ("b", "gone", 2.0)], "w1",
     "b"),
    ("none wants it: the slot stays free", [("a", "w2", 1.0)], "w1", None),
]


@pytest.mark.parametrize(("name", "rows", "freed", "taker"), TAKES, ids=[row[0] for row in TAKES])
def test_a_freed_slot_goes_to_the_oldest_that_wants_it(name, rows, freed, taker):
    lot: ParkingLot[str] = ParkingLot()
    _parked(lot, rows)
    found = lot.take_first(PARKED_QUEUE, "acme/shop/green", [freed], ["w1", "w2"])
    assert (found[0] if found is not None else None) == taker
    assert lot.depth("acme/shop/green") == len(rows) - (taker is not None)


def test_each_waits_its_own_timeout_and_the_depth_counts_wake_and_queue_together():
    lot: ParkingLot[str] = ParkingLot()
    _parked(lot, [("a", "", 1.0), ("b", "w1", 2.0), ("c", "", 4.0)])
    lot.park(PARKED_WAKE, "acme/shop/green", "d", Exchange(), 3.0)
    assert lot.depth("acme/shop/green") == 4 and lot.depth("acme/shop/blue") == 0
    assert lot.terms(PARKED_QUEUE, "acme/shop/green") == (0, 5.0)  # the group's queue.timeout, said at park
    # at 7.5, with a 5 s timeout: those that came before 2.5 are overdue, oldest first; the rest wait on
    assert [client for client, _ in lot.release_older(PARKED_QUEUE, "acme/shop/green", 7.5 - 5.0)] == ["a", "b"]
    found = lot.take_first(PARKED_QUEUE, "acme/shop/green", ["w1"], ["w1"])
    assert found is not None and found[0] == "c" and found[2] == 4.0
    assert not lot.holds(PARKED_QUEUE, "acme/shop/green") and lot.depth("acme/shop/green") == 1


def test_a_slot_on_another_worker_skips_what_waits_for_a_saturated_one_without_walking_it():
    """Requests of sticky users piled up for one saturated worker (w2) do not make a slot on another (w1) look at
    each of them: the oldest that may go is taken, and those for w2 keep their order and their times."""
    lot: ParkingLot[str] = ParkingLot()
    _parked(lot, [(f"sticky{n}", "w2", float(n)) for n in range(5000)] + [("new", "", 6000.0), ("w1's", "w1", 6001.0)])
    assert lot.take_first(PARKED_QUEUE, "acme/shop/green", ["w1"], ["w1", "w2"])[0] == "new"
    assert lot.take_first(PARKED_QUEUE, "acme/shop/green", ["w1"], ["w1", "w2"])[0] == "w1's"
    assert lot.take_first(PARKED_QUEUE, "acme/shop/green", ["w1"], ["w1", "w2"]) is None
    spot = lot._spots[PARKED_QUEUE]["acme/shop/green"]
    assert spot.order[0].client == "sticky0" and len(spot.order) <= 2 * spot.count + 64
    assert lot.overdue(PARKED_QUEUE, 10.0, 9.5) == ["acme/shop/green"]  # counted from the oldest still there
    assert [client for client, _ in lot.release_older(PARKED_QUEUE, "acme/shop/green", 2.0)] == ["sticky0", "sticky1"]
    assert lot.take_first(PARKED_QUEUE, "acme/shop/green", ["w2"], ["w1", "w2"])[0] == "sticky2"
    assert lot.depth("acme/shop/green") == 4997


def test_the_lot_takes_and_releases_as_a_walk_from_the_oldest_would():
    """Random parks, takes and timeouts (seeded), against the plain walk the lot replaces (the reference)."""
    rng = random.Random(20261204)
    lot: ParkingLot[str] = ParkingLot()
    reference: list[tuple[str, str, float]] = []  # (client, wants, when), oldest first
    workers = ["w1", "w2", "w3"]
    now = 0.0
    for step in range(20_000):
        now += rng.random() * 0.01
        roll = rng.random()
        if roll < 0.5:
            wants = rng.choice(["", "", "w1", "w2", "w2", "w2", "gone"])
            lot.park(PARKED_QUEUE, "g", f"r{step}", Exchange(), now, wants=wants, wait=1.0)
            reference.append((f"r{step}", wants, now))
        elif roll < 0.95:
            free = rng.sample(workers, rng.randint(1, 2))
            found = lot.take_first(PARKED_QUEUE, "g", free, workers)
            expected = next((r for r in reference if not r[1] or r[1] in free or r[1] not in workers), None)
            assert (found[0], found[2]) == (expected[0], expected[2]) if expected else found is None, step
            if expected:
                reference.remove(expected)
        else:
            before = now - rng.random() * 0.5
            released = [client for client, _ in lot.release_older(PARKED_QUEUE, "g", before)]
            assert released == [r[0] for r in reference if r[2] < before], step
            reference = [r for r in reference if r[2] >= before]
        assert lot.depth("g") == len(reference)
        assert lot.holds(PARKED_QUEUE, "g") is bool(reference)
        first = reference[0][2] if reference else None
        assert lot.overdue(PARKED_QUEUE, now, 0.2) == (["g"] if first is not None and now - first > 0.2 else [])
    assert [client for client, _ in lot.release(PARKED_QUEUE, "g")] == [r[0] for r in reference]


# -- the forward counters: saturated at the concurrency, room handed to the queue first ---------------------------

def _worker(forwards: ForwardCounters, concurrency: int) -> WorkerCounters:
    counters = forwards.worker("w1")
    counters.group = "acme/shop/green"
    forwards.bound(counters, concurrency)
    return counters


def test_a_worker_is_saturated_at_its_concurrency_and_has_room_below_it():
    forwards = ForwardCounters()
    counters = _worker(forwards, 2)
    forwards.forwarded(counters)
    assert forwards.saturated == set()
    forwards.forwarded(counters)
    assert forwards.saturated == {"w1"}
    forwards.ended(counters)
    assert forwards.saturated == set() and counters.in_flight == 1


def test_room_waits_for_the_queue_when_the_front_says_so():
    forwards = ForwardCounters()
    told: list[str] = []
    keep_for_the_queue = True

    def on_free(counters: WorkerCounters) -> bool:
        told.append(counters.worker)
        return not keep_for_the_queue

    forwards.on_free = on_free
    counters = _worker(forwards, 1)
    forwards.forwarded(counters)
    forwards.ended(counters)
    assert told == ["w1"] and forwards.saturated == {"w1"}  # kept until the queue's drain hands the slot over
    keep_for_the_queue = False
    forwards.forwarded(counters)
    forwards.ended(counters)
    assert forwards.saturated == set()


@pytest.mark.parametrize(("in_flight", "before", "after", "saturated"), [
    (2, 2, 4, False),  # raised by a reload: room at once
    (2, 4, 2, True),  # lowered: saturated at once
    (1, 4, 2, False),
])
def test_a_new_concurrency_saturates_or_frees_at_once(in_flight, before, after, saturated):
    forwards = ForwardCounters()
    counters = _worker(forwards, before)
    for _ in range(in_flight):
        forwards.forwarded(counters)
    forwards.bound(counters, after)
    assert ("w1" in forwards.saturated) is saturated


# -- the pool's burst check, told of queued requests: at once for a group's first, then at most every
#    BURST_ASK_EVERY while its requests keep queueing (a flood must not run the pool's Python per request) ---------

def _front() -> tuple[Front, list[tuple[str, str, str]]]:
    """A front (never started) whose queue tells the burst checks it asks to the list."""
    front = Front(Address("127.0.0.1", 0), RouteTable({}), lambda tenant, app, group: [])
    asked: list[tuple[str, str, str]] = []
    front.waiting.on_queued = asked.append
    return front, asked


# (name, when each request of the group queues, which of them ask the burst check)
BURSTS = [
    ("the first at once", [10.0], [True]),
    ("a flood: the first, then one per BURST_ASK_EVERY", [10.0, 10.01, 10.049, 10.05, 10.06, 10.2],
     [True, False, False, True, False, True]),
]


@pytest.mark.parametrize(("name", "times", "asks"), BURSTS, ids=[row[0] for row in BURSTS])
def test_the_burst_check_is_asked_at_once_then_at_most_every_interval(name, times, asks):
    front, asked = _front()
    queue = front.waiting.queue
    target = Target(AppRoute("acme", "shop", "green", label="acme/shop"), front.forwards.route("acme", "shop"), None)
    for at, ask in zip(times, asks, strict=True):
        before = len(asked)
        queue.enqueue(Queued("acme/shop/green", ""), target, front.listening.connection(), Exchange(), at)
        assert (len(asked) > before) is ask, at
    assert front.waiting.parked.depth("acme/shop/green") == len(times)  # each waits, asked or not
    assert set(asked) == {("acme", "shop", "green")}


def test_groups_are_asked_for_apart_and_forgotten_once_quiet():
    front, asked = _front()
    queue = front.waiting.queue
    routes = {name: Target(AppRoute("acme", name, "green", label=f"acme/{name}"), front.forwards.route("acme", name),
                           None) for name in ("shop", "blog")}
    queue.enqueue(Queued("acme/shop/green", ""), routes["shop"], front.listening.connection(), Exchange(), 10.0)
    queue.enqueue(Queued("acme/blog/green", ""), routes["blog"], front.listening.connection(), Exchange(), 10.01)
    assert asked == [("acme", "shop", "green"), ("acme", "blog", "green")]
    queue.forget_asked(10.0 + BURST_ASK_EVERY)  # the front's tick: shop's ask is old, blog's is not
    queue.enqueue(Queued("acme/blog/green", ""), routes["blog"], front.listening.connection(), Exchange(),
                  10.0 + BURST_ASK_EVERY)
    assert len(asked) == 2
    queue.enqueue(Queued("acme/shop/green", ""), routes["shop"], front.listening.connection(), Exchange(),
                  10.0 + BURST_ASK_EVERY)
    assert len(asked) == 3  # forgotten: asked again at once
    queue.forget_asked(100.0)
    assert not queue._asked  # nothing kept for groups that stopped queueing
