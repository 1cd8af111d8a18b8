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
    every = max(settle + 1, int(-(-IDLE_SECONDS // interval)))
    ticks = 1 + settle + 3 * every
    reads = _reads(cadence, "i" * ticks)
    assert reads[0] == "R"  # its final values, the tick it goes idle
    assert reads[settle] == "R"  # the writeback after the last exit
    later = [i + 1 for i, c in enumerate(reads) if c == "R" and i > settle]
    assert len(later) == 3 and all(b - a == every for a, b in pairwise(later))
    assert reads.count("R") == 5


def test_going_active_again_reads_at_once_and_a_new_idle_spell_starts_over():
    cadence = Cadence(5.0)
    assert _reads(cadence, "aaiiiaai") == "RRR..RRR"


def test_idle_reads_spread_over_the_ticks_by_key():
    cadence = Cadence(5.0)
    keys = [("app", f"t{t}", f"a{a}") for t in range(40) for a in range(5)]
    every = int(IDLE_SECONDS // 5.0)
    per_tick = [0] * every
    for tick in range(1, 1 + 8 + 2 * every):
        for key in keys:
            if cadence.due(key, False, tick) and tick > 8:
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
