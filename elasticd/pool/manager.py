"""The elastic pool's shell: archives reports, asks the pure policies, and carries out what they decide.

Per group it keeps each worker's window of rows ``{ts, report, forward}`` (forward = the front's cumulative
counters for that worker when the row was archived), the spawns in flight, the workers being drained and
the decision journal. It acts in three places only, and never on a timer of its own for placement or
compaction (seed 000):

- a login arrives on the request path → placement (keep or pass), admission, then the scale-up check;
- a report arrives (from the channel, or built by elasticd for a worker that does not report) → archive,
  the scale-up check, then the capacity ledger, which may compact;
- the sensing tick (every ``occupancy_interval``) builds reports for silent workers and finds hung ones,
  which are killed and replaced (their users are re-placed by the front).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from elasticd.config import Config, Pool
from elasticd.pool.evaluator import (
    SMOOTHING_ROWS,
    Forward,
    Row,
    Window,
    components_of,
    history_of,
    occupancy,
    rates_of,
)
from elasticd.pool.journal import Journal
from elasticd.pool.ledger import ledger, plan_compaction
from elasticd.pool.policy import Decision, WorkerView, check_capacity, place_login
from elasticd.pool.report import Report
from elasticd.pool.sensing import TreeSensor

__all__ = ["PoolManager"]

log = logging.getLogger("elasticd.pool")

GroupKey = tuple[str, str, str]
HUNG_INTERVALS = 3  # an announced worker silent this many intervals is hung


class _Worker(Protocol):
    id: str
    pid: int | None
    routable: bool
    state: str


class _Supervisor(Protocol):
    def workers_of(self, key: GroupKey) -> list[Any]: ...
    def add_worker(self, key: GroupKey) -> Any: ...
    async def retire(self, worker_id: str) -> None: ...
    async def replace_worker(self, worker_id: str) -> None: ...


class _User(Protocol):
    seconds: float


class _Surface(Protocol):
    def on(self, worker: str) -> Iterable[tuple[str, _User]]: ...
    def assign(self, user: str, worker: str, now: float) -> Any: ...


class _Counters(Protocol):
    requests: int
    errors: int
    seconds: float


class _Accounting(Protocol):
    def worker(self, worker_id: str) -> _Counters: ...
    def open_by_worker(self) -> dict[str, int]: ...


class _Group:
    __slots__ = ("concurrency", "draining", "journal", "occupancy", "pool", "sensors", "spawning", "user_seconds",
                 "windows")

    def __init__(self, pool: Pool, concurrency: int) -> None:
        self.pool = pool
        self.concurrency = concurrency
        self.windows: dict[str, Window] = {}
        # Evaluated when a report is archived (the only time it can change), so placement on the request path
        # reads N numbers instead of re-averaging N windows.
        self.occupancy: dict[str, float] = {}
        self.sensors: dict[str, TreeSensor] = {}
        self.spawning: set[str] = set()
        self.draining: set[str] = set()
        self.journal = Journal()
        self.user_seconds: dict[str, float] = {}  # user → cumulative seconds at the last ledger check


class PoolManager:
    __slots__ = (
        "_accounting",
        "_announced",
        "_clock",
        "_groups",
        "_last_report",
        "_supervisor",
        "_surface",
        "_tasks",
        "_wall",
        "draining",
        "interval",
    )

    def __init__(self, supervisor: _Supervisor, surface: _Surface, accounting: _Accounting, *,
                 interval: float, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self._supervisor = supervisor
        self._surface = surface
        self._accounting = accounting
        self.interval = interval
        self._clock = clock
        self._wall = wall
        self._groups: dict[GroupKey, _Group] = {}
        self._announced: set[str] = set()
        self._last_report: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.draining: set[str] = set()  # every group's, for the front's hot path (no new requests to these)

    # ------------------------------------------------------------------ config

    def apply(self, config: Config) -> None:
        """Thresholds are reloadable: a reload swaps a group's pool config; removed groups are forgotten."""
        self.interval = config.server.occupancy_interval
        wanted = {(t.name, a.name, g.name): g for t, a, g in config.groups()}
        for key in [k for k in self._groups if k not in wanted]:
            del self._groups[key]
        for key, group in wanted.items():
            entry = self._groups.get(key)
            if entry is None:
                self._groups[key] = _Group(group.pool, group.concurrency)
            else:
                entry.pool, entry.concurrency = group.pool, group.concurrency
                # memory_limit may have changed: every cached occupancy is re-read from its window.
                entry.occupancy = {wid: occupancy(w.rows, group.pool.memory_limit) for wid, w in entry.windows.items()}

    # ------------------------------------------------------------------ views

    def _routable(self, key: GroupKey) -> list[Any]:
        entry = self._groups.get(key)
        draining = entry.draining if entry else set()
        return [w for w in self._supervisor.workers_of(key) if w.routable and w.id not in draining]

    def routable_ids(self, key: GroupKey) -> list[str]:
        """What the front may send requests to: routable and not being drained, the reception first."""
        return [w.id for w in self._routable(key)]

    @staticmethod
    def _occupancy(entry: _Group, worker_id: str) -> float:
        return entry.occupancy.get(worker_id, 0.0)

    def _views(self, key: GroupKey, entry: _Group) -> list[WorkerView]:
        return [WorkerView(w.id, self._occupancy(entry, w.id)) for w in self._routable(key)]

    def occupancies(self) -> Iterable[tuple[GroupKey, str, float]]:
        for key, entry in self._groups.items():
            for worker in self._supervisor.workers_of(key):
                yield key, worker.id, self._occupancy(entry, worker.id)

    def groups(self) -> list[GroupKey]:
        return list(self._groups)

    def decision_counts(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for entry in self._groups.values():
            for kind, n in entry.journal.counts.items():
                total[kind] = total.get(kind, 0) + n
        return total

    # ------------------------------------------------------------------ the request path: a login

    def on_login(self, key: GroupKey, user: str) -> str | None:
        """Where a user who just logged in lives from now on (None: the group has no routable worker)."""
        entry = self._groups.get(key)
        if entry is None:
            return None
        views = self._views(key, entry)
        if not views:
            return None
        decisions = place_login(views, entry.pool)
        for decision in decisions:
            self._record(entry, decision)
            if decision.kind == "fallback":
                log.warning("pool %s: %s", "/".join(key), decision.reason)
        self._check_capacity(key, entry, views)
        return decisions[-1].worker

    # ------------------------------------------------------------------ reports

    def on_report(self, worker_id: str, report: Report, now: float, *, announced: bool = True) -> None:
        if announced:
            self._announced.add(worker_id)
            self._last_report[worker_id] = now
        found = self._find(worker_id)
        if found is None:
            return
        key, entry = found
        counters = self._accounting.worker(worker_id)
        forward = Forward(counters.requests, counters.errors, counters.seconds)
        window = entry.windows.setdefault(worker_id, Window())
        window.add(Row(now, report, forward))
        entry.occupancy[worker_id] = occupancy(window.rows, entry.pool.memory_limit)
        views = self._views(key, entry)
        self._check_capacity(key, entry, views)
        self._check_ledger(key, entry, views)

    def forget_worker(self, worker_id: str) -> None:
        self._announced.discard(worker_id)
        self._last_report.pop(worker_id, None)
        for entry in self._groups.values():
            entry.windows.pop(worker_id, None)
            entry.occupancy.pop(worker_id, None)
            entry.sensors.pop(worker_id, None)
            entry.spawning.discard(worker_id)

    def _find(self, worker_id: str) -> tuple[GroupKey, _Group] | None:
        key = _key_of(worker_id)
        entry = self._groups.get(key) if key else None
        return (key, entry) if key and entry else None

    # ------------------------------------------------------------------ scale-up and compaction

    def _check_capacity(self, key: GroupKey, entry: _Group, views: Sequence[WorkerView]) -> None:
        workers = {w.id: w for w in self._supervisor.workers_of(key)}
        entry.spawning = {wid for wid in entry.spawning if wid in workers and not workers[wid].routable
                          and workers[wid].state not in ("failed", "stopped")}
        decision = check_capacity(views, entry.pool, spawning=len(entry.spawning))
        if decision is None:
            return
        worker = self._supervisor.add_worker(key)
        entry.spawning.add(worker.id)
        self._record(entry, Decision(decision.kind, worker.id, decision.reason, decision.numbers))
        log.info("pool %s: scale-up to %d workers (%s)", "/".join(key), len(workers) + 1, decision.reason)

    def _check_ledger(self, key: GroupKey, entry: _Group, views: Sequence[WorkerView]) -> None:
        if entry.draining or entry.spawning:
            return  # one change at a time: let the group settle and be measured again
        # A worker without a full smoothing window has no reading yet: a newborn reads 0 so that it admits, but
        # that 0 is not headroom. Compacting on it retired workers seconds after a scale-up, under the very load
        # that caused it (seen in the VM). Anti-flapping is the window: wait until every worker has one.
        if any(len(entry.windows[v.id].rows) < SMOOTHING_ROWS if v.id in entry.windows else True for v in views):
            return
        plan = plan_compaction(views, self._user_loads(entry, views), entry.pool)
        if plan is None:
            return
        self._record(entry, plan.decision)
        now = self._clock()
        for user, target in plan.moves.items():
            self._surface.assign(user, target, now)
        entry.draining.add(plan.retire)
        self.draining.add(plan.retire)
        log.info("pool %s: compaction: draining %s (%d users moved)", "/".join(key), plan.retire, len(plan.moves))
        self._spawn(self._retire(key, entry, plan.retire))

    def _user_loads(self, entry: _Group, views: Sequence[WorkerView]) -> dict[str, dict[str, float]]:
        """Each user's share of its worker's occupancy, from the forward seconds it consumed since the last
        check (evenly when it consumed none: an idle user costs little, but is not free)."""
        loads: dict[str, dict[str, float]] = {}
        seen: dict[str, float] = {}
        for view in views:
            users = list(self._surface.on(view.id))
            deltas = {}
            for user, record in users:
                seen[user] = record.seconds
                deltas[user] = max(record.seconds - entry.user_seconds.get(user, 0.0), 0.0)
            if deltas:
                loads[view.id] = loads_for(view.occupancy, deltas)
        entry.user_seconds = seen
        return loads

    async def _retire(self, key: GroupKey, entry: _Group, worker_id: str) -> None:
        """Graceful: no new requests (draining), let the open ones finish, then stop the worker."""
        deadline = self._clock() + max(self.interval * HUNG_INTERVALS, 30.0)
        while self._accounting.open_by_worker().get(worker_id, 0) and self._clock() < deadline:
            await asyncio.sleep(0.05)
        self._record(entry, Decision("retire", worker_id, "drained: no request open on it", {}))
        await self._supervisor.retire(worker_id)
        entry.draining.discard(worker_id)
        self.draining.discard(worker_id)
        self.forget_worker(worker_id)

    # ------------------------------------------------------------------ the sensing tick

    def sense(self) -> None:
        """Build reports for workers that do not report; find announced workers that went silent."""
        now = self._clock()
        open_requests = self._accounting.open_by_worker()
        for key, entry in self._groups.items():
            for worker in self._supervisor.workers_of(key):
                if not worker.routable or worker.pid is None:
                    continue
                if worker.id in self._announced:
                    last = self._last_report.get(worker.id, now)
                    if now - last > HUNG_INTERVALS * self.interval:
                        log.error("pool %s: worker %s announced but sent no report for %.1fs: hung, replacing it",
                                  "/".join(key), worker.id, now - last)
                        self._record(entry, Decision("hung", worker.id, "silent for 3 intervals", {
                            "silent_seconds": round(now - last, 3)}))
                        self.forget_worker(worker.id)
                        self._spawn(self._supervisor.replace_worker(worker.id))
                    continue
                sensor = entry.sensors.get(worker.id)
                if sensor is None or sensor.pid != worker.pid:
                    sensor = entry.sensors[worker.id] = TreeSensor(worker.pid)
                report = sensor.report(now, busy=open_requests.get(worker.id, 0), total=entry.concurrency)
                if report is not None:
                    self.on_report(worker.id, report, now, announced=False)

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.sense()
            except Exception:  # the tick must survive anything one worker's /proc can throw at it
                log.exception("pool: the sensing tick failed")

    # ------------------------------------------------------------------ visibility

    def describe(self, tenant: str, app: str, users_of: Callable[[str], list[str]]) -> dict[str, Any]:
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
                    "components": {k: round(v, 4) for k, v in components_of(rows, entry.pool.memory_limit).items()},
                    "history": [round(v, 3) for v in history_of(rows, entry.pool.memory_limit)],
                    "rates": None if rates is None else {"rps": round(rates.rps, 3), "latency": rates.latency,
                                                         "error_rate": round(rates.error_rate, 3)},
                    "users": users_of(worker.id),
                })
            book = ledger(occupancies, entry.pool)
            pool = entry.pool
            groups[g] = {
                "thresholds": {"reception": pool.reception_threshold, "admission": pool.admission_threshold,
                               "compaction_margin": pool.compaction_margin, "min_workers": pool.min_workers,
                               "max_workers": pool.max_workers, "memory_limit": pool.memory_limit},
                "ledger": book.numbers(),
                "workers": workers,
                "decisions": entry.journal.last(),
                "decision_counts": dict(entry.journal.counts),
            }
        return {"tenant": tenant, "app": app, "groups": groups}

    # ------------------------------------------------------------------ helpers

    def _record(self, entry: _Group, decision: Decision) -> None:
        entry.journal.record(self._wall(), decision)

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _key_of(worker_id: str) -> GroupKey | None:
    """Worker ids are tenant.app.group.N, and names cannot hold a dot."""
    parts = worker_id.split(".")
    return (parts[0], parts[1], parts[2]) if len(parts) == 4 else None


def loads_for(worker_occupancy: float, deltas: Mapping[str, float]) -> dict[str, float]:
    """Split a worker's occupancy among its users in proportion to what each consumed."""
    total = sum(deltas.values())
    return {u: worker_occupancy * (d / total if total else 1 / len(deltas)) for u, d in deltas.items()}
