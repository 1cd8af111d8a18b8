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
import hmac
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elasticd import __version__
from elasticd.accounting.process_trees import MEASURED_BY_TREES, read_process_trees
from elasticd.accounting.sampler import Sampler
from elasticd.accounting.usage import measure
from elasticd.agent.listener import AgentListener
from elasticd.agent.rooms import AgentRooms
from elasticd.api.server import AdminApi, SocketInUse
from elasticd.background import Background
from elasticd.cgroup.activation import Activation, CgroupRefused
from elasticd.config import App, Config, ConfigError, PoolSettings, Quotas, Resources, Tenant, load_config
from elasticd.config.notices import balancer_warnings, isolation_warnings, restart_only_changes
from elasticd.front import Front, RouteTable, Upstream
from elasticd.limits.overrides import effective
from elasticd.limits.runtime import LimitsReply, RuntimeLimits
from elasticd.metrics import MetricsServer
from elasticd.monitor.auth import read_credentials
from elasticd.monitor.census import ask_all
from elasticd.monitor.page import MonitorPage
from elasticd.monitor.population import fuse, population_counts
from elasticd.pool.budget import CPU_SAMPLES, UNLIMITED, Budget, budget_of, enforced
from elasticd.pool.channel import ChannelServer
from elasticd.pool.channel_metrics import ChannelCollector
from elasticd.pool.evaluator import SMOOTHING_ROWS
from elasticd.pool.manager import PoolManager
from elasticd.pool.mover import Mover
from elasticd.pool.pool_metrics import PoolCollector
from elasticd.pool.sensing import in_process_tree
from elasticd.probes.capacity_metrics import CapacityCollector
from elasticd.probes.publish import RegistryPage, read_registry
from elasticd.probes.wiring import CapacityWiring
from elasticd.supervisor.lifecycle import GONE, WILL_SERVE, WorkerState
from elasticd.supervisor.sandbox import sandbox_for
from elasticd.supervisor.spawn import channel_path
from elasticd.supervisor.supervisor import Supervisor
from elasticd.supervisor.worker import Worker
from elasticd.systemd import Notifier, setup_logging
from elasticd.worker_ids import parse_worker_id

__all__ = ["Daemon", "main"]

log = logging.getLogger("elasticd")

DEFAULT_CONFIG = "/etc/elastic.yaml"


@dataclass(slots=True)
class ReloadResult:
    ok: bool
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    at: float = field(default_factory=time.time)


class Daemon:
    __slots__ = (
        "_controllers",
        "_draining_stop",
        "_reload_lock",
        "_routing",
        "_routing_version",
        "_said",
        "_stop",
        "_tasks",
        "_upstream_of",
        "agent",
        "api",
        "capacity",
        "cgroups",
        "channel",
        "config",
        "config_path",
        "front",
        "last_reload",
        "limits",
        "metrics",
        "monitor",
        "mover",
        "notifier",
        "pool",
        "registry",
        "sampler",
        "started_at",
        "supervisor",
    )

    def __init__(self, config: Config, config_path: str) -> None:
        self.config = config
        self.config_path = config_path
        self.notifier = Notifier()
        self.cgroups = Activation()
        server = config.server
        self.supervisor = Supervisor(server.runtime_dir, self.cgroups.leaf, stop_timeout=server.stop_timeout,
                                     occupancy_interval=server.occupancy_interval,
                                     systemd_cat=Supervisor.journal_for_workers())
        self.supervisor.on_worker_state = self._on_worker_state
        self.front = Front(server.listen, RouteTable.from_config(config), self._upstreams,
                           quotas=_quotas(config), request_timeout=server.request_timeout, user_ttl=server.user_ttl,
                           move_timeout=server.move_timeout)
        self.limits = RuntimeLimits(lambda: self.config, config_path,
                                    lambda t: self.cgroups.write_tenant(self.config, t, self.limits.resources_of(t)),
                                    self.reload)
        self.pool = PoolManager(self.supervisor, self.front.surface, self.front.forwards,
                                interval=server.occupancy_interval, hung_after=server.hung_after,
                                budget=self._budget, tunnels=self.front.tunnels_by_worker,
                                user_tunnels=self.front.tunnels_of)
        self.front.on_login = self.pool.on_login
        self.front.wake = self.pool.wake  # a request for a group at zero workers starts one and waits for it
        self.supervisor.drain = lambda workers, timeout: self.pool.wait_drained([w.id for w in workers], timeout)
        self.channel = ChannelServer(server.runtime_dir, self._authenticate, self.pool.on_report,
                                     interval=server.occupancy_interval)
        # Live moves: compaction and `elasticctl drain` carry each user's state to its next worker.
        self.mover = Mover(self.front, self.channel, on_end=self.pool.record_move, package_limit=self._package_limit)
        self.pool.mover = self.mover
        self.front.kept = self._kept
        # Capacity probes (seed 001): readings narrow the front's admission and feed the pool's occupancy.
        self.capacity = CapacityWiring(self.front, self.pool, self.supervisor)
        self.front.place = self.capacity.place
        self.sampler = Sampler()
        self.monitor = MonitorPage(self.monitor_state)  # its credentials are read in run() (and at each reload)
        self.registry = RegistryPage(self.capacity.registry_apps)  # its secret too
        self.metrics = MetricsServer(server.metrics_listen, self.sampler, self._limits_in_force,
                                     extra_collectors=[self.front.collector(), PoolCollector(self.pool),
                                                       ChannelCollector(self.channel),
                                                       CapacityCollector(self.capacity.state)],
                                     routes=[self.monitor.add_routes, self.registry.add_routes])
        self.api = AdminApi(self, server.admin_socket, server.admin_group)
        # HAProxy's agent-check (server.agent_listen): each host's room, in HAProxy's own protocol.
        rooms = AgentRooms(self.pool, self.supervisor)
        self.agent = AgentListener(server.agent_listen, rooms) if server.agent_listen is not None else None
        self._draining_stop = False  # a stop is answering `drain` for server.stop_drain first
        self.started_at = time.time()
        self.last_reload: ReloadResult | None = None
        self._reload_lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._tasks = Background(log, "a background task of the daemon")  # activations, reloads, removals
        self._upstream_of: dict[str, Upstream] = {}
        self._routing: dict[tuple[str, str, str], list[Upstream]] = {}  # see _upstreams
        self._routing_version = -1
        self._controllers: dict[str, frozenset[str]] = {}  # per tenant, read at each activation
        self._said: set[str] = set()  # warnings given once per start

    # ------------------------------------------------------------------ wiring for the parts

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

    def _upstreams(self, tenant: str, app: str, group: str) -> list[Upstream]:
        """Called by the front for every request: the pool's routable workers (the one draining filter), as
        Upstreams. Worked out once per group until what is routable may have changed — a worker's state, a
        group's membership (the supervisor's ``changes``), a drain (the pool's) — not per request: with N
        workers that is O(N) Python a request. The list is shared: the front only reads it."""
        version = self.supervisor.changes + self.pool.changes  # both only grow: their sum moves with either
        if version != self._routing_version:
            self._routing.clear()
            self._routing_version = version
        key = (tenant, app, group)
        upstreams = self._routing.get(key)
        if upstreams is None:
            nodes = self.capacity.nodes.get(key)
            if nodes is not None:  # a nodes: group: its upstreams are the config's (a reload moves the version)
                self._routing[key] = nodes
                return nodes
            cache = self._upstream_of
            upstreams = []
            for w in self.pool.routable(key):
                upstream = cache.get(w.id)
                if upstream is None:
                    upstream = cache[w.id] = Upstream(w.id, w.socket_path)
                upstreams.append(upstream)
            self._routing[key] = upstreams
        return upstreams

    def _kept(self, worker_id: str) -> Upstream | None:
        """A worker being emptied by live moves, while it still runs: the front sends it the users pinned to it
        (those waiting their turn to be moved off), though the routable lists leave it out."""
        worker = self.supervisor.find(worker_id)
        if worker is None or not worker.routable or worker_id not in self.pool.draining:
            return None
        upstream = self._upstream_of.get(worker_id)
        if upstream is None:
            upstream = self._upstream_of[worker_id] = Upstream(worker_id, worker.socket_path)
        return upstream

    def _package_limit(self, worker_id: str) -> int:
        """The most bytes a package from this worker may have: its group's ``pool.max_package``."""
        parts = parse_worker_id(worker_id)
        tenant = self.config.tenants.get(parts.tenant) if parts is not None else None
        app = tenant.apps.get(parts.app) if tenant is not None and parts is not None else None
        group = app.groups.get(parts.group) if app is not None and parts is not None else None
        return group.pool.max_package if group is not None else PoolSettings().max_package

    def _authenticate(self, tenant: str, worker_id: str, token: str, pid: int, uid: int) -> str | None:
        """A channel peer is the worker it claims only on its own tenant's socket, with that worker's token, from
        its process tree, and (for a tenant with a user) with that user's uid."""
        worker = self.supervisor.find(worker_id)
        if worker is None or worker.tenant != tenant:
            return f"no worker {worker_id[:80]!r} of tenant {tenant} runs here"
        if not worker.token or not hmac.compare_digest(token.encode(), worker.token.encode()):
            return f"wrong token for worker {worker_id}"
        run_as = worker.spec.run_as
        if run_as is not None and uid != run_as.uid:
            return f"uid {uid} is not the uid of tenant {worker.tenant}'s user {run_as.user} ({run_as.uid})"
        if worker.pid is None or not in_process_tree(pid, worker.pid):
            return f"pid {pid} is not in the process tree of worker {worker_id}"
        return None

    def _on_worker_state(self, worker: Worker) -> None:
        self.notifier.status(self.supervisor.summary())
        key = (worker.tenant, worker.app, worker.group)
        if worker.routable:
            self.pool.on_routable(worker.id)
            self.front.woke(key)  # requests waiting for a group at zero: they go to it now
        elif worker.state == WorkerState.FAILED or (worker.state in GONE and not any(
                w.state in WILL_SERVE for w in self.supervisor.workers_of(key))):
            self.front.wake_failed(key, f"its worker {worker.id} did not start ({worker.state})")
        if worker.routable or worker.state in GONE:
            self.capacity.sync()  # its probe starts once its socket accepts; it stops, its reading dropped, as it goes
        if worker.state in GONE:
            # The pooled connections point at a process that is gone; a restarted one gets fresh ones, and
            # a fresh window: its readings described another process.
            self.pool.forget_worker(worker.id)
            self.mover.worker_died(worker.id)  # a move from it places its user anew; one to it aborts
            self.channel.forget(worker.id)  # what its library announced: a new process announces again
            if worker.state == WorkerState.STOPPED:  # gone for good (a restart keeps its id and socket path)
                self._upstream_of.pop(worker.id, None)
                self.front.forget_worker(worker.id)  # its connections and its forward counters
            else:
                self.front.close_upstream(worker.id)

    # ------------------------------------------------------------------ activation and reload

    async def _activate(self, config: Config, previous: Config | None) -> list[str]:
        self.limits.forget_removed(config)
        # Run-time overrides are written over the config's values, so a reload does not undo them.
        problems = self.cgroups.write(config, lambda t: effective(config.tenants[t].resources,
                                                                   self.limits.overrides.get(t, {})))
        self._controllers = self.cgroups.controllers(config)
        # Routes first: a removed app stops receiving traffic before its workers are stopped.
        self.front.set_routes(RouteTable.from_config(config))
        self.front.set_quotas(_quotas(config))
        self.front.configure(request_timeout=config.server.request_timeout, user_ttl=config.server.user_ttl,
                             move_timeout=config.server.move_timeout)
        self.pool.apply(config)
        if self.agent is not None:
            self.agent.rooms.apply(config)
        self.capacity.apply(config)  # nodes: groups' upstreams, and the probes (workers' start as they come up)
        # The budget reads rates over two sampler intervals and memory events over one smoothing window.
        server = config.server
        self.sampler.set_keep(max(CPU_SAMPLES, math.ceil(SMOOTHING_ROWS * server.occupancy_interval
                                                         / server.sample_interval) + 1))
        # Each tenant's channel socket, in its own workers directory, before its workers start and announce.
        self.channel.configure(server.occupancy_interval)
        problems.extend(await self.channel.serve({t: channel_path(server.runtime_dir, t) for t in config.tenants}))
        result = await self.supervisor.apply(config)
        problems.extend(result.problems)
        self.capacity.sync()  # (a launch's workers join their group only once all of them are routable)
        if previous is not None:
            if result.retired:  # removed apps and tenants: their cgroups go once their workers have drained
                self._track(self._remove_when_drained(previous, result.retired))
        else:
            await self.cgroups.remove_stale(config)
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

    async def reload(self) -> ReloadResult:
        """Parse and validate first: an invalid file changes nothing and its error is returned and logged.
        A task of its own, so that a stop can cancel it wherever it is, and shielded from its caller: an
        admin client that hangs up (aiohttp 3.8 cancels its handler) does not cut a reload in half."""
        if self._stop.is_set():
            return ReloadResult(ok=False, error="elasticd is stopping: the reload was not started")
        return await asyncio.shield(self._track(self._reload()))

    async def _reload(self) -> ReloadResult:
        async with self._reload_lock:
            self.notifier.reloading()
            try:
                new = load_config(self.config_path)
                credentials = read_credentials(new.server.monitor)
                publisher = read_registry(new.server.registry)
            except (ConfigError, ValueError) as exc:
                log.error("reload refused, the running configuration stays: %s\n%s", self.config_path, exc)
                result = ReloadResult(ok=False, error=f"{self.config_path}:\n{exc}")
            else:
                self.monitor.credentials = credentials
                self.registry.publisher = publisher
                result = ReloadResult(ok=True, problems=restart_only_changes(self.config, new))
                for problem in result.problems:
                    log.warning("%s", problem)
                result.problems.extend(await self._activate(new, self.config))
                log.info("reloaded %s", self.config_path)
            self.last_reload = result
            status = self.supervisor.summary()
            self.notifier.ready(status if result.ok else f"{status}; last reload refused: invalid configuration")
            return result

    async def set_limits(self, tenant: str, body: Any) -> LimitsReply:
        return await self.limits.set(tenant, body)

    async def clear_limits(self, tenant: str, names: str | None) -> LimitsReply:
        return await self.limits.clear(tenant, names)

    async def drain(self, worker_id: str) -> dict[str, Any]:
        """POST /v1/workers/{worker}/drain: KeyError for no such worker, ValueError when it is draining."""
        result = await self.pool.drain(worker_id)
        return {"worker": worker_id, "empty": result.empty, "moved": result.moved,
                "failed": [list(failure) for failure in result.failed], "left": result.left}

    def pool_state(self, tenant: str, app: str) -> dict[str, Any]:
        """GET /v1/apps/{tenant}/{app}/pool; LookupError for an app that is not configured."""
        configured = self.config.tenants.get(tenant)
        if configured is None or app not in configured.apps:
            raise LookupError(f"no app {tenant}/{app} in the running configuration")
        surface = self.front.surface

        def users_of(worker_id: str) -> list[dict[str, Any]]:
            # The id is a session secret: the admin API shows a prefix that is enough to tell users apart.
            return [{"user": user[:8], "login": rec.login, "requests": rec.requests,
                     "seconds": round(rec.seconds, 3)} for user, rec in surface.on(worker_id)]

        return self.capacity.describe_pool(self.pool.describe(tenant, app, users_of))

    async def population(self, tenant: str, app: str) -> dict[str, Any]:
        """GET /v1/apps/{tenant}/{app}/population: every user of the app, fused from the workers' registers
        (asked over the channel, all at once) and the front's consumption; LookupError for an unknown app."""
        configured = self.config.tenants.get(tenant)
        if configured is None or app not in configured.apps:
            raise LookupError(f"no app {tenant}/{app} in the running configuration")
        workers = [(w.id, group) for group in configured.apps[app].groups
                   for w in self.supervisor.workers_of((tenant, app, group)) if w.routable]
        answers = await ask_all(self.channel, workers)
        surface = self.front.surface
        rows = fuse(answers, list(surface.users.items()), self.front.clock(), surface.newcomers.snapshot())
        return {"tenant": tenant, "app": app, **population_counts(rows), "rows": rows}

    async def monitor_state(self, app: str | None) -> dict[str, Any]:
        """The monitor page's state (GET /monitor/state): the apps, and for one of them (the first when None)
        its pool and its population. LookupError for an app that is not configured."""
        apps = [f"{t.name}/{a.name}" for t, a in self.config.apps()]
        chosen = app if app is not None else (apps[0] if apps else None)
        state: dict[str, Any] = {"apps": apps, "app": chosen, "at": time.time(), "version": __version__}
        if chosen is not None:
            tenant, _, name = chosen.partition("/")
            state["pool"] = self.pool_state(tenant, name)
            state["population"] = await self.population(tenant, name)
        return state

    async def usage(self, interval_ms: int, apps: bool) -> dict[str, Any]:
        """Two reads of the tenant groups, ``interval_ms`` apart (GET /v1/tenants/usage); without cgroups, of
        the tenants' worker process trees, and the report says so."""
        tree, config = self.cgroups.tree, self.config
        if tree is None:
            trees = {}
            for tenant in config.tenants.values():
                by_app = {app.name: self._worker_pids(tenant, app) for app in tenant.apps.values()}
                trees[tenant.name] = (tuple(pid for pids in by_app.values() for pid in pids),
                                      self.limits.resources_of(tenant.name), by_app)
            report = await measure(trees, interval_ms, apps=apps, read=read_process_trees, threaded=True)
            warning = self.cgroups.decision.warning if self.cgroups.decision else None
            return {"measured": "process trees", "note": MEASURED_BY_TREES,
                    "why": warning or "server.cgroups.mode is off", **report}
        targets = {
            tenant.name: (tree.tenant_dir(tenant.name), self.limits.resources_of(tenant.name),
                          {app: tree.leaf(tenant.name, app) for app in tenant.apps})
            for tenant in config.tenants.values()
        }
        return {"measured": "cgroups", **await measure(targets, interval_ms, apps=apps, read=self.sampler.read_now)}

    def _worker_pids(self, tenant: Tenant, app: App) -> tuple[int, ...]:
        return tuple(w.pid for group in app.groups for w in self.supervisor.workers_of((tenant.name, app.name, group))
                     if w.pid is not None)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        workers = self.supervisor.status()
        users = self.front.surface.count_by_group()
        tenants: dict[str, Any] = {}
        for tenant in self.config.tenants.values():
            apps: dict[str, Any] = {}
            for app in tenant.apps.values():
                apps[app.name] = {
                    "domains": list(app.domains),
                    "root": app.root,
                    "leaf": self.cgroups.leaf(tenant.name, app.name),
                    "default_group": app.default_group,
                    "groups": {g: {"workers": workers.get((tenant.name, app.name, g), []),
                                   "sticky_users": users.get((f"{tenant.name}/{app.name}", g), 0),
                                   "active": g in app.active_groups}
                               for g in app.groups},
                    "canary": None if app.canary is None else {"group": app.canary.group,
                                                               "share": app.canary.share},
                }
            run_as = tenant.run_as
            tenants[tenant.name] = {"limits": self.limits.describe(tenant.name), "apps": apps,
                                    "user": None if run_as is None else {"name": run_as.user, "uid": run_as.uid,
                                                                         "group": run_as.group, "gid": run_as.gid},
                                    "isolation": (view.describe() if (view := sandbox_for(self.config, tenant))
                                                  is not None else None)}
        last = self.last_reload
        return {
            "version": __version__,
            "pid": os.getpid(),
            "config": self.config_path,
            "uptime": round(time.time() - self.started_at, 3),
            "listen": str(self.config.server.listen),
            "cgroups": self.cgroups.describe(self.config.server.cgroups.mode),
            "last_reload": None if last is None else {
                "ok": last.ok, "error": last.error, "problems": last.problems,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last.at))},
            "tenants": tenants,
        }

    # ------------------------------------------------------------------ run

    async def run(self) -> int:
        try:
            self.monitor.credentials = read_credentials(self.config.server.monitor)
            self.registry.publisher = read_registry(self.config.server.registry)
            self.cgroups.claim(self.config.server.cgroups)
            os.makedirs(os.path.join(self.config.server.runtime_dir, "workers"), mode=0o755, exist_ok=True)
            await self.api.start()
            await self.front.start()
            await self.metrics.start()
            # (the channel listens once an activation names the tenants: ChannelServer.serve)
            if self.agent is not None:
                await self.agent.start()
        except (CgroupRefused, SocketInUse, ValueError, OSError) as exc:
            log.error("refusing to start: %s", exc)
            self.notifier.send(f"STATUS=refusing to start: {exc}")
            await self._shutdown()
            return 1
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._on_signal, signum.name)
        activation = self._track(self._activate(self.config, None))
        stop = loop.create_task(self._stop.wait())
        await asyncio.wait({activation, stop}, return_when=asyncio.FIRST_COMPLETED)
        if activation.done() and not activation.cancelled() and activation.exception() is not None:
            stop.cancel()
            await self._shutdown()
            raise activation.exception()  # type: ignore[misc]  # a bug of ours: say so, as before
        if not self._stop.is_set():
            self._track(self.sampler.run(self.config.server.sample_interval))
            self._track(self.pool.run())
            self.notifier.ready(self.supervisor.summary())
            self.notifier.start_watchdog()
            log.info("elasticd %s ready: front on %s, %s", __version__, self.config.server.listen,
                     self.supervisor.summary())
            await stop
        await self._shutdown()
        return 0

    def _on_signal(self, name: str) -> None:
        getattr(self, f"_on_{name.lower()}")()

    def _on_sighup(self) -> None:
        self._track(self.reload())  # refused by reload() itself once stopping

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
        await self._tasks.settle()
        await self.notifier.stop_watchdog()
        await self.front.stop(self.config.server.stop_timeout)
        await self.capacity.aclose()
        await self.supervisor.stop_all()
        await self.cgroups.drain_all(self.config)
        await self.api.stop()
        await self.channel.stop()
        if self.agent is not None:
            await self.agent.stop()
        await self.metrics.stop()
        self.sampler.close()
        log.info("stopped")


def _quotas(config: Config) -> dict[str, Quotas]:
    return {tenant.name: tenant.quotas for tenant in config.tenants.values()}


# ---------------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elasticd", description="Supervisor for multi-tenant Linux hosts.")
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=f"configuration file (default {DEFAULT_CONFIG})")
    parser.add_argument("--check", action="store_true", help="validate the configuration and exit (0 ok, 1 not)")
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
        print(f"{args.config}: ok ({len(config.tenants)} tenants, {groups} groups)")
        return 0
    setup_logging(getattr(logging, args.log_level.upper()))
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        log.error("invalid configuration %s:\n%s", args.config, exc)
        return 1
    path = str(Path(args.config).resolve())
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(Daemon(config, path).run())


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
