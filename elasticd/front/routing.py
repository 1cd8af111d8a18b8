"""Which app a request is for, and which worker of it is next: pure decisions, no I/O.

The front asks the table for the app of a ``Host`` header, then asks ``RoundRobin`` for one of the upstreams
the supervisor currently says are routable. Both are rebuilt or pruned on reload, never mutated by requests
in a way that depends on time.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from elasticd.config import Config

__all__ = ["AppRoute", "RoundRobin", "RouteTable", "normalize_host"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class AppRoute:
    tenant: str
    app: str
    group: str

    @property
    def key(self) -> tuple[str, str, str]:
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

    __slots__ = ("_catch_all", "_exact", "_suffixes")

    def __init__(self, routes: Mapping[str, AppRoute] | None = None) -> None:
        self._exact: dict[str, AppRoute] = {}
        self._suffixes: dict[str, AppRoute] = {}  # ".example.com" for "*.example.com"
        self._catch_all: AppRoute | None = None
        for domain, route in (routes or {}).items():
            name = domain.strip().lower().rstrip(".")
            if name == "*":
                self._catch_all = route
            elif name.startswith("*."):
                self._suffixes[name[1:]] = route
            else:
                self._exact[name] = route

    @classmethod
    def from_config(cls, config: Config) -> RouteTable:
        # The config already refuses a domain routed to two apps, so a plain dict loses nothing.
        routes = {
            domain: AppRoute(tenant.name, app.name, app.default_group)
            for tenant, app in config.apps()
            for domain in app.domains
        }
        return cls(routes)

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


class RoundRobin:
    """Picks the next item of a list per key.

    The list is the caller's current view (workers come and go), so the state is only a position per key,
    taken modulo the list's length on every pick: a grown or shrunk list never breaks it, and it cycles
    through every item when the list stays the same.
    """

    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next: dict[Hashable, int] = {}

    def pick(self, key: Hashable, items: Sequence[T]) -> T:
        if not items:
            raise ValueError("nothing to pick from")
        index = self._next.get(key, 0) % len(items)
        # Store the next position already reduced, so counters stay small however long the daemon runs.
        self._next[key] = (index + 1) % len(items)
        return items[index]

    def retain(self, keys: Collection[Hashable]) -> None:
        """Forget the positions of keys no longer routed (after a reload), so state stays bounded."""
        for key in [k for k in self._next if k not in keys]:
            del self._next[key]
