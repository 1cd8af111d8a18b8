"""What the pool keeps per group, as one small typed record of four parts, each with one owner of its changes:

- ``settings``: what the config says (replaced whole at a reload, never changed in place);
- ``readings``: what its workers measure (each worker's window of rows, the occupancy evaluated from it when a
  report is archived, its capacity reading, its RSS, the /proc sensors of workers that do not report);
- ``flight``: the changes under way (workers starting, being drained, cold starts and one owed);
- ``book``: what it has decided (the decision journal, the cold starts' histogram, the scale-up hold, when a
  request last came).

The draining set is read on the front's hot path through a cache that the pool's ``changes`` counter
invalidates: it is replaced whole, never changed in place (a frozenset has no add), and only through
``Flight.drain``/``Flight.undrain``, which count the change. A mistake here would route requests to a worker
being retired.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from elasticd.config.model import PoolSettings
from elasticd.pool.evaluator import Row, Window, occupancy
from elasticd.pool.idle import ColdStarts
from elasticd.pool.journal import Journal
from elasticd.pool.policy import PoolDecision, WorkerView
from elasticd.pool.proc_sensor import TreeSensor

__all__ = ["Book", "Changes", "Flight", "GroupRecord", "GroupSettings", "WorkerReadings"]


@dataclass(frozen=True, slots=True)
class GroupSettings:
    pool: PoolSettings
    concurrency: int
    floor: int = 1  # workers it keeps however idle: min_workers while active, else 0 (Config.App.floor)
    active: bool = True  # new users go to it (the default group or the canary)


class Changes:
    """One counter shared by every group and the manager: bumped whenever what the front may route to could
    answer otherwise (a drain begins or ends, a reload). The daemon's routing cache compares it per request."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def bump(self) -> None:
        self.count += 1


class WorkerReadings:
    """What a group's workers measure, by worker id."""

    __slots__ = ("capacity", "occupancy", "rss", "sensors", "served_from", "user_seconds", "wall", "windows")

    def __init__(self) -> None:
        self.windows: dict[str, Window] = {}
        # Evaluated when a report is archived (the only time it can change), so placement on the request path
        # reads N numbers instead of re-averaging N windows.
        self.occupancy: dict[str, float] = {}
        # What each worker's own capacity reading says (used / limit, probes/): a worker that says it is full is
        # full, whatever its reports average to. Not smoothed: the reading is the worker's word for now.
        self.capacity: dict[str, float] = {}
        self.rss: dict[str, int] = {}  # each worker's latest RSS (the memory hold's "one more worker")
        self.sensors: dict[str, TreeSensor] = {}
        self.wall = 1.0  # the CPU one worker of the group can use: min(1 core, the tenant's cpu.max)
        self.user_seconds: dict[str, float] = {}  # user → cumulative seconds at the last ledger check
        # Each worker's forward count when its process became routable: what it has served since is what
        # pool.max_requests counts (a restart keeps the worker's counters, and starts its count anew).
        self.served_from: dict[str, int] = {}

    def archive(self, worker_id: str, row: Row, memory_limit: int | None) -> None:
        window = self.windows.setdefault(worker_id, Window())
        window.add(row)
        self.occupancy[worker_id] = occupancy(window.rows, memory_limit, cpu_wall=self.wall)
        if row.report.rss is not None:
            self.rss[worker_id] = row.report.rss

    def reevaluate(self, memory_limit: int | None) -> None:
        """The CPU wall or memory_limit changed: every cached occupancy is read again from its window."""
        self.occupancy = {wid: occupancy(w.rows, memory_limit, cpu_wall=self.wall) for wid, w in self.windows.items()}

    def occupancy_of(self, worker_id: str) -> float:
        measured = self.occupancy.get(worker_id, 0.0)
        if not self.capacity:
            return measured
        return max(measured, self.capacity.get(worker_id, 0.0))  # the capacity component

    def rows(self, worker_id: str) -> int:
        """How many readings of this worker are in its window (0: none yet)."""
        window = self.windows.get(worker_id)
        return len(window.rows) if window is not None else 0

    def mean_rss(self, views: Sequence[WorkerView]) -> float | None:
        """The mean of these workers' latest RSS readings."""
        latest = self.rss
        values = [rss for view in views if (rss := latest.get(view.id)) is not None]
        return sum(values) / len(values) if values else None

    def forget(self, worker_id: str) -> None:
        self.windows.pop(worker_id, None)
        self.occupancy.pop(worker_id, None)
        self.capacity.pop(worker_id, None)
        self.rss.pop(worker_id, None)
        self.sensors.pop(worker_id, None)
        self.served_from.pop(worker_id, None)


class Flight:
    """A group's changes under way."""

    __slots__ = ("_changes", "cold", "draining", "owed", "recycled", "spawning")

    def __init__(self, changes: Changes) -> None:
        self._changes = changes
        self.spawning: set[str] = set()  # started for a scale-up or cold start, not yet routable and measured
        self.cold: dict[str, float] = {}  # worker → when its cold start began (a request waits for it)
        # A cold start owed to a waiting request, begun once the workers being retired have stopped (cap.py).
        self.owed = False
        self.recycled: set[str] = set()  # workers whose recycle was decided (once per process: see check_recycle)
        self.draining: frozenset[str] = frozenset()  # see the module's note: changed only below

    def drain(self, worker_ids: frozenset[str] | set[str]) -> None:
        self.draining = self.draining | worker_ids
        self._changes.bump()

    def undrain(self, worker_id: str) -> None:
        if worker_id in self.draining:
            self.draining = self.draining - {worker_id}
            self._changes.bump()

    def forget(self, worker_id: str) -> None:
        self.cold.pop(worker_id, None)  # (a cold start that failed: not starting any more)
        self.spawning.discard(worker_id)
        self.recycled.discard(worker_id)


@dataclass(slots=True)
class Book:
    """What the group has decided, and when it was last asked for."""

    journal: Journal = field(default_factory=Journal)
    cold_starts: ColdStarts = field(default_factory=ColdStarts)
    bound: frozenset[str] = frozenset()  # the resources holding its scale-up, while they do
    hold: PoolDecision | None = None  # the decision that started the hold (its reason and numbers)
    last_active: float = 0.0  # when a request to it was last seen (the sensing tick's count moved)
    last_requests: int = -1  # its forward count at the last tick
    burst_at: float = float("-inf")  # when its short signal was last high (requests waiting: policy.check_burst)
    wall: Callable[[], float] = time.time  # the journal's clock: wall-clock seconds, for people

    def record(self, decision: PoolDecision) -> None:
        self.journal.record(self.wall(), decision)

    def saw(self, requests: int, open_requests: int, now: float) -> None:
        """The sensing tick's count of the group's forwards, and its requests open now: a count that moved since the
        last tick, or a request open, makes the group active now (the idle rule's clock)."""
        if requests != self.last_requests or open_requests:
            self.last_requests = requests
            self.last_active = now


class GroupRecord:
    __slots__ = ("book", "flight", "readings", "settings")

    def __init__(self, settings: GroupSettings, changes: Changes, now: float,
                 wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.readings = WorkerReadings()
        self.flight = Flight(changes)
        self.book = Book(last_active=now, wall=wall)  # its idle time counts from its start

    @property
    def pool(self) -> PoolSettings:
        return self.settings.pool

    def forget(self, worker_id: str) -> None:
        self.readings.forget(worker_id)
        self.flight.forget(worker_id)
