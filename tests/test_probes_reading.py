"""Capacity readings (probes/reading.py), as tables: a reading's fullness, ratio and deadline; the book per node
and source (source-scoped forgetting, expiry when looked at, the tightest reading, the refusal); Retry-After.
Time passed in."""

from __future__ import annotations

import math

import pytest

from elasticd.probes.reading import (
    BACKOFF,
    MAX_BACKOFF,
    Reading,
    Readings,
    Refusal,
    backoff_reading,
    parse_retry_after,
)

NODE = "acme.shop.green.1"
OTHER = "acme.shop.green.2"
NOW = 1_000_000_000.0  # Sun, 09 Sep 2001 01:46:40 GMT


def prom(used: float, limit: float = 8.0, at: float = 0.0, **kw: float) -> Reading:
    return Reading("prometheus", used, limit, at, **kw)


def reg(used: float, limit: float = 8.0, at: float = 0.0, **kw: float) -> Reading:
    return Reading("registry", used, limit, at, **kw)


def book(*readings: Reading, max_age: float = 5.0, node: str = NODE) -> Readings:
    out = Readings()
    out.describe(node, max_age)
    for reading in readings:
        out.set(node, reading)
    return out


# -- a reading ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("used", "limit", "full", "ratio"), [
    (0, 8, False, 0.0),
    (5, 8, False, 0.625),
    (7.5, 8, False, 0.9375),
    (8, 8, True, 1.0),  # used == limit: full
    (12, 8, True, 1.0),  # over: full, the ratio clamped
    (-3, 8, False, 0.0),  # a negative count clamped to 0
    (0, 0, True, 1.0),  # no limit at all: full
    (1, -1, True, 1.0),
])
def test_a_readings_fullness_and_ratio(used, limit, full, ratio):
    reading = prom(used, limit)
    assert (reading.full, reading.ratio) == (full, ratio)


@pytest.mark.parametrize(("reading", "max_age", "deadline"), [
    (prom(1, at=10.0), 5.0, 15.0),  # max_age after it was taken
    (prom(1, at=10.0), 0.0, math.inf),  # 0: never, by itself
    (prom(1, at=10.0, expires_at=12.0), 5.0, 12.0),  # its own end comes first
    (prom(1, at=10.0, expires_at=20.0), 5.0, 15.0),  # max_age comes first
    (prom(1, at=10.0, expires_at=20.0), 0.0, 20.0),  # max_age 0: its own end only
    (prom(1, at=10.0, expires_at=15.0), 5.0, 15.0),
    # a back-off ends when it said it would, also after max_age (a back-off is no measurement growing old)
    (Reading(BACKOFF, 1, 1, 10.0, expires_at=40.0, retry_after=30.0), 5.0, 40.0),
    (Reading(BACKOFF, 1, 1, 10.0, expires_at=12.0, retry_after=2.0), 5.0, 12.0),
    (Reading(BACKOFF, 1, 1, 10.0, expires_at=40.0, retry_after=30.0), 0.0, 40.0),
])
def test_a_readings_deadline(reading, max_age, deadline):
    assert reading.deadline(max_age) == deadline


@pytest.mark.parametrize(("now", "fresh"), [(10.0, True), (14.999, True), (15.0, False), (99.0, False)])
def test_a_reading_is_fresh_until_its_deadline_exclusive(now, fresh):
    assert prom(1, at=10.0).fresh(now, 5.0) is fresh


def test_a_reading_as_json() -> None:
    assert prom(3, 8, at=10.0).as_json(12.25) == {"source": "prometheus", "used": 3, "limit": 8, "at": 10.0,
                                                  "age": 2.25}
    assert backoff_reading(30.0, 10.0).as_json(5.0) == {"source": BACKOFF, "used": 1.0, "limit": 1.0, "at": 10.0,
                                                        "age": 0.0, "expires_at": 40.0, "retry_after": 30.0}


# -- the book: per node and source ------------------------------------------------------------------------------


def test_max_age_is_per_node_with_a_default_of_5s() -> None:
    readings = Readings()
    readings.describe(NODE, 0.0)
    assert (readings.max_age(NODE), readings.max_age(OTHER)) == (0.0, 5.0)


def test_a_newer_reading_of_a_source_replaces_the_older() -> None:
    readings = book(prom(2, at=0.0), prom(6, at=1.0))
    assert readings.fresh(NODE, 1.5) == [prom(6, at=1.0)]


@pytest.mark.parametrize(("forget", "answer", "left"), [
    ("prometheus", True, [BACKOFF, "registry"]),  # a passive back-off outlives a probe that went blind
    ("registry", True, ["prometheus", BACKOFF]),
    (BACKOFF, True, ["prometheus", "registry"]),
    ("custom", False, ["prometheus", BACKOFF, "registry"]),  # none of that source: nothing changes
    (None, True, []),  # every source
])
def test_forgetting_is_per_source(forget, answer, left):
    readings = book(prom(2), backoff_reading(30.0, 0.0), reg(3))
    readings.set(OTHER, prom(1))
    version = readings.version
    assert readings.forget(NODE, forget) is answer
    assert [r.source for r in readings.fresh(NODE, 1.0)] == left
    assert readings.version == version + (1 if answer else 0)
    assert readings.fresh(OTHER, 1.0) == [prom(1)]  # another node untouched
    assert sorted(readings.nodes()) == ([NODE, OTHER] if left else [OTHER])


def test_forgetting_a_node_without_readings_changes_nothing() -> None:
    readings = Readings()
    assert readings.forget(NODE, None) is False and readings.forget(NODE, "prometheus") is False
    assert readings.version == 0 and list(readings.nodes()) == []


def test_an_expired_reading_is_dropped_when_looked_at() -> None:
    readings = book(prom(2, at=0.0), reg(3, at=0.0, expires_at=2.0))
    version = readings.version
    assert [r.source for r in readings.fresh(NODE, 1.9)] == ["prometheus", "registry"]
    assert readings.version == version  # looking changes nothing while all are fresh
    assert readings.fresh(NODE, 2.0) == [prom(2)]  # the registry's own end
    assert readings.version == version + 1
    assert readings.tightest(NODE, 5.0) is None  # max_age 5s after it was taken: gone, the node with it
    assert list(readings.nodes()) == [] and readings.version == version + 2


def test_max_age_0_believes_a_reading_until_replaced() -> None:
    readings = book(prom(2, at=0.0), max_age=0.0)
    assert readings.fresh(NODE, 1e9) == [prom(2)]
    assert readings.next_deadline(NODE, 1e9) is None


@pytest.mark.parametrize(("readings", "now", "tightest"), [
    ([], 1.0, None),
    ([prom(2)], 1.0, prom(2)),
    ([prom(2), reg(6)], 1.0, reg(6)),  # the highest ratio
    ([prom(7), reg(6)], 1.0, prom(7)),
    ([prom(8), backoff_reading(10.0, 0.0)], 1.0, backoff_reading(10.0, 0.0)),  # a back-off first, whatever
    ([prom(1), reg(5, 4), backoff_reading(10.0, 0.0)], 1.0, backoff_reading(10.0, 0.0)),
    ([prom(1), reg(8, expires_at=3.0)], 2.9, reg(8, expires_at=3.0)),  # a tighter reading holds while fresh
    ([prom(1), reg(8, expires_at=3.0)], 3.0, prom(1)),  # then the looser one rules
    ([prom(1, at=0.0), backoff_reading(10.0, 0.0)], 7.0, backoff_reading(10.0, 0.0)),  # the back-off outlives it
])
def test_the_tightest_reading(readings, now, tightest):
    assert book(*readings).tightest(NODE, now) == tightest


@pytest.mark.parametrize(("readings", "now", "refusal"), [
    ([], 1.0, None),
    ([prom(7)], 1.0, None),  # room
    ([prom(8)], 1.0, Refusal(5.0, 1, prom(8))),  # full: until it expires, retry after 1s without a back-off
    ([prom(8), reg(9, expires_at=3.0)], 1.0, Refusal(5.0, 1, prom(8))),  # the latest deadline of the full
    ([prom(8, at=0.0), reg(9, at=2.0)], 2.5, Refusal(7.0, 1, prom(8))),  # (a tie on ratio: the first set)
    ([prom(1), reg(8, expires_at=3.0)], 1.0, Refusal(3.0, 1, reg(8, expires_at=3.0))),  # a tighter one holds
    ([prom(1), reg(8, expires_at=3.0)], 3.0, None),  # ... while fresh: then the looser one rules, with room
    # a back-off: its remaining seconds, rounded up; it rules the refusal, and outlives max_age
    ([backoff_reading(12.5, 0.0)], 2.0, Refusal(12.5, 11, backoff_reading(12.5, 0.0))),
    ([prom(8), backoff_reading(30.0, 0.0)], 1.0, Refusal(30.0, 29, backoff_reading(30.0, 0.0))),
    ([prom(8), backoff_reading(30.0, 0.0)], 6.0, Refusal(30.0, 24, backoff_reading(30.0, 0.0))),
    ([backoff_reading(2.0, 0.0)], 1.9, Refusal(2.0, 1, backoff_reading(2.0, 0.0))),  # never less than 1
    ([backoff_reading(2.0, 0.0)], 2.0, None),  # over
    # a back-off longer than MAX_BACKOFF (not from parse_retry_after, which caps): told MAX_BACKOFF
    ([Reading(BACKOFF, 1, 1, 0.0, expires_at=1000.0, retry_after=1000.0)], 10.0,
     Refusal(1000.0, 300, Reading(BACKOFF, 1, 1, 0.0, expires_at=1000.0, retry_after=1000.0))),
])
def test_the_refusal(readings, now, refusal):
    assert book(*readings).refusal(NODE, now) == refusal


def test_a_refusal_with_max_age_0_lasts_until_replaced() -> None:
    readings = book(prom(8), max_age=0.0)
    assert readings.refusal(NODE, 1e6) == Refusal(math.inf, 1, prom(8))
    readings.set(NODE, prom(3, at=1e6))
    assert readings.refusal(NODE, 1e6) is None


@pytest.mark.parametrize(("readings", "max_age", "now", "deadline"), [
    ([], 5.0, 1.0, None),
    ([prom(1)], 5.0, 1.0, 5.0),
    ([prom(1), reg(1, expires_at=3.0)], 5.0, 1.0, 3.0),  # the first to end
    ([prom(1), reg(1, expires_at=3.0)], 5.0, 3.0, 5.0),  # (the registry's is over and dropped)
    ([prom(1)], 0.0, 1.0, None),  # none ends by itself
    ([prom(1), reg(1, expires_at=3.0)], 0.0, 1.0, 3.0),
    ([prom(1), backoff_reading(30.0, 0.0)], 5.0, 1.0, 5.0),
    ([prom(1), backoff_reading(30.0, 0.0)], 5.0, 5.0, 30.0),
])
def test_the_next_deadline(readings, max_age, now, deadline):
    assert book(*readings, max_age=max_age).next_deadline(NODE, now) == deadline


def test_the_version_moves_on_every_change_and_only_then() -> None:
    readings = Readings()
    readings.describe(NODE, 5.0)  # a block described: no reading changed
    assert readings.version == 0
    readings.set(NODE, prom(1))
    readings.set(NODE, prom(2))  # (the same source again is a change too)
    readings.set(NODE, reg(3))
    assert readings.version == 3
    assert readings.forget(NODE, "custom") is False and readings.version == 3
    assert readings.forget(NODE, "prometheus") is True and readings.version == 4
    readings.drop(NODE)
    assert readings.version == 5
    readings.drop(NODE)  # nothing left to drop
    assert readings.version == 5


def test_drop_forgets_a_nodes_readings_and_its_block() -> None:
    readings = book(prom(8), backoff_reading(30.0, 0.0), max_age=0.0)
    readings.describe(OTHER, 1.0)
    readings.set(OTHER, prom(1))
    readings.drop(NODE)
    assert readings.fresh(NODE, 1.0) == [] and readings.refusal(NODE, 1.0) is None
    assert readings.max_age(NODE) == 5.0  # back to the default: its block went with it
    assert list(readings.nodes()) == [OTHER] and readings.max_age(OTHER) == 1.0


# -- Retry-After -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "seconds"), [
    ("120", 120.0),
    (b"7", 7.0),
    ("  42 ", 42.0),
    ("300", 300.0),
    ("301", MAX_BACKOFF),  # capped: believed five minutes, then asked again
    ("86400", MAX_BACKOFF),
    ("99999999999999999999", MAX_BACKOFF),
    ("0", None),  # no wait is no back-off
    ("", None),
    ("   ", None),
    (b"", None),
    (None, None),
    ("soon", None),
    ("-5", None),
    ("1.5", None),
    ("12s", None),
    ("\u0661\u0662", None),  # digits, but not ASCII ones
    # an HTTP-date: seconds from now
    ("Sun, 09 Sep 2001 01:47:10 GMT", 30.0),
    (b"Sun, 09 Sep 2001 01:47:10 GMT", 30.0),
    ("Sun, 09 Sep 2001 01:46:41 +0000", 1.0),
    ("Sun, 09 Sep 2001 03:47:10 +0200", 30.0),  # another zone, the same instant
    ("Mon, 10 Sep 2001 01:46:40 GMT", MAX_BACKOFF),  # a day ahead: capped
    ("Sun, 09 Sep 2001 01:46:40 GMT", None),  # now: over
    ("Sun, 09 Sep 2001 01:40:00 GMT", None),  # in the past
    ("Sun, 09 Sep 2001 01:47:10", None),  # naive, no zone: not knowable
    ("Sun, 09 Sep 2001 01:47:10 -0000", None),  # -0000: "zone unknown" (RFC 5322), naive too
    ("Sun, 32 Sep 2001 01:47:10 GMT", None),  # no such day
])
def test_parse_retry_after(value, seconds):
    assert parse_retry_after(value, NOW) == seconds


def test_a_backoff_reading_is_full_until_its_end() -> None:
    reading = backoff_reading(30.0, 100.0)
    assert reading == Reading(BACKOFF, 1.0, 1.0, 100.0, expires_at=130.0, retry_after=30.0)
    assert (reading.source, reading.full, reading.ratio) == ("ratelimit", True, 1.0)
    assert reading.fresh(129.9, 5.0) and not reading.fresh(130.0, 5.0)
