"""The sensing tick (every ``occupancy_interval``): the pool's only timer, and it places and compacts nothing.

- GATHER: for a worker that does not report (no library), elasticd builds its report from /proc (``TreeSensor``)
  and hands it to the manager like any report;
- ask the liveness rule about every routable worker: silent AND making no progress for ``hung_after`` is hung,
  and is killed and replaced (its users are re-placed by the front); busy is never hung;
- ask the idle rule about every group at a floor of zero: nobody on it and no request for ``idle_timeout``
  retires its workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from elasticd.pool.group_record import GroupRecord
from elasticd.pool.idle import idle_stop
from elasticd.pool.liveness import Progress, observe, reporting, verdict
from elasticd.pool.policy import PoolDecision
from elasticd.pool.ports import GroupKey, PoolForwards, PoolSupervisor, PoolSurface, PoolWorker
from elasticd.pool.proc_sensor import TreeSensor
from elasticd.pool.report import Report
from elasticd.pool.retirement import Retirement

__all__ = ["SensingTick"]

log = logging.getLogger("elasticd.pool")


class SensingTick:
    __slots__ = ("_forwards", "_last_report", "_progress", "_report", "_retirement", "_spawn", "_supervisor",
                 "_surface", "_tree_cpu", "_tunnels", "announced", "hung_after", "interval")

    def __init__(self, supervisor: PoolSupervisor, surface: PoolSurface, forwards: PoolForwards, *,
                 tunnels: Callable[[], Mapping[str, int]], tree_cpu: Callable[[int], float | None],
                 report: Callable[[str, Report, float], None], retirement: Retirement,
                 spawn: Callable[[Coroutine[Any, Any, Any]], object], interval: float, hung_after: float) -> None:
        self._supervisor = supervisor
        self._surface = surface
        self._forwards = forwards
        self._tunnels = tunnels
        self._tree_cpu = tree_cpu
        self._report = report  # a sensed report goes where a worker's own would (the manager's, announced=False)
        self._retirement = retirement
        self._spawn = spawn
        self.interval = interval
        self.hung_after = hung_after
        self.announced: set[str] = set()  # workers whose library reports over the channel
        self._last_report: dict[str, tuple[float, float | None]] = {}  # worker → (when, its loop_lag)
        self._progress: dict[str, Progress] = {}

    def heard(self, worker_id: str, now: float, loop_lag: float | None) -> None:
        """A worker's own report came over the channel."""
        self.announced.add(worker_id)
        self._last_report[worker_id] = (now, loop_lag)

    def forget(self, worker_id: str) -> None:
        self.announced.discard(worker_id)
        self._last_report.pop(worker_id, None)
        self._progress.pop(worker_id, None)

    def sense(self, groups: Mapping[GroupKey, GroupRecord], now: float) -> None:
        open_requests = self._forwards.open_by_worker()
        oldest = self._forwards.oldest_open_by_worker()
        tunnels = self._tunnels()
        users = self._surface.count_by_group()
        workers_of = self._supervisor.workers_of
        live: list[tuple[GroupKey, GroupRecord, Sequence[PoolWorker]]] = []
        for key, record in list(groups.items()):
            workers = workers_of(key)
            if not workers:
                # At zero (most groups of a host of idle tenants, every tick): no worker to sense or retire, and no
                # request counted on one; only the idle rule's book (on the front's loop, 10,000 such groups each
                # through the whole check were ~19 ms a tick).
                record.book.saw(0, 0, now)
                continue
            self._check_idle(key, record, now, open_requests, tunnels, users.get((f"{key[0]}/{key[1]}", key[2]), 0),
                             workers)
            live.append((key, record, workers))
        for key, record, workers in live:
            for worker in workers:
                if not worker.routable or worker.pid is None or worker.id in record.flight.draining:
                    continue
                announced = worker.id in self.announced
                if not announced:
                    sensor = record.readings.sensors.get(worker.id)
                    if sensor is None or sensor.pid != worker.pid:
                        sensor = record.readings.sensors[worker.id] = TreeSensor(worker.pid)
                    report = sensor.report(now, busy=open_requests.get(worker.id, 0),
                                           total=record.settings.concurrency)
                    if report is not None:
                        self._report(worker.id, report, now)
                    cpu = sensor.cpu_seconds
                else:
                    last = self._last_report.get(worker.id)
                    if last is not None and reporting(now, last[0], last[1], self.interval):
                        answered = self._forwards.worker(worker.id).answered
                        self._progress[worker.id] = Progress(now, None, answered)  # alive: no /proc walk
                        continue
                    cpu = self._tree_cpu(worker.pid)
                self._check_liveness(key, record, worker, now, cpu, announced, open_requests, oldest)

    def _check_idle(self, key: GroupKey, record: GroupRecord, now: float, open_requests: Mapping[str, int],
                    tunnels: Mapping[str, int], users: int, workers: Sequence[PoolWorker]) -> None:
        """``users``: those the surface has in the group (on its workers, or placed again at their next request);
        ``workers``: the group's, as the supervisor has them now."""
        book, flight, settings = record.book, record.flight, record.settings
        requests = sum(self._forwards.worker(w.id).requests for w in workers)
        open_here = sum(open_requests.get(w.id, 0) + tunnels.get(w.id, 0) for w in workers)
        book.saw(requests, open_here, now)
        if settings.floor or not workers or flight.draining or flight.spawning or not all(w.routable for w in workers):
            return  # (a worker starting or restarting: requests may be waiting for it in the front)
        why = idle_stop(now=now, floor=settings.floor, active=settings.active, workers=len(workers), users=users,
                        open_requests=open_here, last_active=book.last_active,
                        idle_timeout=settings.pool.idle_timeout)
        if why is not None:
            self._retirement.retire_all(key, record, [w.id for w in workers], why)

    def _check_liveness(self, key: GroupKey, record: GroupRecord, worker: PoolWorker, now: float,
                        cpu: float | None, announced: bool, open_requests: Mapping[str, int],
                        oldest: Mapping[str, float]) -> None:
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
        record.book.record(PoolDecision("hung", worker.id, hung.reason, {**hung.numbers, "pid": worker.pid}))
        self.forget(worker.id)
        record.forget(worker.id)
        self._spawn(self._supervisor.replace_worker(worker.id))
