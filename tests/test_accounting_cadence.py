"""cadence.py as a table: an active cgroup every tick; an idle one at its first idle tick, once more after the
settle, then once per idle period on a tick of its own; a reload's forgetting."""

from __future__ import annotations

from itertools import pairwise

import pytest

from elasticd.accounting.cadence import IDLE_SECONDS, SETTLE_SECONDS, Cadence, _offset

KEY = ("app", "acme", "shop")


def _reads(cadence: Cadence, activity: str, key=KEY) -> str:
    """activity: one letter a tick from tick 1, 'a' active, 'i' idle; the result: 'R' where read, '.' not."""
    return "".join("R" if cadence.due(key, letter == "a", tick) else "."
                   for tick, letter in enumerate(activity, start=1))


def test_active_is_read_every_tick():
    assert _reads(Cadence(5.0), "aaaaaa") == "RRRRRR"


@pytest.mark.parametrize("interval", [1.0, 5.0, 10.0, 30.0, 60.0])
def test_idle_is_read_at_once_after_the_settle_then_once_a_period(interval):
    cadence = Cadence(interval)
    settle = max(1, int(-(-SETTLE_SECONDS // interval)))
    every = max(2 * settle + 1, int(-(-IDLE_SECONDS // interval)))
    ticks = 1 + 2 * settle + 3 * every
    reads = _reads(cadence, "i" * ticks)
    assert reads[0] == "R"  # its final values, the tick it goes idle
    assert reads[settle + _offset(KEY) % every % settle] == "R"  # the writeback, within the next settle
    later = [i + 1 for i, c in enumerate(reads) if c == "R" and i > 2 * settle]
    assert len(later) == 3 and all(b - a == every for a, b in pairwise(later))
    assert reads.count("R") == 5


def test_going_active_again_reads_at_once_and_a_new_idle_spell_starts_over():
    cadence = Cadence(5.0)
    assert _reads(cadence, "aaiiiaai") == "RRR..RRR"


def test_a_start_that_idles_every_cgroup_at_once_spreads_their_second_read():
    cadence = Cadence(5.0)
    keys = [("app", f"t{t}", f"a{a}") for t in range(100) for a in range(10)]
    per_tick = [sum(cadence.due(key, False, tick) for key in keys) for tick in range(1, 16)]
    assert per_tick[0] == 1000  # every one's final values, once
    assert max(per_tick[1:]) < 1000 // 3  # the writeback reads spread over the next settle


def test_idle_reads_spread_over_the_ticks_by_key():
    cadence = Cadence(5.0)
    keys = [("app", f"t{t}", f"a{a}") for t in range(40) for a in range(5)]
    every = int(IDLE_SECONDS // 5.0)
    per_tick = [0] * every
    for tick in range(1, 1 + 14 + 2 * every):
        for key in keys:
            if cadence.due(key, False, tick) and tick > 14:  # (past the first read and the settle's)
                per_tick[tick % every] += 1
    # 200 idle cgroups, 60 ticks a period: no tick takes more than a few of them (a hash spreads them)
    assert max(per_tick) <= 2 * 2 * 200 // every + 4
    assert _offset(("app", "a", "b")) == _offset(("app", "a", "b"))  # stable, not salted per process


def test_forget_drops_the_standing_of_removed_cgroups():
    cadence = Cadence(5.0)
    cadence.due(KEY, False, 1)
    assert cadence.idle(KEY) and cadence.idle_count == 1
    cadence.forget(set())
    assert not cadence.idle(KEY) and cadence.due(KEY, False, 2)  # read again: a new idle spell


def test_a_non_positive_interval_is_refused():
    with pytest.raises(ValueError, match="interval must be positive"):
        Cadence(0)
