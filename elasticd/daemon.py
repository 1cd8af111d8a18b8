"""The daemon: wires the config, cgroups, supervisor, front and admin API together, and runs them.

Start: validate the config, claim the cgroup base (moving elasticd into ``<base>/server`` before anything
else when the base is its own cgroup), write every limit, start the workers, then ``READY=1``. Signals are
dispatched by name (``SIGHUP`` → a reload, ``SIGTERM``/``SIGINT`` → stop; behind a balancer, ``SIGTERM`` first
answers HAProxy's agent ``drain`` for ``server.stop_drain``, still serving). Reloads run one at a time as tasks,
whether they come from SIGHUP or ``POST /v1/reload``; a stop never waits behind one: it cancels the activation or
reload under way (a reload can wait up to 30 s for new workers to become routable) and shuts down.

The shutdown is bounded, in this order: the front stops accepting and lets answers under way finish (up to
``stop_timeout``); then every worker elasticd ever started and has not stopped — in a group, being launched,
draining, being replaced — gets SIGTERM at once, and SIGKILL after ``stop_timeout``; then the leaves are
emptied (cgroup.kill), then the admin API, the channel and the metrics close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

from elasticd import __version__
from elasticd.accounting.activity import Activity
from elasticd.accounting.sampler import Sampler
from elasticd.agent.listener import AgentListener
from elasticd.agent.rooms import AgentRooms
from elasticd.api.server import AdminApi, SocketInUse
from elasticd.background import Background
from elasticd.cgroup.activation import Activation, CgroupRefused
from elasticd.channel_auth import ChannelAuth
from elasticd.config import Config, ConfigError, PoolSettings, Quotas, Resources, load_config
from elasticd.config.changes import changed_tenants
from elasticd.config.include import ParsedFiles
from elasticd.config.model import Server
from elasticd.config.notices import balancer_warnings, few, isolation_warnings, restart_only_changes
from elasticd.control import DaemonControl, DaemonParts, ReloadResult
from elasticd.crash.keeping import StateKeeping
from elasticd.front import Front, RouteTable
from elasticd.front.serving import BACKLOG
from elasticd.heap import Heap, hold_full_passes
from elasticd.keeper.link import KeeperLink, KeptRow
from elasticd.keeper.own import KeeperSpawner, keeper_socket, reach_keeper
from elasticd.limits.overrides import effective
from elasticd.limits.runtime import RuntimeLimits
from elasticd.listener_guard.guard import ListenerGuard
from elasticd.listener_guard.own import OWN_LISTENERS
from elasticd.listener_guard.verdict import tenants_by_uid
from elasticd.listeners import Listeners
from elasticd.loop_slices import GIL_SWITCH
from elasticd.metrics import MetricsServer
from elasticd.monitor.auth import read_credentials
from elasticd.monitor.page import MonitorPage
from elasticd.pool.budget import CPU_SAMPLES, UNLIMITED, Budget, budget_of, enforced
from elasticd.pool.channel_metrics import ChannelCollector
from elasticd.pool.channel_server import ChannelServer
from elasticd.pool.evaluator import SMOOTHING_ROWS
from elasticd.pool.manager import PoolManager
from elasticd.pool.mover import Mover
from elasticd.pool.pool_metrics import PoolCollector
from elasticd.probes.capacity_metrics import CapacityCollector
from elasticd.probes.publish import RegistryPage, read_registry
from elasticd.probes.wiring import CapacityWiring
from elasticd.proxy_trust import ProxyTrust, TrustedProxies
from elasticd.supervisor.lifecycle import GONE, WILL_SERVE, WorkerState
from elasticd.supervisor.spawn import channel_path
from elasticd.supervisor.supervisor import Supervisor
from elasticd.supervisor.worker_process import Worker
from elasticd.systemd import Notifier, forget_stored, listen_fds, setup_logging, store_listeners
from elasticd.tenant_files.runtime import TenantChange, TenantFiles
from elasticd.upgrade.inherited import close_strays, kept_descriptors
from elasticd.upgrade.reexec import ReExec, read_inherited_state, running_state, stop_unadopted
from elasticd.upgrade.state import READS as STATE_FORMATS_READ
from elasticd.upgrade.state import SavedState
from elasticd.upgrade.state import dump as dump_state
from elasticd.upstream_lists import UpstreamLists
from elasticd.worker_ids import parse_worker_id

__all__ = ["Daemon", "main"]

log = logging.getLogger("elasticd")

DEFAULT_CONFIG = "/etc/elastic.yaml"


# A worker's end that leaves the requests waiting for its group nothing to wait for, unless another of the group
# will serve (or the pool owes it a start): failed (a crash loop), or stopped; and an exit before it ever served.
_ENDED: Final = frozenset({WorkerState.FAILED, WorkerState.STOPPED})

class Daemon:
    __slots__ = (
        "_controllers",
        "_draining_stop",
        "_keeper_path",
        "_reload_lock",
        "_said",
        "_spawner",
        "_state_fds",
        "_stop",
        "_tasks",
        "_uids",
        "activity",
        "agent",
        "api",
        "capacity",
        "cgroups",
        "channel",
        "config",
        "config_path",
        "control",
        "front",
        "guard",
        "heap",
        "inherited",
        "keeper",
        "keeping",
        "kept_rows",
        "last_reload",
        "last_written",
        "limits",
        "listeners",
        "metrics",
        "monitor",
        "mover",
        "notifier",
        "parsed",
        "pool",
        "reexec",
        "registry",
        "sampler",
        "supervisor",
        "upstreams",
    )

    def __init__(self, config: Config, config_path: str, inherited: SavedState | None = None,
                 refused_state: str | None = None, stored: Mapping[str, list[int]] | None = None,
                 parsed: ParsedFiles | None = None, keeper: str | None = None) -> None:
        self.config = config
        self.config_path = config_path
        # The included files' last good parse: a reload parses only the files that changed (config/include.py).
        self.parsed = parsed if parsed is not None else ParsedFiles()
        self.last_written: frozenset[str] = frozenset()  # the tenants whose cgroup files the last activation wrote
        # A re-exec in place (upgrade/reexec.py): what the previous image handed over (None: a plain start), and why
        # it could not be taken, if it could not.
        self.inherited = (inherited, refused_state)
        # Every listening socket, by name: the previous image's when it handed them over; kept for the next one.
        # Every listening socket, by name: the previous image's when it handed them over, or systemd's store's after a
        # restart (``stored``); held for the next image, and for the store.
        stored = dict(stored or {})
        self._state_fds = stored.pop("state", [])  # the running state's memfd, if the store kept one (elasticd/crash)
        self.listeners = Listeners(inherited.listeners if inherited is not None else stored)
        self.listeners.on_discard = forget_stored
        self.notifier = Notifier()
        self.cgroups = Activation()
        server = config.server
        self.supervisor = Supervisor(server.runtime_dir, self.cgroups.leaf, stop_timeout=server.stop_timeout,
                                     occupancy_interval=server.occupancy_interval,
                                     systemd_cat=Supervisor.journal_for_workers())
        self.supervisor.on_worker_state = self._on_worker_state
        # The front asks for a group's upstreams at every request: the pool's routable workers, cached (see there).
        self.upstreams = UpstreamLists(self.supervisor, lambda key: self.capacity.nodes.get(key))
        self.front = Front(server.listen, RouteTable.from_config(config), self.upstreams,
                           quotas=_quotas(config), request_timeout=server.request_timeout, user_ttl=server.user_ttl,
                           move_timeout=server.move_timeout)
        self.limits = RuntimeLimits(lambda: self.config, config_path,
                                    lambda t: self.cgroups.write_tenant(self.config, t, self.limits.resources_of(t)),
                                    self.reload)
        self.pool = PoolManager(self.supervisor, self.front.surface, self.front.forwards,
                                interval=server.occupancy_interval, hung_after=server.hung_after,
                                budget=self._budget, tunnels=self.front.tunnels_by_worker,
                                user_tunnels=self.front.tunnels_of)
        self.upstreams.wire(self.pool)
        self.front.forwarding.on_login = self.pool.on_login
        self.front.forwarding.wake = self.pool.wake  # a request for a group at zero workers starts one and waits for it
        self.pool.on_wake_failed = self.front.waiting.wake_failed
        self.front.waiting.on_queued = self.pool.on_queued  # a queued request is the burst's short signal
        self.pool.queued = lambda key: self.front.waiting.parked.depth("/".join(key))
        self.supervisor.wait_drained = lambda workers, timeout: self.pool.wait_drained([w.id for w in workers], timeout)
        self.channel = ChannelServer(server.runtime_dir, ChannelAuth(self.supervisor), self.pool.on_report,
                                     interval=server.occupancy_interval, listeners=self.listeners)
        # Live moves: compaction and `elasticctl drain` carry each user's state to its next worker.
        self.mover = Mover(self.front, self.channel, on_end=self.pool.record_move, package_limit=self._package_limit)
        self.pool.mover = self.mover
        self.front.forwarding.kept = self.upstreams.kept
        # Capacity probes (seed 001): readings narrow the front's admission and feed the pool's occupancy.
        self.capacity = CapacityWiring(self.front, self.pool, self.supervisor)
        self.front.forwarding.place = self.capacity.place
        self.activity = Activity()  # which apps /metrics shows their own series for
        self.sampler = Sampler(interval=config.server.sample_interval, activity=self.activity)
        self.sampler.set_busy(self.supervisor.apps_alive)  # an app with a worker is read every tick, populated or not
        tenant_files = TenantFiles(lambda: self.config, self.change_tenant_file, self.supervisor.workers_of_tenant)
        self.control = DaemonControl(
            DaemonParts(self.supervisor, self.front, self.pool, self.capacity, self.channel, self.cgroups, self.limits,
                        self.sampler, tenant_files),
            config=lambda: self.config, config_path=config_path, reload=self.reload,
            last_reload=lambda: self.last_reload, upgrade=self.upgrade, upgrade_state=lambda: self.reexec.state())
        self.monitor = MonitorPage(self.control.monitor_state)  # its credentials are read in run() (and at each reload)
        self.registry = RegistryPage(self.capacity.registry_apps)  # its secret too
        # elasticd's own listeners answer no tenant's process (by its socket's cgroup or owner: listener_guard).
        self.guard = ListenerGuard(self.cgroups.tenants_by_cgroup, self._tenants_by_uid)
        self._uids: tuple[Config, dict[int, str]] | None = None
        self.metrics = MetricsServer(server.metrics_listen, self.sampler, self._limits_in_force,
                                     extra_collectors=[self.front.collector(self._shown),
                                                       PoolCollector(self.pool, self._shown),
                                                       ChannelCollector(self.channel),
                                                       CapacityCollector(self.capacity.state),
                                                       self.guard.collector()],
                                     routes=[self.monitor.add_routes, self.registry.add_routes], shown=self._shown,
                                     guard=self.guard)
        self.api = AdminApi(self.control, server.admin_socket, server.admin_group)
        # HAProxy's agent-check (server.agent_listen): each host's room, in HAProxy's own protocol.
        rooms = AgentRooms(self.pool, self.supervisor)
        self.agent = AgentListener(server.agent_listen, rooms, self.guard) if server.agent_listen is not None else None
        self._draining_stop = False  # a stop is answering `drain` for server.stop_drain first
        self.last_reload: ReloadResult | None = None
        self._reload_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks = Background(log, "a background task of the daemon")  # activations, reloads, removals
        self.heap = Heap()  # kept out of the collector's full passes after the start and each reload (heap.py)
        self._controllers: dict[str, frozenset[str]] = {}  # per tenant, read at each activation
        self._said: set[str] = set()  # warnings given once per start
        self.reexec = ReExec(self)
        # The parent of every worker (elasticd/keeper), reached at the start; its table then (a previous image's
        # workers, for the adoption).
        self.keeper: KeeperLink | None = None
        self.kept_rows: list[KeptRow] = []
        # The keeper's socket when it runs in a unit of its own (--keeper): the workers then outlive a crash of
        # elasticd. None: elasticd starts a keeper of its own, tied to its life.
        self._keeper_path = keeper
        self._spawner: KeeperSpawner | None = None  # the workers' way to the keeper, across a loss of it
        self.keeping: StateKeeping | None = None  # the running state, kept in systemd's store for a crash

    # ------------------------------------------------------------------ wiring for the parts

    def _shown(self, tenant: str, app: str) -> bool:
        return self.activity.shown(tenant, app, time.monotonic())

    def _proxy_trust(self, server: Server) -> ProxyTrust | None:
        """Who the front lets state X-Forwarded-* and Forwarded (None: nobody, and nothing is asked per connection)."""
        trusted = TrustedProxies.of(server.trusted_proxies, [uid for _, uid in server.trusted_proxy_users])
        return ProxyTrust(trusted, self.guard) if trusted.anyone else None

    def _tenants_by_uid(self) -> dict[int, str]:
        config = self.config
        if self._uids is None or self._uids[0] is not config:  # (made again once per config, not per connection)
            self._uids = (config, tenants_by_uid((t.name, t.run_as.uid) for t in config.tenants.values()
                                                 if t.run_as is not None))
        return self._uids[1]

    def _limits_in_force(self) -> dict[str, Resources]:
        return {name: self.limits.resources_of(name) for name in self.config.tenants}

    def _budget(self, tenant: str, app: str) -> Budget:
        """The tenant's cgroup budget for the pool: the sampler's recent samples and the limits in force
        (none when cgroups are not enforced: then no limit is real, and none holds a scale-up)."""
        if not self.cgroups.enforced or tenant not in self.config.tenants:
            return UNLIMITED
        resources = enforced(self.limits.resources_of(tenant), self._controllers.get(tenant, frozenset()))
        return budget_of(self.sampler.history(("tenant", tenant)), resources,
                         app_samples=self.sampler.history(("app", tenant, app)))

    def _package_limit(self, worker_id: str) -> int:
        """The most bytes a package from this worker may have: its group's ``pool.max_package``."""
        parts = parse_worker_id(worker_id)
        tenant = self.config.tenants.get(parts.tenant) if parts is not None else None
        app = tenant.apps.get(parts.app) if tenant is not None and parts is not None else None
        group = app.groups.get(parts.group) if app is not None and parts is not None else None
        return group.pool.max_package if group is not None else PoolSettings().max_package

    def _on_worker_state(self, worker: Worker) -> None:
        self.notifier.status(self.supervisor.summary())
        key = (worker.tenant, worker.app, worker.group)
        if worker.routable:
            self.pool.on_routable(worker.id)
            self.front.waiting.woke(key)  # requests waiting for a group at zero: they go to it now
        elif (worker.state in _ENDED or (worker.state == WorkerState.EXITED and not worker.served)) \
                and not self.pool.owes_start(key) \
                and not any(w.state in WILL_SERVE for w in self.supervisor.workers_of(key) if w is not worker):
            # (one that served and exited is restarting: the requests that wait for its group wait for it; one whose
            # start failed is a broken command, and they are answered now rather than at their timeout)
            self.front.waiting.wake_failed(key, f"its worker {worker.id} did not start ({worker.state})")
        if worker.routable or worker.state in GONE:
            self.capacity.sync()  # its probe starts once its socket accepts; it stops, its reading dropped, as it goes
        if worker.state in GONE:
            # The pooled connections point at a process that is gone; a restarted one gets fresh ones, and
            # a fresh window: its readings described another process.
            self.pool.forget_worker(worker.id)
            self.mover.worker_died(worker.id)  # a move from it places its user anew; one to it aborts
            self.channel.forget(worker.id)  # what its library announced: a new process announces again
            if worker.state == WorkerState.STOPPED:  # gone for good (a restart keeps its id and socket path)
                self.upstreams.forget(worker.id)
                self.front.forget_worker(worker.id)  # its connections and its forward counters
            else:
                self.front.close_upstream(worker.id)

    # ------------------------------------------------------------------ activation and reload

    async def _activate(self, config: Config, previous: Config | None,
                        channel_inodes: Mapping[str, int] | None = None, everything: bool = False) -> list[str]:
        self.limits.forget_removed(config)
        # A start (and `elasticctl reload --all`) writes every tenant's cgroup files; a reload, those of the tenants
        # whose settings changed. Run-time overrides are written over the config's values, so a reload does not
        # undo them.
        written = changed_tenants(None if everything else previous, config)
        problems = self.cgroups.write(config, lambda t: effective(config.tenants[t].resources,
                                                                   self.limits.overrides.get(t, {})), only=written)
        self.last_written = written
        fresh = self.cgroups.controllers(config, only=written)  # (the others' are as they were read last)
        self._controllers = {name: fresh.get(name, self._controllers.get(name, frozenset()))
                             for name in config.tenants}
        # Each step below walks every app, a few ms each at 10,000 apps, and the front serves every tenant's requests
        # on this loop: the loop gets a turn between two steps (``_turn``), so a reload holds a request for one step,
        # not all of them. Not before the pool has the routes' groups: a request for a group the pool does not know
        # is a 503 ("no worker available") where one it knows waits for its worker (a crash's restart adopting its
        # workers: 24-crash). After that, a request in between sees the new routes and groups with the old probes'
        # settings for that turn; a step that starts or stops a worker already let the loop run in its middle.
        # Routes first: a removed app stops receiving traffic before its workers are stopped.
        self.front.set_routes(RouteTable.from_config(config, self.front.routes))
        self.front.set_quotas(_quotas(config))
        self.front.configure(request_timeout=config.server.request_timeout, user_ttl=config.server.user_ttl,
                             move_timeout=config.server.move_timeout, trusts=self._proxy_trust(config.server),
                             keep_underscored=config.server.underscored_headers == "keep")
        self.pool.apply(config, written)  # (only the changed tenants' groups are made again)
        if self.agent is not None:
            self.agent.rooms.apply(config)
        await _turn()
        self.capacity.apply(config)  # nodes: groups' upstreams, and the probes (workers' start as they come up)
        await _turn()
        # The budget reads rates over two sampler intervals and memory events over one smoothing window.
        server = config.server
        self.sampler.set_keep(max(CPU_SAMPLES, math.ceil(SMOOTHING_ROWS * server.occupancy_interval
                                                         / server.sample_interval) + 1))
        self.activity.configure(server.metrics.window, server.metrics.app_series == "all")
        self.activity.forget(lambda tenant, app: tenant in config.tenants and app in config.tenants[tenant].apps)
        # Each tenant's channel socket, in its own workers directory, before its workers start and announce.
        self.channel.configure(server.occupancy_interval)
        problems.extend(await self.channel.serve({t: channel_path(server.runtime_dir, t) for t in config.tenants},
                                                 channel_inodes))
        await _turn()
        result = await self.supervisor.apply(config)
        problems.extend(result.problems)
        await _turn()
        self.capacity.sync()  # (a launch's workers join their group only once all of them are routable)
        if previous is not None:
            if result.retired:  # removed apps and tenants: their cgroups go once their workers have drained
                self._track(self._remove_when_drained(previous, result.retired))
        else:
            await self.cgroups.remove_stale(config)
        await _turn()
        # Reopened here: a reload may have added or removed cgroups under the sampler's descriptors.
        self.sampler.set_targets(self.cgroups.sampler_targets(config))
        self.config = config
        for problem in problems:
            log.error("%s", problem)
        for warning in [*isolation_warnings(config), *balancer_warnings(config)]:
            if warning not in self._said:  # once per start (a reload repeats only what it newly brings)
                self._said.add(warning)
                log.warning("%s", warning)
        if server.hung_after >= server.request_timeout:
            log.warning("server.hung_after (%gs) is not shorter than server.request_timeout (%gs): a worker that "
                        "does not report is never found hung (the front answers 504 first)", server.hung_after,
                        server.request_timeout)
        return problems

    async def _remove_when_drained(self, previous: Config, retired: list[asyncio.Task[None]]) -> None:
        await asyncio.gather(*retired, return_exceptions=True)
        # Against the config running now, not the one of that reload: a later reload may have brought it back;
        # and never a leaf that still holds a worker of ours (one draining from a later removal).
        await self.cgroups.remove_dropped(previous, lambda: self.config, busy=self.supervisor.holds_app)

    def _track(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        return self._tasks.spawn(coroutine)

    track = _track  # (the re-exec's hand-over runs as one of the daemon's tasks: a stop cancels it)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def reload_lock(self) -> asyncio.Lock:
        return self._reload_lock

    async def upgrade(self) -> tuple[bool, str]:
        """A re-exec in place of the installed elasticd (upgrade/reexec.py): (True, what happens next) once the
        preflight passed and the hand-over began; (False, why not) and nothing stopped."""
        return await self.reexec.begin()

    async def reload(self, everything: bool = False) -> ReloadResult:
        """Parse and validate first: an invalid file changes nothing and its error is returned and logged.
        A task of its own, so that a stop can cancel it wherever it is, and shielded from its caller: an
        admin client that hangs up (aiohttp 3.8 cancels its handler) does not cut a reload in half.
        ``everything`` (elasticctl reload --all): every file parsed again and every tenant's cgroup files written,
        not only what changed."""
        if self._stop.is_set():
            return ReloadResult(ok=False, error="elasticd is stopping: the reload was not started")
        return await asyncio.shield(self._track(self._reload(everything)))

    async def change_tenant_file(self, change: TenantChange) -> ReloadResult:
        """A panel's change of one tenant's file (tenant_files/runtime.py): validated against the whole
        configuration as it would be, written, then applied as a reload; refused with nothing changed."""
        if self._stop.is_set():
            return ReloadResult(ok=False, error="elasticd is stopping: nothing was changed", status=503)
        return await asyncio.shield(self._track(self._reload(False, change)))

    async def _validated(self, change: TenantChange) -> ReloadResult | None:
        """The change checked and written (None), or why not (nothing written)."""
        conflict = change.conflict(self.config)
        if conflict is not None:
            return ReloadResult(ok=False, error=conflict[1], status=conflict[0])
        try:
            await asyncio.to_thread(load_config, self.config_path, self.parsed, {str(change.path): change.text})
        except ConfigError as exc:
            return ReloadResult(ok=False, error=f"{self.config_path} with {change.path} changed:\n"
                                                f"{change.in_body(exc)}", status=422)
        try:
            await asyncio.to_thread(change.commit)
        except OSError as exc:
            return ReloadResult(ok=False, error=f"cannot write {change.path}: {exc.strerror or exc}", status=500)
        return None

    async def _reload(self, everything: bool, change: TenantChange | None = None) -> ReloadResult:
        async with self._reload_lock:
            refused = await self._validated(change) if change is not None else None
            if refused is not None:
                return refused
            self.notifier.reloading()
            try:
                if everything:
                    self.parsed.clear()
                # In a thread (it reads files and builds a new Config; nothing the loop holds): at 10,000 apps it is
                # ~50 ms of Python the front's loop would otherwise wait on (loop_slices.py, GIL_SWITCH).
                new = await asyncio.to_thread(load_config, self.config_path, self.parsed)
                credentials = read_credentials(new.server.monitor)
                publisher = read_registry(new.server.registry)
            except (ConfigError, ValueError) as exc:
                log.error("reload refused, the running configuration stays: %s\n%s", self.config_path, exc)
                result = ReloadResult(ok=False, error=f"{self.config_path}:\n{exc}", status=422)
                if change is not None:  # (another file was edited in between: this one goes back as it was)
                    await asyncio.to_thread(change.undo)
            else:
                self.monitor.credentials = credentials
                self.registry.publisher = publisher
                result = ReloadResult(ok=True, problems=restart_only_changes(self.config, new))
                for problem in result.problems:
                    log.warning("%s", problem)
                result.problems.extend(await self._activate(new, self.config, everything=everything))
                result.written = sorted(self.last_written)
                log.info("reloaded %s: %s", self.config_path, written_summary(self.last_written, len(new.tenants)))
                self.heap.settle_soon(asyncio.get_running_loop())  # (the configuration replaced is garbage now)
            self.last_reload = result
            status = self.supervisor.summary()
            self.notifier.ready(status if result.ok else f"{status}; last reload refused: invalid configuration")
            return result

    # ------------------------------------------------------------------ run

    async def run(self) -> int:
        saved, refused = self.inherited
        server = self.config.server
        try:
            self.monitor.credentials = read_credentials(server.monitor)
            self.registry.publisher = read_registry(server.registry)
            cgroups = server.cgroups
            if saved is not None and saved.cgroup_base is not None and cgroups.path is None:
                # The previous image moved this process from its own cgroup (the base) into <base>/server at its
                # start: the base is the one it claimed, not the cgroup this process is in now.
                cgroups = replace(cgroups, path=saved.cgroup_base)
            if self._keeper_path is not None:
                # The keeper's unit: its cgroup is the tenants' base (it moved itself into <base>/keeper), unless the
                # configuration names one.
                self.keeper, self.kept_rows = await reach_keeper(self._keeper_path, start=False)
            if self.keeper is not None:
                self.cgroups.claim(cgroups, keeper_base=self.keeper.base, keeper_refused=self.keeper.base_refused)
            else:
                self.cgroups.claim(cgroups)
            os.makedirs(os.path.join(server.runtime_dir, "workers"), mode=0o755, exist_ok=True)
            if self.keeper is None:
                # After the claim: a keeper started here is forked from <base>/server, where elasticd is by now.
                self.keeper, self.kept_rows = await reach_keeper(keeper_socket(server.runtime_dir), start=True)
            self.keeper.on_lost = self._on_keeper_lost
            self._spawner = KeeperSpawner(self.keeper)
            self.supervisor.spawner = self._spawner
            crashed = self._keep_state(saved)
            if saved is not None:
                self.notifier.start_watchdog()  # (the previous image fed it until the exec: one process throughout)
            await self.api.start(self.listeners)
            if saved is None:  # (taking over, the front accepts once the workers are adopted: below)
                await self.front.start(self._front_sockets())
            own = self.listeners.tcp("metrics", server.metrics_listen.host, server.metrics_listen.port, 128)
            await self.metrics.start(own)
            # (the channel listens once an activation names the tenants: ChannelServer.serve)
            if self.agent is not None:
                agent = self.listeners.tcp("agent", self.agent.address.host, self.agent.address.port, 128)
                await self.agent.start(agent)
                own = [*own, *agent]
            # where a tenant's node or probe URL must not lead elasticd (front/serving.py, probes/probe.py)
            OWN_LISTENERS.set(sock.getsockname()[:2] for sock in own)
        except (CgroupRefused, SocketInUse, ValueError, OSError) as exc:
            log.error("refusing to start: %s", exc)
            self.notifier.send(f"STATUS=refusing to start: {exc}")
            await self._shutdown()
            return 1
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            loop.add_signal_handler(signum, self._on_signal, signum.name)
        if crashed is not None:
            self.reexec.adopt(crashed, None, crash=True)
        else:
            self.reexec.adopt(saved, refused)
        activation = self._track(self._activate(self.config, None,
                                                saved.channel_inodes if saved is not None else None))
        stop = loop.create_task(self._stop.wait())
        await asyncio.wait({activation, stop}, return_when=asyncio.FIRST_COMPLETED)
        if activation.done() and not activation.cancelled() and activation.exception() is not None:
            stop.cancel()
            await self._shutdown()
            raise activation.exception()  # type: ignore[misc]  # a bug of ours: say so, as before
        if saved is not None and not self._stop.is_set():
            try:
                await self.front.start(self._front_sockets())
            except OSError as exc:
                log.error("refusing to go on: the front cannot listen: %s", exc)
                await self._shutdown()
                return 1
            await self.reexec.serving(saved)
        if not self._stop.is_set():
            # (Behind a balancer, not the front's: a host that stops must refuse connections, so that HAProxy sends
            # them to the others at once, rather than leave them in a backlog while it restarts.)
            store_listeners(self.listeners, front=self.agent is None)
            if self.keeping is not None:
                self.keeping.write(force=True)
                self._track(self.keeping.run())
            self._track(self.sampler.run(self.config.server.sample_interval))
            self._track(self.pool.run())
            self.heap.settle_soon(loop)  # what the start made lives as long as the configuration: frozen
            self.notifier.ready(self.supervisor.summary())
            self.notifier.start_watchdog()
            log.info("elasticd %s ready: front on %s, %s", __version__, self.config.server.listen,
                     self.supervisor.summary())
            await stop
        await self._shutdown()
        return 0

    def _keep_state(self, saved: SavedState | None) -> SavedState | None:
        """The running state, kept in systemd's store from now on (elasticd/crash); what a crashed instance left."""
        fds, self._state_fds = self._state_fds, []
        self.keeping, crashed = StateKeeping.opened(
            saved.state_store if saved is not None else None, fds,
            lambda: dump_state(running_state(self, outputs=False)), self._state_mark)
        return crashed

    def _on_keeper_lost(self) -> None:
        if not self.stopping:
            self._track(self._reach_keeper_again())

    async def _reach_keeper_again(self) -> None:
        """The keeper's connection ended unasked (the keeper died, or its unit was restarted): its workers went with
        it and restart through the next keeper, reached here (elasticd's own: started anew)."""
        log.error("the keeper's connection ended: its workers are gone with it (they restart once a keeper is "
                  "reached again)")
        assert self._spawner is not None
        self._spawner.lost()
        path = self._keeper_path or keeper_socket(self.config.server.runtime_dir)
        while not self.stopping:
            try:
                link, rows = await reach_keeper(path, start=self._keeper_path is None)
            except OSError as exc:
                log.error("no keeper reached yet: %s; trying again", exc)
                await asyncio.sleep(1.0)
                continue
            link.on_lost = self._on_keeper_lost
            self.keeper, self.kept_rows = link, rows
            stop_unadopted(self, set())  # (a keeper that outlived the connection: its children are no one's now)
            self._spawner.replace(link)
            log.info("a keeper (pid %d) is reached again: the workers restart through it", link.keeper_pid)
            return

    def _state_mark(self) -> tuple[int, int, str]:
        """What changes when the kept state does (cheaper than the document): workers, users, overrides."""
        return (self.supervisor.changes, self.front.surface.changes,
                repr(sorted(self.limits.overrides.items())) if self.limits.overrides else "")

    def _on_signal(self, name: str) -> None:
        getattr(self, f"_on_{name.lower()}")()

    def _on_sighup(self) -> None:
        self._track(self.reload())  # refused by reload() itself once stopping

    def _on_sigusr2(self) -> None:
        """A re-exec in place, as nginx's and PHP-FPM's USR2: its outcome is in the journal and ``GET /v1/upgrade``."""
        self._track(self.upgrade())

    def _front_sockets(self) -> list[socket.socket]:
        listen = self.config.server.listen
        return self.listeners.tcp("front", listen.host, listen.port, BACKLOG)

    def _on_sigterm(self) -> None:
        """A stop. Behind a balancer (server.agent_listen and server.stop_drain), the agent answers `drain` first,
        for stop_drain, while everything still serves: HAProxy sends new users to the other hosts before the
        workers go. A second SIGTERM (or SIGINT) meanwhile stops at once."""
        drain = self.config.server.stop_drain
        if self.agent is None or drain <= 0 or self._draining_stop or self._stop.is_set():
            self._stop.set()
            return
        self._draining_stop = True
        self.agent.stopping = True
        self.front.close_after_answers()  # (kept-alive connections end with their answers, none idle at the stop)
        self.notifier.send(f"STATUS=stopping: answering drain to HAProxy for {drain:g}s first")
        log.info("stopping: the agent answers drain for %gs first (server.stop_drain), still serving", drain)
        asyncio.get_running_loop().call_later(drain, self._stop.set)

    def _on_sigint(self) -> None:
        self._stop.set()  # (Ctrl-C on a terminal: no balancer to tell)

    async def _shutdown(self) -> None:
        if self.agent is not None:
            self.agent.stopping = True  # (every stop, drained first or not: HAProxy hears `drain` to the end)
        self.notifier.stopping()
        log.info("stopping")
        self._stop.set()
        # What may still start or stop workers goes first: activations, reloads, the pool's retires.
        self.supervisor.stopping = True
        self.pool.stop()
        self.mover.abort_all("elasticd is stopping")  # each user stays where it is, its held requests go there
        self.heap.stop()
        await self._tasks.settle()
        await self.notifier.stop_watchdog()
        # The front's listening socket closes with its server: a client (or HAProxy) is refused from now on, and goes
        # elsewhere, rather than waiting in a backlog nobody will accept from. (A re-exec keeps it instead: reexec.py.)
        self.listeners.release("front")
        await self.front.stop(self.config.server.stop_timeout)
        await self.capacity.aclose()
        await self.supervisor.stop_all()
        if self.keeping is not None:
            forget_stored("state")  # a clean stop: what the next instance finds is no crash's
            self.keeping.stored.close()
        if self.keeper is not None:
            self.keeper.stop()  # (its workers stopped: the keeper goes too)
        await self.cgroups.drain_all(self.config)
        await self.api.stop()
        await self.channel.stop()
        if self.agent is not None:
            await self.agent.stop()
        await self.metrics.stop()
        self.guard.close()  # (its netlink socket: once no listener it guards accepts)
        self.listeners.close_all()
        self.sampler.close()
        log.info("stopped")


def written_summary(written: frozenset[str], tenants: int) -> str:
    """The tenants whose cgroup files an activation wrote, in one line."""
    if not written:
        return f"no tenant changed (of {tenants}): no cgroup file written"
    return f"{len(written)} of {tenants} tenants written ({few(sorted(written))})"



async def _turn() -> None:
    """One turn of the event loop for everything else waiting on it (a reload's steps: see ``_activate``)."""
    await asyncio.sleep(0)

def _quotas(config: Config) -> dict[str, Quotas]:
    return {tenant.name: tenant.quotas for tenant in config.tenants.values()}


# ---------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticd", description="Supervisor for multi-tenant Linux hosts.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"configuration file (default {DEFAULT_CONFIG})")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit (0 ok, 1 not)")
    parser.add_argument("--state-format", type=int, metavar="N",
                        help="with --check: also refuse (1) unless this elasticd reads a re-exec state of format N "
                             "(the preflight of `elasticctl upgrade`)")
    parser.add_argument("--keeper", metavar="SOCKET",
                        help="the socket of the keeper's unit (elasticd-keeper.service): workers are started through "
                             "it and outlive a crash of elasticd; without it elasticd starts a keeper of its own, "
                             "tied to its life")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    parser.add_argument("--version", action="version", version=f"elasticd {__version__}")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check:
        try:
            config = load_config(args.config)
            read_credentials(config.server.monitor)
        except (ConfigError, ValueError) as exc:
            print(f"{args.config}: invalid configuration", file=sys.stderr)
            print(exc, file=sys.stderr)
            return 1
        groups = sum(1 for _ in config.groups())
        if args.state_format is not None and args.state_format not in STATE_FORMATS_READ:
            formats = ", ".join(map(str, STATE_FORMATS_READ))
            print(f"elasticd {__version__} reads a re-exec state of formats {formats}, not {args.state_format}: "
                  "an upgrade in place to it cannot keep the workers (restart it instead)", file=sys.stderr)
            return 1
        print(f"{args.config}: ok ({len(config.tenants)} tenants, {groups} groups)")
        return 0
    # First, before anything opens a descriptor: what the previous image (a re-exec) or systemd (its store, after a
    # restart) passed, and every other inherited descriptor closed (none is this image's to keep unnamed).
    saved, refused = read_inherited_state(os.environ)
    stored = listen_fds(os.environ)
    close_strays(kept_descriptors(saved, stored))
    setup_logging(getattr(logging, args.log_level.upper()))
    hold_full_passes()  # until the start's settle: the start makes everything, each full pass would walk it (heap.py)
    parsed = ParsedFiles()
    try:
        config = load_config(args.config, parsed)
    except ConfigError as exc:
        log.error("invalid configuration %s:\n%s", args.config, exc)
        return 1
    path = str(Path(args.config).resolve())
    sys.setswitchinterval(GIL_SWITCH)  # (the front's loop waits less for a thread's GIL: loop_slices.py)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(Daemon(config, path, saved, refused, stored, parsed, args.keeper).run())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop when it is there: the front's relay costs about a tenth less CPU per request on it (see
    benchmarks/front_bench.py). ELASTICD_LOOP=asyncio keeps the standard loop."""
    if os.environ.get("ELASTICD_LOOP") == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


if __name__ == "__main__":
    sys.exit(main())
