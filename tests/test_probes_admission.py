"""Admission on capacity readings (seed 001) in the front's decision (front/core/dispatch.py ``decide`` with its
``full`` map: worker id → (until, retry_after, wait)): a full worker takes nothing; a new user goes to one with
room; a sticky user waits for room on its own worker (``NoRoom``), never re-placed; every worker full is a ``NoRoom``
for the group, its quota slot given back; readings only ever narrow. Tables; time passed in."""

from __future__ import annotations

from typing import Any

import pytest

from elasticd.config.model import Quotas
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.core.dispatch import NoRoom, Refuse, Target, decide
from elasticd.front.core.http1 import RequestHead
from elasticd.front.core.quota import TenantQuota
from elasticd.front.core.routing import AppRoute
from elasticd.front.core.sticky import Surface, place

ROUTE = AppRoute("acme", "shop", "green", None, 0.0, frozenset({"green"}), "acme/shop")
GROUP = "acme/shop/green"
USER = "a" * 32
NOW = 100.0


def _head(cookie: str | None) -> RequestHead:
    head = RequestHead()
    head.cookie = f"elastic_uid={cookie}".encode() if cookie else None
    return head


class _W:
    def __init__(self, worker_id: str) -> None:
        self.worker_id = worker_id

    def __repr__(self) -> str:
        return f"_W({self.worker_id!r})"


def _workers(*ids: str):  # type: ignore[no-untyped-def]
    made = [_W(i) for i in ids]
    return lambda tenant, app, group: made if (tenant, app, group) == ("acme", "shop", "green") else []


def _full(until: float = NOW + 5, retry_after: int = 2, wait: float = 1.0) -> tuple[float, int, float]:
    return (until, retry_after, wait)


def _run(user: str, full: dict[str, tuple[float, int, float]] | None, *, routable: tuple[str, ...] = ("w1", "w2"),
         unroutable: tuple[str, ...] = (), kept: tuple[str, ...] = (), quota: TenantQuota | None = None
         ) -> tuple[Any, Surface]:
    """``user``: "new" (no cookie), "sticky:W" (a cookie, on the surface on W), "pinned:W" (and pinned there)."""
    surface = Surface(60.0)
    cookie = None
    if user != "new":
        how, _, worker = user.partition(":")
        surface.assign(USER, worker, 1.0, "green", "acme/shop")
        if how == "pinned":
            surface.pin(USER)
        cookie = USER
    keeping = {k: _W(k) for k in kept}
    forwards = ForwardCounters()
    target = Target(ROUTE, forwards.route("acme", "shop"), quota)
    decision = decide(target, _head(cookie), NOW, _workers(*routable), unroutable, surface, place, forwards,
                      keeping.get, None, full)
    return decision, surface


def _where(decision: Any) -> Any:
    """A forward's worker id, else the decision itself."""
    return decision[0].worker_id if isinstance(decision, tuple) and not isinstance(decision, (NoRoom, Refuse)) \
        else decision


@pytest.mark.parametrize(("user", "full", "kwargs", "expected"), [
    # no readings: as before (the reception for a new user, its own worker for a sticky one)
    ("new", None, {}, "w1"),
    ("new", {}, {}, "w1"),
    ("sticky:w2", None, {}, "w2"),
    ("sticky:w2", {}, {}, "w2"),
    # a new user skips a full reception: the next worker with room
    ("new", {"w1": _full()}, {}, "w2"),
    ("new", {"w1": _full(), "w2": _full()}, {"routable": ("w1", "w2", "w3")}, "w3"),
    ("new", {"w2": _full()}, {}, "w1"),  # another full: the reception as before
    ("new", {"w9": _full()}, {}, "w1"),  # a reading of a worker not in the group changes nothing
    # a reading whose time is over is no refusal
    ("new", {"w1": _full(until=NOW)}, {}, "w1"),
    ("new", {"w1": _full(until=NOW - 10)}, {}, "w1"),
    ("new", {"w1": _full(until=NOW + 0.001)}, {}, "w2"),
    ("sticky:w1", {"w1": _full(until=NOW)}, {}, "w1"),
    # every worker full: a NoRoom for the group, the least retry_after and the longest wait
    ("new", {"w1": _full(retry_after=5, wait=0.5), "w2": _full(retry_after=2, wait=3.0)}, {},
     NoRoom(GROUP, 2, 3.0)),
    ("new", {"w1": _full(retry_after=7, wait=1.5)}, {"routable": ("w1",)}, NoRoom(GROUP, 7, 1.5)),
    ("sticky:gone", {"w1": _full(retry_after=4), "w2": _full(retry_after=9)}, {}, NoRoom(GROUP, 4, 1.0)),  # re-placed
    # a sticky user whose worker is full waits for room there: never re-placed elsewhere
    ("sticky:w1", {"w1": _full(retry_after=3, wait=0.25)}, {}, NoRoom("w1", 3, 0.25)),
    ("sticky:w1", {"w1": _full(retry_after=3, wait=0.25), "w2": _full(retry_after=1, wait=9.0)}, {},
     NoRoom("w1", 3, 0.25)),  # everyone full: its own worker's NoRoom, not the group's
    # a sticky user whose worker has room, another full: its own worker
    ("sticky:w1", {"w2": _full()}, {}, "w1"),
    ("sticky:w2", {"w1": _full()}, {}, "w2"),
    ("sticky:", {"w1": _full()}, {}, "w2"),  # its worker went ("" on the surface): placed where there is room
    # a pinned user on a kept (draining) worker is not subject to admission: it is served where it waits
    ("pinned:wk", {"w1": _full(), "w2": _full()}, {"kept": ("wk",)}, "wk"),
    ("pinned:wk", {"w1": _full()}, {"kept": ("wk",)}, "wk"),
    ("pinned:wk", {"wk": _full(), "w1": _full(), "w2": _full()}, {"kept": ("wk",)}, "wk"),
    ("pinned:wk", {"w1": _full(), "w2": _full()}, {"kept": ("wk",), "unroutable": ("wk",)},
     NoRoom(GROUP, 2, 1.0)),  # its kept worker found dead: admitted like anyone re-placed
    ("pinned:wk", {"w1": _full(retry_after=6), "w2": _full()}, {}, NoRoom(GROUP, 2, 1.0)),  # no such worker kept
    # only narrowing: a reading that says room does not admit an unroutable worker
    ("new", {"w1": _full(until=NOW - 1), "w2": _full(retry_after=4)}, {"unroutable": ("w1",)}, NoRoom(GROUP, 4, 1.0)),
    ("new", {"w1": _full(until=NOW - 1)}, {"unroutable": ("w1",)}, "w2"),
    ("sticky:w1", {"w1": _full(until=NOW - 1), "w2": _full(retry_after=4)}, {"unroutable": ("w1",)},
     NoRoom(GROUP, 4, 1.0)),  # its worker found dead: re-placed, and nowhere has room
    ("sticky:w1", {"w1": _full(until=NOW - 1)}, {"unroutable": ("w1",)}, "w2"),
])
def test_admission(user, full, kwargs, expected):
    decision, _ = _run(user, full, **kwargs)
    assert _where(decision) == expected


@pytest.mark.parametrize(("full", "worker"), [(None, "w1"), ({"w1": _full()}, "w2")])
def test_a_new_user_admitted_is_given_its_cookie_and_placed_where_it_went(full, worker):
    decision, surface = _run("new", full)
    assert _where(decision) == worker
    _, user, entry, cookie, quota, group = decision
    assert entry is None and cookie.startswith(b"Set-Cookie: elastic_uid=" + user.encode()) and group == "green"
    assert quota is None and len(surface) == 0  # on the surface when it comes back with the cookie


def test_a_sticky_user_left_waiting_stays_on_its_worker() -> None:
    decision, surface = _run("sticky:w1", {"w1": _full(retry_after=3)})
    assert decision == NoRoom("w1", 3, 1.0)
    entry = surface.get(USER)
    assert entry is not None and (entry.worker, entry.group, entry.seen) == ("w1", "green", 1.0)  # not re-placed


def test_a_user_whose_worker_went_is_placed_where_there_is_room() -> None:
    decision, surface = _run("sticky:gone", {"w1": _full()})
    assert _where(decision) == "w2"
    entry = surface.get(USER)
    assert entry is not None and decision[2] is entry and (entry.worker, entry.seen) == ("w2", NOW)


@pytest.mark.parametrize(("user", "full", "kwargs", "room"), [
    ("new", {"w1": _full(retry_after=5), "w2": _full(retry_after=2, wait=0.5)}, {}, NoRoom(GROUP, 2, 1.0)),
    ("sticky:w2", {"w2": _full(retry_after=8, wait=2.0)}, {}, NoRoom("w2", 8, 2.0)),
])
def test_a_room_gives_its_quota_slot_back(user, full, kwargs, room):
    quota = TenantQuota(Quotas(max_concurrent_requests=2), 0.0)
    assert quota.admit(0.0) is None  # another request, in flight meanwhile
    assert quota.gate.in_flight == 1
    decision, _ = _run(user, full, quota=quota, **kwargs)
    assert decision == room
    assert quota.gate.in_flight == 1  # its own slot given back: the other one still counted
    # a request that is admitted keeps its slot until its exchange settles
    forwarded, _ = _run(user, {}, quota=quota, **kwargs)
    assert _where(forwarded) in ("w1", "w2") and forwarded[4] is quota and quota.gate.in_flight == 2
    # and a full quota refuses before any reading is looked at
    refused, _ = _run(user, full, quota=quota, **kwargs)
    assert isinstance(refused, Refuse) and refused.status == 503 and quota.gate.in_flight == 2
