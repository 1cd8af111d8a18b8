"""Tables for the evaluator and each policy of the elastic pool, with the seed's worked example."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elasticd.config.model import PoolSettings
from elasticd.pool.evaluator import ForwardSnapshot, Row, Window, components_of, history_of, occupancy, rates_of
from elasticd.pool.ledger import ledger, plan_compaction
from elasticd.pool.policy import WorkerView, admit, check_scale_up, place_login
from elasticd.pool.report import Executor, Report, ReportError, parse_report

POOL = PoolSettings(min_workers=1, max_workers=4, reception_threshold=0.5, admission_threshold=0.8,
            compaction_margin=1.5, memory_limit=256 * 1024**2)


def rows(*specs, memory_limit=None) -> list[Row]:
    """(cpu, busy/total, rss) per row, at 5 s apart."""
    out = []
    for i, (cpu, executor, rss) in enumerate(specs):
        ex = Executor(busy=executor[0], total=executor[1]) if executor else None
        out.append(Row(ts=5.0 * i, report=Report(cpu=cpu, executor=ex, rss=rss)))
    return out


# ---------------------------------------------------------------------- the report


def test_report_parses_the_fixed_shape():
    report = parse_report({"users": 3, "pages": 4, "connections": 2, "active_users": 1,
                           "executor": {"busy": 2, "total": 8, "queue_depth": 0}, "cpu": 0.25, "rss": 1000,
                           "backlog": 0, "load": 0.5})
    assert report.executor == Executor(2, 8, 0)
    assert (report.cpu, report.rss, report.users) == (0.25, 1000, 3)
    assert parse_report({"cpu": None}).cpu is None  # the first tick has no cpu delta
    assert (report.pages, report.backlog) == (4, 0)


def test_what_a_worker_does_not_measure_reads_none_not_zero():
    report = parse_report({"users": 1, "executor": {"busy": 0, "total": 8}})
    assert (report.pages, report.backlog, report.executor) == (None, None, Executor(0, 8, None))


@pytest.mark.parametrize(("data", "reason"), [
    ([], "not an object"),
    ({"users": -1}, "users: -1 is not a count"),
    ({"users": True}, "users: True is not a count"),
    ({"cpu": "lots"}, "cpu: 'lots' is not a non-negative number"),
    ({"cpu": float("nan")}, "cpu: nan"),
    ({"executor": {"busy": 1, "total": 0}}, "executor.total: must be at least 1"),
    ({"executor": 3}, "executor: not an object"),
    ({"rss": -5}, "rss: -5 is not a byte count"),
    ({"weather": "sunny"}, "unknown fields: weather"),
    ({"pages": -2}, "pages: -2 is not a count"),
    ({"backlog": 1.5}, "backlog: 1.5 is not a count"),
    ({"executor": {"busy": 1, "total": 2, "queue_depth": "x"}}, "queue_depth: 'x' is not a count"),
    ({"executor": {"busy": 1, "total": 2, "waiting": 1}}, "executor: unknown fields: waiting"),
])
def test_report_refusals(data, reason):
    with pytest.raises(ReportError, match=reason.replace("(", r"\(")):
        parse_report(data)


# ---------------------------------------------------------------------- the evaluator

EVALUATOR = [
    ("no rows reads 0: a newborn admits", [], None, 0.0, {}),
    ("cpu clipped at one core", [(1.7, None, None)], None, 1.0, {"cpu": 1.0}),
    ("executor busy/total", [(None, (2, 8), None)], None, 0.25, {"executor": 0.25}),
    ("memory only with a limit", [(None, None, 128 * 1024**2)], None, 0.0, {}),
    ("memory with a limit", [(None, None, 128 * 1024**2)], 256 * 1024**2, 0.5, {"memory": 0.5}),
    ("average first, then max", [(0.9, (0, 8), None), (0.3, (8, 8), None)], None, 0.6,
     {"cpu": 0.6, "executor": 0.5}),
    ("only the last 6 rows count", [(1.0, None, None)] * 4 + [(0.0, None, None)] * 6, None, 0.0, {"cpu": 0.0}),
    ("a missing component averages over the rows that carry it", [(0.4, None, None), (None, None, None)], None,
     0.4, {"cpu": 0.4}),
]


@pytest.mark.parametrize(("name", "specs", "limit", "expected", "parts"), EVALUATOR, ids=[r[0] for r in EVALUATOR])
def test_evaluator(name, specs, limit, expected, parts):
    window = rows(*specs)
    assert occupancy(window, limit) == pytest.approx(expected)
    assert components_of(window, limit) == pytest.approx(parts)


def test_history_and_window_bound():
    window = Window(maxlen=60)
    for row in rows(*[(i / 100, None, None) for i in range(70)]):
        window.add(row)
    assert len(window.rows) == 60
    history = history_of(window.rows, None)
    assert history[0] == pytest.approx(0.10) and history[-1] == pytest.approx(0.69)


def test_rates_from_forward_deltas():
    report = Report()
    window = [Row(0.0, report, ForwardSnapshot(100, 1, 10.0)), Row(5.0, report, None),
              Row(10.0, report, ForwardSnapshot(300, 3, 30.0))]
    rates = rates_of(window)
    assert rates.rps == pytest.approx(20.0)
    assert rates.latency == pytest.approx(0.1)
    assert rates.error_rate == pytest.approx(0.2)
    assert rates_of(window[:1]) is None
    reset = [Row(0.0, report, ForwardSnapshot(100, 0, 1.0)), Row(5.0, report, ForwardSnapshot(3, 0, 0.1))]
    assert rates_of(reset) is None


# ---------------------------------------------------------------------- placement and admission


def views(*occupancies: float) -> list[WorkerView]:
    return [WorkerView(f"w{i}", o) for i, o in enumerate(occupancies)]


PLACEMENT = [
    ("a group of one always keeps", (0.95,), ["keep"], "w0"),
    ("reception under its threshold keeps", (0.3, 0.1), ["keep"], "w0"),
    ("reception over passes to the least occupied", (0.6, 0.5, 0.2, 0.7), ["pass", "admit"], "w2"),
    ("at the threshold passes", (0.5, 0.1), ["pass", "admit"], "w1"),
    ("nobody under admission: fallback on the last", (0.9, 0.85, 0.95), ["pass", "fallback"], "w2"),
    ("reception_threshold 0 reproduces v1.0's exclusion", (0.0, 0.1), ["keep"], "w0"),
]


@pytest.mark.parametrize(("name", "occ", "kinds", "worker"), PLACEMENT, ids=[r[0] for r in PLACEMENT])
def test_placement(name, occ, kinds, worker):
    decisions = place_login(views(*occ), POOL)
    assert [d.kind for d in decisions] == kinds
    assert decisions[-1].worker == worker


def test_reception_threshold_zero_always_passes():
    from dataclasses import replace
    decisions = place_login(views(0.0, 0.1), replace(POOL, reception_threshold=0.0))
    assert [d.kind for d in decisions] == ["pass", "admit"]


def test_admission_never_picks_the_reception():
    assert admit(views(0.0, 0.7), POOL).worker == "w1"
    with pytest.raises(ValueError):
        admit(views(0.0), POOL)


# ---------------------------------------------------------------------- scale-up

SCALE = [
    ("group of one under its keep threshold", (0.4,), 0, None),
    ("group of one over its keep threshold", (0.6,), 0, "scale-up"),
    ("someone under admission", (0.9, 0.85, 0.7), 0, None),
    ("nobody under admission", (0.1, 0.85, 0.9), 0, "scale-up"),
    ("guard: a spawn in flight", (0.1, 0.85, 0.9), 1, None),
    ("guard: max_workers", (0.1, 0.85, 0.9, 0.95), 0, None),
    ("guard: max_workers, group of one", (0.9,), 0, "scale-up"),
]


@pytest.mark.parametrize(("name", "occ", "spawning", "kind"), SCALE, ids=[r[0] for r in SCALE])
def test_check_capacity(name, occ, spawning, kind):
    decision = check_scale_up(views(*occ), POOL, spawning=spawning)
    assert (decision.kind if decision else None) == kind


def test_unbounded_max_workers():
    from dataclasses import replace
    assert check_scale_up(views(0.1, 0.9, 0.9, 0.9), replace(POOL, max_workers=None), spawning=0).kind == "scale-up"


# ---------------------------------------------------------------------- the ledger and compaction


def test_seed_worked_example():
    # 4 workers: C = 0.5 + 3·0.8 = 2.9; at O = 2.3, H = 0.6: nothing to do.
    busy = views(0.5, 0.6, 0.6, 0.6)
    book = ledger([w.occupancy for w in busy], POOL)
    assert (book.capacity, book.occupied, book.headroom) == pytest.approx((2.9, 2.3, 0.6))
    assert plan_compaction(busy, {}, POOL) is None
    # At O = 1.5, H = 1.4 > 1.2: compact the least-occupied outer worker; then C = 2.1 and H = 0.6.
    quiet = views(0.4, 0.5, 0.2, 0.4)
    loads = {"w2": {"u1": 0.1, "u2": 0.1}}
    plan = plan_compaction(quiet, loads, POOL)
    assert plan is not None and plan.retire == "w2"
    assert set(plan.moves) == {"u1", "u2"} and set(plan.moves.values()) <= {"w1", "w3"}
    after = plan.decision.numbers["after"]
    assert (after["C"], after["H"]) == pytest.approx((2.1, 0.6))


COMPACTION = [
    ("never below min_workers", (0.0, 0.0), {}, 2, None),
    ("never the reception", (0.0, 0.3, 0.0), {}, 1, "w2"),
    ("an idle worker is an empty move-set", (0.05, 0.0), {}, 1, "w1"),
    ("no compaction when the survivor would be over", (0.0, 0.85, 0.0), {}, 1, None),
    ("a heavy user that fits nowhere keeps its worker", (0.0, 0.7, 0.15), {"w2": {"big": 0.15}}, 1, None),
]


@pytest.mark.parametrize(("name", "occ", "loads", "min_workers", "retire"), COMPACTION,
                         ids=[r[0] for r in COMPACTION])
def test_compaction(name, occ, loads, min_workers, retire):
    from dataclasses import replace
    plan = plan_compaction(views(*occ), loads, replace(POOL, min_workers=min_workers))
    assert (plan.retire if plan else None) == retire


# ---------------------------------------------------------------------- properties


@st.composite
def groups(draw):
    n = draw(st.integers(min_value=2, max_value=8))
    occupancies = [draw(st.floats(min_value=0.0, max_value=1.0)) for _ in range(n)]
    loads = {}
    for i, occ in enumerate(occupancies[1:], start=1):
        k = draw(st.integers(min_value=0, max_value=5))
        shares = [draw(st.floats(min_value=0.01, max_value=1.0)) for _ in range(k)]
        total = sum(shares)
        loads[f"w{i}"] = {f"u{i}.{j}": occ * s / total for j, s in enumerate(shares)} if k else {}
    rt = draw(st.floats(min_value=0.0, max_value=0.8))
    at = draw(st.floats(min_value=max(rt, 0.3), max_value=0.95))
    margin = draw(st.floats(min_value=1.0, max_value=2.5))
    pool = PoolSettings(min_workers=1, max_workers=None, reception_threshold=rt, admission_threshold=at,
                compaction_margin=margin)
    return views(*occupancies), loads, pool


@settings(max_examples=400, deadline=None)
@given(groups())
def test_a_compaction_never_leads_straight_into_a_scale_up(group):
    workers, loads, pool = group
    plan = plan_compaction(workers, loads, pool)
    if plan is None:
        return
    projected = {w.id: w.occupancy for w in workers if w.id != plan.retire}
    for user, target in plan.moves.items():
        projected[target] += loads[plan.retire][user]
    survivors = [WorkerView(w.id, projected[w.id]) for w in workers if w.id != plan.retire]
    assert check_scale_up(survivors, pool, spawning=0) is None


@settings(max_examples=400, deadline=None)
@given(groups())
def test_drained_users_always_fit_under_admission_on_the_survivors(group):
    workers, loads, pool = group
    plan = plan_compaction(workers, loads, pool)
    if plan is None:
        return
    assert set(plan.moves) == set(loads.get(plan.retire, {}))
    projected = {w.id: w.occupancy for w in workers if w.id != plan.retire}
    for user, target in plan.moves.items():
        projected[target] += loads[plan.retire][user]
    reception = workers[0].id
    for target in set(plan.moves.values()):
        threshold = pool.reception_threshold if target == reception else pool.admission_threshold
        assert projected[target] < threshold
        if len(workers) > 2:
            assert target != reception  # admission never uses the reception while others survive


# ---------------------------------------------------------------------- the burst (the short signal)

_W2 = [WorkerView("w1", 0.3), WorkerView("w2", 0.2)]

# (name, routable, waiting in the front, waiting in executors, starting, counted, a binding limit, measuring,
#  the decision's kind or None)
BURST = [
    ("nothing waits: the window's rule alone", _W2, 0, 0, 0, 2, False, False, None),
    ("requests wait in the front: grow now, whatever the average says", _W2, 3, 0, 0, 2, False, False, "scale-up"),
    ("an executor's queue is the same signal", _W2, 0, 2, 0, 2, False, False, "scale-up"),
    ("one start at a time", _W2, 3, 0, 1, 3, False, False, None),
    ("at max_workers", [*_W2, WorkerView("w3", 0.9), WorkerView("w4", 0.9)], 9, 0, 0, 4, False, False, None),
    ("held by the tenant's limit", _W2, 3, 0, 0, 2, True, False, "held"),
    ("no reading of the tenant's cgroup yet", _W2, 3, 0, 0, 2, False, True, None),
    ("no routable worker: the cold start's", [], 3, 0, 0, 0, False, False, None),
]


@pytest.mark.parametrize(("name", "workers", "waiting", "executor_waiting", "starting", "counted", "bound",
                          "measuring", "kind"), BURST, ids=[row[0] for row in BURST])
def test_the_burst_grows_the_group_at_once_under_the_same_guards(name, workers, waiting, executor_waiting, starting,
                                                                 counted, bound, measuring, kind):
    from elasticd.pool.budget import LimitBinding
    from elasticd.pool.policy import check_burst

    holds = [LimitBinding("memory", "memory.current plus one worker over 0.9 of memory.max", {})] if bound else []
    decision = check_burst(workers, POOL, waiting=waiting, executor_waiting=executor_waiting, starting=starting,
                           counted=counted, holds=holds, measuring=measuring)
    assert (decision.kind if decision is not None else None) == kind
    if decision is not None:
        assert decision.reason.startswith("burst: ") and decision.numbers["waiting"] == waiting


# (name, the worker's reading times, the last burst, readings that count for compaction)
CALM = [
    ("no burst ever: every reading", [1.0, 2.0, 3.0], float("-inf"), 3),
    ("a burst now: none", [1.0, 2.0, 3.0], 3.0, 0),
    ("readings since the burst only", [1.0, 2.0, 3.0, 4.0], 2.5, 2),
]


@pytest.mark.parametrize(("name", "times", "burst_at", "counted"), CALM, ids=[row[0] for row in CALM])
def test_no_compaction_while_a_burst_lasts_nor_until_a_window_was_read_after_it(name, times, burst_at, counted):
    from elasticd.pool.evaluator import SMOOTHING_ROWS
    from elasticd.pool.ledger import calm_rows, may_compact

    assert calm_rows(times, burst_at) == counted
    full = [float(i) for i in range(SMOOTHING_ROWS)]
    assert may_compact(draining=False, spawning=False, rows=[calm_rows(full, float("-inf"))])
    assert not may_compact(draining=False, spawning=False, rows=[calm_rows(full, 0.5)])
