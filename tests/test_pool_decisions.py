"""The pool's decisions that the manager used to make inline, as tables: the cap (one definition for scale-up, the
cold start, the drain and the agent), the cold-start rule, the drain's replacement, and how a compaction empties its
worker."""

from __future__ import annotations

import math

import pytest

from elasticd.agent.line import GroupRoom
from elasticd.pool.cap import may_start, startable
from elasticd.pool.drain import replacement_for_drain
from elasticd.pool.idle import WakeVerdict, wake_rule
from elasticd.pool.ledger import Compaction, CompactionSteps, compaction_steps, may_compact
from elasticd.pool.policy import PoolDecision
from elasticd.supervisor.lifecycle import WorkerState as S

# (max_workers, held, replacing) → how many more may start
CAP = [
    (None, 0, 0, None),
    (None, 99, 0, None),
    (3, 0, 0, 3),
    (3, 2, 0, 1),
    (3, 3, 0, 0),
    (3, 4, 0, 0),  # over it (a reload lowered max_workers): none, never negative
    (1, 1, 1, 1),  # one leaving, one coming: a drain's replacement at max 1
    (2, 2, 1, 1),
    (2, 3, 1, 0),  # a replacement already counted: no second one
]


@pytest.mark.parametrize(("maximum", "held", "replacing", "room"), CAP)
def test_the_cap(maximum, held, replacing, room):
    assert startable(maximum, held, replacing=replacing) == room
    assert may_start(maximum, held, replacing=replacing) is (room is None or room > 0)


@pytest.mark.parametrize(("maximum", "held", "occupancies", "room"), [
    (3, 3, (0.5, 0.5, 0.5), 0.0),  # at the cap, no headroom
    (3, 2, (0.5, 0.5), 0.3),  # one more may start: worth admission_threshold
    (3, 1, (), 0.6),  # held but none routable yet (starting): two more, each worth admission_threshold
    (3, 0, (), 1.2),  # at zero: the first to start is a reception (0.6), then two more
    (2, 1, (0.2,), 0.7),  # its headroom (0.6 - 0.2) and one more
    (1, 2, (0.2,), 0.4),  # a drain's replacement over the cap: no start counted, its headroom only
])
def test_the_agent_asks_the_same_cap(maximum, held, occupancies, room):
    assert math.isclose(GroupRoom(tuple(occupancies), held, maximum, 0.6, 0.3).room, room, abs_tol=1e-9)


R, G = True, False  # routable or not

# (name, workers as (state, routable, leaving), launching, held, max_workers, verdict)
WAKE = [
    ("nothing yet: start one", [], False, 0, 2, WakeVerdict.START),
    ("unbounded", [], False, 0, None, WakeVerdict.START),
    ("routable ones the front found dead", [(S.RUNNING, R, False)], False, 1, 2, WakeVerdict.DEAD),
    ("a start in flight", [(S.STARTING, G, False)], False, 1, 2, WakeVerdict.COMING),
    ("in backoff: it restarts by itself", [(S.BACKOFF, G, False)], False, 1, 2, WakeVerdict.COMING),
    ("a reload is launching one", [], True, 1, 2, WakeVerdict.COMING),
    ("a crash loop", [(S.FAILED, G, False)], False, 0, 2, WakeVerdict.FAILED),
    ("a failed one and a start in flight", [(S.FAILED, G, False), (S.STARTING, G, False)], False, 1, 2,
     WakeVerdict.COMING),
    ("an idle retire under way, room left", [(S.RUNNING, R, True)], False, 1, 2, WakeVerdict.START),
    ("an idle retire under way at the cap", [(S.RUNNING, R, True)], False, 1, 1, WakeVerdict.AFTER_RETIRE),
    ("the retired one is out of the list, stopping", [], False, 1, 1, WakeVerdict.AFTER_RETIRE),
    ("a drained one stays routable but takes no one", [(S.RUNNING, R, True), (S.STARTING, G, False)], False, 2, 2,
     WakeVerdict.COMING),
    ("its only worker just exited (killed): it restarts", [(S.EXITED, G, False)], False, 1, 1, WakeVerdict.COMING),
    ("killed, and the front found it first", [(S.RUNNING, R, False)], False, 1, 1, WakeVerdict.DEAD),
    ("at the cap with none leaving", [(S.STOPPING, G, False)], False, 1, 1, WakeVerdict.AT_CAP),
]


@pytest.mark.parametrize(("name", "workers", "launching", "held", "maximum", "verdict"), WAKE,
                         ids=[row[0] for row in WAKE])
def test_the_cold_start_rule(name, workers, launching, held, maximum, verdict):
    assert wake_rule(workers, launching=launching, counted=held, max_workers=maximum) is verdict
    # Hold or refuse: only a crash loop, or a cap held by workers that stay, answer 503; every other verdict has
    # the request wait in the front (a worker is coming, or the one found dead is about to be restarted).
    assert verdict.waits is (verdict not in {WakeVerdict.FAILED, WakeVerdict.AT_CAP})


# (name, staying, floor, held, max_workers, stopping, outcome: None | "replace" | the refusal's words)
DRAIN = [
    ("the others keep the floor", 2, 1, 3, 3, False, None),
    ("a floor of zero", 0, 0, 1, 1, False, None),
    ("under the floor: one leaving, one coming", 0, 1, 1, 1, False, "replace"),
    ("under the floor with room", 1, 2, 2, 4, False, "replace"),
    ("a replacement already counted at the cap", 0, 1, 2, 1, False, "max_workers 1"),
    ("elasticd is stopping", 0, 1, 1, 2, True, "elasticd is stopping"),
    ("stopping, but no replacement needed", 1, 1, 2, 2, True, None),
]


@pytest.mark.parametrize(("name", "staying", "floor", "held", "maximum", "stopping", "outcome"), DRAIN,
                         ids=[row[0] for row in DRAIN])
def test_the_drains_replacement(name, staying, floor, held, maximum, stopping, outcome):
    kwargs = {"staying": staying, "floor": floor, "counted": held, "max_workers": maximum, "stopping": stopping}
    if outcome is None or outcome == "replace":
        why = replacement_for_drain("acme.shop.green.1", **kwargs)
        assert (why is None) is (outcome is None)
        if why is not None:
            assert "replaces acme.shop.green.1" in why and f"min_workers {floor}" in why
        return
    with pytest.raises(ValueError, match=outcome) as refused:
        replacement_for_drain("acme.shop.green.1", **kwargs)
    assert "kept, with its users" in str(refused.value)


@pytest.mark.parametrize(("draining", "spawning", "rows", "may"), [
    (False, False, [6, 6, 9], True),
    (False, False, [], True),
    (True, False, [6, 6], False),  # one change at a time
    (False, True, [6, 6], False),
    (False, False, [6, 5], False),  # a newborn's 0 is not headroom
])
def test_when_the_ledger_may_be_asked(draining, spawning, rows, may):
    assert may_compact(draining=draining, spawning=spawning, rows=rows) is may


PLAN = Compaction("w2", {"busy": "w3", "idle": "w3", "mid": "w1"}, PoolDecision("compaction", "w2", "test"))


@pytest.mark.parametrize(("live", "steps"), [
    (True, CompactionSteps(moves=(("idle", "w3"), ("mid", "w1"), ("busy", "w3")))),  # the idlest first
    (False, CompactionSteps(repoint={"busy": "w3", "idle": "w3", "mid": "w1"})),  # no mover: all at once
])
def test_how_a_compaction_empties_its_worker(live, steps):
    assert compaction_steps(PLAN, {"busy": 0.3, "mid": 0.1}, live=live) == steps


# ---------------------------------------------------------------------- recycling

# (name, served, rss, max_requests, max_rss, a change under way, recycled?)
RECYCLE = [
    ("no limits: never", 10**9, 10**12, None, None, False, False),
    ("under max_requests", 99, None, 100, None, False, False),
    ("at its own limit (max_requests and its jitter)", "limit", None, 100, None, False, True),
    ("RSS under max_rss", 0, 100 << 20, None, 200 << 20, False, False),
    ("RSS at max_rss", 0, 200 << 20, None, 200 << 20, False, True),
    ("no RSS reading", 0, None, None, 200 << 20, False, False),
    ("due, but the group starts or drains a worker: wait", 10**6, 10**12, 100, 1, True, False),
]


@pytest.mark.parametrize(("name", "served", "rss", "max_requests", "max_rss", "changing", "recycled"), RECYCLE,
                         ids=[row[0] for row in RECYCLE])
def test_the_recycle_decision(name, served, rss, max_requests, max_rss, changing, recycled):
    from elasticd.pool.recycling import recycle_reason, requests_limit

    limit = requests_limit(max_requests, "acme.shop.green.1")
    if served == "limit":
        assert recycle_reason(served=limit - 1, rss=rss, limit=limit, max_rss=max_rss, changing=False) is None
        served = limit
    reason = recycle_reason(served=served, rss=rss, limit=limit, max_rss=max_rss, changing=changing)
    assert (reason is not None) is recycled, reason


def test_the_jitter_spreads_a_groups_limits_by_up_to_a_tenth_fixed_per_worker():
    from elasticd.pool.recycling import requests_limit

    limits = [requests_limit(1000, f"acme.shop.green.{n}") for n in range(1, 41)]
    assert all(1000 <= limit <= 1100 for limit in limits) and len(set(limits)) > 20  # not all at once
    assert requests_limit(1000, "acme.shop.green.7") == requests_limit(1000, "acme.shop.green.7")  # fixed
    assert requests_limit(5, "acme.shop.green.1") == 5 and requests_limit(None, "acme.shop.green.1") is None


@pytest.mark.parametrize(("staying", "floor", "counted", "maximum", "outcome"), [
    (3, 1, 4, 4, "replaces"),  # a recycle always replaces, the floor or not: in the recycled one's place
    (0, 1, 1, 1, "replaces"),  # its group's only worker, at the cap
    (3, 1, 5, 4, "no replacement"),  # over the cap even counting it in the recycled one's place: kept
])
def test_a_recycled_worker_is_always_replaced_first(staying, floor, counted, maximum, outcome):
    try:
        why = replacement_for_drain("w1", staying=staying, floor=floor, counted=counted, max_workers=maximum,
                                    recycled="served 100 requests")
    except ValueError as exc:
        why = str(exc)
    assert why is not None and outcome in why
