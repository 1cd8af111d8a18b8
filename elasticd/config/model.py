"""The configuration model: immutable data, what every part of elasticd reads.

``config/load.py`` builds it from YAML (and validates it); nothing else constructs it outside tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["Address", "App", "Canary", "CgroupSettings", "Config", "Group", "MonitorAuth", "PoolSettings", "Quotas",
           "Resources", "RunAs", "Server", "Tenant", "default_burst"]


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class CgroupSettings:
    mode: str = "auto"
    path: str | None = None  # None: elasticd's own cgroup


@dataclass(frozen=True, slots=True)
class MonitorAuth:
    """``server.monitor``: basic auth for the monitor page (it shows user names). The password is the first line
    of ``password_file``, read by the daemon at start and at each reload (monitor/auth.py)."""

    user: str
    password_file: str


@dataclass(frozen=True, slots=True)
class Server:
    listen: Address = Address("127.0.0.1", 8080)
    metrics_listen: Address = Address("127.0.0.1", 9464)
    admin_socket: str = "/run/elasticd/admin.sock"
    admin_group: str | None = None
    runtime_dir: str = "/run/elasticd"
    cgroups: CgroupSettings = CgroupSettings()
    sample_interval: float = 5.0
    occupancy_interval: float = 5.0
    request_timeout: float = 60.0
    stop_timeout: float = 10.0
    user_ttl: float = 1800.0
    hung_after: float = 30.0  # silent AND making no progress this long = hung (never under 3 intervals)
    move_timeout: float = 10.0  # a live move's hard deadline: a moving user's requests are held at most this
    monitor: MonitorAuth | None = None  # None: /monitor answers without auth (metrics_listen is loopback)


@dataclass(frozen=True, slots=True)
class Resources:
    """Per-tenant limits. None means unlimited (written as ``max``); swap defaults to 0, not unlimited,
    because otherwise a memory limit is silently absorbed by swap."""

    cpu: float | None = None  # percent of one CPU
    memory: int | None = None
    swap: int | None = 0
    pids: int | None = None
    io_weight: int | None = None  # None: the kernel default, 100
    io_read: int | None = None  # bytes per second
    io_write: int | None = None


@dataclass(frozen=True, slots=True)
class Quotas:
    max_concurrent_requests: int | None = None
    requests_per_second: float | None = None
    burst: int | None = None  # None with a rate: default_burst(rate)


def default_burst(requests_per_second: float) -> int:
    """A token bucket's size when the file names a rate and no burst: one second's worth of requests."""
    return max(1, math.ceil(requests_per_second))


@dataclass(frozen=True, slots=True)
class PoolSettings:
    min_workers: int = 1
    max_workers: int | None = 4  # None (`null` or "max" in the file): unbounded, as seed 000 says
    reception_threshold: float = 0.5
    admission_threshold: float = 0.8
    compaction_margin: float = 1.5
    memory_limit: int | None = None
    drain_timeout: float = 300.0  # a retired worker's open requests and tunnels get this long to finish
    idle_timeout: float = 600.0  # a group at min_workers 0 retires its last worker after this long unused
    # A scale-up is held (not made) when the tenant's cgroup could give a new worker nothing: its CPU usage at
    # this share of its cpu.max, or throttled in this share of its periods; memory.current plus one more
    # worker's RSS over this share of memory.max; pids.current plus one more worker's over this share of pids.max.
    cpu_held_at: float = 0.9
    throttled_held_at: float = 0.5
    memory_held_at: float = 0.9
    pids_held_at: float = 0.9


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    command: tuple[str, ...]
    python: str | None = None  # None: elasticd's own interpreter
    env: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 8
    pool: PoolSettings = PoolSettings()


@dataclass(frozen=True, slots=True)
class Canary:
    """``canary: {group, share}``: new users whose id hashes within ``share`` (0 to 1) go to ``group``."""

    group: str
    share: float


@dataclass(frozen=True, slots=True)
class App:
    name: str
    domains: tuple[str, ...]
    root: str
    default_group: str
    groups: Mapping[str, Group]
    canary: Canary | None = None

    @property
    def active_groups(self) -> frozenset[str]:
        """The groups new users go to: the default and the canary. Any other (the blue of a blue/green switch
        whose users are leaving) starts no worker of its own and empties out."""
        return frozenset({self.default_group} | ({self.canary.group} if self.canary is not None else set()))

    def floor(self, group: str) -> int:
        """The workers a group keeps however idle: its min_workers while active, else none."""
        return self.groups[group].pool.min_workers if group in self.active_groups else 0


@dataclass(frozen=True, slots=True)
class RunAs:
    """The Unix user and group a tenant's workers run as (resolved when the config is loaded)."""

    user: str
    uid: int
    group: str
    gid: int
    home: str


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    resources: Resources
    quotas: Quotas
    apps: Mapping[str, App]
    run_as: RunAs | None = None  # None: no `user:`, its workers run as elasticd does (root)


@dataclass(frozen=True, slots=True)
class Config:
    server: Server
    tenants: Mapping[str, Tenant]
    source: str = "<string>"

    def apps(self) -> Iterator[tuple[Tenant, App]]:
        for tenant in self.tenants.values():
            for app in tenant.apps.values():
                yield tenant, app

    def groups(self) -> Iterator[tuple[Tenant, App, Group]]:
        for tenant, app in self.apps():
            for group in app.groups.values():
                yield tenant, app, group
