"""The supervisor: runs each configured group's workers and brings them in line with a new config.

``apply(config)`` is the one entry point for start and reload: it diffs (``plan``) and carries out the
diff. A group whose spec changed is replaced without a gap: new workers are started and awaited until
routable, and only then are the old ones stopped; if the new ones never become routable the old ones stay
and the error is reported. Workers whose definition did not change are not touched (same pid).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from elasticd.config import Config
from elasticd.supervisor.plan import Desired, GroupKey, Plan, Running, plan
from elasticd.supervisor.spawn import WorkerSpec, spec_for
from elasticd.supervisor.worker import Worker

__all__ = ["ApplyResult", "Supervisor"]


# How long a start or reload waits for new workers to accept connections before it reports them.
START_WAIT = 30.0


@dataclass(slots=True)
class ApplyResult:
    plan: Plan
    problems: list[str]


class _Group:
    __slots__ = ("counter", "desired", "workers")

    def __init__(self, desired: Desired) -> None:
        self.desired = desired
        self.workers: list[Worker] = []
        self.counter = 0


class Supervisor:
    __slots__ = ("_groups", "_launching", "_lock", "leaf_for", "occupancy_interval", "on_worker_state",
                 "runtime_dir", "start_wait", "stop_timeout")

    def __init__(self, runtime_dir: str, leaf_for: Callable[[str, str], str | None], *,
                 stop_timeout: float = 10.0, occupancy_interval: float = 5.0,
                 start_wait: float = START_WAIT) -> None:
        self.runtime_dir = runtime_dir
        self.leaf_for = leaf_for
        self.stop_timeout = stop_timeout
        self.occupancy_interval = occupancy_interval
        self.start_wait = start_wait
        self.on_worker_state: Callable[[Worker], None] | None = None
        self._groups: dict[GroupKey, _Group] = {}
        # Started by a start or reload and not yet in their group (that waits until they are routable): they
        # run, and announce themselves on the channel, meanwhile.
        self._launching: dict[str, Worker] = {}
        self._lock = asyncio.Lock()

    # ------------------------------------------------------------------ views

    def workers(self) -> Iterable[Worker]:
        for entry in self._groups.values():
            yield from entry.workers

    def find(self, worker_id: str) -> Worker | None:
        found = next((w for w in self.workers() if w.id == worker_id), None)
        return found if found is not None else self._launching.get(worker_id)

    def status(self) -> dict[GroupKey, list[dict[str, object]]]:
        return {key: [w.describe() for w in entry.workers] for key, entry in self._groups.items()}

    def summary(self) -> str:
        workers = list(self.workers())
        running = sum(1 for w in workers if w.routable)
        failed = sum(1 for w in workers if w.state == "failed")
        text = f"{len(self._groups)} groups, {running}/{len(workers)} workers running"
        return text + (f", {failed} failed" if failed else "")

    # ------------------------------------------------------------------ apply

    def desired(self, config: Config) -> dict[GroupKey, Desired]:
        return {
            (tenant.name, app.name, group.name):
                Desired(spec_for(app, group, self.leaf_for(tenant.name, app.name)), group.pool.min_workers,
                        group.pool.max_workers)
            for tenant, app, group in config.groups()
        }

    async def apply(self, config: Config) -> ApplyResult:
        async with self._lock:
            self.stop_timeout = config.server.stop_timeout
            self.occupancy_interval = config.server.occupancy_interval
            os.makedirs(os.path.join(self.runtime_dir, "workers"), mode=0o755, exist_ok=True)
            desired = self.desired(config)
            running = {key: Running(entry.desired.spec, len(entry.workers)) for key, entry in self._groups.items()}
            todo = plan(running, desired)
            problems: list[str] = []
            # Removed groups first (their traffic is already routed away), then what needs new processes.
            await asyncio.gather(*(self._stop_group(key) for key in todo.stop))
            results = await asyncio.gather(
                *(self._start_group(key, desired[key]) for key in todo.start),
                *(self._replace_group(key, desired[key]) for key in todo.replace),
                *(self._resize_group(key, desired[key]) for key in todo.resize),
            )
            for found in results:
                problems.extend(found)
            for key in todo.keep:
                # Unchanged, but a failed worker gets a fresh chance: a reload is the operator's retry.
                self._groups[key].desired = desired[key]
                problems.extend(await self._revive_failed(key))
            return ApplyResult(todo, problems)

    # ------------------------------------------------------------------ the elastic pool's hands

    def add_worker(self, key: GroupKey) -> Worker:
        """Start one more worker in a group (scale-up). It joins the group at once; it is routable, and so
        counted by the pool as more than a spawn in flight, once its socket accepts."""
        entry = self._groups[key]
        worker = self._new_worker(key, entry, entry.desired.spec)
        entry.workers.append(worker)
        worker.start()
        return worker

    async def retire(self, worker_id: str) -> None:
        """Take a worker out of its group and stop it gracefully (compaction's last step)."""
        for entry in self._groups.values():
            for worker in entry.workers:
                if worker.id == worker_id:
                    entry.workers.remove(worker)
                    await worker.stop(self.stop_timeout)
                    return

    async def replace_worker(self, worker_id: str) -> None:
        """A new worker in the group, then the old one stopped (a hung worker: the grace ends in SIGKILL)."""
        for key, entry in self._groups.items():
            for worker in entry.workers:
                if worker.id == worker_id:
                    entry.workers.remove(worker)
                    self.add_worker(key)
                    await worker.stop(self.stop_timeout)
                    return

    def workers_of(self, key: GroupKey) -> list[Worker]:
        entry = self._groups.get(key)
        return list(entry.workers) if entry else []

    async def stop_all(self) -> None:
        async with self._lock:
            await asyncio.gather(*(self._stop_group(key) for key in list(self._groups)))

    # ------------------------------------------------------------------ the steps

    def _new_worker(self, key: GroupKey, entry: _Group, spec: WorkerSpec) -> Worker:
        entry.counter += 1
        tenant, app, group = key
        worker = Worker(f"{tenant}.{app}.{group}.{entry.counter}", tenant, app, group, spec,
                        runtime_dir=self.runtime_dir, occupancy_interval=self.occupancy_interval)
        worker.on_state = self.on_worker_state
        return worker

    async def _launch(self, key: GroupKey, entry: _Group, spec: WorkerSpec, count: int) -> tuple[list[Worker],
                                                                                                   list[str]]:
        fresh = [self._new_worker(key, entry, spec) for _ in range(count)]
        self._launching.update((w.id, w) for w in fresh)
        try:
            for worker in fresh:
                worker.start()
            ready = await asyncio.gather(*(w.wait_routable(self.start_wait) for w in fresh))
        finally:
            for worker in fresh:
                self._launching.pop(worker.id, None)
        problems = [f"worker {w.id} is not routable ({w.state}) after {self.start_wait:g}s"
                    for w, ok in zip(fresh, ready, strict=True) if not ok]
        return fresh, problems  # the daemon logs them, with the rest of an activation's problems

    async def _start_group(self, key: GroupKey, want: Desired) -> list[str]:
        entry = self._groups[key] = _Group(want)
        fresh, problems = await self._launch(key, entry, want.spec, want.min_workers)
        entry.workers.extend(fresh)
        return problems

    async def _replace_group(self, key: GroupKey, want: Desired) -> list[str]:
        entry = self._groups[key]
        old = list(entry.workers)
        fresh, problems = await self._launch(key, entry, want.spec, want.clamp(len(old)))
        if any(w.routable for w in fresh) or not any(w.routable for w in old):
            entry.workers = fresh
            entry.desired = want
            await self._stop_workers(old)
        else:
            # The new definition does not come up while the old one serves: keep serving the old one.
            problems.append(f"group {'/'.join(key)}: the new definition did not start; the previous workers "
                            "keep serving")
            entry.workers = old
            await self._stop_workers(fresh)
        return problems

    async def _resize_group(self, key: GroupKey, want: Desired) -> list[str]:
        entry = self._groups[key]
        entry.desired = want
        target = want.clamp(len(entry.workers))
        surplus = len(entry.workers) - target
        if surplus > 0:
            # The newest go first: the oldest is the reception users were born on.
            leaving, entry.workers = entry.workers[target:], entry.workers[:target]
            await self._stop_workers(leaving)
            return []
        fresh, problems = await self._launch(key, entry, want.spec, -surplus)
        entry.workers.extend(fresh)
        return problems

    async def _revive_failed(self, key: GroupKey) -> list[str]:
        entry = self._groups[key]
        failed = [w for w in entry.workers if w.state == "failed"]
        if not failed:
            return []
        entry.workers = [w for w in entry.workers if w.state != "failed"]
        await self._stop_workers(failed)
        fresh, problems = await self._launch(key, entry, entry.desired.spec, len(failed))
        entry.workers.extend(fresh)
        return problems

    async def _stop_group(self, key: GroupKey) -> None:
        entry = self._groups.pop(key, None)
        if entry is not None:
            await self._stop_workers(entry.workers)

    async def _stop_workers(self, workers: list[Worker]) -> None:
        await asyncio.gather(*(w.stop(self.stop_timeout) for w in workers))
