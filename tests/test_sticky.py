"""Sticky users as tables: the cookie, the surface (placement, login, expiry), and its size per user."""

from __future__ import annotations

import gc
import tracemalloc

import pytest

from elasticd.front.core.sticky import Surface, new_user_id, place, set_cookie_line, user_from_cookie
from elasticd.front.upstream import Upstream

UID = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(("header", "user"), [
    (f"elastic_uid={UID}", UID),
    (f"a=1; elastic_uid={UID}", UID),
    (f"a=1;elastic_uid={UID}; b=2", UID),
    (f"elastic_uid={UID} ; b=2", UID),
    (f"xelastic_uid={UID}", None),  # another cookie whose name ends like ours
    (f"xelastic_uid=zz; elastic_uid={UID}", UID),  # ... is skipped, ours found after it
    (f"elastic_uid={UID}0", None),  # too long
    (f"elastic_uid={UID[:-1]}", None),  # too short
    (f"elastic_uid={UID.upper()}", None),  # we only issue lower case
    ("elastic_uid=0123456789abcdef0123456789abcdeg", None),  # not hex
    ("elastic_uid=", None),
    ("", None),
    (f"elastic_uid=bad; elastic_uid={UID}", UID),  # a second, well-formed one is taken
])
def test_user_from_cookie(header: str, user: str | None) -> None:
    assert user_from_cookie(header.encode()) == user


def test_new_user_ids_are_128_random_bits_and_parse_back() -> None:
    ids = {new_user_id() for _ in range(2000)}  # across the 4 KiB block boundary several times
    assert len(ids) == 2000
    for uid in list(ids)[:50]:
        assert len(uid) == 32 and int(uid, 16) >= 0
        assert user_from_cookie(f"elastic_uid={uid}".encode()) == uid


@pytest.mark.parametrize(("secure", "line"), [
    (False, f"Set-Cookie: elastic_uid={UID}; Path=/; HttpOnly; SameSite=Lax\r\n"),
    (True, f"Set-Cookie: elastic_uid={UID}; Path=/; HttpOnly; SameSite=Lax; Secure\r\n"),
])
def test_set_cookie_line(secure: bool, line: str) -> None:
    assert set_cookie_line(UID, secure) == line.encode()


W1, W2, W3 = Upstream("w1", "/a"), Upstream("w2", "/b"), Upstream("w3", "/c")


@pytest.mark.parametrize(("routable", "chosen"), [
    ([W1, W2, W3], "w1"),
    ([W2, W1], "w2"),  # the reception is whoever is first routable
    ([W3], "w3"),
])
def test_place_is_the_reception(routable: list[Upstream], chosen: str) -> None:
    surface = Surface(60)
    assert place(None, surface, routable) == chosen
    assert place(UID, surface, routable) == chosen


def test_place_needs_a_worker() -> None:
    with pytest.raises(ValueError):
        place(None, Surface(60), [])


def test_surface_assign_login_and_consumption() -> None:
    surface = Surface(ttl=60)
    entry = surface.assign("u1", "w1", now=10.0)
    assert (entry.worker, entry.login, entry.seen, entry.requests, entry.seconds) == ("w1", None, 10.0, 0, 0.0)
    assert surface.assign("u1", "w2", now=11.0) is entry  # a re-placement re-points the same entry
    assert (entry.worker, entry.seen) == ("w2", 11.0)
    assert surface.login("u1", "alice", "w2", now=12.0).login == "alice"
    assert surface.login("u1", None, "w2", now=13.0).login is None  # "-": logged out
    fresh = surface.login("u2", "bob", "w1", now=14.0)  # logged in on its first answer: enters the surface
    assert (fresh.worker, fresh.login) == ("w1", "bob")
    assert sorted(user for user, _ in surface.on("w1")) == ["u2"]
    assert len(surface) == 2 and "u1" in surface and surface.get("nobody") is None
    assert surface.forget("u2") is fresh and surface.forget("u2") is None


def test_release_re_places_a_gone_workers_users() -> None:
    surface = Surface(ttl=60)
    for user, worker in (("a", "w1"), ("b", "w2"), ("c", "w1")):
        surface.assign(user, worker, 0.0)
    surface.login("c", "carol", "w1", 0.0)
    assert surface.release("w1") == 2
    assert {u: e.worker for u, e in surface.users.items()} == {"a": "", "b": "w2", "c": ""}
    assert surface.users["c"].login == "carol"  # who it is stays; where it lives is decided again
    assert list(surface.on("w1")) == []


@pytest.mark.parametrize(("seen", "now", "kept"), [
    ({"a": 0.0, "b": 50.0, "c": 100.0}, 100.0, ["a", "b", "c"]),  # idle exactly ttl: kept
    ({"a": 0.0, "b": 50.0, "c": 100.0}, 100.5, ["b", "c"]),  # idle longer than ttl: forgotten
    ({"a": 0.0, "b": 50.0, "c": 100.0}, 1000.0, []),
    ({}, 1000.0, []),
])
def test_surface_expiry(seen: dict[str, float], now: float, kept: list[str]) -> None:
    surface = Surface(ttl=100.0)
    for user, at in seen.items():
        surface.assign(user, "w1", at)
    gone = surface.expire(now)
    assert sorted(surface.users) == kept
    assert sorted(gone) == sorted(set(seen) - set(kept))


def test_bytes_per_user_on_the_surface() -> None:
    """The surface stays small: what one more user costs, everything it holds included."""
    count = 20_000
    surface = Surface(ttl=1800)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(count):
            # the id string parsed from the cookie is the key: the surface keeps it alive, so it counts
            entry = surface.assign(new_user_id(), "acme.shop.green.1", now=1000.0 + i * 0.001)
            entry.add(0.25 + i * 1e-6, now=1e6 + i)  # its epoch past the small-int cache, as a real one's is
            entry.requests += 300  # so is its count
        per_user = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    # id string 81, entry 120, five floats and ints ~130, the ring of six epochs (one array of doubles) 176, the
    # dict's slot and index ~30-60 (growth-dependent): ~580 bytes, 58 MB for 100,000 users
    print(f"surface: {per_user:.0f} bytes per user")
    assert per_user < 600
