"""The supervisor: runs each configured group's workers and brings them in line with a new config.

``apply(config)`` is the one entry point for start and reload: it diffs (``plan``) and carries out the
diff. A group whose spec changed is replaced without a gap: new workers are started and awaited until
routable, and only then are the old ones retired; if the new ones never become routable the old ones stay
and the error is reported. Workers whose definition did not change are not touched (same pid).

Workers leaving a group (a removed app or tenant, a replaced or shrunk group) are retired in the
background: no new requests reach them (they are out of the group's list, which is what the front routes
to), ``wait_drained`` waits until nothing is open on them (requests and WebSocket tunnels, up to the group's
``drain_timeout``), then they are stopped. A reload does not wait for that.

Every worker ever started and not yet stopped is in ``_alive``, whichever list it is in (a group's, being
launched, retiring, being replaced): ``stop_all`` reaches each of them, in parallel, within one grace.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field

from elasticd.background import Background
from elasticd.config.model import Config, RunAs
from elasticd.supervisor.lifecycle import COUNTED, WILL_SERVE, WorkerState
from elasticd.supervisor.plan import Desired, GroupKey, Plan, Running, plan
from elasticd.supervisor.sandbox import hidden_for, inaccessible_path, sandbox_for, tmp_dirs
from elasticd.supervisor.spawn import WorkerSpec, socket_dir, spec_for
from elasticd.supervisor.spawner import Spawner
from elasticd.supervisor.worker_process import Adopt, Worker, journal_for_workers
from elasticd.worker_ids import format_worker_id

__all__ = ["ApplyResult", "Supervisor"]

log = logging.getLogger("elasticd.supervisor")

# (the workers leaving, the longest they may take) → returns once nothing is open on them, or at the timeout
DrainFn = Callable[[Sequence[Worker], float], Awaitable[object]]


# How long a start or reload waits for new workers to accept connections before it reports them.
START_WAIT = 30.0


@dataclass(slots=True)
class ApplyResult:
    plan: Plan
    problems: list[str]
    # Done once the workers of removed groups have drained and stopped (their cgroups can go then).
    retired: list[asyncio.Task[None]] = field(default_factory=list)


class _Group:
    """A group's definition and its workers. The workers are a tuple, replaced whole through the setter: every
    change of membership is then counted (``Supervisor.changes``), which the front's cached routing relies
    on; an in-place append or remove, which would go uncounted, does not exist on a tuple."""

    __slots__ = ("_changed", "_workers", "desired")

    def __init__(self, desired: Desired, changed: Callable[[], None]) -> None:
        self.desired = desired
        self._changed = changed
        self._workers: tuple[Worker, ...] = ()

    @property
    def workers(self) -> tuple[Worker, ...]:
        return self._workers

    # (the setter takes the getter's type: mypy before 1.16, trixie's among them, has no asymmetric properties)
    @workers.setter
    def workers(self, workers: tuple[Worker, ...]) -> None:
        self._workers = workers
        self._changed()


class Supervisor:
    __slots__ = ("_alive", "_background", "_counters", "_desired", "_groups", "_lock", "_rebuilt", "carried_in",
                 "changes",
                 "leaf_for",
                 "occupancy_interval", "on_worker_state", "runtime_dir", "spawner", "start_wait", "stop_timeout",
                 "stopping", "systemd_cat", "wait_drained")

    def __init__(self, runtime_dir: str, leaf_for: Callable[[str, str], str | None], *,
                 stop_timeout: float = 10.0, occupancy_interval: float = 5.0,
                 start_wait: float = START_WAIT, systemd_cat: str | None = None) -> None:
        self.runtime_dir = runtime_dir
        # Where every worker's output goes, decided once per daemon start (``journal_for_workers``): systemd-cat's
        # path, straight to journald; None, relayed through elasticd's log within a bound per worker.
        self.systemd_cat = systemd_cat
        self.leaf_for = leaf_for
        # Who starts the workers' processes: the daemon's keeper (set before the first start); None: elasticd itself.
        self.spawner: Spawner | None = None
        self.stop_timeout = stop_timeout
        self.occupancy_interval = occupancy_interval
        self.start_wait = start_wait
        self.on_worker_state: Callable[[Worker], None] | None = None
        # Bumped by every change of what is routable: a group's membership, a group added or removed, a worker's
        # state. Whoever caches a view of the routable workers compares it (the daemon's routing for the front).
        self.changes = 0
        self._groups: dict[GroupKey, _Group] = {}
        # The last desired() per tenant: (its model, the shared settings, its groups' Desired), reused as it was.
        self._desired: dict[str, tuple[object, object, dict[GroupKey, Desired]]] = {}
        self._rebuilt: set[str] = set()  # the tenants whose Desired was built anew since the last apply
        self._alive: dict[str, Worker] = {}
        # Per group, the last worker number given. Kept when a group is removed: its workers may still be
        # draining when a reload brings it back, and a reused id would share their socket, pool and journal.
        self._counters: dict[GroupKey, int] = {}
        self._background = Background(log, "retiring workers")
        self._lock = asyncio.Lock()
        self.wait_drained: DrainFn | None = None  # the daemon's: waits on the front's open requests and tunnels
        # Set once a re-exec's new image has taken up the requests and tunnels carried over (until then the front
        # counts none of them open): workers adopted only to be retired wait for it before their drain is read.
        self.carried_in: asyncio.Event | None = None
        self.stopping = False

    @staticmethod
    def journal_for_workers() -> str | None:
        """The daemon's ``systemd_cat=`` (see ``worker.journal_for_workers``)."""
        return journal_for_workers()

    # ------------------------------------------------------------------ views

    def workers(self) -> Iterable[Worker]:
        for entry in self._groups.values():
            yield from entry.workers

    def find(self, worker_id: str) -> Worker | None:
        """Any worker started and not yet stopped (a retiring one still reports on the channel)."""
        return self._alive.get(worker_id)

    def counted(self, key: GroupKey) -> int:
        """Every worker of the group with a process or about to have one (starting, running, in backoff,
        draining, being replaced; not failed, not stopped: lifecycle.COUNTED), in any list: what max_workers caps."""
        return sum(1 for w in self._alive.values() if (w.tenant, w.app, w.group) == key and w.state in COUNTED)

    def launching(self, key: GroupKey) -> bool:
        """Whether a worker is being started for the group outside its list (a start or reload launching it:
        it joins the list once routable, or at the launch's end): a start in flight all the same."""
        listed = {w.id for w in self.workers_of(key)}
        return any((w.tenant, w.app, w.group) == key and w.id not in listed
                   and w.state in WILL_SERVE for w in self._alive.values())

    def holds_app(self, tenant: str, app: str) -> bool:
        """Whether any worker of this app is alive (its leaf must not be killed or removed meanwhile)."""
        return any((w.tenant, w.app) == (tenant, app) for w in self._alive.values())

    def workers_of_tenant(self, tenant: str) -> int:
        """How many of a tenant's workers are alive (a removal's reply says how many it stops)."""
        return sum(1 for w in self._alive.values() if w.tenant == tenant)

    def apps_alive(self) -> set[tuple[str, str]]:
        """The (tenant, app) pairs with a worker alive (the sampler asks once a tick)."""
        return {(w.tenant, w.app) for w in self._alive.values()}

    def status(self) -> dict[GroupKey, list[dict[str, object]]]:
        return {key: [w.describe() for w in entry.workers] for key, entry in self._groups.items()}

    def summary(self) -> str:
        workers = list(self.workers())
        running = sum(1 for w in workers if w.routable)
        failed = sum(1 for w in workers if w.state == WorkerState.FAILED)
        text = f"{len(self._groups)} groups, {running}/{len(workers)} workers running"
        return text + (f", {failed} failed" if failed else "")

    # ------------------------------------------------------------------ apply

    def desired(self, config: Config) -> dict[GroupKey, Desired]:
        """Every spawned group's spec and sizes. A tenant whose model is the very object of the last activation (an
        unchanged file: config/include.py), under the same server settings and hidden paths, keeps its specs as they
        were built then: a reload of 10,000 apps rebuilds the changed tenant's alone."""
        hidden = hidden_for(config)
        shared = (config.server, hidden)
        previous = self._desired
        # Compared once, not per tenant (the server's settings are one dataclass: 2,000 comparisons were ~2 ms).
        last = next(iter(previous.values()))[1] if previous else None
        same = last == shared
        fresh: dict[str, tuple[object, object, dict[GroupKey, Desired]]] = {}
        result: dict[GroupKey, Desired] = {}
        for tenant in config.tenants.values():
            kept = previous.get(tenant.name)
            if kept is not None and kept[0] is tenant and (kept[1] is last if same else kept[1] == shared):
                groups = kept[2]
            else:
                self._rebuilt.add(tenant.name)
                sandbox = sandbox_for(config, tenant, hidden)
                groups = {
                    (tenant.name, app.name, group.name):
                        Desired(spec_for(app, group, self.leaf_for(tenant.name, app.name), tenant.run_as, sandbox),
                                app.floor(group.name),  # none for a group new users do not go to, or at min 0
                                group.pool.max_workers, group.pool.drain_timeout)
                    for app in tenant.apps.values() for group in app.groups.values()
                    if group.spawned  # (a nodes: group has nothing to start)
                }
            fresh[tenant.name] = (tenant, shared, groups)
            result.update(groups)
        self._desired = fresh
        return result

    async def apply(self, config: Config) -> ApplyResult:
        async with self._lock:
            self.stop_timeout = config.server.stop_timeout
            self.occupancy_interval = config.server.occupancy_interval
            workers_dir = os.path.join(self.runtime_dir, "workers")
            os.makedirs(workers_dir, mode=0o755, exist_ok=True)
            os.chmod(workers_dir, 0o755)  # (searchable by every tenant's user whatever elasticd's umask: UMask=0027)
            desired = self.desired(config)
            # Only the tenants whose specs were built anew (a new or changed tenant; all of them at a start) are
            # planned, and their socket directories and views made again: a reload of 10,000 apps touches the
            # changed tenant's. The others' groups are as they were (their Desired is the very object).
            # (since the last apply: a re-exec's adopt() asked desired() first, and its tenants are to be planned)
            touched, self._rebuilt = self._rebuilt, set()
            for tenant in config.tenants.values():
                if tenant.name in touched:
                    _prepare_socket_dir(socket_dir(self.runtime_dir, tenant.name), tenant.run_as)
            if any(config.tenants[name].isolation is not None for name in touched):
                _prepare_views(config, self.runtime_dir, touched)
            running = {key: Running(entry.desired.spec, len(entry.workers)) for key, entry in self._groups.items()
                       if key[0] in touched or key not in desired}
            todo = plan(running, {key: want for key, want in desired.items() if key[0] in touched})
            problems: list[str] = []
            # Removed groups first (their traffic is already routed away): drained and stopped in the background.
            retired = [task for key in todo.stop if (task := self._stop_group(key)) is not None]
            results = await asyncio.gather(
                *(self._start_group(key, desired[key]) for key in todo.start),
                *(self._replace_group(key, desired[key]) for key in todo.replace),
                *(self._resize_group(key, desired[key]) for key in todo.resize),
            )
            for found in results:
                problems.extend(found)
            for key in todo.keep:
                self._groups[key].desired = desired[key]
            # Unchanged, but a failed worker gets a fresh chance: a reload is the operator's retry.
            failed = {(w.tenant, w.app, w.group) for w in self._alive.values() if w.state == WorkerState.FAILED}
            for key in sorted(failed):
                if key in self._groups and key in desired and key not in todo.replace and key not in todo.start:
                    problems.extend(await self._revive_failed(key))
            return ApplyResult(todo, problems, retired)

    # ------------------------------------------------------------------ the elastic pool's hands

    def add_worker(self, key: GroupKey) -> Worker | None:
        """Start one more worker in a group (scale-up). It joins the group at once; it is routable, and so
        counted by the pool as more than a spawn in flight, once its socket accepts. None while stopping or
        for a group that is not running."""
        entry = self._groups.get(key)
        if entry is None or self.stopping:
            return None
        worker = self._new_worker(key, entry, entry.desired.spec)
        entry.workers = (*entry.workers, worker)
        worker.start()
        return worker

    async def retire(self, worker_id: str) -> None:
        """Take a worker out of its group and stop it gracefully (compaction's last step; the pool drained it)."""
        for entry in self._groups.values():
            for worker in entry.workers:
                if worker.id == worker_id:
                    entry.workers = tuple(w for w in entry.workers if w is not worker)
                    await self._stop(worker, self.stop_timeout)
                    return

    async def replace_worker(self, worker_id: str) -> None:
        """A hung worker: killed at once (it answers no signal it could handle, and its grace would only delay
        the replacement), then a new one in the group. Killed first, so that a replacement never takes the
        group over max_workers."""
        for key, entry in self._groups.items():
            for worker in entry.workers:
                if worker.id == worker_id:
                    entry.workers = tuple(w for w in entry.workers if w is not worker)
                    await worker.kill()
                    if self._alive.get(worker.id) is worker:
                        del self._alive[worker.id]
                    self.add_worker(key)
                    return

    # ------------------------------------------------------------------ a re-exec in place

    def alive(self) -> list[tuple[Worker, bool]]:
        """Every worker started and not yet stopped, and whether it is in its group's list (False: retiring)."""
        listed = {w.id for w in self.workers()}
        return [(w, w.id in listed) for w in self._alive.values()]

    def next_numbers(self) -> dict[GroupKey, int]:
        """Per group, the last worker number given (a new image must not give a live worker's id again)."""
        return dict(self._counters)

    def adopt(self, config: Config, kept: Sequence[tuple[str, GroupKey, Adopt, int, bool]],
              leaving: Sequence[tuple[str, GroupKey, Adopt, bool]], numbers: dict[GroupKey, int]) -> list[Worker]:
        """Before the first ``apply`` of a new image: the previous image's workers, still this process's children.
        ``kept`` (id, group, process, restarts, served): the same process of an unchanged group, back in its group's
        list — ``apply`` then finds the group running as configured and starts nothing (but up to its floor).
        ``leaving`` (id, group, process, sandboxed): of a group changed or removed, or retiring already: drained and
        stopped in the background, as a reload does. Returns the adopted workers."""
        desired = self.desired(config)
        for key, number in numbers.items():
            self._counters[key] = max(self._counters.get(key, 0), number)
        adopted = []
        for worker_id, key, process, restarts, served in kept:
            want = desired[key]
            entry = self._groups.get(key)
            if entry is None:
                entry = self._groups[key] = _Group(want, self._changed)
            worker = self._adopted(worker_id, key, want.spec, sandboxed=want.spec.sandbox is not None)
            entry.workers = (*entry.workers, worker)
            worker.adopt(process, restarts=restarts, served=served)
            adopted.append(worker)
        retiring = []
        for worker_id, key, process, sandboxed in leaving:
            want_now = desired.get(key)
            # (its own definition is the previous image's, not known here; nothing restarts it, a stop ends it)
            spec = want_now.spec if want_now is not None else WorkerSpec((), (), "/", None)
            worker = self._adopted(worker_id, key, spec, sandboxed=sandboxed)
            worker.adopt(process, restarts=0, served=True)
            retiring.append(worker)
            adopted.append(worker)
        if retiring:
            drain = max((d.drain_timeout for d in desired.values()), default=30.0)
            self._retire_later(retiring, drain)
        return adopted

    def _adopted(self, worker_id: str, key: GroupKey, spec: WorkerSpec, *, sandboxed: bool) -> Worker:
        tenant, app, group = key
        worker = Worker(worker_id, tenant, app, group, spec, runtime_dir=self.runtime_dir,
                        occupancy_interval=self.occupancy_interval, systemd_cat=self.systemd_cat, spawner=self.spawner)
        worker.sandboxed = sandboxed
        worker.on_state = self._worker_state
        self._alive[worker.id] = worker
        return worker

    def workers_of(self, key: GroupKey) -> tuple[Worker, ...]:
        entry = self._groups.get(key)
        return entry.workers if entry else ()

    async def stop_all(self) -> None:
        """Every worker alive, in parallel, each with the grace then SIGKILL: bounded by one stop_timeout.

        Not under the lock: an apply in progress (waiting for workers to become routable) must not delay a
        stop; the daemon cancels it first, and whatever it had launched is in ``_alive`` all the same."""
        self.stopping = True
        await self._background.settle()
        self._groups.clear()
        await self._stop_workers(list(self._alive.values()))

    # ------------------------------------------------------------------ the steps

    def _new_worker(self, key: GroupKey, entry: _Group, spec: WorkerSpec) -> Worker:
        number = self._counters[key] = self._counters.get(key, 0) + 1
        tenant, app, group = key
        worker = Worker(format_worker_id(tenant, app, group, number), tenant, app, group, spec,
                        runtime_dir=self.runtime_dir, occupancy_interval=self.occupancy_interval,
                        systemd_cat=self.systemd_cat, spawner=self.spawner)
        worker.on_state = self._worker_state
        self._alive[worker.id] = worker  # before it starts: from here on, stop_all reaches it
        return worker

    def _changed(self) -> None:
        self.changes += 1

    def _worker_state(self, worker: Worker) -> None:
        self.changes += 1  # routable or not may have changed
        if self.on_worker_state is not None:
            self.on_worker_state(worker)

    async def _stop(self, worker: Worker, grace: float) -> None:
        # Out of _alive only once it has stopped: a stop cancelled half-way (a retire at shutdown) leaves the
        # worker for stop_all to finish, not forgotten with a process still running.
        await worker.stop(grace)
        if self._alive.get(worker.id) is worker:
            del self._alive[worker.id]

    def _retire_later(self, workers: Sequence[Worker], drain_timeout: float) -> asyncio.Task[None] | None:
        """Drain, then stop, in the background (the workers are already out of their group's list)."""
        if not workers:
            return None

        async def retire() -> None:
            # Cancelled only by stop_all, which stops every alive worker itself: no stop here on cancellation.
            if self.carried_in is not None:
                await self.carried_in.wait()
            if self.wait_drained is not None:
                try:
                    await self.wait_drained(workers, drain_timeout)
                except Exception:
                    log.exception("waiting for %s to drain failed; stopping them now", ", ".join(w.id for w in workers))
            await self._stop_workers(workers)

        return self._background.spawn(retire(), name=f"retire {', '.join(w.id for w in workers)}")

    async def _launch(self, key: GroupKey, entry: _Group, spec: WorkerSpec, count: int) -> tuple[list[Worker],
                                                                                                   list[str]]:
        return await self._until_routable(self._begin(key, entry, spec, count))

    def _begin(self, key: GroupKey, entry: _Group, spec: WorkerSpec, count: int) -> list[Worker]:
        # Not in their group until routable (or the wait ends); they run, and announce themselves on the
        # channel, meanwhile — find() and stop_all know them through _alive (and launching() counts them).
        if self.stopping:
            return []
        fresh = [self._new_worker(key, entry, spec) for _ in range(count)]
        for worker in fresh:
            worker.start()
        return fresh

    async def _until_routable(self, fresh: list[Worker]) -> tuple[list[Worker], list[str]]:
        ready = await asyncio.gather(*(w.wait_routable(self.start_wait) for w in fresh))
        problems = [f"worker {w.id} is not routable ({w.state}) after {self.start_wait:g}s"
                    for w, ok in zip(fresh, ready, strict=True) if not ok]
        return fresh, problems  # the daemon logs them, with the rest of an activation's problems

    async def _start_group(self, key: GroupKey, want: Desired) -> list[str]:
        entry = self._groups[key] = _Group(want, self._changed)
        self._changed()
        fresh, problems = await self._launch(key, entry, want.spec, want.min_workers)
        entry.workers = (*entry.workers, *fresh)
        return problems

    async def _replace_group(self, key: GroupKey, want: Desired) -> list[str]:
        entry = self._groups[key]
        old = list(entry.workers)
        fresh, problems = await self._launch(key, entry, want.spec, want.clamp(len(old)))
        if any(w.routable for w in fresh) or not any(w.routable for w in old):
            entry.workers = tuple(fresh)
            entry.desired = want
            self._retire_later(old, want.drain_timeout)
        else:
            # The new definition does not come up while the old one serves: keep serving the old one.
            problems.append(f"group {'/'.join(key)}: the new definition did not start; the previous workers "
                            "keep serving")
            entry.workers = tuple(old)
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
            self._retire_later(leaving, want.drain_timeout)
            return []
        fresh, problems = await self._launch(key, entry, want.spec, -surplus)
        entry.workers = (*entry.workers, *fresh)
        return problems

    async def _revive_failed(self, key: GroupKey) -> list[str]:
        entry = self._groups[key]
        failed = [w for w in entry.workers if w.state == WorkerState.FAILED]
        if not failed:
            return []
        entry.workers = tuple(w for w in entry.workers if w.state != WorkerState.FAILED)
        # The fresh ones begin before the failed ones are stopped: while that stop is awaited, a request for the
        # group must see a start in flight (launching), not a group at zero with room under max_workers, whose
        # cold start would be one worker over the cap (seen: two running in a group of max_workers 1).
        begun = self._begin(key, entry, entry.desired.spec, len(failed))
        await self._stop_workers(failed)
        fresh, problems = await self._until_routable(begun)
        entry.workers = (*entry.workers, *fresh)
        return problems

    def _stop_group(self, key: GroupKey) -> asyncio.Task[None] | None:
        entry = self._groups.pop(key, None)
        if entry is None:
            return None
        self._changed()
        return self._retire_later(list(entry.workers), entry.desired.drain_timeout)

    async def _stop_workers(self, workers: Sequence[Worker]) -> None:
        await asyncio.gather(*(self._stop(w, self.stop_timeout) for w in workers))


def _prepare_socket_dir(path: str, run_as: RunAs | None) -> None:
    """Mode 0700, owned by the tenant's user (root's without one): its workers bind their sockets there, no other
    tenant may even look in. Set on every activation, so a changed ``user:`` takes effect with the reload."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    uid, gid = (run_as.uid, run_as.gid) if run_as is not None else (os.geteuid(), os.getegid())
    if os.geteuid() == 0:
        os.chown(path, uid, gid)
    os.chmod(path, 0o700)


def _prepare_views(config: Config, runtime_dir: str, only: Collection[str] | None = None) -> None:
    """What isolated workers' views are made of, on the host: the empty mode-0000 file bound over hidden files, and
    each isolated tenant's /tmp and /var/tmp (sticky and open to all, as a host's: inside the view only the tenant's
    user is there), in a directory only root may enter (``<tmp_dir>`` and ``<tmp_dir>/<tenant>``: 0700)."""
    blank = inaccessible_path(runtime_dir)
    if not os.path.isfile(blank):
        with open(os.open(blank, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o000), "wb"):
            pass
    os.chmod(blank, 0o000)
    os.makedirs(config.server.tmp_dir, mode=0o700, exist_ok=True)
    os.chmod(config.server.tmp_dir, 0o700)
    for tenant in config.tenants.values():
        if tenant.isolation is None or (only is not None and tenant.name not in only):
            continue
        own = os.path.join(config.server.tmp_dir, tenant.name)
        os.makedirs(own, mode=0o700, exist_ok=True)
        os.chmod(own, 0o700)
        for path in tmp_dirs(own):
            os.makedirs(path, exist_ok=True)
            os.chmod(path, 0o1777)
