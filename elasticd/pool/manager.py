"""The elastic pool's shell: archives reports, asks the pure policies, and carries out what they decide.

Per group it keeps each worker's window of rows ``{ts, report, forward}`` (forward = the front's cumulative
counters for that worker when the row was archived), the spawns in flight, the workers being drained and
the decision journal. It acts in three places only, and never on a timer of its own for placement or
compaction (seed 000):

- a login arrives on the request path → placement (keep or pass), admission, then the scale-up check;
- a report arrives (from the channel, or built by elasticd for a worker that does not report) → archive,
  the scale-up check, then the capacity ledger, which may compact;
- the sensing tick (every ``occupancy_interval``) builds reports for workers that do not report and asks
  the liveness rule about every worker: silent AND making no progress for ``hung_after`` is hung, and is
  killed and replaced (its users are re-placed by the front); busy is never hung.

The tenant's cgroup enters every decision through ``budget`` (the daemon's: the sampler's recent samples of
the tenant and the limits in force, see ``budget.py``): it sets the CPU wall of the evaluator, and holds a
scale-up that the tenant's cpu.max, memory.max or pids.max would leave with nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from elasticd.background import Background
from elasticd.config.model import Config, PoolSettings, Server
from elasticd.pool.budget import UNLIMITED, Budget, limit_bindings
from elasticd.pool.drain import drain_verdict
from elasticd.pool.evacuate import Evacuation, PoolMover, evacuate
from elasticd.pool.evaluator import (
    SMOOTHING_ROWS,
    ForwardSnapshot,
    Row,
    Window,
    components_of,
    history_of,
    occupancy,
    rates_of,
)
from elasticd.pool.idle import ColdStarts, idle_stop
from elasticd.pool.journal import Journal
from elasticd.pool.ledger import ledger, plan_compaction, plan_evacuation
from elasticd.pool.liveness import Progress, observe, reporting, verdict
from elasticd.pool.move import Move, MoveSummary, Outcome
from elasticd.pool.policy import PoolDecision, WorkerView, check_capacity, next_hold, place_login
from elasticd.pool.ports import GroupKey, PoolForwards, PoolSupervisor, PoolSurface
from elasticd.pool.report import Report
from elasticd.pool.sensing import TreeSensor, tree_cpu
from elasticd.pool.user_loads import user_loads
from elasticd.supervisor.lifecycle import COMING, COUNTED, WorkerState
from elasticd.worker_ids import parse_worker_id

__all__ = ["LIMITED_RESOURCES", "PoolManager"]

log = logging.getLogger("elasticd.pool")

LIMITED_RESOURCES = ("cpu", "memory", "pids")  # what can hold a scale-up (elasticd_group_limit_bound)
_DRAIN_POLL = 0.1  # seconds between two looks at what is still open on a draining worker
MEASURED_ROWS = SMOOTHING_ROWS // 2  # readings before a worker's occupancy may ask for a scale-up


class _Group:
    __slots__ = ("active", "bound", "capacity", "cold", "cold_starts", "concurrency", "draining", "floor", "held",
                 "journal",
                 "last_active", "last_requests", "occupancy", "pool", "rss", "sensors", "spawning", "user_seconds",
                 "wall", "windows")

    def __init__(self, pool: PoolSettings, concurrency: int, floor: int = 1, active: bool = True) -> None:
        self.pool = pool
        self.concurrency = concurrency
        self.floor = floor  # workers it keeps however idle: min_workers while active, else 0 (Config.App.floor)
        self.active = active  # new users go to it (the default group or the canary)
        self.cold: dict[str, float] = {}  # worker → when its cold start began (a request waits for it)
        self.cold_starts = ColdStarts()
        self.last_active = 0.0  # when a request to the group was last seen (the sensing tick's count moved)
        self.last_requests = -1  # the group's forward count at the last tick
        self.wall = 1.0  # the CPU one worker of the group can use: min(1 core, the tenant's cpu.max)
        self.bound: frozenset[str] = frozenset()  # the resources holding the group's scale-up, while they do
        self.held: PoolDecision | None = None  # the decision that started the hold (its reason and numbers)
        self.windows: dict[str, Window] = {}
        # Evaluated when a report is archived (the only time it can change), so placement on the request path
        # reads N numbers instead of re-averaging N windows.
        self.occupancy: dict[str, float] = {}
        # What each worker's own capacity reading says (used / limit, probes/): a worker that says it is full is
        # full, whatever its reports average to. Not smoothed: the reading is the worker's word for now.
        self.capacity: dict[str, float] = {}
        self.rss: dict[str, int] = {}  # each worker's latest RSS (the memory hold's "one more worker")
        self.sensors: dict[str, TreeSensor] = {}
        self.spawning: set[str] = set()
        # Replaced whole, never changed in place (a frozenset has no add): each change is counted by the
        # manager (``changes``), which the front's cached routing relies on.
        self.draining: frozenset[str] = frozenset()
        self.journal = Journal()
        self.user_seconds: dict[str, float] = {}  # user → cumulative seconds at the last ledger check


class PoolManager:
    __slots__ = (
        "_announced",
        "_budget",
        "_clock",
        "_forwards",
        "_groups",
        "_last_report",
        "_progress",
        "_supervisor",
        "_surface",
        "_tasks",
        "_tree_cpu",
        "_tunnels",
        "_user_tunnels",
        "_wall",
        "changes",
        "hung_after",
        "interval",
        "move_timeout",
        "mover",
    )

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
        self._tunnels = tunnels or dict
        self._user_tunnels = user_tunnels  # a user's open tunnels: it is moved once they closed
        self._tree_cpu = tree_cpu
        self.interval = interval
        self.hung_after = hung_after if hung_after is not None else Server().hung_after
        self._clock = clock
        self._wall = wall
        self._groups: dict[GroupKey, _Group] = {}
        self._announced: set[str] = set()
        self._last_report: dict[str, tuple[float, float | None]] = {}  # worker → (when, its loop_lag)
        self._progress: dict[str, Progress] = {}
        self._tasks = Background(log, "pool: a retire or replacement")
        self.changes = 0  # bumped whenever ``routable`` may answer otherwise (a drain begins or ends, a reload)
        # Live moves (pool/mover.py), set by the daemon once the channel exists; without one, compaction
        # re-points users (their in-process state is then lost).
        self.mover: PoolMover | None = None
        self.move_timeout = Server().move_timeout

    # ------------------------------------------------------------------ config

    def apply(self, config: Config) -> None:
        """Thresholds are reloadable: a reload swaps a group's pool config; removed groups are forgotten."""
        self.interval = config.server.occupancy_interval
        self.hung_after = config.server.hung_after
        self.move_timeout = config.server.move_timeout
        wanted = {(t.name, a.name, g.name): (a, g) for t, a, g in config.spawned_groups()}
        self.changes += 1
        for key in [k for k in self._groups if k not in wanted]:
            del self._groups[key]
        now = self._clock()
        for key, (app, group) in wanted.items():
            entry = self._groups.get(key)
            floor, active = app.floor(group.name), group.name in app.active_groups
            if entry is None:
                entry = self._groups[key] = _Group(group.pool, group.concurrency, floor, active)
                entry.last_active = now  # its idle time counts from its start
            else:
                entry.pool, entry.concurrency, entry.floor, entry.active = group.pool, group.concurrency, floor, active
                # memory_limit may have changed: every cached occupancy is re-read from its window.
                self._reevaluate(entry)

    def _reevaluate(self, entry: _Group) -> None:
        entry.occupancy = {wid: occupancy(w.rows, entry.pool.memory_limit, cpu_wall=entry.wall)
                           for wid, w in entry.windows.items()}

    # ------------------------------------------------------------------ views

    @property
    def draining(self) -> set[str]:
        """Every group's workers being compacted away (a view; the filter itself is ``routable``)."""
        return set().union(*(entry.draining for entry in self._groups.values()))

    def routable(self, key: GroupKey) -> list[Any]:
        """The one draining filter: the supervisor's routable workers less those being compacted away (they get
        no new requests). The front's hot path and every decision read it."""
        entry = self._groups.get(key)
        if entry is None or not entry.draining:
            return [w for w in self._supervisor.workers_of(key) if w.routable]
        draining = entry.draining
        return [w for w in self._supervisor.workers_of(key) if w.routable and w.id not in draining]

    def routable_ids(self, key: GroupKey) -> list[str]:
        """What the front may send requests to: routable and not being drained, the reception first."""
        return [w.id for w in self.routable(key)]

    @staticmethod
    def _occupancy(entry: _Group, worker_id: str) -> float:
        measured = entry.occupancy.get(worker_id, 0.0)
        if not entry.capacity:
            return measured
        return max(measured, entry.capacity.get(worker_id, 0.0))  # the capacity component

    def on_capacity(self, worker_id: str, key: GroupKey, ratio: float | None) -> None:
        """A worker's capacity reading changed (None: it has none now). A reading at its limit is checked for a
        scale-up at once: every worker that says it is full is one the group cannot place on."""
        entry = self._groups.get(key)
        if entry is None:
            return
        before = entry.capacity.get(worker_id)
        if ratio is None:
            entry.capacity.pop(worker_id, None)
        else:
            entry.capacity[worker_id] = ratio
        if ratio is not None and ratio >= 1.0 and before != ratio:
            self._check_capacity(key, entry, self._views(key, entry))

    def capacity_of(self, worker_id: str) -> float | None:
        found = self._find(worker_id)
        return found[1].capacity.get(worker_id) if found is not None else None

    def _views(self, key: GroupKey, entry: _Group) -> list[WorkerView]:
        return [WorkerView(w.id, self._occupancy(entry, w.id)) for w in self.routable(key)]

    def occupancies(self) -> Iterable[tuple[GroupKey, str, float]]:
        for key, entry in self._groups.items():
            for worker in self._supervisor.workers_of(key):
                yield key, worker.id, self._occupancy(entry, worker.id)

    def groups(self) -> list[GroupKey]:
        return list(self._groups)

    def decision_counts(self) -> dict[GroupKey, dict[str, int]]:
        return {key: dict(entry.journal.counts) for key, entry in self._groups.items()}

    def occupancies_of(self, key: GroupKey) -> list[float]:
        """The group's routable workers' occupancies, the reception first (what its ledger reads)."""
        entry = self._groups.get(key)
        return [] if entry is None else [view.occupancy for view in self._views(key, entry)]

    def limits_bound(self) -> dict[GroupKey, frozenset[str]]:
        """Per group, the resources holding its scale-up right now (elasticd_group_limit_bound)."""
        return {key: entry.bound for key, entry in self._groups.items()}

    # ------------------------------------------------------------------ the request path: a login

    def on_login(self, key: GroupKey, user: str, worker: str | None = None, placed: bool = False) -> str | None:
        """Where a user who just logged in on ``worker`` lives from now on; None: where it is. ``placed``: it
        was logged in already (a login again decides nothing: placement happens once)."""
        entry = self._groups.get(key)
        if entry is None:
            return None
        views = self._views(key, entry)
        if not views:
            return None
        decisions = place_login(views, entry.pool, current=worker, placed=placed)
        for decision in decisions:
            self._record(entry, decision)
            if decision.kind == "fallback":
                log.warning("pool %s: %s", "/".join(key), decision.reason)
        self._check_capacity(key, entry, views)
        if not decisions or decisions[-1].kind == "keep":
            return None  # keeping is the null action: nobody is re-pointed
        return decisions[-1].worker

    # ------------------------------------------------------------------ scale to zero: the cold start

    def wake(self, key: GroupKey) -> bool:
        """The front has a request for a group with no routable worker: True when a worker is starting for it
        (one is started now if none is: a cold start), so the request waits; False when none will come (the
        group is not configured, at max_workers, its workers failed, or routable ones exist that the front found
        dead): the request is answered 503 as before."""
        entry = self._groups.get(key)
        if entry is None:
            return False
        now = self._clock()
        entry.last_active = now  # a request came for it: not idle (it may be going to zero just now)
        # The workers staying: one an idle retire is stopping serves no one any more (nor counts against the cap).
        workers = [w for w in self._supervisor.workers_of(key) if w.id not in entry.draining]
        if any(w.routable for w in workers):
            return False  # routable ones the front found dead: a 503, as ever
        if any(w.state in COMING for w in workers) or self._supervisor.launching(key):
            return True  # a start in flight (this cold start's, a restart, a reload's launch): wait for it
        if any(w.state == WorkerState.FAILED for w in workers):
            return False
        if entry.pool.max_workers is not None and len(workers) >= entry.pool.max_workers:
            return False
        worker = self._supervisor.add_worker(key)
        if worker is None:
            return False
        entry.spawning.add(worker.id)
        entry.cold[worker.id] = now
        self._record(entry, PoolDecision("scale-up", worker.id, "cold start: a request for a group at zero "
                                         "workers (it waits in the front for this one)", {"workers": 0}))
        log.info("pool %s: cold start of %s for a waiting request", "/".join(key), worker.id)
        return True

    def on_routable(self, worker_id: str) -> float | None:
        """A worker became routable; the seconds its cold start took, when it was one."""
        found = self._find(worker_id)
        if found is None:
            return None
        started = found[1].cold.pop(worker_id, None)
        if started is None:
            return None
        seconds = self._clock() - started
        found[1].cold_starts.observe(seconds)
        log.info("pool %s: %s routable %.2fs after its cold start", "/".join(found[0]), worker_id, seconds)
        return seconds

    def cold_starts(self) -> dict[GroupKey, ColdStarts]:
        return {key: entry.cold_starts for key, entry in self._groups.items()}

    # ------------------------------------------------------------------ reports

    def on_report(self, worker_id: str, report: Report, now: float, *, announced: bool = True) -> None:
        if announced:
            self._announced.add(worker_id)
            self._last_report[worker_id] = (now, report.loop_lag)
        found = self._find(worker_id)
        if found is None:
            return
        key, entry = found
        budget = self._budget(key[0], key[1])
        if budget.wall != entry.wall:  # the tenant's cpu.max changed (an override, a reload)
            entry.wall = budget.wall
            self._reevaluate(entry)
        counters = self._forwards.worker(worker_id)
        forward = ForwardSnapshot(counters.requests, counters.errors, counters.seconds)
        window = entry.windows.setdefault(worker_id, Window())
        window.add(Row(now, report, forward))
        entry.occupancy[worker_id] = occupancy(window.rows, entry.pool.memory_limit, cpu_wall=entry.wall)
        if report.rss is not None:
            entry.rss[worker_id] = report.rss
        views = self._views(key, entry)
        self._check_capacity(key, entry, views, budget)
        self._check_ledger(key, entry, views)

    def forget_worker(self, worker_id: str) -> None:
        self._announced.discard(worker_id)
        self._last_report.pop(worker_id, None)
        self._progress.pop(worker_id, None)
        for entry in self._groups.values():
            entry.cold.pop(worker_id, None)  # (a cold start that failed: not starting any more)
            entry.windows.pop(worker_id, None)
            entry.occupancy.pop(worker_id, None)
            entry.capacity.pop(worker_id, None)
            entry.rss.pop(worker_id, None)
            entry.sensors.pop(worker_id, None)
            entry.spawning.discard(worker_id)

    def _find(self, worker_id: str) -> tuple[GroupKey, _Group] | None:
        key = _key_of(worker_id)
        entry = self._groups.get(key) if key else None
        return (key, entry) if key and entry else None

    # ------------------------------------------------------------------ scale-up and compaction

    def _check_capacity(self, key: GroupKey, entry: _Group, views: Sequence[WorkerView],
                        budget: Budget | None = None) -> None:
        workers = {w.id: w for w in self._supervisor.workers_of(key)}
        entry.spawning = {wid for wid in entry.spawning if wid in workers and not workers[wid].routable
                          and workers[wid].state in COUNTED}
        # Routable but not yet measured (fewer than MEASURED_ROWS readings) is still a spawn in flight: its first
        # readings are its own start-up (imports, warm-up), and one spike must not grow the group.
        unmeasured = sum(1 for view in views
                         if view.id not in entry.windows or len(entry.windows[view.id].rows) < MEASURED_ROWS)
        if budget is None:
            budget = self._budget(key[0], key[1])
        # What one more worker would add, only where a limit can be passed (this runs at every report and login).
        binding = limit_bindings(budget, entry.pool,
                        worker_rss=self._mean_rss(entry, views) if budget.memory_max is not None else None,
                        worker_pids=self._pids_per_worker(key[0], budget) if budget.pids_max is not None else None)
        decision = check_capacity(views, entry.pool, spawning=len(entry.spawning) + unmeasured,
                                  held=self._supervisor.held(key), holds=binding, measuring=budget.pending)
        bound, new = next_hold(entry.bound, binding, decision, measuring=budget.pending)
        if entry.bound and not bound:
            log.info("pool %s: no longer held by the tenant's %s limit", "/".join(key), ", ".join(sorted(entry.bound)))
        entry.bound = bound
        if decision is None:
            return
        if decision.kind == "held":
            if new:  # a new hold (or another limit): one journal entry, one log line
                entry.held = decision
                self._record(entry, decision)
                log.warning("pool %s: scale-up held: %s", "/".join(key), decision.reason)
            return
        worker = self._supervisor.add_worker(key)
        if worker is None:
            return  # stopping, or the group is going: nothing to grow
        entry.spawning.add(worker.id)
        self._record(entry, PoolDecision(decision.kind, worker.id, decision.reason,
                                     {**decision.numbers, "budget": budget.numbers()}))
        log.info("pool %s: scale-up to %d workers (%s)", "/".join(key), self._supervisor.held(key), decision.reason)

    @staticmethod
    def _mean_rss(entry: _Group, views: Sequence[WorkerView]) -> float | None:
        """The group's mean worker RSS from each routable worker's latest reading."""
        latest = entry.rss
        values = [rss for view in views if (rss := latest.get(view.id)) is not None]
        return sum(values) / len(values) if values else None

    def _pids_per_worker(self, tenant: str, budget: Budget) -> float | None:
        if budget.reading is None or budget.reading.pids is None:
            return None
        workers = sum(self._supervisor.held(key) for key in self._groups if key[0] == tenant)
        return budget.reading.pids / workers if workers else None

    def _check_ledger(self, key: GroupKey, entry: _Group, views: Sequence[WorkerView]) -> None:
        if entry.draining or entry.spawning:
            return  # one change at a time: let the group settle and be measured again
        # A worker without a full smoothing window has no reading yet: a newborn reads 0 so that it admits, but
        # that 0 is not headroom. Compacting on it retired workers seconds after a scale-up, under the very load
        # that caused it (seen in the VM). Anti-flapping is the window: wait until every worker has one.
        if any(len(entry.windows[v.id].rows) < SMOOTHING_ROWS if v.id in entry.windows else True for v in views):
            return
        loads_by_worker = self._user_loads(entry, views)
        # (the group's floor: an old group of a blue/green switch compacts below its min_workers as users leave)
        pool = entry.pool if entry.floor == entry.pool.min_workers else dataclasses.replace(entry.pool,
                                                                                              min_workers=entry.floor)
        plan = plan_compaction(views, loads_by_worker, pool, self._tunnels())
        if plan is None:
            return
        self._record(entry, plan.decision)
        if self.mover is None:
            entry.draining = entry.draining | {plan.retire}
            self.changes += 1
            now = self._clock()
            for user, target in plan.moves.items():
                self._surface.assign(user, target, now)
            log.info("pool %s: compaction: draining %s (%d users re-pointed)", "/".join(key), plan.retire,
                     len(plan.moves))
            self._spawn(self._retire(key, entry, plan.retire))
            return
        loads = loads_by_worker.get(plan.retire, {})
        moves = sorted(plan.moves.items(), key=lambda item: (loads.get(item[0], 0.0), item[0]))  # idle first
        self._begin_emptying(entry, plan.retire, [user for user, _ in moves])
        log.info("pool %s: compaction: draining %s (%d users to move)", "/".join(key), plan.retire, len(moves))
        self._spawn(self._empty_then_retire(key, entry, plan.retire, moves))

    def _begin_emptying(self, entry: _Group, worker_id: str, users: Sequence[str]) -> None:
        """The worker takes no one new (draining); the users to be moved off stay on it until their turn
        (pinned: the front still serves them there)."""
        for user in users:
            self._surface.pin(user)
        entry.draining = entry.draining | {worker_id}
        self.changes += 1

    def _end_emptying(self, entry: _Group, worker_id: str, users: Sequence[str]) -> None:
        """The emptying ended without a retire (a move failed, something broke): the worker serves again."""
        for user in users:
            self._surface.pin(user, False)
        if worker_id in entry.draining:
            entry.draining = entry.draining - {worker_id}
            self.changes += 1

    async def _empty_then_retire(self, key: GroupKey, entry: _Group, worker_id: str,
                                 moves: Sequence[tuple[str, str]]) -> Evacuation:
        """Move the users off (one at a time); retire the worker once empty, else keep it (draining ends)."""
        assert self.mover is not None
        users = [user for user, _ in moves]
        try:
            result = await evacuate(self.mover, worker_id, moves, move_timeout=self.move_timeout,
                                    tunnels_of=self._tunnels_of, drain_timeout=entry.pool.drain_timeout,
                                    clock=self._clock)
            if result.empty:
                await self._retire(key, entry, worker_id)  # (its own cleanup ends the draining)
                return result
            user, why = result.failed[0]
            log.warning("pool %s: draining %s stopped, the worker is kept: the move of %s failed (%s); %d moved, "
                        "%d left on it", "/".join(key), worker_id, user, why, len(result.moved),
                        len(result.left) + 1)
            return result
        finally:
            self._end_emptying(entry, worker_id, users)

    async def drain(self, worker_id: str) -> Evacuation:
        """An operator takes ``worker_id`` out (``elasticctl drain``): no new users, a replacement first if the
        group would fall under ``min_workers``, every user moved off, then retired. KeyError: no such worker;
        ValueError: it is being drained already, or no replacement can start (elasticd is stopping); TimeoutError:
        the replacement did not come up. It runs as one of the pool's tasks: the caller going away (an admin client
        that gave up) does not stop it half way; elasticd stopping does."""
        found = self._find(worker_id)
        if found is None or all(w.id != worker_id for w in self._supervisor.workers_of(found[0])):
            raise KeyError(worker_id)
        key, entry = found
        if worker_id in entry.draining:
            raise ValueError(f"{worker_id} is being drained already")
        loads = self._user_loads(entry, self._views(key, entry)).get(worker_id, {})
        users = [user for user, _ in self._surface.on(worker_id)]
        self._begin_emptying(entry, worker_id, users)  # reserved before anything is awaited
        task = self._tasks.spawn(self._drain(key, entry, worker_id, users, loads), name=f"drain {worker_id}")
        result: Evacuation = await asyncio.shield(task)
        return result

    async def _drain(self, key: GroupKey, entry: _Group, worker_id: str, users: Sequence[str],
                     loads: Mapping[str, float]) -> Evacuation:
        try:
            if sum(1 for w in self._supervisor.workers_of(key) if w.id != worker_id) < entry.floor:
                replacement = self._supervisor.add_worker(key)
                if replacement is None:  # elasticd is stopping (or the group going): the worker stays as it is
                    raise ValueError(f"no replacement for {worker_id} can start now (elasticd is stopping, or its "
                                     f"group is going): it is kept, with its users")
                entry.spawning.add(replacement.id)
                self._record(entry, PoolDecision("scale-up", replacement.id, f"replaces {worker_id}, drained by "
                                                 f"an operator, to keep min_workers {entry.floor}"))
                await self._routable_soon(key, replacement.id)
            views = self._views(key, entry)  # the survivors: the drained one is no longer routable here
            plan = plan_evacuation(worker_id, views, loads, users)
            if users and not plan:
                return Evacuation(worker_id, failed=[(users[0], "no other routable worker to move to")],
                                  left=list(users[1:]))
            if self.mover is None:
                now = self._clock()
                for user, target in plan:
                    self._surface.assign(user, target, now)
                await self._retire(key, entry, worker_id)
                return Evacuation(worker_id, moved=list(users))
            return await self._empty_then_retire(key, entry, worker_id, plan)
        finally:
            self._end_emptying(entry, worker_id, users)

    async def _routable_soon(self, key: GroupKey, worker_id: str, timeout: float = 30.0) -> None:
        started = self._clock()
        while not any(w.id == worker_id and w.routable for w in self._supervisor.workers_of(key)):
            if self._clock() - started > timeout:
                raise TimeoutError(f"the replacement {worker_id} did not become routable in {timeout:g}s")
            await asyncio.sleep(_DRAIN_POLL)

    def _tunnels_of(self, user: str) -> int:
        return self._user_tunnels(user) if self._user_tunnels is not None else 0

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
        self._record(found[1], PoolDecision("move" if moved else "move-aborted", move.source, reason, numbers))

    def _user_loads(self, entry: _Group, views: Sequence[WorkerView]) -> dict[str, dict[str, float]]:
        loads, entry.user_seconds = user_loads(views, self._surface.on, entry.user_seconds)
        return loads

    async def _retire(self, key: GroupKey, entry: _Group, worker_id: str, why: str | None = None) -> None:
        """Graceful: no new requests (draining), let what is open finish (requests and tunnels, up to the
        group's drain_timeout), then stop the worker."""
        started = self._clock()
        try:
            cut = await self.wait_drained([worker_id], entry.pool.drain_timeout)
            reason = f"drain timeout: cut {cut[worker_id]}" if cut else "drained: nothing open on it"
            if why is not None:
                reason = f"{why}; {reason}"
            self._record(entry, PoolDecision("retire", worker_id, reason,
                                         {"waited_seconds": round(self._clock() - started, 3)}))
            await self._supervisor.retire(worker_id)
        finally:
            entry.draining = entry.draining - {worker_id}
            self.changes += 1
            self.forget_worker(worker_id)

    async def wait_drained(self, worker_ids: Sequence[str], drain_timeout: float) -> dict[str, str]:
        """Return once nothing is open on these workers (no request, no tunnel), or at ``drain_timeout``;
        what stopping them then cuts, by worker, each named in a warning."""
        started = self._clock()
        waiting = list(worker_ids)
        cut: dict[str, str] = {}
        while waiting:
            open_requests, tunnels = self._forwards.open_by_worker(), self._tunnels()
            now = self._clock()
            for worker_id in list(waiting):
                decided = drain_verdict(now, started, open_requests=open_requests.get(worker_id, 0),
                                        tunnels=tunnels.get(worker_id, 0), drain_timeout=drain_timeout)
                if decided.stop:
                    waiting.remove(worker_id)
                    if decided.cut:
                        cut[worker_id] = decided.cut
                        log.warning("worker %s: still busy after the drain timeout (%gs): stopping it cuts %s",
                                    worker_id, drain_timeout, decided.cut)
            if waiting:
                await asyncio.sleep(_DRAIN_POLL)
        return cut

    # ------------------------------------------------------------------ the sensing tick

    def sense(self) -> None:
        """Build reports for workers that do not report; ask the liveness rule about every worker; retire the
        workers of a group that is idle at a floor of zero."""
        now = self._clock()
        open_requests = self._forwards.open_by_worker()
        oldest = self._forwards.oldest_open_by_worker()
        tunnels = self._tunnels()
        users = self._surface.count_by_group()
        for key, entry in list(self._groups.items()):
            self._check_idle(key, entry, now, open_requests, tunnels, users.get((f"{key[0]}/{key[1]}", key[2]), 0))
        for key, entry in self._groups.items():
            for worker in self._supervisor.workers_of(key):
                if not worker.routable or worker.pid is None or worker.id in entry.draining:
                    continue
                announced = worker.id in self._announced
                if not announced:
                    sensor = entry.sensors.get(worker.id)
                    if sensor is None or sensor.pid != worker.pid:
                        sensor = entry.sensors[worker.id] = TreeSensor(worker.pid)
                    report = sensor.report(now, busy=open_requests.get(worker.id, 0), total=entry.concurrency)
                    if report is not None:
                        self.on_report(worker.id, report, now, announced=False)
                    cpu = sensor.cpu_seconds
                else:
                    last = self._last_report.get(worker.id)
                    if last is not None and reporting(now, last[0], last[1], self.interval):
                        answered = self._forwards.worker(worker.id).answered
                        self._progress[worker.id] = Progress(now, None, answered)  # alive: no /proc walk
                        continue
                    cpu = self._tree_cpu(worker.pid)
                self._check_liveness(key, entry, worker, now, cpu, announced, open_requests, oldest)

    def _check_idle(self, key: GroupKey, entry: _Group, now: float, open_requests: Mapping[str, int],
                    tunnels: Mapping[str, int], users: int) -> None:
        """``users``: those the surface has in the group (on its workers, or placed again at their next request)."""
        workers = self._supervisor.workers_of(key)
        requests = sum(self._forwards.worker(w.id).requests for w in workers)
        open_here = sum(open_requests.get(w.id, 0) + tunnels.get(w.id, 0) for w in workers)
        if requests != entry.last_requests or open_here:
            entry.last_requests = requests
            entry.last_active = now
        if entry.floor or not workers or entry.draining or entry.spawning or not all(w.routable for w in workers):
            return  # (a worker starting or restarting: requests may be waiting for it in the front)
        why = idle_stop(now=now, floor=entry.floor, active=entry.active, workers=len(workers), users=users,
                        open_requests=open_here, last_active=entry.last_active,
                        idle_timeout=entry.pool.idle_timeout)
        if why is None:
            return
        log.info("pool %s: %s; retiring %s", "/".join(key), why, ", ".join(w.id for w in workers))
        entry.draining = entry.draining | {w.id for w in workers}
        self.changes += 1
        for worker in workers:
            self._spawn(self._retire(key, entry, worker.id, why))

    def _check_liveness(self, key: GroupKey, entry: _Group, worker: Any, now: float, cpu: float | None,
                        announced: bool, open_requests: Mapping[str, int], oldest: Mapping[str, float]) -> None:
        answered = self._forwards.worker(worker.id).answered
        progress = self._progress[worker.id] = observe(self._progress.get(worker.id), now, cpu, answered)
        last = self._last_report.get(worker.id)
        hung = verdict(now, progress, hung_after=self.hung_after, reports=announced,
                       last_report=last[0] if last else progress.at, loop_lag=last[1] if last else None,
                       oldest_open=oldest.get(worker.id), open_requests=open_requests.get(worker.id, 0))
        if hung is None:
            return
        log.error("pool %s: worker %s (pid %s) is hung: %s %s; killing and replacing it", "/".join(key),
                  worker.id, worker.pid, hung.reason, hung.numbers)
        self._record(entry, PoolDecision("hung", worker.id, hung.reason, {**hung.numbers, "pid": worker.pid}))
        self.forget_worker(worker.id)
        self._spawn(self._supervisor.replace_worker(worker.id))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sense()
            except Exception:  # the tick must survive anything one worker's /proc can throw at it
                log.exception("pool: the sensing tick failed")

    def stop(self) -> None:
        """At shutdown: the retires and replacements in flight end here; a worker one of them was stopping stays
        in the supervisor's registry until it has stopped, so stop_all finishes it."""
        self._tasks.cancel()

    # ------------------------------------------------------------------ visibility

    def describe(self, tenant: str, app: str, users_of: Callable[[str], list[dict[str, Any]]]) -> dict[str, Any]:
        groups = {}
        for (t, a, g), entry in self._groups.items():
            if (t, a) != (tenant, app):
                continue
            routable = self.routable_ids((t, a, g))
            occupancies = [self._occupancy(entry, wid) for wid in routable]
            workers = []
            for worker in self._supervisor.workers_of((t, a, g)):
                window = entry.windows.get(worker.id)
                rows = list(window.rows) if window else []
                rates = rates_of(rows)
                workers.append({
                    "id": worker.id, "pid": worker.pid, "state": worker.state,
                    "reception": bool(routable) and worker.id == routable[0],
                    "draining": worker.id in entry.draining, "spawning": worker.id in entry.spawning,
                    "announced": worker.id in self._announced,
                    "occupancy": round(self._occupancy(entry, worker.id), 4),
                    "components": {**{k: round(v, 4) for k, v in
                                      components_of(rows, entry.pool.memory_limit, cpu_wall=entry.wall).items()},
                                   **({"capacity": round(entry.capacity[worker.id], 4)}
                                      if worker.id in entry.capacity else {})},
                    "history": [round(v, 3) for v in history_of(rows, entry.pool.memory_limit, entry.wall)],
                    "rates": None if rates is None else {"rps": round(rates.rps, 3), "latency": rates.latency,
                                                         "error_rate": round(rates.error_rate, 3)},
                    "sticky_users": users_of(worker.id),
                    # Its latest reading as reported (or sensed): what is not measured is absent or None.
                    "last_report": _report_json(rows[-1].report) if rows else None,
                })
            book = ledger(occupancies, entry.pool)
            pool = entry.pool
            held = entry.held if entry.bound else None
            cold = entry.cold_starts
            groups[g] = {
                "active": entry.active, "floor": entry.floor,
                "cold_starts": {"count": cold.count, "last_seconds": None if cold.last is None else round(cold.last, 3),
                                "starting": sorted(entry.cold)},
                "thresholds": {"reception": pool.reception_threshold, "admission": pool.admission_threshold,
                               "compaction_margin": pool.compaction_margin, "min_workers": pool.min_workers,
                               "max_workers": pool.max_workers, "memory_limit": pool.memory_limit,
                               "drain_timeout": pool.drain_timeout, "idle_timeout": pool.idle_timeout,
                               "cpu_held_at": pool.cpu_held_at,
                               "throttled_held_at": pool.throttled_held_at, "memory_held_at": pool.memory_held_at,
                               "pids_held_at": pool.pids_held_at},
                "cpu_wall": round(entry.wall, 4),
                "held": None if held is None else {"resources": sorted(entry.bound), "reason": held.reason,
                                                   "limits": held.numbers.get("limits", {})},
                "held_workers": self._supervisor.held((t, a, g)),
                "ledger": book.numbers(),
                "workers": workers,
                "decisions": entry.journal.last(),
                "decision_counts": dict(entry.journal.counts),
                "moves": self._moves_in((t, a, g)),
            }
        return {"tenant": tenant, "app": app, "groups": groups}

    def _moves_in(self, key: GroupKey) -> list[dict[str, Any]]:
        """The users being moved in the group now (for ``elasticctl pool``)."""
        if self.mover is None:
            return []
        book = getattr(self.mover, "book", None)
        moves: list[Move] = book.moves() if book is not None else []
        now = self._clock()
        return [{"user": m.user, "from": m.source, "to": m.target, "step": m.step.value,
                 "seconds": round(now - m.started, 3)} for m in moves if _key_of(m.source) == key]

    # ------------------------------------------------------------------ helpers

    def _record(self, entry: _Group, decision: PoolDecision) -> None:
        entry.journal.record(self._wall(), decision)

    def _spawn(self, coroutine: Any) -> None:
        self._tasks.spawn(coroutine)


def _report_json(report: Report) -> dict[str, Any]:
    data = dataclasses.asdict(report)
    if data["executor"] is not None and data["executor"]["queue_depth"] is None:
        del data["executor"]["queue_depth"]
    return data


def _key_of(worker_id: str) -> GroupKey | None:
    parts = parse_worker_id(worker_id)
    return parts.group_key if parts is not None else None

