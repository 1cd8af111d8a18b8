"""What the agent answers about, read from the running daemon (a shell): each app's active groups as the pool and
the supervisor see them now (``line.AppRoom``), found by a domain or ``tenant/app``. The line itself is the pure
``line`` module's."""

from __future__ import annotations

from collections.abc import Mapping

from elasticd.agent.line import AppRoom, GroupRoom
from elasticd.config.model import Config
from elasticd.front.core.routing import RouteTable
from elasticd.pool.manager import PoolManager
from elasticd.pool.ports import GroupKey
from elasticd.supervisor.lifecycle import WorkerState
from elasticd.supervisor.supervisor import Supervisor

__all__ = ["AgentRooms"]



class AgentRooms:
    __slots__ = ("_config", "_pool", "_removed", "_routes", "_supervisor")

    def __init__(self, pool: PoolManager, supervisor: Supervisor) -> None:
        self._pool = pool
        self._supervisor = supervisor
        self._config: Config | None = None
        self._routes = RouteTable()
        # Apps a reload removed, by their domains and "tenant/app": answered `drain` while their workers finish.
        self._removed: dict[str, tuple[str, str]] = {}

    def apply(self, config: Config) -> None:
        previous = self._config
        self._config = config
        self._routes = RouteTable.from_config(config)
        if previous is not None:
            for tenant, app in previous.apps():
                if tenant.name not in config.tenants or app.name not in config.tenants[tenant.name].apps:
                    for name in (*app.domains, f"{tenant.name}/{app.name}"):
                        self._removed[name] = (tenant.name, app.name)
        for name, (tenant_name, app_name) in list(self._removed.items()):
            if tenant_name in config.tenants and app_name in config.tenants[tenant_name].apps:
                del self._removed[name]  # back in the config

    def resolve(self, hint: str) -> AppRoom | None:
        """The app a hint names (a domain as the front routes it, or tenant/app), None when none here."""
        config = self._config
        if config is None:
            return None
        if "/" in hint:
            tenant, _, app = hint.partition("/")
            if tenant in config.tenants and app in config.tenants[tenant].apps:
                return self.app(tenant, app)
        else:
            route = self._routes.lookup(hint)
            if route is not None:
                return self.app(route.tenant, route.app)
        removed = self._removed.get(hint)
        if removed is not None:
            if self._supervisor.holds_app(*removed):
                return AppRoom("/".join(removed), (), removed=True)
            del self._removed[hint]  # its workers finished: it is simply not here any more
        return None

    def app(self, tenant: str, app: str, bound: Mapping[GroupKey, frozenset[str]] | None = None) -> AppRoom:
        assert self._config is not None
        configured = self._config.tenants[tenant]
        model = configured.apps[app]
        bound = self._pool.limits_bound() if bound is None else bound
        draining = self._pool.draining
        groups = []
        routable = failed = remote = False
        emptying = True  # every worker of its active groups being emptied (and at least one)
        for name in sorted(model.active_groups):
            group = model.groups[name]
            key = (tenant, app, name)
            if not group.spawned:
                remote = True  # (nodes: another host's room is its own agent's to say)
                continue
            workers = self._supervisor.workers_of(key)
            serving = any(w.routable for w in workers)
            dead = any(w.state == WorkerState.FAILED for w in workers) and not serving
            routable, failed = routable or serving, failed or dead
            emptying = emptying and bool(workers) and all(w.id in draining for w in workers)
            share = 1.0 if model.canary is None else (model.canary.share if name == model.canary.group
                                                       else 1.0 - model.canary.share)
            pool = group.pool
            groups.append(GroupRoom(tuple(self._pool.occupancies_of(key)), self._supervisor.counted(key),
                                    pool.max_workers, pool.reception_threshold, pool.admission_threshold,
                                    held=bool(bound.get(key)), failed=dead, share=share))
        return AppRoom(f"{tenant}/{app}", tuple(groups), failed=failed and not routable,
                       draining=bool(groups) and emptying, remote=remote and not groups,
                       maxconn=configured.quotas.max_concurrent_requests)

    def apps(self) -> list[AppRoom]:
        config = self._config
        if config is None:
            return []
        bound = self._pool.limits_bound()  # (once for the host's answer, not once per group)
        return [self.app(t.name, a.name, bound) for t, a in config.apps()]
