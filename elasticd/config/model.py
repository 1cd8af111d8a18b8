"""The configuration model: immutable data, what every part of elasticd reads.

``config/load.py`` builds it from YAML (and validates it); nothing else constructs it outside tests.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["PROBE_KINDS", "Address", "App", "Canary", "Capacity", "CgroupSettings", "Config", "Group", "Isolation",
           "MonitorAuth",
           "Node", "PoolSettings", "Quotas", "Registry", "Resources", "RunAs", "Server", "Tenant", "default_burst",
           "node_id"]


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
class MetricsSettings:
    """``server.metrics``: which apps' own series /metrics shows (accounting/activity.py)."""

    app_series: str = "active"  # active: apps active within the window; all: every app's
    window: float = 900.0


@dataclass(frozen=True, slots=True)
class MonitorAuth:
    """``server.monitor``: basic auth for the monitor page (it shows user names). The password is the first line
    of ``password_file``, read by the daemon at start and at each reload (monitor/auth.py)."""

    user: str
    password_file: str


@dataclass(frozen=True, slots=True)
class Registry:
    """``server.registry``: publish ``GET /v1/registry`` on metrics_listen, signed with the secret in
    ``secret_file`` (at least 32 bytes, read at start and at each reload); ``key_file``: a bearer key readers
    must send; ``instance``: the name the snapshot carries (default: the host name)."""

    secret_file: str
    ttl: float = 10.0
    key_file: str | None = None
    instance: str | None = None


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
    registry: Registry | None = None  # None: no /v1/registry
    agent_listen: Address | None = None  # HAProxy's agent-check answered here (elasticd/agent/); None: off
    stop_drain: float = 0.0  # at a stop, answer the agent `drain` this long first, still serving (0: off)
    # Where each isolated tenant's private /tmp and /var/tmp live on the host (<tmp_dir>/<tenant>/tmp, .../var-tmp).
    tmp_dir: str = "/var/tmp/elasticd"
    # Where elasticd writes a tenant's own file (elasticctl tenant add|set, limit --persist of a tenant defined
    # there): <tenant_config_dir>/<tenant>.yaml, which an include glob must cover. None: tenants are not managed.
    tenant_config_dir: str | None = None
    # elasticd's own files that outlive a reboot: the backups and lock files of the tenant files it edits.
    state_dir: str = "/var/lib/elasticd"
    metrics: MetricsSettings = MetricsSettings()
    # Who may state where a request came from (X-Forwarded-*, Forwarded): proxies on other hosts by network (CIDR,
    # normalised), a proxy on this host by its user ((name, uid)); nobody by default (config/forwarding.py).
    trusted_proxies: tuple[str, ...] = ()
    trusted_proxy_users: tuple[tuple[str, int], ...] = ()
    underscored_headers: str = "drop"  # request header names with "_": drop (as nginx) or keep


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
    # The most bytes one user's package (its state, carried by a live move) may have; a bigger one is refused and the
    # move aborted, the user left where it was with its state. At most the channel's frame bound (MAX_PACKAGE).
    max_package: int = 16 << 20
    # A scale-up is held (not made) when the tenant's cgroup could give a new worker nothing: its CPU usage at
    # this share of its cpu.max, or throttled in this share of its periods; memory.current plus one more
    # worker's RSS over this share of memory.max; pids.current plus one more worker's over this share of pids.max.
    cpu_held_at: float = 0.9
    throttled_held_at: float = 0.5
    memory_held_at: float = 0.9
    pids_held_at: float = 0.9
    # Recycling (pool/recycling.py): a worker is replaced — a new one first, its users moved live, its open work
    # drained — once its process has served ``max_requests`` (plus a jitter of up to a tenth, fixed per worker, so a
    # group's workers do not all go at once) or its RSS passed ``max_rss``. None: never.
    max_requests: int | None = None
    max_rss: int | None = None


# The kinds of capacity probe (seed 001). ``inflight`` (also ``none``, or no block) is no probe object at all:
# admission reads the open-request count. ``ratelimit`` is passive: a 429 answer with Retry-After is a back-off.
PROBE_KINDS = ("inflight", "none", "prometheus", "registry", "custom", "ratelimit")


@dataclass(frozen=True, slots=True)
class Capacity:
    """A ``capacity:`` block: how a worker's or a node's own capacity is read (``probes/``).

    ``interval``: how often the *source* is polled (the probe's own timer is this times the number of probes
    polling the same source); ``max_age``: how long a reading is believed (0: until replaced); ``limit``: the
    most it takes (default: the group's concurrency); ``wait``: how long a sticky user's request waits for room
    before it is answered 503."""

    probe: str = "inflight"  # one of PROBE_KINDS, ``none`` read as ``inflight``
    interval: float = 2.0
    max_age: float = 5.0
    limit: int | None = None
    wait: float = 1.0
    path: str = "/metrics"  # prometheus: on the worker's own socket (or the node's URL)
    url: str | None = None  # prometheus or registry: a URL of its own (a node's metrics on another port)
    running: tuple[str, ...] = ()  # prometheus: metric names (alternatives); () = the seed's defaults
    waiting: tuple[str, ...] = ()
    secret_file: str | None = None  # registry: the publisher's secret
    key_file: str | None = None  # registry: the bearer key the publisher asks readers for
    app: str | None = None  # registry: "tenant/app" in the snapshot (default: this group's own)
    max_skew: float = 5.0  # registry: a snapshot from further in the future than this is refused
    cls: str | None = None  # custom: "module:Class"
    block: Mapping[str, object] = field(default_factory=dict)  # the block verbatim (a custom class gets it)

    @property
    def probed(self) -> bool:
        """A probe object polls for it (not the open-request count, not the passive back-off alone)."""
        return self.probe in ("prometheus", "registry", "custom")


@dataclass(frozen=True, slots=True)
class Node:
    """An HTTP upstream elasticd does not start (another host's front, an inference server): routed, sticky
    and admitted like a worker, never spawned. ``id`` is ``tenant.app.group@name``."""

    name: str
    host: str
    port: int
    url: str
    capacity: Capacity | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """A group's ``queue: {max, timeout}``: requests wait in the front while every routable worker of the group has
    as many in flight as its ``concurrency`` — at most ``max`` of them at once (those waiting for a worker that is
    coming count too), each at most ``timeout``; past either, 503 with Retry-After. Passenger's
    ``max_request_queue_size`` is 100 too; 5 s is long for a user to wait for a page and short enough that an
    overload shows as a fast, honest 503 (the burst scale-up has started a worker well before)."""

    max: int = 100
    timeout: float = 5.0


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    command: tuple[str, ...]
    python: str | None = None  # None: elasticd's own interpreter
    env: Mapping[str, str] = field(default_factory=dict)
    concurrency: int = 8
    pool: PoolSettings = PoolSettings()
    capacity: Capacity | None = None  # each of its workers' capacity probe (None: the open-request count)
    nodes: tuple[Node, ...] = ()  # instead of a command: upstreams elasticd does not start
    queue: QueueSettings = QueueSettings()

    @property
    def spawned(self) -> bool:
        """Its workers are processes elasticd starts (a ``command:`` group), not ``nodes:``."""
        return not self.nodes


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
class Isolation:
    """``tenants.<t>.isolation``: its workers' view of the host (a mount and pid namespace of their own, made by
    bubblewrap: ``supervisor/sandbox.py``). ``writable``: extra paths bound read-write (inside the tenant's roots
    or its user's home); ``read_only``: extra paths bound read-only (a shared runtime, a venv outside the roots);
    ``home``: the user's home, bound read-write, when it is a directory the user owns (decided at load)."""

    writable: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    home: str | None = None


@dataclass(frozen=True, slots=True)
class Tenant:
    name: str
    resources: Resources
    quotas: Quotas
    apps: Mapping[str, App]
    run_as: RunAs | None = None  # None: no `user:`, its workers run as elasticd does (root)
    isolation: Isolation | None = None  # None: its workers see the host as elasticd does (no `user:`, or turned off)


@dataclass(frozen=True, slots=True)
class Config:
    server: Server
    tenants: Mapping[str, Tenant]
    source: str = "<string>"  # the main file
    # The include globs, absolute (the main file's top-level include:), and the file that defines each tenant (the
    # main file's, or an included one's): where its errors are said and where limit --persist writes.
    includes: tuple[str, ...] = ()
    tenant_files: Mapping[str, str] = field(default_factory=dict)

    def file_of(self, tenant: str) -> str:
        return self.tenant_files.get(tenant, self.source)

    def apps(self) -> Iterator[tuple[Tenant, App]]:
        for tenant in self.tenants.values():
            for app in tenant.apps.values():
                yield tenant, app

    def groups(self) -> Iterator[tuple[Tenant, App, Group]]:
        for tenant, app in self.apps():
            for group in app.groups.values():
                yield tenant, app, group

    def spawned_groups(self) -> Iterator[tuple[Tenant, App, Group]]:
        """The groups whose workers elasticd starts (not the ``nodes:`` ones)."""
        return ((t, a, g) for t, a, g in self.groups() if g.spawned)


def node_id(tenant: str, app: str, group: str, name: str) -> str:
    return f"{tenant}.{app}.{group}@{name}"
