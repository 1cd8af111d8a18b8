"""The admin API's answers (``api.server.Control``): status, a pool's and a population's state, the monitor page's,
usage, drains and run-time limits. It reads the daemon's parts and decides nothing of its own: a view and a
forwarding desk, so that ``daemon.py`` is left to wire and run."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from elasticd import __version__
from elasticd.accounting import files as files_module
from elasticd.accounting.process_trees import MEASURED_BY_TREES, read_process_trees
from elasticd.accounting.sampler import FD_RESERVE, Sampler
from elasticd.accounting.usage import measure
from elasticd.cgroup.activation import Activation
from elasticd.config import App, Config, Tenant
from elasticd.front import Front
from elasticd.limits.runtime import LimitsReply, RuntimeLimits
from elasticd.loop_slices import gather_in_slices
from elasticd.monitor.census import ask_all
from elasticd.monitor.population import fuse, population_counts
from elasticd.pool.channel_server import ChannelServer
from elasticd.pool.manager import PoolManager
from elasticd.probes.wiring import CapacityWiring
from elasticd.supervisor.sandbox import hidden_for, sandbox_for
from elasticd.supervisor.supervisor import Supervisor
from elasticd.tenant_files.runtime import TenantFiles, TenantReply

__all__ = ["DaemonControl", "ReloadResult"]


@dataclass(slots=True)
class ReloadResult:
    ok: bool
    error: str | None = None
    problems: list[str] = field(default_factory=list)
    at: float = field(default_factory=time.time)
    written: list[str] = field(default_factory=list)  # the tenants whose cgroup files it wrote
    status: int = 200  # a refusal's, for a tenant file's change: 409 a conflict, 422 invalid, 500 not written


@dataclass(slots=True)
class DaemonParts:
    """What the answers read: the daemon's parts, fixed for its life."""

    supervisor: Supervisor
    front: Front
    pool: PoolManager
    capacity: CapacityWiring
    channel: ChannelServer
    cgroups: Activation
    limits: RuntimeLimits
    sampler: Sampler
    tenant_files: TenantFiles


class DaemonControl:
    __slots__ = ("_capacity", "_cgroups", "_channel", "_config", "_front", "_last_reload", "_limits", "_pool",
                 "_reload", "_sampler", "_started_at", "_supervisor", "_tenant_files", "_upgrade", "_upgrade_state",
                 "config_path")

    def __init__(self, parts: DaemonParts, *, config: Callable[[], Config], config_path: str,
                 reload: Callable[[bool], Awaitable[ReloadResult]],
                 last_reload: Callable[[], ReloadResult | None],
                 upgrade: Callable[[], Awaitable[tuple[bool, str]]] | None = None,
                 upgrade_state: Callable[[], dict[str, Any]] | None = None) -> None:
        self._supervisor = parts.supervisor
        self._front = parts.front
        self._pool = parts.pool
        self._capacity = parts.capacity
        self._channel = parts.channel
        self._cgroups = parts.cgroups
        self._limits = parts.limits
        self._sampler = parts.sampler
        self._tenant_files = parts.tenant_files
        # Read at each answer: a reload replaces the config and the last reload's outcome.
        self._config = config
        self._last_reload = last_reload
        self._reload = reload
        self._upgrade = upgrade
        self._upgrade_state = upgrade_state
        self.config_path = config_path
        self._started_at = time.time()

    @property
    def config(self) -> Config:
        return self._config()

    async def reload(self, everything: bool = False) -> ReloadResult:
        return await self._reload(everything)

    async def upgrade(self) -> tuple[bool, str]:
        if self._upgrade is None:
            return False, "this elasticd cannot upgrade in place"
        return await self._upgrade()

    def upgrade_state(self) -> dict[str, Any]:
        return self._upgrade_state() if self._upgrade_state is not None else {"under_way": False, "report": None}

    async def set_limits(self, tenant: str, body: Any) -> LimitsReply:
        return await self._limits.set(tenant, body)

    async def clear_limits(self, tenant: str, names: str | None) -> LimitsReply:
        return await self._limits.clear(tenant, names)

    async def put_tenant(self, tenant: str, raw: bytes, content_type: str, create_only: bool) -> TenantReply:
        return await self._tenant_files.put(tenant, raw, content_type, create_only)

    async def get_tenant(self, tenant: str) -> TenantReply:
        return await self._tenant_files.get(tenant)

    async def delete_tenant(self, tenant: str) -> TenantReply:
        return await self._tenant_files.delete(tenant)

    async def drain(self, worker_id: str) -> dict[str, Any]:
        """POST /v1/workers/{worker}/drain: KeyError for no such worker, ValueError when it is draining."""
        result = await self._pool.drain(worker_id)
        return {"worker": worker_id, "empty": result.empty, "moved": result.moved,
                "failed": [list(failure) for failure in result.failed], "left": result.left}

    def pool_state(self, tenant: str, app: str) -> dict[str, Any]:
        """GET /v1/apps/{tenant}/{app}/pool; LookupError for an app that is not configured."""
        configured = self.config.tenants.get(tenant)
        if configured is None or app not in configured.apps:
            raise LookupError(f"no app {tenant}/{app} in the running configuration")
        surface = self._front.surface

        def users_of(worker_id: str) -> list[dict[str, Any]]:
            # The id is a session secret: the admin API shows a prefix that is enough to tell users apart.
            return [{"user": user[:8], "login": rec.login, "requests": rec.requests,
                     "seconds": round(rec.seconds, 3)} for user, rec in surface.on(worker_id)]

        described = self._capacity.describe_pool(self._pool.describe(tenant, app, users_of))
        for name, group in described.get("groups", {}).items():
            settings = configured.apps[app].groups.get(name)
            if settings is not None:
                group["queue"] = self._queue_of(f"{tenant}/{app}/{name}", settings.queue.max, settings.queue.timeout)
        return described

    def _queue_of(self, key: str, most: int, timeout: float) -> dict[str, Any]:
        """The group's queue in the front: waiting now, its bounds, how many waited and how many it refused."""
        stats = self._front.forwards.queues.get(key)
        return {"depth": self._front.waiting.parked.depth(key), "max": most, "timeout": timeout,
                "waited": stats.count if stats is not None else 0,
                "refused": dict(stats.refused) if stats is not None else {}}

    async def population(self, tenant: str, app: str) -> dict[str, Any]:
        """GET /v1/apps/{tenant}/{app}/population: every user of the app, fused from the workers' registers
        (asked over the channel, all at once) and the front's consumption; LookupError for an unknown app."""
        configured = self.config.tenants.get(tenant)
        if configured is None or app not in configured.apps:
            raise LookupError(f"no app {tenant}/{app} in the running configuration")
        workers = [(w.id, group) for group in configured.apps[app].groups
                   for w in self._supervisor.workers_of((tenant, app, group)) if w.routable]
        answers = await ask_all(self._channel, workers)
        surface = self._front.surface
        rows = fuse(answers, list(surface.users.items()), self._front.clock(), surface.newcomers.snapshot())
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
        tree, config = self._cgroups.tree, self.config
        if tree is None:
            trees = {}
            for tenant in config.tenants.values():
                by_app = {app.name: self._worker_pids(tenant, app) for app in tenant.apps.values()}
                trees[tenant.name] = (tuple(pid for pids in by_app.values() for pid in pids),
                                      self._limits.resources_of(tenant.name), by_app)
            report = await measure(trees, interval_ms, apps=apps, read=read_process_trees, threaded=True)
            warning = self._cgroups.decision.warning if self._cgroups.decision else None
            return {"measured": "process trees", "note": MEASURED_BY_TREES,
                    "why": warning or "server.cgroups.mode is off", **report}
        targets = {
            tenant.name: (tree.tenant_dir(tenant.name), self._limits.resources_of(tenant.name),
                          {app: tree.leaf(tenant.name, app) for app in tenant.apps})
            for tenant in config.tenants.values()
        }
        return {"measured": "cgroups", **await measure(targets, interval_ms, apps=apps, read=self._sampler.read_now)}

    def _worker_pids(self, tenant: Tenant, app: App) -> tuple[int, ...]:
        return tuple(w.pid for group in app.groups for w in self._supervisor.workers_of((tenant.name, app.name, group))
                     if w.pid is not None)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        status = self._status_head()
        status["tenants"] = dict(self._tenant_statuses())
        return status

    async def status_in_slices(self) -> dict[str, Any]:
        """``status()``, with a turn of the loop whenever a slice of it took LOOP_SLICE (loop_slices.py): made in one
        step it held the front's loop ~180 ms at 10,000 apps (benchmarks/stall_watch, an ``elasticctl status``). A
        snapshot as of its first tenant: the workers and users are read then, a reload meanwhile is not in it."""
        status = self._status_head()
        status["tenants"] = dict(await gather_in_slices(self._tenant_statuses()))
        return status

    def _tenant_statuses(self) -> Iterator[tuple[str, dict[str, Any]]]:
        config = self.config
        workers = self._supervisor.status()
        users = self._front.surface.count_by_group()
        hidden = hidden_for(config)
        for tenant in config.tenants.values():
            apps: dict[str, Any] = {}
            for app in tenant.apps.values():
                apps[app.name] = {
                    "domains": list(app.domains),
                    "root": app.root,
                    "leaf": self._cgroups.leaf(tenant.name, app.name),
                    "default_group": app.default_group,
                    "groups": {g: {"workers": workers.get((tenant.name, app.name, g), []),
                                   "sticky_users": users.get((f"{tenant.name}/{app.name}", g), 0),
                                   "active": g in app.active_groups}
                               for g in app.groups},
                    "canary": None if app.canary is None else {"group": app.canary.group,
                                                               "share": app.canary.share},
                }
            run_as = tenant.run_as
            yield tenant.name, {"limits": self._limits.describe(tenant.name), "apps": apps,
                                "user": None if run_as is None else {"name": run_as.user, "uid": run_as.uid,
                                                                     "group": run_as.group, "gid": run_as.gid},
                                "isolation": (view.describe() if (view := sandbox_for(config, tenant, hidden))
                                              is not None else None)}

    def _status_head(self) -> dict[str, Any]:
        """Everything the status says but its tenants (which come last)."""
        last = self._last_reload()
        return {
            "version": __version__,
            "pid": os.getpid(),
            "config": self.config_path,
            "uptime": round(time.time() - self._started_at, 3),
            "listen": str(self.config.server.listen),
            "cgroups": self._cgroups.describe(self.config.server.cgroups.mode),
            "last_reload": None if last is None else {
                "ok": last.ok, "error": last.error, "problems": last.problems,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(last.at))},
            "descriptors": self._descriptors(),
            "began": self._began(),
        }

    def _began(self) -> dict[str, Any]:
        """How this instance began: a start, an upgrade in place, or after a crash (what it adopted then)."""
        began = dict(self.upgrade_state().get("began") or {"how": "start", "at": self._started_at})
        began["at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(began["at"]))
        return began

    def _descriptors(self) -> dict[str, Any]:
        """elasticd's open descriptors against its limit: what the admin socket says when they run low (it keeps a
        reserve to answer with: accounting/sampler.py)."""
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            count = len(os.listdir("/proc/self/fd"))
        except OSError:
            count = -1
        limit = soft if soft != resource.RLIM_INFINITY else None
        low = limit is not None and count >= limit - 2 * FD_RESERVE
        return {"open": count, "limit": limit, "sampler": self._sampler.open_descriptors,
                "refused_opens": files_module.descriptors_refused,
                "low": low, "warning": (f"{count} of {limit} descriptors open: the sampler skips reads until some are "
                                        "free (raise LimitNOFILE= of elasticd.service, or look for what holds them: "
                                        "ls -l /proc/<pid>/fd)") if low else None}
