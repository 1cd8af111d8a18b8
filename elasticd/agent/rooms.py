"""What the agent answers about, read from the running daemon (a shell): each app's active groups as the pool and
the supervisor see them now (``line.AppRoom``), found by a domain or ``tenant/app``. The line itself is the pure
``line`` module's."""

from __future__ import annotations

from elasticd.agent.line import AppRoom, GroupRoom
from elasticd.config.model import Config
from elasticd.front.core.routing import RouteTable
from elasticd.pool.manager import PoolManager
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
        if removed is not None and self._supervisor.holds_app(*removed):
            return AppRoom("/".join(removed), (), draining=True)
        return None

    def app(self, tenant: str, app: str) -> AppRoom:
        assert self._config is not None
        configured = self._config.tenants[tenant]
        model = configured.apps[app]
        groups = []
        routable = failed = False
        for name in sorted(model.active_groups):
            group = model.groups[name]
            key = (tenant, app, name)
            if not group.spawned:
                continue  # (nodes: another host's room is its own agent's to say)
            workers = self._supervisor.workers_of(key)
            routable = routable or any(w.routable for w in workers)
            failed = failed or any(w.state == "failed" for w in workers)
            pool = group.pool
            groups.append(GroupRoom(tuple(self._pool.occupancies_of(key)), self._supervisor.held(key),
                                    pool.max_workers, pool.reception_threshold, pool.admission_threshold,
                                    held=bool(self._pool.limits_bound().get(key))))
        return AppRoom(f"{tenant}/{app}", tuple(groups), failed=failed and not routable,
                       maxconn=configured.quotas.max_concurrent_requests)

    def apps(self) -> list[AppRoom]:
        config = self._config
        return [] if config is None else [self.app(t.name, a.name) for t, a in config.apps()]
