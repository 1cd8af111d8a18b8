"""The elastic pool's shell: it wires the pool's parts and turns each event into gather → decide → act.

Three events act, and never a timer of its own for placement or compaction (seed 000):

- a login on the request path → placement (keep or pass), admission (``policy``), then the scale-up check;
- a report (from the channel, or sensed by the tick for a worker that does not report) → archived in the
  group's readings, then the scale-up check, then the capacity ledger (``ledger``), which may compact;
- a request for a group with no routable worker → the cold-start rule (``idle.wake_rule``).

Each event's gather → decide → act is a module of its own: the scale-up check and the ledger ``scaling.py``, the
cold start ``waking.py``, taking workers out (compaction, the idle retire, an operator's drain) ``retirement.py``,
the sensing tick (sensed reports, the liveness and idle rules) ``tick.py``; the JSON view is ``pool_view.py``'s;
each group's state is one ``GroupRecord``. The deciding modules are pure and tested as tables: ``policy``
(placement, admission, scale-up), ``cap`` (max_workers), ``ledger``, ``idle``, ``drain``, ``liveness``, ``budget``.

The tenant's cgroup enters every decision through ``budget`` (the daemon's: the sampler's recent samples of
the tenant and the limits in force, see ``budget.py``): it sets the CPU wall of the evaluator, and holds a
scale-up that the tenant's cpu.max, memory.max or pids.max would leave with nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Coroutine, Iterable, Mapping, Sequence
from typing import Any

from elasticd.background import Background
from elasticd.config.model import Config, Server
from elasticd.pool.budget import UNLIMITED, Budget
from elasticd.pool.emptying import Evacuation, PoolMover
from elasticd.pool.evaluator import ForwardSnapshot, Row
from elasticd.pool.group_record import Changes, GroupRecord, GroupSettings
from elasticd.pool.idle import ColdStarts
from elasticd.pool.move_machine import Move, MoveSummary, Outcome
from elasticd.pool.policy import PoolDecision, WorkerView, place_login
from elasticd.pool.pool_view import describe_group, describe_moves
from elasticd.pool.ports import GroupKey, PoolForwards, PoolSupervisor, PoolSurface, PoolWorker
from elasticd.pool.proc_sensor import tree_cpu
from elasticd.pool.report import Report
from elasticd.pool.retirement import Retirement
from elasticd.pool.scaling import Scaling
from elasticd.pool.tick import SensingTick
from elasticd.pool.waking import Waking
from elasticd.worker_ids import parse_worker_id

__all__ = ["LIMITED_RESOURCES", "PoolManager"]

log = logging.getLogger("elasticd.pool")

LIMITED_RESOURCES = ("cpu", "memory", "pids")  # what can hold a scale-up (elasticd_group_limit_bound)


class PoolManager:
    __slots__ = ("_budget", "_changes", "_clock", "_forwards", "_groups", "_retirement", "_scaling", "_supervisor",
                 "_surface", "_tasks", "_tick", "_waking", "_wall", "queued")

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
        # Requests waiting in the front for a group (its queue and its wake): the burst's short signal (the daemon
        # wires the front's parking lot; none by default).
        self.queued: Callable[[GroupKey], int] = lambda key: 0
        self._wall = wall
        self._groups: dict[GroupKey, GroupRecord] = {}
        self._changes = Changes()
        self._tasks = Background(log, "pool: a retire or replacement")
        open_tunnels = tunnels or dict
        self._retirement = Retirement(supervisor, surface, forwards, tunnels=open_tunnels,
                                      user_tunnels=user_tunnels or (lambda user: 0), views=self._views,
                                      spawn=self._spawn, after_retire=self._after_retire, clock=clock,
                                      move_timeout=Server().move_timeout)
        self._tick = SensingTick(supervisor, surface, forwards, tunnels=open_tunnels, tree_cpu=tree_cpu,
                                 report=self._sensed, retirement=self._retirement,
                                 spawn=lambda coroutine: self._spawn(coroutine, None), interval=interval,
                                 hung_after=hung_after if hung_after is not None else Server().hung_after)
        self._scaling = Scaling(supervisor, self._retirement, budget=self._budget, tunnels=open_tunnels,
                                tenant_counted=self._tenant_counted)
        self._waking = Waking(supervisor, clock)

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
    def on_wake_failed(self) -> Callable[[GroupKey, str], object] | None:
        return self._waking.on_wake_failed

    @on_wake_failed.setter
    def on_wake_failed(self, told: Callable[[GroupKey, str], object] | None) -> None:
        """Told when a cold start owed to waiting requests cannot begin after all (the daemon: the front answers
        them 503 at once rather than at their request timeout)."""
        self._waking.on_wake_failed = told

    @property
    def mover(self) -> PoolMover | None:
        return self._retirement.mover

    @mover.setter
    def mover(self, mover: PoolMover | None) -> None:
        """Live moves (pool/mover.py), set by the daemon once the channel exists."""
        self._retirement.mover = mover

    def apply(self, config: Config, changed: Collection[str] | None = None) -> None:
        """Thresholds are reloadable: a reload swaps a group's pool config; removed groups are forgotten.
        ``changed``: the tenants whose settings may differ from those last applied (config/changes.py; None: every
        tenant): another tenant's groups keep their settings, which are made of its settings alone (at 10,000 apps,
        remaking them all was a fifth of a reload, the front's loop held meanwhile)."""
        self._tick.interval = config.server.occupancy_interval
        self._tick.hung_after = config.server.hung_after
        self._retirement.move_timeout = config.server.move_timeout
        tenants = config.tenants
        groups = self._groups
        if changed is None:
            wanted = {(t.name, a.name, g.name): (a, g) for t, a, g in config.spawned_groups()}
            gone = [key for key in groups if key not in wanted]
        else:
            # Only the changed tenants' groups are walked, and those of a tenant the pool has none of yet (a new one,
            # whatever ``changed`` says): every other's are as they were, keys and settings.
            known = {key[0] for key in groups}
            walked = {*changed, *(name for name in tenants if name not in known)}
            wanted = {(name, a.name, g.name): (a, g) for name in walked if (t := tenants.get(name)) is not None
                      for a in t.apps.values() for g in a.groups.values() if g.spawned}
            gone = [key for key in groups if key[0] not in tenants or (key[0] in walked and key not in wanted)]
        self._changes.bump()
        for key in gone:
            del groups[key]
        now = self._clock()
        for key, (app, group) in wanted.items():
            record = groups.get(key)
            settings = GroupSettings(group.pool, group.concurrency, app.floor(group.name),
                                     group.name in app.active_groups)
            if record is None:
                groups[key] = GroupRecord(settings, self._changes, now, self._wall)
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
        readings = record.readings
        if not readings.capacity:  # (the common case, on every login and report: no method call per worker)
            occupancy = readings.occupancy
            return [WorkerView(w.id, occupancy.get(w.id, 0.0)) for w in self.routable(key)]
        occupancy_of = readings.occupancy_of
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

    def worker_states(self) -> dict[GroupKey, dict[str, int]]:
        """Per group with workers, how many are in each state of their life (supervisor/lifecycle.py)."""
        counts: dict[GroupKey, dict[str, int]] = {}
        for key in self._groups:
            for worker in self._supervisor.workers_of(key):
                states = counts.setdefault(key, {})
                states[worker.state.value] = states.get(worker.state.value, 0) + 1
        return counts

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
        self._scaling.check_scale_up(key, record, views)
        if not decisions or decisions[-1].kind == "keep":
            return None  # keeping is the null action: nobody is re-pointed
        return decisions[-1].worker

    # ------------------------------------------------------------------ event: a request queued in the front

    def on_queued(self, key: GroupKey) -> None:
        """A request waits in the front's queue for the group (every routable worker at its concurrency): the burst
        check, at once (``Scaling.check_burst``)."""
        record = self._groups.get(key)
        if record is not None:
            self._scaling.check_burst(key, record, self._views(key, record), self.queued(key), self._clock())

    # ------------------------------------------------------------------ event: a request for a group at zero

    def wake(self, key: GroupKey) -> bool:
        """The front has a request for a group with no routable worker: True when a worker is coming for it, so the
        request waits; False when none will: it is answered 503 (``waking.py``)."""
        record = self._groups.get(key)
        return record is not None and self._waking.wake(key, record)

    def owes_start(self, key: GroupKey) -> bool:
        """Whether a cold start is owed to requests waiting for the group (they keep waiting for it)."""
        record = self._groups.get(key)
        return record is not None and record.flight.owed

    def _after_retire(self, key: GroupKey, record: GroupRecord) -> None:
        if self._groups.get(key) is record:  # (not a group a reload removed meanwhile)
            self._waking.after_retire(key, record)

    def on_routable(self, worker_id: str) -> float | None:
        """A worker became routable; the seconds its cold start took, when it was one."""
        found = self._find(worker_id)
        if found is None:
            return None
        found[1].readings.served_from[worker_id] = self._forwards.worker(worker_id).requests
        return self._waking.on_routable(found[0], found[1], worker_id)

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
        self._scaling.check_burst(key, record, views, self.queued(key), now)
        self._scaling.check_scale_up(key, record, views, budget)
        self._scaling.check_ledger(key, record, views)
        self._retirement.check_recycle(key, record, worker_id, counters.requests, report.rss)

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
            self._scaling.check_scale_up(key, record, self._views(key, record))

    def forget_worker(self, worker_id: str) -> None:
        self._tick.forget(worker_id)
        for record in self._groups.values():
            record.forget(worker_id)

    def _tenant_counted(self, tenant: str) -> int:
        return sum(self._supervisor.counted(key) for key in self._groups if key[0] == tenant)

    def _find(self, worker_id: str) -> tuple[GroupKey, GroupRecord] | None:
        key = _key_of(worker_id)
        record = self._groups.get(key) if key else None
        return (key, record) if key and record else None

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
