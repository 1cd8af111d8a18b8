"""Growing and compacting a group: the two checks a report (and a login) asks, each as gather → decide → act.

- the scale-up check: gather what is starting or not yet measured, the tenant's cgroup budget and what one more
  worker would add to it; decide (``policy.check_scale_up``, ``policy.next_hold``: pure); act — start a worker, or
  journal a new hold once;
- the burst check: gather the front's queue and the workers' executor queues; decide (``policy.check_burst``:
  pure); act as the scale-up does;
- the capacity ledger: gather the group's occupancies and each user's share, counting only the readings since the
  last burst; decide (``ledger.calm_rows``, ``may_compact``, ``plan_compaction``, ``compaction_steps``: pure); act —
  hand the compaction to ``retirement``.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

from elasticd.pool.budget import Budget, limit_bindings
from elasticd.pool.evaluator import SMOOTHING_ROWS
from elasticd.pool.group_record import GroupRecord
from elasticd.pool.ledger import calm_rows, compaction_steps, may_compact, plan_compaction
from elasticd.pool.policy import PoolDecision, WorkerView, check_burst, check_scale_up, next_hold
from elasticd.pool.ports import GroupKey, PoolSupervisor
from elasticd.pool.retirement import Retirement
from elasticd.supervisor.lifecycle import COUNTED

__all__ = ["MEASURED_ROWS", "Scaling"]

log = logging.getLogger("elasticd.pool")

MEASURED_ROWS = SMOOTHING_ROWS // 2  # readings before a worker's occupancy may ask for a scale-up


class Scaling:
    __slots__ = ("_budget", "_retirement", "_supervisor", "_tenant_counted", "_tunnels")

    def __init__(self, supervisor: PoolSupervisor, retirement: Retirement, *,
                 budget: Callable[[str, str], Budget], tunnels: Callable[[], Mapping[str, int]],
                 tenant_counted: Callable[[str], int]) -> None:
        self._supervisor = supervisor
        self._retirement = retirement
        self._budget = budget
        self._tunnels = tunnels
        self._tenant_counted = tenant_counted  # every worker counted for the tenant, all its groups

    def check_scale_up(self, key: GroupKey, record: GroupRecord, views: Sequence[WorkerView],
                       budget: Budget | None = None) -> None:
        # gather
        flight, readings, book = record.flight, record.readings, record.book
        workers = {w.id: w for w in self._supervisor.workers_of(key)}
        flight.spawning = {wid for wid in flight.spawning if wid in workers and not workers[wid].routable
                           and workers[wid].state in COUNTED}
        # Routable but not yet measured (fewer than MEASURED_ROWS readings) is still a spawn in flight: its first
        # readings are its own start-up (imports, warm-up), and one spike must not grow the group.
        windows = readings.windows
        unmeasured = sum(1 for view in views if view.id not in windows or len(windows[view.id].rows) < MEASURED_ROWS)
        if budget is None:
            budget = self._budget(key[0], key[1])
        # What one more worker would add, only where a limit can be passed (this runs at every report and login).
        rss = readings.mean_rss(views) if budget.memory_max is not None else None
        binding = limit_bindings(budget, record.pool, worker_rss=rss,
                                 worker_pids=self._pids_per_worker(key[0], budget) if budget.pids_max else None)
        # decide
        decision = check_scale_up(views, record.pool, spawning=len(flight.spawning) + unmeasured,
                                  counted=self._supervisor.counted(key), holds=binding, measuring=budget.pending)
        bound, new = next_hold(book.bound, binding, decision, measuring=budget.pending)
        if book.bound and not bound:
            log.info("pool %s: no longer held by the tenant's %s limit", "/".join(key), ", ".join(sorted(book.bound)))
        book.bound = bound
        # act
        self._act(key, record, decision, new, budget)

    def check_burst(self, key: GroupKey, record: GroupRecord, views: Sequence[WorkerView], waiting: int,
                    now: float) -> None:
        """The short signal (``policy.check_burst``): requests wait in the front's queue (``waiting``) or in a
        worker's executor. Asked as a request is queued and at each report; the budget is read only when the cheap
        guards let a start through (a queued burst asks this for every request)."""
        # gather
        flight, readings, book = record.flight, record.readings, record.book
        executor_waiting = 0
        for view in views:
            window = readings.windows.get(view.id)
            executor = window.rows[-1].report.executor if window is not None and window.rows else None
            if executor is not None and executor.queue_depth:
                executor_waiting += executor.queue_depth
        if waiting <= 0 and executor_waiting <= 0:
            return
        book.burst_at = now
        routable = {view.id for view in views}
        starting = sum(1 for wid in flight.spawning if wid not in routable)
        counted = self._supervisor.counted(key)
        # decide: first on what costs nothing to know, then with the tenant's budget when a start may follow
        if check_burst(views, record.pool, waiting=waiting, executor_waiting=executor_waiting, starting=starting,
                       counted=counted) is None:
            return
        budget = self._budget(key[0], key[1])
        rss = readings.mean_rss(views) if budget.memory_max is not None else None
        binding = limit_bindings(budget, record.pool, worker_rss=rss,
                                 worker_pids=self._pids_per_worker(key[0], budget) if budget.pids_max else None)
        decision = check_burst(views, record.pool, waiting=waiting, executor_waiting=executor_waiting,
                               starting=starting, counted=counted, holds=binding, measuring=budget.pending)
        bound, new = next_hold(book.bound, binding, decision, measuring=budget.pending)
        book.bound = bound
        # act
        self._act(key, record, decision, new, budget)

    def _act(self, key: GroupKey, record: GroupRecord, decision: PoolDecision | None, new_hold: bool,
             budget: Budget) -> None:
        """A scale-up decision carried out: a worker started, or a new hold journaled once."""
        if decision is None:
            return
        book, flight = record.book, record.flight
        if decision.kind == "held":
            if new_hold:  # a new hold (or another limit): one journal entry, one log line
                book.hold = decision
                book.record(decision)
                log.warning("pool %s: scale-up held: %s", "/".join(key), decision.reason)
            return
        worker = self._supervisor.add_worker(key)
        if worker is None:
            return  # stopping, or the group is going: nothing to grow
        flight.spawning.add(worker.id)
        book.record(PoolDecision(decision.kind, worker.id, decision.reason,
                                 {**decision.numbers, "budget": budget.numbers()}))
        log.info("pool %s: scale-up to %d workers (%s)", "/".join(key), self._supervisor.counted(key),
                 decision.reason)

    def _pids_per_worker(self, tenant: str, budget: Budget) -> float | None:
        if budget.reading is None or budget.reading.pids is None:
            return None
        workers = self._tenant_counted(tenant)
        return budget.reading.pids / workers if workers else None

    def check_ledger(self, key: GroupKey, record: GroupRecord, views: Sequence[WorkerView]) -> None:
        # gather
        flight, settings = record.flight, record.settings
        if flight.draining or flight.spawning:
            return  # (may_compact's first rule, asked before the rows are counted: this runs at every report)
        windows, burst_at = record.readings.windows, record.book.burst_at
        if not may_compact(draining=False, spawning=False,
                           rows=[calm_rows([row.ts for row in windows[view.id].rows], burst_at)
                                 if view.id in windows else 0 for view in views]):
            return
        loads_by_worker = self._retirement.user_loads(record, views)
        # (the group's floor: an old group of a blue/green switch compacts below its min_workers as users leave)
        pool = settings.pool if settings.floor == settings.pool.min_workers else dataclasses.replace(
            settings.pool, min_workers=settings.floor)
        # decide
        plan = plan_compaction(views, loads_by_worker, pool, self._tunnels())
        if plan is None:
            return
        record.book.record(plan.decision)
        steps = compaction_steps(plan, loads_by_worker.get(plan.retire, {}), live=self._retirement.mover is not None)
        # act
        self._retirement.compact(key, record, plan.retire, steps)
