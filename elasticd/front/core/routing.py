"""Which app a request is for: a pure decision, no I/O.

The front asks the table for the app of a ``Host`` header (and remembers the answer per Host value); which
worker of the app's group then serves is the sticky surface's and the placement's decision (``sticky``).
The table is rebuilt on reload, never mutated by requests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Final

from elasticd.config.model import Config, QueueSettings
from elasticd.front.core.bounds import DEFAULT_CONCURRENCY

_DEFAULT_QUEUE = QueueSettings()
DEFAULT_QUEUE_MAX: Final = _DEFAULT_QUEUE.max
DEFAULT_QUEUE_TIMEOUT: Final = _DEFAULT_QUEUE.timeout

__all__ = ["AppRoute", "RouteTable", "normalize_host"]


@dataclass(frozen=True, slots=True)
class AppRoute:
    """An app, as the front routes to it: ``group`` is its default group (new users go there), ``canary`` the
    group a ``canary_share`` of new users go to instead, ``groups`` every group it has (a user placed in one of
    them stays there: ``groups.choose_group``)."""

    tenant: str
    app: str
    group: str
    canary: str | None = None
    canary_share: float = 0.0
    groups: frozenset[str] = frozenset()
    label: str = ""  # "tenant/app" (made once per table: a placement records it on the user's entry)
    # (group, its concurrency) for each group: what one worker serves at once, which bounds the front's connections
    # to it (``bounds.connection_bound``). A tuple, not a mapping: a route is hashed.
    concurrency: tuple[tuple[str, int], ...] = ()
    # (group, its queue's max, its queue's timeout) for each group (config.model.QueueSettings)
    queues: tuple[tuple[str, int, float], ...] = ()

    def concurrency_of(self, group: str) -> int:
        """The concurrency of ``group``'s workers (the config's default when the route does not say)."""
        for name, value in self.concurrency:
            if name == group:
                return value
        return DEFAULT_CONCURRENCY

    def queue_of(self, group: str) -> tuple[int, float]:
        """(max, timeout) of ``group``'s queue (the config's default when the route does not say)."""
        for name, most, timeout in self.queues:
            if name == group:
                return most, timeout
        return DEFAULT_QUEUE_MAX, DEFAULT_QUEUE_TIMEOUT

    @property
    def key(self) -> tuple[str, str, str]:
        """The default group's key."""
        return (self.tenant, self.app, self.group)

    def __str__(self) -> str:
        return f"{self.tenant}/{self.app}"


def normalize_host(host_header: str | None) -> str | None:
    """The host name of a ``Host`` header: port stripped (also after ``[v6]``), lower case, no trailing dot.

    None when there is nothing left to route on. Ports are ignored because the same app answers on every
    port the front listens on, and a FQDN's trailing dot names the same host as without it.
    """
    if not host_header:
        return None
    host = host_header.strip()
    if host.startswith("["):
        end = host.find("]")
        if end < 0:
            return None
        host = host[1:end]
    elif host.count(":") == 1:
        host = host.partition(":")[0]
    # More than one colon without brackets is a bare IPv6 literal (not valid in Host, but unambiguous).
    host = host.lower().rstrip(".")
    return host or None


class RouteTable:
    """Domain → app route. Built once per configuration; lookups never allocate more than the host string.

    Domains are exact host names; ``*.example.com`` (which the config accepts) matches any name below
    ``example.com`` at any depth, the longest suffix winning; a lone ``*`` catches every host not otherwise
    routed. Exact names always win over wildcards.
    """

    __slots__ = ("_app_keys", "_by_tenant", "_catch_all", "_exact", "_suffixes")

    def __init__(self, routes: Mapping[str, AppRoute] | None = None) -> None:
        self._exact: dict[str, AppRoute] = {}
        self._suffixes: dict[str, AppRoute] = {}  # ".example.com" for "*.example.com"
        self._catch_all: AppRoute | None = None
        # Each tenant's routes as from_config built them, with the model they came from (reused while it is the
        # same object: a reload of 10,000 apps builds the changed tenant's routes alone).
        self._by_tenant: dict[str, tuple[object, dict[str, AppRoute], frozenset[str]]] = {}  # (…, its routed apps)
        self._app_keys: set[tuple[str, str]] | None = None  # (tenant, app) routed, for a table not from a config
        for domain, route in (routes or {}).items():
            name = domain.strip().lower().rstrip(".")
            if name == "*":
                self._catch_all = route
            elif name.startswith("*."):
                self._suffixes[name[1:]] = route
            else:
                self._exact[name] = route

    @classmethod
    def from_config(cls, config: Config, previous: RouteTable | None = None) -> RouteTable:
        """The table of ``config``; ``previous`` (the table it replaces) lends the routes of every tenant whose
        model is the very object it was built from."""
        # The config already refuses a domain routed to two apps, so a plain dict loses nothing.
        routes: dict[str, AppRoute] = {}
        by_tenant: dict[str, tuple[object, dict[str, AppRoute], frozenset[str]]] = {}
        for tenant in config.tenants.values():
            kept = previous._by_tenant.get(tenant.name) if previous is not None else None
            if kept is not None and kept[0] is tenant:
                by_tenant[tenant.name] = kept
                routes.update(kept[1])
                continue
            own = {
                domain: AppRoute(tenant.name, app.name, app.default_group,
                                 app.canary.group if app.canary is not None else None,
                                 app.canary.share if app.canary is not None else 0.0, frozenset(app.groups),
                                 f"{tenant.name}/{app.name}",
                                 tuple(sorted((name, group.concurrency) for name, group in app.groups.items())),
                                 tuple(sorted((name, group.queue.max, group.queue.timeout)
                                              for name, group in app.groups.items())))
                for app in tenant.apps.values()
                for domain in app.domains
            }
            by_tenant[tenant.name] = (tenant, own, frozenset(route.app for route in own.values()))
            routes.update(own)
        table = cls(routes)
        table._by_tenant = by_tenant
        return table

    def routes_app(self, tenant: str, app: str) -> bool:
        """Whether any domain routes to the app (one lookup: after a reload the front keeps the stats of every app
        this says yes to, 10,000 of them asked at a hosting host's scale)."""
        if self._by_tenant:
            entry = self._by_tenant.get(tenant)
            return entry is not None and app in entry[2]
        if self._app_keys is None:
            self._app_keys = {(route.tenant, route.app) for route in self.routes()}
        return (tenant, app) in self._app_keys

    def lookup(self, host_header: str | None) -> AppRoute | None:
        host = normalize_host(host_header)
        if host is None:
            return None
        route = self._exact.get(host)
        if route is not None:
            return route
        if self._suffixes:
            # Walk ".b.c", ".c" from the most specific: "a.b.c" tries "*.b.c" before "*.c".
            dot = host.find(".")
            while dot >= 0:
                route = self._suffixes.get(host[dot:])
                if route is not None:
                    return route
                dot = host.find(".", dot + 1)
        return self._catch_all

    def routes(self) -> Iterator[AppRoute]:
        """Every distinct route (an app reached by several domains appears once)."""
        seen: set[AppRoute] = set()
        extra = [self._catch_all] if self._catch_all is not None else []
        for route in [*self._exact.values(), *self._suffixes.values(), *extra]:
            if route not in seen:
                seen.add(route)
                yield route

    def __len__(self) -> int:
        return len(self._exact) + len(self._suffixes) + (self._catch_all is not None)
