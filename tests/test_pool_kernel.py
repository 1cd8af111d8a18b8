"""Tables for the pool's meeting with the kernel: the cgroup budget and the held rule, the CPU wall, placement
once, the hard cap, the liveness rule (busy is not hung) and the drain rule (a tunnel is open work)."""

from __future__ import annotations

from collections import deque

import pytest

from elasticd.accounting.parse import Pressure
from elasticd.accounting.sample import Sample
from elasticd.config.model import PoolSettings, Resources
from elasticd.pool.budget import UNLIMITED, Budget, CgroupReading, budget_of, cpu_wall, enforced, limit_bindings
from elasticd.pool.drain import drain_verdict
from elasticd.pool.evaluator import Row, occupancy
from elasticd.pool.ledger import plan_compaction
from elasticd.pool.liveness import CPU_PROGRESS, Progress, observe, verdict
from elasticd.pool.policy import WorkerView, check_scale_up, place_login
from elasticd.pool.report import Executor, Report, parse_report

POOL = PoolSettings(min_workers=1, max_workers=4)
MiB = 1024**2


def sample(ts: float, *, usage_s: float = 0.0, periods: int = 0, throttled: int = 0, memory: int | None = None,
           events: dict[str, int] | None = None, pids: int | None = None, psi: float | None = None) -> Sample:
    return Sample(ts, cpu_usage_usec=int(usage_s * 1e6), cpu_periods=periods, cpu_throttled_periods=throttled,
                  memory_bytes=memory, memory_events=events if events is not None else {"max": 0, "oom_kill": 0},
                  pids=pids, cpu_pressure=Pressure(0, psi) if psi is not None else None)


# ---------------------------------------------------------------------- the budget


def test_budget_rates_over_the_last_two_sampler_intervals():
    # 0-5 s idle, then 5-15 s at 0.5 core: the rate over the last three samples sees the load, not the window.
    samples = [sample(0, usage_s=0), sample(5, usage_s=0.0, periods=50), sample(10, usage_s=2.5, periods=100,
               throttled=40), sample(15, usage_s=5.0, periods=150, throttled=90, psi=12.5)]
    b = budget_of(deque(samples, maxlen=8), Resources(cpu=50.0))  # the sampler keeps a deque
    assert b.cpu_quota == 0.5 and b.wall == 0.5
    assert b.reading is not None
    assert b.reading.cpu_cores == pytest.approx(0.5)
    assert b.reading.throttled_share == pytest.approx(0.9)
    assert b.reading.pressure == {"cpu": 12.5}


def test_the_app_leafs_share_and_the_throttled_time_are_in_the_numbers():
    tenant = [Sample(0.0, cpu_usage_usec=0, cpu_periods=0, cpu_throttled_periods=0, cpu_throttled_usec=0),
              Sample(10.0, cpu_usage_usec=5_000_000, cpu_periods=100, cpu_throttled_periods=95,
                     cpu_throttled_usec=4_000_000)]
    app = [Sample(0.0, cpu_usage_usec=0), Sample(10.0, cpu_usage_usec=3_000_000)]
    b = budget_of(tenant, Resources(cpu=50.0), app_samples=app)
    assert b.reading.app_cpu_cores == pytest.approx(0.3) and b.reading.throttled_rate == pytest.approx(0.4)
    [hold] = limit_bindings(b, POOL, worker_rss=None, worker_pids=None)
    assert hold.numbers["app_usage_cores"] == 0.3 and hold.numbers["throttled_seconds_per_second"] == 0.4


def test_budget_without_two_samples_has_no_reading_but_knows_the_quota():
    b = budget_of([sample(0)], Resources(cpu=30.0, memory=256 * MiB))
    assert (b.reading, b.wall, b.memory_max) == (None, 0.3, 256 * MiB)
    assert limit_bindings(b, POOL, worker_rss=None, worker_pids=None) == []


def test_a_counter_reset_reads_as_no_rate():
    b = budget_of([sample(0, usage_s=9.0), sample(5, usage_s=1.0)], Resources(cpu=50.0))
    assert b.reading is not None and b.reading.cpu_cores is None
    assert limit_bindings(b, POOL, worker_rss=None, worker_pids=None) == []


@pytest.mark.parametrize(("quota", "expected"), [(None, 1.0), (0.5, 0.5), (2.0, 1.0), (1.0, 1.0)])
def test_cpu_wall(quota, expected):
    assert cpu_wall(quota) == expected


def reading(**kw) -> CgroupReading:
    base = {"span": 10.0, "cpu_cores": 0.0, "throttled_share": 0.0, "memory": None, "memory_events": {},
            "pids": None}
    return CgroupReading(**{**base, **kw})


HOLDS = [
    ("cpu saturated at its quota", Budget(0.5, None, None, reading(cpu_cores=0.48)), None, None, ["cpu"]),
    ("cpu just under the share, rarely throttled", Budget(0.5, None, None, reading(cpu_cores=0.44,
                                                                                  throttled_share=0.3)),
     None, None, []),
    ("cpu throttled in most periods", Budget(0.5, None, None, reading(cpu_cores=0.3, throttled_share=0.7)),
     None, None, ["cpu"]),
    ("no cpu.max: never cpu-held", Budget(None, None, None, reading(cpu_cores=1.9, throttled_share=0.0)),
     None, None, []),
    ("a quota raised to 2 cores: the same load fits", Budget(2.0, None, None, reading(cpu_cores=0.5)),
     None, None, []),
    ("memory: one more worker would pass 90%", Budget(None, 512 * MiB, None, reading(memory=400 * MiB)),
     80 * MiB, None, ["memory"]),
    ("memory: room for one more", Budget(None, 512 * MiB, None, reading(memory=300 * MiB)), 80 * MiB, None, []),
    ("memory: an OOM kill in the window", Budget(None, 512 * MiB, None,
                                                 reading(memory=100 * MiB, memory_events={"oom_kill": 1})),
     10 * MiB, None, ["memory"]),
    ("memory: memory.max reached in the window", Budget(None, 512 * MiB, None,
                                                        reading(memory=100 * MiB, memory_events={"max": 3})),
     None, None, ["memory"]),
    ("pids: one more worker's processes would pass 90%", Budget(None, None, 100, reading(pids=80)), None, 15,
     ["pids"]),
    ("pids: room", Budget(None, None, 100, reading(pids=40)), None, 15, []),
    ("cpu and memory at once", Budget(0.5, 512 * MiB, None, reading(cpu_cores=0.5, memory=500 * MiB)),
     10 * MiB, None, ["cpu", "memory"]),
    ("no reading: nothing binds", Budget(0.5, 512 * MiB, 10, None), None, None, []),
]


@pytest.mark.parametrize(("name", "budget", "rss", "pids", "resources"), HOLDS, ids=[h[0] for h in HOLDS])
def test_holds(name, budget, rss, pids, resources):
    found = limit_bindings(budget, POOL, worker_rss=rss, worker_pids=pids)
    assert [h.resource for h in found] == resources
    for h in found:
        assert h.reason and h.numbers  # the journal carries the numbers


def test_the_thresholds_are_the_pools():
    strict = PoolSettings(cpu_held_at=0.5, throttled_held_at=0.9)
    assert [h.resource for h in limit_bindings(Budget(1.0, None, None, reading(cpu_cores=0.6)), strict, worker_rss=None,
                                      worker_pids=None)] == ["cpu"]
    assert limit_bindings(Budget(1.0, None, None, reading(cpu_cores=0.6)), POOL, worker_rss=None,
                          worker_pids=None) == []


# ---------------------------------------------------------------------- the wall in the evaluator


def test_a_worker_at_its_tenants_quota_is_saturated():
    window = [Row(float(i), Report(cpu=0.5, executor=Executor(1, 8))) for i in range(6)]
    assert occupancy(window, None) == 0.5  # against one core
    assert occupancy(window, None, cpu_wall=0.5) == 1.0  # against what its cgroup can give it
    assert occupancy(window, None, cpu_wall=cpu_wall(2.0)) == 0.5


def test_the_report_accepts_loop_lag():
    assert parse_report({"loop_lag": 1.25}).loop_lag == 1.25
    assert parse_report({}).loop_lag is None


# ---------------------------------------------------------------------- scale-up: the cap and the hold

CPU_HOLD = limit_bindings(Budget(0.5, None, None, reading(cpu_cores=0.5)), POOL, worker_rss=None, worker_pids=None)

CAPACITY = [
    # (name, occupancies of the routable, spawning, held by the supervisor, max, holds, expected kind)
    ("busy lone reception: scale up", [0.9], 0, 1, 4, [], "scale-up"),
    ("busy lone reception, tenant at its cpu.max: held", [0.9], 0, 1, 4, CPU_HOLD, "held"),
    ("held only matters when a scale-up is wanted", [0.2], 0, 1, 4, CPU_HOLD, None),
    ("a spawn in flight waits, held or not", [0.9], 1, 2, 4, CPU_HOLD, None),
    ("2 routable of 3 held (one starting/backoff/draining): the cap holds", [0.9, 0.9], 0, 3, 3, [], None),
    ("a worker being replaced counts", [0.9, 0.95, 0.9], 0, 4, 4, [], None),
    ("under the cap counting every state", [0.9, 0.95], 0, 2, 3, [], "scale-up"),
    ("unbounded", [0.9] * 9, 0, 9, None, [], "scale-up"),
]


def test_no_scale_up_before_the_first_cgroup_reading():
    pending = budget_of([sample(0)], Resources(cpu=50.0))
    assert pending.pending and not UNLIMITED.pending
    views = [WorkerView("r", 0.9)]
    assert check_scale_up(views, POOL, spawning=0, measuring=pending.pending) is None
    assert check_scale_up(views, POOL, spawning=0, measuring=False).kind == "scale-up"


def test_a_file_that_appeared_late_still_gives_a_rate():
    late = [Sample(0.0), sample(5, usage_s=1.0, periods=50), sample(10, usage_s=3.5, periods=100)]
    b = budget_of(late, Resources(cpu=50.0))
    assert b.reading is not None and b.reading.cpu_cores == pytest.approx(0.5)


@pytest.mark.parametrize(("name", "occ", "spawning", "held", "maximum", "binding", "kind"), CAPACITY,
                         ids=[c[0] for c in CAPACITY])
def test_capacity(name, occ, spawning, held, maximum, binding, kind):
    pool = PoolSettings(min_workers=1, max_workers=maximum)
    views = [WorkerView(f"w{i}", o) for i, o in enumerate(occ)]
    decision = check_scale_up(views, pool, spawning=spawning, counted=held, holds=binding)
    assert (decision.kind if decision else None) == kind
    if kind == "held":
        assert "cpu" in decision.numbers["limits"]
        assert decision.numbers["limits"]["cpu"]["quota_cores"] == 0.5
        assert "limit" in decision.reason


def test_the_life_of_a_hold():
    from elasticd.pool.policy import PoolDecision, next_hold
    held, scale = PoolDecision("held", None, "r"), PoolDecision("scale-up", None, "r")
    none = frozenset()
    assert next_hold(none, CPU_HOLD, held, measuring=False) == ({"cpu"}, True)  # starts: journaled
    assert next_hold(frozenset({"cpu"}), CPU_HOLD, held, measuring=False) == ({"cpu"}, False)  # goes on
    assert next_hold(frozenset({"cpu"}), CPU_HOLD, None, measuring=False) == ({"cpu"}, False)  # load dipped
    assert next_hold(frozenset({"cpu"}), [], None, measuring=False) == (none, False)  # the limit binds no more
    assert next_hold(frozenset({"cpu"}), [], scale, measuring=False) == (none, False)  # a scale-up was made
    assert next_hold(frozenset({"cpu"}), [], None, measuring=True) == ({"cpu"}, False)  # no reading: no change


# ---------------------------------------------------------------------- placement once

PLACEMENT = [
    # (name, reception occupancy, current worker, logged in before, kinds, the worker it lives on)
    ("a guest on the idle reception is kept", 0.2, "r", False, ["keep"], "r"),
    ("a guest on the busy reception is passed", 0.7, "r", False, ["pass", "admit"], "b"),
    ("kept earlier, logs in again while the reception is busy: nothing", 0.7, "r", True, [], None),
    ("admitted to b, logs in again while the reception is idle: nothing", 0.2, "b", True, [], None),
    ("logged out on b, logs in again: still where it is", 0.2, "b", False, [], None),
]


@pytest.mark.parametrize(("name", "reception", "current", "placed", "kinds", "worker"), PLACEMENT,
                         ids=[p[0] for p in PLACEMENT])
def test_placement_once(name, reception, current, placed, kinds, worker):
    views = [WorkerView("r", reception), WorkerView("b", 0.1)]
    decisions = place_login(views, POOL, current=current, placed=placed)
    assert [d.kind for d in decisions] == kinds
    assert (decisions[-1].worker if decisions else None) == worker


# ---------------------------------------------------------------------- compaction: tunnels, guests

def test_compaction_prefers_a_worker_without_a_tunnel():
    views = [WorkerView("r", 0.1), WorkerView("a", 0.0), WorkerView("b", 0.05), WorkerView("c", 0.05)]
    plan = plan_compaction(views, {}, POOL, {"a": 1})
    assert plan is not None and plan.retire == "b"  # a is the least occupied, but holds a WebSocket
    plan = plan_compaction(views, {}, POOL, {"a": 1, "b": 2, "c": 1})
    assert plan is not None and plan.retire == "a"  # every candidate holds one: the least occupied waits
    assert plan.decision.numbers["tunnels"] == 1


def test_guests_load_is_projected_onto_the_reception():
    # a carries 0.25 of guests: drained, that lands on the reception; at 0.3 + 0.25 the group of one left would
    # be over its threshold and grow again at once, so no compaction; at 0.2 + 0.25 it fits.
    pool = PoolSettings(min_workers=1, max_workers=4, compaction_margin=0.5)
    assert plan_compaction([WorkerView("r", 0.3), WorkerView("a", 0.25)], {"a": {}}, pool) is None
    assert plan_compaction([WorkerView("r", 0.2), WorkerView("a", 0.25)], {"a": {}}, pool) is not None


def test_only_the_users_given_move():
    views = [WorkerView("r", 0.1), WorkerView("a", 0.1), WorkerView("b", 0.05)]
    plan = plan_compaction(views, {"b": {"alice": 0.05}}, POOL)
    assert plan is not None and plan.retire == "b" and dict(plan.moves) == {"alice": "a"}


# ---------------------------------------------------------------------- liveness: busy is not hung

def run_liveness(ticks, *, reports: bool, hung_after: float = 3.0):
    """ticks: (now, cpu seconds, answered, last report or None, loop_lag, oldest open or None)."""
    progress = None
    result = None
    for now, cpu, answered, last, lag, oldest in ticks:
        progress = observe(progress, now, cpu, answered)
        result = verdict(now, progress, hung_after=hung_after, reports=reports, last_report=last, loop_lag=lag,
                         oldest_open=oldest, open_requests=1 if oldest is not None else 0)
        if result is not None:
            return now, result
    return None


LIVENESS = [
    ("a handler burning CPU: loop stalled, reports flowing, CPU advancing", True,
     [(t, 0.9 * t, 0, t, t, 0.0) for t in range(10)], None),
    ("a handler burning CPU with the reporter thread starved: silent but CPU advancing", True,
     [(t, 0.9 * t, 0, 0.0, 0.0, 0.0) for t in range(10)], None),
    ("SIGSTOPped: no reports, no CPU, no answers", True,
     [(t, 5.0, 0, 0.0, None, None) for t in range(10)], 3),
    ("deadlocked while idle: reports flow but the loop stalled, no CPU", True,
     [(t, 5.0 + 0.001 * t, 0, t, float(t), None) for t in range(10)], 3),
    ("idle and healthy: reports flow, the loop beats, no CPU", True,
     [(t, 5.0, 0, t, 0.01, None) for t in range(10)], None),
    ("silent, but answers completing", True,
     [(t, 5.0, t, 0.0, None, None) for t in range(10)], None),
    ("sensor-less and idle: nothing open, nothing to wait for", False,
     [(t, 5.0, 0, None, None, None) for t in range(10)], None),
    ("sensor-less, a request open and nothing moving", False,
     [(t, 5.0, 0, None, None, 0.0) for t in range(10)], 3),
    ("sensor-less, a request open but CPU advancing", False,
     [(t, 5.0 + t, 0, None, None, 0.0) for t in range(10)], None),
    ("CPU creeping under the floor is no progress", True,
     [(t, 5.0 + CPU_PROGRESS / 10 * t, 0, 0.0, None, None) for t in range(10)], 3),
    ("a wedged loop beside a background thread: CPU creeps past the floor, never at a rate", True,
     [(t, 5.0 + 0.01 * t, 0, t, float(t), None) for t in range(30)], 3),
]


@pytest.mark.parametrize(("name", "reports", "ticks", "hung_at"), LIVENESS, ids=[c[0] for c in LIVENESS])
def test_liveness(name, reports, ticks, hung_at):
    found = run_liveness(ticks, reports=reports)
    assert (found[0] if found else None) == hung_at
    if found:
        assert {"silent_seconds", "no_progress_seconds", "cpu_seconds", "answered"} <= set(found[1].numbers)


def test_progress_marks_only_move_on_progress():
    p = observe(None, 0.0, 1.0, 0)
    assert observe(p, 5.0, 1.01, 0) is p  # under the floor
    assert observe(p, 5.0, 1.2, 0) == Progress(5.0, 1.2, 0)
    assert observe(p, 5.0, 1.0, 1) == Progress(5.0, 1.0, 1)


# ---------------------------------------------------------------------- drains never cut work

DRAIN = [
    ("nothing open: stop now", 1.0, 0, 0, (True, None)),
    ("a request open: wait", 1.0, 1, 0, (False, None)),
    ("a WebSocket tunnel open: wait", 100.0, 0, 1, (False, None)),
    ("past the timeout: stop, naming what is cut", 301.0, 2, 1, (True, "2 open requests and 1 open WebSocket tunnel")),
]


@pytest.mark.parametrize(("name", "now", "requests", "tunnels", "expected"), DRAIN, ids=[d[0] for d in DRAIN])
def test_drain(name, now, requests, tunnels, expected):
    v = drain_verdict(now, 0.0, open_requests=requests, tunnels=tunnels, drain_timeout=300.0)
    assert (v.stop, v.cut) == expected


def test_a_limit_without_its_controller_binds_nothing():
    limits = Resources(cpu=50.0, memory=MiB, pids=10)
    assert enforced(limits, {"cpu", "memory", "pids"}) == limits
    assert enforced(limits, {"memory"}) == Resources(cpu=None, memory=MiB, pids=None)


def test_unlimited_budget():
    assert UNLIMITED.wall == 1.0 and limit_bindings(UNLIMITED, POOL, worker_rss=1, worker_pids=1) == []
