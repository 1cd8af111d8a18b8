"""The elastic pool's shell: it wires the pool's parts and turns each event into gather → decide → act.

Three events act, and never a timer of its own for placement or compaction (seed 000):

- a login on the request path → placement (keep or pass), admission (``policy``), then the scale-up check;
- a report (from the channel, or sensed by the tick for a worker that does not report) → archived in the
  group's readings, then the scale-up check, then the capacity ledger (``ledger``), which may compact;
- a request for a group with no routable worker → the cold-start rule (``idle.wake_rule``).

The sensing tick (``tick.py``) builds reports, and asks the liveness and idle rules. Taking workers out —
compaction, the idle retire, an operator's drain — is ``retirement.py``'s; the JSON view is ``pool_view.py``'s;
each group's state is one ``GroupRecord``. The deciding modules are pure and tested as tables: ``policy``
(placement, admission, scale-up), ``cap`` (max_workers), ``ledger``, ``idle``, ``drain``, ``liveness``, ``budget``.

The tenant's cgroup enters every decision through ``budget`` (the daemon's: the sampler's recent samples of
the tenant and the limits in force, see ``budget.py``): it sets the CPU wall of the evaluator, and holds a
scale-up that the tenant's cpu.max, memory.max or pids.max would leave with nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from elasticd.background import Background
from elasticd.config.model import Config, Server
from elasticd.pool.budget import UNLIMITED, Budget, limit_bindings
from elasticd.pool.emptying import Evacuation, PoolMover
from elasticd.pool.evaluator import SMOOTHING_ROWS, ForwardSnapshot, Row
from elasticd.pool.group_record import Changes, GroupRecord, GroupSettings
from elasticd.pool.idle import ColdStarts, WakeVerdict, wake_rule
from elasticd.pool.ledger import compaction_steps, may_compact, plan_compaction
from elasticd.pool.move_machine import Move, MoveSummary, Outcome
from elasticd.pool.policy import PoolDecision, WorkerView, check_scale_up, next_hold, place_login
from elasticd.pool.pool_view import describe_group, describe_moves
from elasticd.pool.ports import GroupKey, PoolForwards, PoolSupervisor, PoolSurface, PoolWorker
from elasticd.pool.proc_sensor import tree_cpu
from elasticd.pool.report import Report
from elasticd.pool.retirement import Retirement
from elasticd.pool.tick import SensingTick
from elasticd.supervisor.lifecycle import COUNTED
from elasticd.worker_ids import parse_worker_id

__all__ = ["LIMITED_RESOURCES", "PoolManager"]

log = logging.getLogger("elasticd.pool")

LIMITED_RESOURCES = ("cpu", "memory", "pids")  # what can hold a scale-up (elasticd_group_limit_bound)
MEASURED_ROWS = SMOOTHING_ROWS // 2  # readings before a worker's occupancy may ask for a scale-up


class PoolManager:
    __slots__ = ("_budget", "_changes", "_clock", "_forwards", "_groups", "_retirement", "_supervisor", "_surface",
                 "_tasks", "_tick", "_tunnels", "_wall", "on_wake_failed")

    def __init__(self, supervisor: PoolSupervisor, surface: PoolSurface, forwards: PoolForwards, *,
                 interval: float, hung_after: float | None = None,
                 budget: Callable[[str, str], Budget] | None = None,
                 tunnels: Callable[[], Mapping[str, int]] | None = None,
                 user_tunnels: Callable[[str], int] | None = None,
                 tree_cpu: Callable[[int], float | None] = tree_cpu,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        self._supervisor = supervisor
        self._surface = surface
        self._forwards = forwards
        self._budget = budget or (lambda tenant, app: UNLIMITED)
        self._clock = clock
        self._wall = wall
        self._groups: dict[GroupKey, GroupRecord] = {}
        self._changes = Changes()
        self._tasks = Background(log, "pool: a retire or replacement")
        self._tunnels = open_tunnels = tunnels or dict
        self._retirement = Retirement(supervisor, surface, forwards, tunnels=open_tunnels,
                                      user_tunnels=user_tunnels or (lambda user: 0), views=self._views,
                                      spawn=self._spawn, after_retire=self._after_retire, clock=clock,
                                      move_timeout=Server().move_timeout)
        self._tick = SensingTick(supervisor, surface, forwards, tunnels=open_tunnels, tree_cpu=tree_cpu,
                                 report=self._sensed, retirement=self._retirement,
                                 spawn=lambda coroutine: self._spawn(coroutine, None), interval=interval,
                                 hung_after=hung_after if hung_after is not None else Server().hung_after)
        # Told when a cold start owed to waiting requests cannot begin after all (the daemon: the front answers
        # them 503 at once rather than at their request timeout).
        self.on_wake_failed: Callable[[GroupKey, str], object] | None = None

    # ------------------------------------------------------------------ settings (reloadable)

    @property
    def changes(self) -> int:
        """Bumped whenever ``routable`` may answer otherwise (a drain begins or ends, a reload)."""
        return self._changes.count

    @property
    def interval(self) -> float:
        return self._tick.interval

    @property
    def hung_after(self) -> float:
        return self._tick.hung_after

    @property
    def mover(self) -> PoolMover | None:
        return self._retirement.mover

    @mover.setter
    def mover(self, mover: PoolMover | None) -> None:
        """Live moves (pool/mover.py), set by the daemon once the channel exists."""
        self._retirement.mover = mover

    def apply(self, config: Config) -> None:
        """Thresholds are reloadable: a reload swaps a group's pool config; removed groups are forgotten."""
        self._tick.interval = config.server.occupancy_interval
        self._tick.hung_after = config.server.hung_after
        self._retirement.move_timeout = config.server.move_timeout
        wanted = {(t.name, a.name, g.name): (a, g) for t, a, g in config.spawned_groups()}
        self._changes.bump()
        for key in [k for k in self._groups if k not in wanted]:
            del self._groups[key]
        now = self._clock()
        for key, (app, group) in wanted.items():
            settings = GroupSettings(group.pool, group.concurrency, app.floor(group.name),
                                     group.name in app.active_groups)
            record = self._groups.get(key)
            if record is None:
                self._groups[key] = GroupRecord(settings, self._changes, now, self._wall)
            else:
                record.settings = settings
                record.readings.reevaluate(group.pool.memory_limit)  # memory_limit may have changed

    # ------------------------------------------------------------------ views

    @property
    def draining(self) -> set[str]:
        """Every group's workers being drained away (a view; the filter itself is ``routable``)."""
        return set().union(*(record.flight.draining for record in self._groups.values()))

    def routable(self, key: GroupKey) -> list[PoolWorker]:
        """The one draining filter: the supervisor's routable workers less those being drained away (they get
        no new requests). The front's hot path and every decision read it."""
        record = self._groups.get(key)
        if record is None or not record.flight.draining:
            return [w for w in self._supervisor.workers_of(key) if w.routable]
        draining = record.flight.draining
        return [w for w in self._supervisor.workers_of(key) if w.routable and w.id not in draining]

    def routable_ids(self, key: GroupKey) -> list[str]:
        """What the front may send requests to: routable and not being drained, the reception first."""
        return [w.id for w in self.routable(key)]

    def _views(self, key: GroupKey, record: GroupRecord) -> list[WorkerView]:
        occupancy_of = record.readings.occupancy_of
        return [WorkerView(w.id, occupancy_of(w.id)) for w in self.routable(key)]

    def capacity_of(self, worker_id: str) -> float | None:
        found = self._find(worker_id)
        return found[1].readings.capacity.get(worker_id) if found is not None else None

    def occupancies(self) -> Iterable[tuple[GroupKey, str, float]]:
        for key, record in self._groups.items():
            for worker in self._supervisor.workers_of(key):
                yield key, worker.id, record.readings.occupancy_of(worker.id)

    def groups(self) -> list[GroupKey]:
        return list(self._groups)

    def decision_counts(self) -> dict[GroupKey, dict[str, int]]:
        return {key: dict(record.book.journal.counts) for key, record in self._groups.items()}

    def occupancies_of(self, key: GroupKey) -> list[float]:
        """The group's routable workers' occupancies, the reception first (what its ledger reads)."""
        record = self._groups.get(key)
        return [] if record is None else [view.occupancy for view in self._views(key, record)]

    def limits_bound(self) -> dict[GroupKey, frozenset[str]]:
        """Per group, the resources holding its scale-up right now (elasticd_group_limit_bound)."""
        return {key: record.book.bound for key, record in self._groups.items()}

    def cold_starts(self) -> dict[GroupKey, ColdStarts]:
        return {key: record.book.cold_starts for key, record in self._groups.items()}

    def describe(self, tenant: str, app: str, users_of: Callable[[str], list[dict[str, Any]]]) -> dict[str, Any]:
        book = getattr(self.mover, "book", None)
        moves: list[Move] = book.moves() if book is not None else []
        now = self._clock()
        groups = {}
        for key, record in self._groups.items():
            if key[:2] != (tenant, app):
                continue
            groups[key[2]] = describe_group(
                record, self._supervisor.workers_of(key), self.routable_ids(key), announced=self._tick.announced,
                counted=self._supervisor.counted(key), users_of=users_of,
                moves=describe_moves([m for m in moves if _key_of(m.source) == key], now))
        return {"tenant": tenant, "app": app, "groups": groups}

    # ------------------------------------------------------------------ event: a login on the request path

    def on_login(self, key: GroupKey, user: str, worker: str | None = None, placed: bool = False) -> str | None:
        """Where a user who just logged in on ``worker`` lives from now on; None: where it is. ``placed``: it
        was logged in already (a login again decides nothing: placement happens once)."""
        record = self._groups.get(key)
        if record is None:
            return None
        views = self._views(key, record)
        if not views:
            return None
        decisions = place_login(views, record.pool, current=worker, placed=placed)
        for decision in decisions:
            record.book.record(decision)
            if decision.kind == "fallback":
                log.warning("pool %s: %s", "/".join(key), decision.reason)
        self._check_scale_up(key, record, views)
        if not decisions or decisions[-1].kind == "keep":
            return None  # keeping is the null action: nobody is re-pointed
        return decisions[-1].worker

    # ------------------------------------------------------------------ event: a request for a group at zero

    def wake(self, key: GroupKey) -> bool:
        """The front has a request for a group with no routable worker: True when a worker is coming for it (a
        cold start begins now, or once the workers being retired have stopped), so the request waits; False when
        none will (see ``idle.WakeVerdict``): the request is answered 503."""
        record = self._groups.get(key)
        if record is None:
            return False
        now = self._clock()
        record.book.last_active = now  # a request came for it: not idle (it may be going to zero just now)
        draining = record.flight.draining
        verdict = wake_rule([(w.state, w.routable, w.id in draining) for w in self._supervisor.workers_of(key)],
                            launching=self._supervisor.launching(key), counted=self._supervisor.counted(key),
                            max_workers=record.pool.max_workers)
        if verdict is WakeVerdict.AFTER_RETIRE:
            record.flight.owed = True
        elif verdict is WakeVerdict.START:
            return self._cold_start(key, record, now)
        return verdict.waits

    def owes_start(self, key: GroupKey) -> bool:
        """Whether a cold start is owed to requests waiting for the group (they keep waiting for it)."""
        record = self._groups.get(key)
        return record is not None and record.flight.owed

    def _cold_start(self, key: GroupKey, record: GroupRecord, now: float) -> bool:
        worker = self._supervisor.add_worker(key)
        if worker is None:
            return False  # stopping, or the group is going
        record.flight.spawning.add(worker.id)
        record.flight.cold[worker.id] = now
        record.book.record(PoolDecision("scale-up", worker.id, "cold start: a request for a group at zero workers "
                                        "(it waits in the front for this one)", {"workers": 0}))
        log.info("pool %s: cold start of %s for a waiting request", "/".join(key), worker.id)
        return True

    def _after_retire(self, key: GroupKey, record: GroupRecord) -> None:
        """A retire ended: a cold start owed to waiting requests may begin now that the cap has room."""
        if not record.flight.owed or self._groups.get(key) is not record:
            return
        record.flight.owed = False
        if not self.wake(key) and self.on_wake_failed is not None:
            self.on_wake_failed(key, "no worker could start for it after its last ones retired")

    def on_routable(self, worker_id: str) -> float | None:
        """A worker became routable; the seconds its cold start took, when it was one."""
        found = self._find(worker_id)
        if found is None:
            return None
        key, record = found
        started = record.flight.cold.pop(worker_id, None)
        if started is None:
            return None
        seconds = self._clock() - started
        record.book.cold_starts.observe(seconds)
        log.info("pool %s: %s routable %.2fs after its cold start", "/".join(key), worker_id, seconds)
        return seconds

    # ------------------------------------------------------------------ event: a report, or a capacity reading

    def on_report(self, worker_id: str, report: Report, now: float) -> None:
        """A worker's own report, over the channel."""
        self._tick.heard(worker_id, now, report.loop_lag)
        self._archive(worker_id, report, now)

    def _sensed(self, worker_id: str, report: Report, now: float) -> None:
        """A report the tick built from /proc for a worker that does not report."""
        self._archive(worker_id, report, now)

    def _archive(self, worker_id: str, report: Report, now: float) -> None:
        found = self._find(worker_id)
        if found is None:
            return
        key, record = found
        readings = record.readings
        budget = self._budget(key[0], key[1])
        if budget.wall != readings.wall:  # the tenant's cpu.max changed (an override, a reload)
            readings.wall = budget.wall
            readings.reevaluate(record.pool.memory_limit)
        counters = self._forwards.worker(worker_id)
        readings.archive(worker_id, Row(now, report, ForwardSnapshot(counters.requests, counters.errors,
                                                                     counters.seconds)), record.pool.memory_limit)
        views = self._views(key, record)
        self._check_scale_up(key, record, views, budget)
        self._check_ledger(key, record, views)

    def on_capacity(self, worker_id: str, key: GroupKey, ratio: float | None) -> None:
        """A worker's capacity reading changed (None: it has none now). A reading at its limit is checked for a
        scale-up at once: every worker that says it is full is one the group cannot place on."""
        record = self._groups.get(key)
        if record is None:
            return
        capacity = record.readings.capacity
        before = capacity.get(worker_id)
        if ratio is None:
            capacity.pop(worker_id, None)
        else:
            capacity[worker_id] = ratio
        if ratio is not None and ratio >= 1.0 and before != ratio:
            self._check_scale_up(key, record, self._views(key, record))

    def forget_worker(self, worker_id: str) -> None:
        self._tick.forget(worker_id)
        for record in self._groups.values():
            record.forget(worker_id)

    def _find(self, worker_id: str) -> tuple[GroupKey, GroupRecord] | None:
        key = _key_of(worker_id)
        record = self._groups.get(key) if key else None
        return (key, record) if key and record else None

    # ------------------------------------------------------------------ scale-up and compaction

    def _check_scale_up(self, key: GroupKey, record: GroupRecord, views: Sequence[WorkerView],
                        budget: Budget | None = None) -> None:
        # gather
        flight, readings, book = record.flight, record.readings, record.book
        workers = {w.id: w for w in self._supervisor.workers_of(key)}
        flight.spawning = {wid for wid in flight.spawning if wid in workers and not workers[wid].routable
                           and workers[wid].state in COUNTED}
        # Routable but not yet measured (fewer than MEASURED_ROWS readings) is still a spawn in flight: its first
        # readings are its own start-up (imports, warm-up), and one spike must not grow the group.
        unmeasured = sum(1 for view in views if readings.rows(view.id) < MEASURED_ROWS)
        if budget is None:
            budget = self._budget(key[0], key[1])
        # What one more worker would add, only where a limit can be passed (this runs at every report and login).
        rss = readings.mean_rss([view.id for view in views]) if budget.memory_max is not None else None
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
        if decision is None:
            return
        if decision.kind == "held":
            if new:  # a new hold (or another limit): one journal entry, one log line
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
        log.info("pool %s: scale-up to %d workers (%s)", "/".join(key), self._supervisor.counted(key), decision.reason)

    def _pids_per_worker(self, tenant: str, budget: Budget) -> float | None:
        if budget.reading is None or budget.reading.pids is None:
            return None
        workers = sum(self._supervisor.counted(key) for key in self._groups if key[0] == tenant)
        return budget.reading.pids / workers if workers else None

    def _check_ledger(self, key: GroupKey, record: GroupRecord, views: Sequence[WorkerView]) -> None:
        flight, settings = record.flight, record.settings
        if not may_compact(draining=bool(flight.draining), spawning=bool(flight.spawning),
                           rows=[record.readings.rows(view.id) for view in views]):
            return
        loads_by_worker = self._retirement.user_loads(record, views)
        # (the group's floor: an old group of a blue/green switch compacts below its min_workers as users leave)
        pool = settings.pool if settings.floor == settings.pool.min_workers else dataclasses.replace(
            settings.pool, min_workers=settings.floor)
        plan = plan_compaction(views, loads_by_worker, pool, self._tunnels())
        if plan is None:
            return
        record.book.record(plan.decision)
        steps = compaction_steps(plan, loads_by_worker.get(plan.retire, {}), live=self.mover is not None)
        self._retirement.compact(key, record, plan.retire, steps)

    # ------------------------------------------------------------------ event: an operator's drain; a move ended

    async def drain(self, worker_id: str) -> Evacuation:
        """An operator takes ``worker_id`` out (``elasticctl drain``): no new users, a replacement first if the
        group would fall under ``min_workers``, every user moved off, then retired. KeyError: no such worker;
        ValueError: it is being drained already, or no replacement can start (elasticd is stopping, or the cap);
        TimeoutError: the replacement did not come up. It runs as one of the pool's tasks: the caller going away
        (an admin client that gave up) does not stop it half way; elasticd stopping does."""
        found = self._find(worker_id)
        if found is None or all(w.id != worker_id for w in self._supervisor.workers_of(found[0])):
            raise KeyError(worker_id)
        key, record = found
        if worker_id in record.flight.draining:
            raise ValueError(f"{worker_id} is being drained already")
        result: Evacuation = await asyncio.shield(self._retirement.drain(key, record, worker_id))
        return result

    async def wait_drained(self, worker_ids: Sequence[str], drain_timeout: float) -> dict[str, str]:
        """(The supervisor's, for workers a reload removes: see ``Retirement.wait_drained``.)"""
        return await self._retirement.wait_drained(worker_ids, drain_timeout)

    def record_move(self, move: Move, summary: MoveSummary) -> None:
        """Journal a move that ended (the Mover's ``on_end``): ``move`` or ``move-aborted`` in the source's group."""
        found = self._find(move.source)
        if found is None:
            return
        moved = summary.outcome is Outcome.MOVED
        reason = (f"{summary.user} moved to {summary.target}" if moved
                  else f"{summary.user} stays on {move.release_to or '(placed anew)'}: {summary.outcome.value}: "
                       f"{summary.why}")
        numbers = {"user": summary.user, "to": summary.target, "ms": round(summary.seconds * 1000, 1),
                   "package_bytes": summary.package_bytes, "outcome": summary.outcome.value}
        found[1].book.record(PoolDecision("move" if moved else "move-aborted", move.source, reason, numbers))

    # ------------------------------------------------------------------ the sensing tick; the end

    def sense(self) -> None:
        self._tick.sense(self._groups, self._clock())

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._tick.interval)
            try:
                self.sense()
            except Exception:  # the tick must survive anything one worker's /proc can throw at it
                log.exception("pool: the sensing tick failed")

    def stop(self) -> None:
        """At shutdown: the retires and replacements in flight end here; a worker one of them was stopping stays
        in the supervisor's registry until it has stopped, so stop_all finishes it."""
        self._tasks.cancel()

    def _spawn(self, coroutine: Coroutine[Any, Any, Any], name: str | None) -> asyncio.Task[Any]:
        return self._tasks.spawn(coroutine, name=name)


def _key_of(worker_id: str) -> GroupKey | None:
    parts = parse_worker_id(worker_id)
    return parts.group_key if parts is not None else None
