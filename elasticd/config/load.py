"""The sections of the configuration and its entry points: YAML text in, a validated Config out.

Validation is pure (text in, model or ``ConfigError`` out) and reports every problem of a file at once, each
naming its key path and line, e.g. ``tenants.acme.resources.cpu (line 14): "15O%" is not a percentage``.
Reload and ``--check`` go through the same function, so "valid" means one thing.
"""

from __future__ import annotations

import grp
import io
import os
import pwd
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError

from elasticd.config.capacity import capacity_block, nodes_list, registry_section
from elasticd.config.checks import check_document
from elasticd.config.forwarding import (
    FORWARDING_KEYS,
    check_trusted_users,
    trusted_proxies,
    trusted_proxy_users,
    underscored_headers,
)
from elasticd.config.include import (
    Included,
    ParsedFiles,
    Stamp,
    check_included,
    expand,
    glob_covers,
    owned_by_tenant,
    read_included,
)
from elasticd.config.isolation import isolation_section
from elasticd.config.model import (
    App,
    Canary,
    CgroupSettings,
    Config,
    Group,
    MetricsSettings,
    MonitorAuth,
    PoolSettings,
    QueueSettings,
    Quotas,
    Resources,
    RunAs,
    Server,
    Tenant,
    default_burst,
)
from elasticd.config.units import UnitError, parse_cpu, parse_size
from elasticd.config.walk import (
    ConfigError,
    ConfigIssue,
    Walk,
    absolute_path,
    address,
    duration,
    duration_or_zero,
    fraction,
    integer,
    join,
    kind,
    mode,
    percentage,
    positive_number,
    share,
    string,
)

__all__ = ["NAME_RE", "RESOURCE_FIELDS", "ResourceField", "load_config", "parse_config"]

# Tenant, app and group names become cgroup directory names: nothing may escape the base.
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")
_HOST_RE = re.compile(r"^(?=.{1,253}$)[a-z0-9*]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$")
_ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# --------------------------------------------------------------------------------------------- sections

_SERVER_KEYS = ("listen", "metrics_listen", "admin_socket", "admin_group", "runtime_dir", "cgroups",
                "sample_interval", "occupancy_interval", "request_timeout", "stop_timeout", "user_ttl",
                "hung_after", "move_timeout", "monitor", "registry", "agent_listen", "stop_drain", "tmp_dir",
                "tenant_config_dir", "state_dir", "metrics", *FORWARDING_KEYS)
_TENANT_KEYS = ("user", "group", "resources", "quotas", "apps", "isolation")
_RESOURCE_KEYS = ("cpu", "memory", "swap", "pids", "io_weight", "io_bandwidth")
_QUOTA_KEYS = ("max_concurrent_requests", "requests_per_second", "burst")
_APP_KEYS = ("domains", "root", "default_group", "canary", "groups")
_GROUP_KEYS = ("command", "python", "env", "concurrency", "pool", "capacity", "nodes", "queue")
_SPAWNED_ONLY = ("command", "python", "env", "pool")  # what a nodes: group (never spawned) has no use for
_POOL_KEYS = ("min_workers", "max_workers", "reception_threshold", "admission_threshold",
              "compaction_margin", "memory_limit", "drain_timeout", "idle_timeout", "cpu_held_at", "throttled_held_at",
              "memory_held_at", "pids_held_at", "max_package", "max_requests", "max_rss")


def _server(walk: Walk, node: Any, line: int | None) -> Server:
    m = walk.mapping(node, "server", line, _SERVER_KEYS)
    d = Server()
    cg = walk.mapping(m.get("cgroups"), "server.cgroups", walk.key_line(m, "cgroups"), ("mode", "path"))
    cgroups = CgroupSettings(
        mode=walk.value(cg, "mode", "server.cgroups", mode, "auto"),
        path=walk.value(cg, "path", "server.cgroups", absolute_path, None),
    )
    occupancy_interval = walk.value(m, "occupancy_interval", "server", duration, d.occupancy_interval)
    hung_after = walk.value(m, "hung_after", "server", duration, d.hung_after)
    # Three reports missed is the least evidence of silence; a shorter hung_after would kill workers whose
    # reports are merely late. Said, not silently raised: the operator asked for something that cannot hold.
    if hung_after < 3 * occupancy_interval - 1e-9:  # (3 * 200ms is 0.6000000000000001 in floats)
        where = "hung_after" if "hung_after" in m else "occupancy_interval"
        walk.error(f"server.{where}", walk.key_line(m, where) or line,
                   f"hung_after ({hung_after:g}s) must be at least 3 occupancy intervals "
                   f"({3 * occupancy_interval:g}s): a worker is called hung only after 3 missed reports")
    return Server(
        monitor=_monitor(walk, m),
        registry=registry_section(walk, m),
        agent_listen=walk.value(m, "agent_listen", "server", address, None),
        stop_drain=walk.value(m, "stop_drain", "server", duration_or_zero, 0.0),
        tmp_dir=walk.value(m, "tmp_dir", "server", absolute_path, d.tmp_dir),
        tenant_config_dir=walk.value(m, "tenant_config_dir", "server", _path, None),
        state_dir=walk.value(m, "state_dir", "server", absolute_path, d.state_dir),
        metrics=_metrics(walk, m),
        trusted_proxies=trusted_proxies(walk, m),
        trusted_proxy_users=trusted_proxy_users(walk, m),
        underscored_headers=walk.value(m, "underscored_headers", "server", underscored_headers,
                                       d.underscored_headers),
        listen=walk.value(m, "listen", "server", address, d.listen),
        metrics_listen=walk.value(m, "metrics_listen", "server", address, d.metrics_listen),
        admin_socket=walk.value(m, "admin_socket", "server", absolute_path, d.admin_socket),
        admin_group=walk.value(m, "admin_group", "server", string, None),
        runtime_dir=walk.value(m, "runtime_dir", "server", absolute_path, d.runtime_dir),
        cgroups=cgroups,
        sample_interval=walk.value(m, "sample_interval", "server", duration, d.sample_interval),
        occupancy_interval=occupancy_interval,
        request_timeout=walk.value(m, "request_timeout", "server", duration, d.request_timeout),
        stop_timeout=walk.value(m, "stop_timeout", "server", duration, d.stop_timeout),
        user_ttl=walk.value(m, "user_ttl", "server", duration, d.user_ttl),
        hung_after=hung_after,
        move_timeout=walk.value(m, "move_timeout", "server", duration, d.move_timeout),
    )


def _metrics(walk: Walk, server: dict[Any, Any]) -> MetricsSettings:
    m = walk.mapping(server.get("metrics"), "server.metrics", walk.key_line(server, "metrics"),
                     ("app_series", "window"))
    d = MetricsSettings()
    return MetricsSettings(app_series=walk.value(m, "app_series", "server.metrics", _app_series, d.app_series),
                           window=walk.value(m, "window", "server.metrics", duration, d.window))


def _app_series(value: Any) -> str:
    text = string(value)
    if text not in ("active", "all"):
        raise ValueError(f'"{text}" is not active or all')
    return text


def _path(value: Any) -> str:
    """A path, absolute or relative to the main file's directory (resolved in _assemble)."""
    text = string(value)
    if not text or "\0" in text:
        raise ValueError(f"{kind(value)} is not a path")
    return os.path.normpath(text)


def _monitor(walk: Walk, server: dict[Any, Any]) -> MonitorAuth | None:
    """``server.monitor: {user, password_file}``: both, or none (absent or null, as any key: no auth). An auth
    half given is refused, not taken for no auth."""
    if server.get("monitor") is None:
        return None
    line = walk.key_line(server, "monitor")
    m = walk.mapping(server["monitor"], "server.monitor", line, ("user", "password_file"))
    if not isinstance(server["monitor"], dict):
        return None
    user = walk.value(m, "user", "server.monitor", string, None)
    password_file = walk.value(m, "password_file", "server.monitor", absolute_path, None)
    for key, value in (("user", user), ("password_file", password_file)):
        if value is None and key not in m:
            walk.error(f"server.monitor.{key}", line, "missing: basic auth needs a user and a password_file")
    if user is not None and (not user or ":" in user or not user.isprintable()):
        walk.error("server.monitor.user", walk.key_line(m, "user"),
                   f'"{user}" cannot be a basic-auth user (not empty, printable, no ":")')
        return None
    return MonitorAuth(user, password_file) if user is not None and password_file is not None else None


def _nonzero_size(value: Any) -> int | None:
    return parse_size(value, allow_zero=False)


# Each tenant limit: its Resources attribute, where it sits under `resources:`, how its value is parsed, and its
# default. The config loader and the run-time limits API both validate through this one table.
@dataclass(frozen=True, slots=True)
class ResourceField:
    attr: str
    keys: tuple[str, ...]
    parse: Callable[[Any], Any]
    default: Any = None

    @property
    def name(self) -> str:
        return ".".join(self.keys)


RESOURCE_FIELDS: tuple[ResourceField, ...] = (
    ResourceField("cpu", ("cpu",), parse_cpu),
    ResourceField("memory", ("memory",), _nonzero_size),
    ResourceField("swap", ("swap",), parse_size, 0),
    ResourceField("pids", ("pids",), integer(1, allow_max=True)),
    ResourceField("io_weight", ("io_weight",), integer(1, 10000)),
    ResourceField("io_read", ("io_bandwidth", "read"), _nonzero_size),
    ResourceField("io_write", ("io_bandwidth", "write"), _nonzero_size),
)


def _resources(walk: Walk, node: Any, path: str, line: int | None) -> Resources:
    m = walk.mapping(node, path, line, _RESOURCE_KEYS)
    io = walk.mapping(m.get("io_bandwidth"), f"{path}.io_bandwidth", walk.key_line(m, "io_bandwidth"),
                      ("read", "write"))
    values = {}
    for f in RESOURCE_FIELDS:
        where, wpath = (io, f"{path}.io_bandwidth") if len(f.keys) == 2 else (m, path)
        values[f.attr] = walk.value(where, f.keys[-1], wpath, f.parse, f.default)
    return Resources(**values)


def _quotas(walk: Walk, node: Any, path: str, line: int | None) -> Quotas:
    m = walk.mapping(node, path, line, _QUOTA_KEYS)
    rps = walk.value(m, "requests_per_second", path, positive_number, None)
    burst = walk.value(m, "burst", path, integer(1), None)
    if burst is not None and rps is None:
        walk.error(f"{path}.burst", walk.key_line(m, "burst"), "needs requests_per_second beside it")
    if rps is not None and burst is None:
        burst = default_burst(rps)
    return Quotas(
        max_concurrent_requests=walk.value(m, "max_concurrent_requests", path, integer(1), None),
        requests_per_second=rps,
        burst=burst,
    )


def _pool(walk: Walk, node: Any, path: str, line: int | None) -> PoolSettings:
    m = walk.mapping(node, path, line, _POOL_KEYS)
    d = PoolSettings()
    # `max_workers: null` (or "max") is unbounded, as in seed 000; only an absent key takes the default.
    unbounded = "max_workers" in m and m["max_workers"] is None
    pool = PoolSettings(
        min_workers=walk.value(m, "min_workers", path, integer(0, 1000), d.min_workers),
        max_workers=None if unbounded else walk.value(m, "max_workers", path, integer(1, 1000, allow_max=True),
                                                      d.max_workers),
        reception_threshold=walk.value(m, "reception_threshold", path, fraction, d.reception_threshold),
        admission_threshold=walk.value(m, "admission_threshold", path, fraction, d.admission_threshold),
        compaction_margin=walk.value(m, "compaction_margin", path, positive_number, d.compaction_margin),
        memory_limit=walk.value(m, "memory_limit", path, lambda v: parse_size(v, allow_zero=False), None),
        drain_timeout=walk.value(m, "drain_timeout", path, duration, d.drain_timeout),
        idle_timeout=walk.value(m, "idle_timeout", path, duration, d.idle_timeout),
        cpu_held_at=walk.value(m, "cpu_held_at", path, share, d.cpu_held_at),
        throttled_held_at=walk.value(m, "throttled_held_at", path, share, d.throttled_held_at),
        memory_held_at=walk.value(m, "memory_held_at", path, share, d.memory_held_at),
        pids_held_at=walk.value(m, "pids_held_at", path, share, d.pids_held_at),
        max_package=walk.value(m, "max_package", path, _package_size, d.max_package),
        max_requests=walk.value(m, "max_requests", path, integer(1, 1_000_000_000), None),
        max_rss=walk.value(m, "max_rss", path, lambda v: parse_size(v, allow_zero=False), None),
    )
    if pool.max_workers is not None and pool.min_workers > pool.max_workers:
        walk.error(f"{path}.min_workers", walk.key_line(m, "min_workers") or line,
                   f"{pool.min_workers} is more than max_workers ({pool.max_workers})")
    return pool


def _queue(walk: Walk, node: Any, path: str, line: int | None) -> QueueSettings:
    m = walk.mapping(node, path, line, ("max", "timeout"))
    d = QueueSettings()
    return QueueSettings(max=walk.value(m, "max", path, integer(0, 1_000_000), d.max),
                         timeout=walk.value(m, "timeout", path, duration, d.timeout))


# The channel's bound on the bytes after one message (elasticd.frames.MAX_PAYLOAD, which the tests keep equal).
MAX_PACKAGE = 64 << 20


def _package_size(value: object) -> int:
    size = parse_size(value, allow_max=False)
    assert size is not None  # ("max" is refused above)
    if size > MAX_PACKAGE:
        raise UnitError(f"{size} bytes is over the channel's bound on one package ({MAX_PACKAGE} bytes, 64M)")
    return size


def _command(walk: Walk, node: Any, path: str, line: int | None) -> tuple[str, ...]:
    if not isinstance(node, list) or not node:
        walk.error(path, line, "must be a non-empty list of arguments (argv, never a shell string), "
                               f"not {kind(node) if node is not None else 'missing'}")
        return ()
    argv = []
    for i, item in enumerate(node):
        if isinstance(item, (dict, list)) or item is None or isinstance(item, bool):
            walk.error(f"{path}[{i}]", walk.item_line(node, i) or line,
                       f"{kind(item) if item is not None else 'null'} is not an argument string")
            continue
        text = str(item)
        if "\0" in text:
            walk.error(f"{path}[{i}]", walk.item_line(node, i) or line, "an argument cannot hold a NUL byte")
        argv.append(text)
    return tuple(argv)


def _env(walk: Walk, node: Any, path: str, line: int | None) -> dict[str, str]:
    m = walk.mapping(node, path, line, None)
    env = {}
    for key, value in m.items():
        kpath, kline = join(path, key), walk.key_line(m, key)
        if not isinstance(key, str) or not _ENV_NAME_RE.match(key):
            walk.error(kpath, kline, f"{kind(key)} is not an environment variable name")
        elif key.startswith("ELASTIC_"):
            walk.error(kpath, kline, "ELASTIC_* variables are set by elasticd for every worker")
        elif isinstance(value, (dict, list)) or value is None:
            walk.error(kpath, kline, "must be a string or a number")
        elif "\0" in str(value):
            walk.error(kpath, kline, "a value cannot hold a NUL byte")
        else:
            env[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


def _group(walk: Walk, name: str, node: Any, path: str, line: int | None) -> Group:
    m = walk.mapping(node, path, line, _GROUP_KEYS)
    nodes = "nodes" in m
    capacity = capacity_block(walk, m.get("capacity"), f"{path}.capacity", walk.key_line(m, "capacity"),
                              for_node=nodes)
    if nodes:
        for key in _SPAWNED_ONLY:
            if key in m:
                walk.error(f"{path}.{key}", walk.key_line(m, key),
                           "a group is either command: (workers elasticd starts) or nodes: (HTTP upstreams it "
                           f"does not start), and {key} is for a command: group")
        return Group(name=name, command=(),
                     concurrency=walk.value(m, "concurrency", path, integer(1, 100000), 8),
                     capacity=capacity,
                     queue=_queue(walk, m.get("queue"), f"{path}.queue", walk.key_line(m, "queue")),
                     nodes=nodes_list(walk, m.get("nodes"), f"{path}.nodes", walk.key_line(m, "nodes") or line,
                                      capacity))
    return Group(
        capacity=capacity,
        name=name,
        command=_command(walk, m.get("command"), f"{path}.command", walk.key_line(m, "command") or line),
        python=walk.value(m, "python", path, absolute_path, None),
        env=_env(walk, m.get("env"), f"{path}.env", walk.key_line(m, "env")),
        concurrency=walk.value(m, "concurrency", path, integer(1, 100000), 8),
        pool=_pool(walk, m.get("pool"), f"{path}.pool", walk.key_line(m, "pool")),
        queue=_queue(walk, m.get("queue"), f"{path}.queue", walk.key_line(m, "queue")),
    )


def _named(walk: Walk, node: dict[Any, Any], path: str, what: str) -> Iterator[tuple[str, Any, str, int | None]]:
    for key, child in node.items():
        line = walk.key_line(node, key)
        kpath = join(path, key)
        if not isinstance(key, str) or not NAME_RE.match(key):
            walk.error(kpath, line, f"{kind(key)} is not a valid {what} name "
                                    "(lowercase letters, digits, '_' and '-', starting with a letter or digit, "
                                    "at most 63 characters)")
            continue
        yield key, child, kpath, line


def _app(walk: Walk, name: str, node: Any, path: str, line: int | None) -> App:
    m = walk.mapping(node, path, line, _APP_KEYS)
    domains: list[str] = []
    dnode = m.get("domains")
    dline = walk.key_line(m, "domains") or line
    if not isinstance(dnode, list) or not dnode:
        walk.error(f"{path}.domains", dline, "must be a non-empty list of host names")
    else:
        for i, item in enumerate(dnode):
            host = str(item).strip().lower() if isinstance(item, str) else None
            if host is None or not _HOST_RE.match(host):
                walk.error(f"{path}.domains[{i}]", walk.item_line(dnode, i) or dline,
                           f"{kind(item)} is not a host name")
            else:
                domains.append(host)
    root = walk.value(m, "root", path, absolute_path, "")
    if "root" not in m:
        walk.error(f"{path}.root", line, "is required (the application's directory)")
    groups: dict[str, Group] = {}
    gnode = walk.mapping(m.get("groups"), f"{path}.groups", walk.key_line(m, "groups") or line, None)
    if not gnode:
        walk.error(f"{path}.groups", walk.key_line(m, "groups") or line, "must define at least one group")
    for gname, child, gpath, gline in _named(walk, gnode, f"{path}.groups", "group"):
        groups[gname] = _group(walk, gname, child, gpath, gline)
    default = walk.value(m, "default_group", path, string, None)
    if default is None:
        default = next(iter(groups), "")
    elif groups and default not in groups:
        walk.error(f"{path}.default_group", walk.key_line(m, "default_group"),
                   f'"{default}" is not one of its groups ({", ".join(groups)})')
    canary = _canary(walk, m, path, groups, default)
    return App(name=name, domains=tuple(domains), root=root, default_group=default, groups=groups, canary=canary)


def _canary(walk: Walk, app: dict[Any, Any], path: str, groups: dict[str, Group], default: str) -> Canary | None:
    """``canary: {group, share}``: another of the app's groups, and the share of new users it gets."""
    if app.get("canary") is None:
        return None
    where = f"{path}.canary"
    line = walk.key_line(app, "canary")
    m = walk.mapping(app["canary"], where, line, ("group", "share"))
    if not isinstance(app["canary"], dict):
        return None
    group = walk.value(m, "group", where, string, None)
    share = walk.value(m, "share", where, percentage, None)
    for key, value in (("group", group), ("share", share)):
        if value is None and key not in m:
            walk.error(f"{where}.{key}", line, "missing: a canary needs a group and a share")
    if group is not None and groups and group not in groups:
        walk.error(f"{where}.group", walk.key_line(m, "group") or line,
                   f'"{group}" is not one of its groups ({", ".join(groups)})')
        return None
    if group is not None and group == default:
        walk.error(f"{where}.group", walk.key_line(m, "group") or line,
                   f'"{group}" is the default_group: a canary is another group')
        return None
    return Canary(group, share) if group is not None and share is not None else None


def _tenant(walk: Walk, name: str, node: Any, path: str, line: int | None) -> Tenant:
    m = walk.mapping(node, path, line, _TENANT_KEYS)
    apps: dict[str, App] = {}
    anode = walk.mapping(m.get("apps"), f"{path}.apps", walk.key_line(m, "apps"), None)
    for aname, child, apath, aline in _named(walk, anode, f"{path}.apps", "app"):
        apps[aname] = _app(walk, aname, child, apath, aline)
    run_as = _run_as(walk, m, path)
    return Tenant(
        name=name,
        resources=_resources(walk, m.get("resources"), f"{path}.resources", walk.key_line(m, "resources")),
        quotas=_quotas(walk, m.get("quotas"), f"{path}.quotas", walk.key_line(m, "quotas")),
        apps=apps,
        run_as=run_as,
        isolation=isolation_section(walk, m, path, run_as, apps),
    )


def _run_as(walk: Walk, m: dict[Any, Any], path: str) -> RunAs | None:
    """``user`` (a name or uid) and ``group`` (default: the user's primary group), looked up in the system's
    user database: a name that does not resolve now is a worker that could never start. Root is refused unless
    it is written as ``user: root``: a tenant that runs as root can undo its own limits, so it must be meant."""
    if "user" not in m or m["user"] is None:
        if "group" in m and m["group"] is not None:
            walk.error(f"{path}.group", walk.key_line(m, "group"), "needs user beside it")
        return None
    raw, line = m["user"], walk.key_line(m, "user")
    entry = _lookup(raw, pwd.getpwuid, pwd.getpwnam)
    if entry is None:
        walk.error(f"{path}.user", line, f"{kind(raw)} is not a user on this host (see getent passwd)")
        return None
    if entry.pw_uid == 0 and raw != "root":
        walk.error(f"{path}.user", line, f"{kind(raw)} is root: write user: root if the tenant is meant to run "
                                         "as root (its workers could then undo their own limits)")
        return None
    gid = entry.pw_gid
    try:
        group_name = grp.getgrgid(gid).gr_name
    except KeyError:  # a primary gid with no name in the group database: the number is all there is
        group_name = str(gid)
    if "group" in m and m["group"] is not None:
        graw = m["group"]
        g = _lookup(graw, grp.getgrgid, grp.getgrnam)
        if g is None:
            walk.error(f"{path}.group", walk.key_line(m, "group"),
                       f"{kind(graw)} is not a group on this host (see getent group)")
            return None
        group_name, gid = g.gr_name, g.gr_gid
    return RunAs(entry.pw_name, entry.pw_uid, group_name, gid, entry.pw_dir)


def _lookup(raw: Any, by_id: Callable[[int], Any], by_name: Callable[[str], Any]) -> Any:
    """A user or group database entry by number or name; None when there is none."""
    try:
        return by_id(raw) if isinstance(raw, int) and not isinstance(raw, bool) else by_name(str(raw))
    except (KeyError, OverflowError):
        return None


# --------------------------------------------------------------------------------------------- entry points

_TOP_KEYS = ("server", "tenants", "include")
_INCLUDED_TOP_KEYS = ("tenants",)


def parse_config(text: str, source: str = "<string>", cache: ParsedFiles | None = None,
                 overlay: Mapping[str, str | None] | None = None) -> Config:
    """Validate YAML text (the main file's) into a Config, or raise ConfigError listing every problem found, in it
    and in the files it includes.

    Two loaders, one walk: the safe loader (libyaml's C scanner, ruamel.yaml.clib, where installed) reads a
    file that is valid in a tenth of the time the round-trip loader takes — a thousand apps is a second of pure
    Python scanning otherwise, paid at every reload. It knows no line numbers, so a configuration with any problem
    is read again by the round-trip loader and walked again, and every error names its file and line. Both give
    the walk the same plain mappings, lists and scalars.

    ``cache``: the included files parsed last time (include.py); an unchanged file's tenants are taken as built
    then, so a reload of 2,000 tenant files parses the one that changed.

    ``overlay``: included files as they would be, path → text (None: as if removed), to validate a change before
    it is written (elasticctl tenant set|remove); the cache is read for the other files but not updated."""
    try:
        return _assemble(text, source, cache, lines=False, overlay=overlay or {})
    except _NeedLines:
        return _assemble(text, source, None, lines=True, overlay=overlay or {})


def load_config(path: str | Path, cache: ParsedFiles | None = None,
                overlay: Mapping[str, str | None] | None = None) -> Config:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([ConfigIssue("", None, f"cannot read {path}: {exc}")], str(path)) from None
    return parse_config(text, str(path), cache, overlay)


class _NeedLines(Exception):
    """The fast pass found a problem: the configuration is read again with line numbers, to say where."""


_SAFE = YAML(typ="safe")


def _document(text: str, lines: bool, file: str | None) -> Any:
    if not lines:
        try:
            return _SAFE.load(io.StringIO(text))
        except Exception:  # said by the round-trip loader, with its line
            raise _NeedLines() from None
    yaml = YAML(typ="rt")
    try:
        return yaml.load(io.StringIO(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        raise _Unreadable(ConfigIssue("", line, f"not valid YAML: {exc.problem or exc.context}", file)) from None
    except Exception as exc:  # ruamel raises a few unmarked errors (e.g. on bad tags)
        raise _Unreadable(ConfigIssue("", None, f"not valid YAML: {exc}", file)) from None


class _Unreadable(Exception):
    def __init__(self, issue: ConfigIssue) -> None:
        super().__init__(str(issue))
        self.issue = issue


class _TenantNodes(dict[str, Any]):
    """``tenants:`` gathered from every file: each tenant's own node, and the line of its key in its own file
    (what ``Walk.key_line`` reads off ruamel's nodes)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: dict[str, int | None] = {}
        self.lc = self

    def key(self, name: str) -> tuple[int, int]:
        line = self.lines.get(name)
        if line is None:
            raise KeyError(name)
        return line - 1, 0


class _NoLines(dict[Any, Any]):
    """Any node of any document, in the fast pass, where nothing knows its line (``Walk.key_line`` says None)."""

    def __getitem__(self, _key: object) -> _NoLines:
        return self


def _matches(globs: list[str], overlay: Mapping[str, str | None]) -> list[tuple[str, str]]:
    """(glob, file) to read: what the globs match on disk, as ``overlay`` would change it."""
    matched = [(pattern, path) for pattern, path in expand(globs) if path not in overlay or overlay[path] is not None]
    on_disk = {path for _pattern, path in matched}
    for path, text in overlay.items():
        pattern = next((g for g in globs if glob_covers([g], path)), None)
        if text is not None and path not in on_disk and pattern is not None:
            matched.append((pattern, path))
    return matched


def _assemble(text: str, source: str, cache: ParsedFiles | None, *, lines: bool,
              overlay: Mapping[str, str | None]) -> Config:
    walk = Walk()
    try:
        doc = _document(text, lines, None)
    except _Unreadable as exc:
        raise ConfigError([exc.issue], source) from None
    top = walk.mapping(doc if doc is not None else {}, "", 1, _TOP_KEYS)
    server = _server(walk, top.get("server"), walk.key_line(top, "server"))
    globs = _include_globs(walk, top, source)
    if server.tenant_config_dir is not None and not os.path.isabs(server.tenant_config_dir):
        server = replace(server, tenant_config_dir=os.path.join(_base(source), server.tenant_config_dir))
    tenants: dict[str, Tenant] = {}
    files: dict[str, str] = {}
    nodes = _TenantNodes()
    tnode = walk.mapping(top.get("tenants"), "tenants", walk.key_line(top, "tenants"), None)
    for tname, child, tpath, tline in _named(walk, tnode, "tenants", "tenant"):
        tenants[tname] = _tenant(walk, tname, child, tpath, tline)
        files[tname], nodes[tname], nodes.lines[tname] = source, child, tline
    kept: dict[str, tuple[Stamp, Mapping[str, Any]]] = {}
    taken: list[Included] = []
    folders: dict[str, os.stat_result] = {}
    unchanged: set[str] = set()  # the tenants of files taken from the cache
    for pattern, path in _matches(globs, overlay):
        if path in overlay:
            body = overlay[path] or ""
            included = Included(path, Stamp(-1, -1, len(body), -1, -1), body)  # (no cache entry has such a stamp)
        else:
            included = check_included(pattern, path, folders)  # (a look: an unchanged file is not read)
        built = cache.get(included) if cache is not None and included.problem is None else None
        if built is not None:
            unchanged.update(built)
        if built is None and included.text is None and included.problem is None:
            included = read_included(pattern, path, included)
        if included.problem is not None or included.stamp is None:
            walk.error("include", walk.key_line(top, "include"), f"{path} {included.problem}")
            continue
        if built is None:
            built = _included_tenants(walk, included.text or "", path, lines)
            if built is None:
                continue
        kept[path] = (included.stamp, built)
        taken.append(included)
        for tname, (tenant, tline, child) in built.items():
            if tname in tenants:
                if not lines:
                    raise _NeedLines()
                first = f"{files[tname]} (line {nodes.lines[tname]})"
                walk.issues.append(ConfigIssue(f"tenants.{tname}", tline,
                                               f"is defined again here: {first} defines it already", path))
                continue
            tenants[tname] = tenant
            files[tname], nodes[tname], nodes.lines[tname] = path, child, tline
    _check_tenant_config_dir(walk, top, server, globs)
    tenant_uids = {t.run_as.uid: t.run_as.user for t in tenants.values() if t.run_as is not None and t.run_as.uid}
    for included in taken:
        if (why := owned_by_tenant(included, tenant_uids)) is not None:
            walk.error("include", walk.key_line(top, "include"), f"{included.path} {why}")
    check_trusted_users(walk, server.trusted_proxy_users, tenants, top)
    if not walk.issues:
        check_document(walk, server, tenants, {"tenants": nodes} if lines else _NoLines(), unchanged)
    if walk.issues:
        if not lines:
            raise _NeedLines()
        # check_document's issues name a tenant's key path: the file is that tenant's
        issues = [_in_file(issue, files, source) for issue in walk.issues]
        raise ConfigError(issues, source)
    if cache is not None and not overlay:
        cache.keep(kept)
    return Config(server=server, tenants=tenants, source=source, includes=tuple(globs),
                  tenant_files={name: file for name, file in files.items() if file != source})


def _included_tenants(walk: Walk, text: str, path: str,
                      lines: bool) -> dict[str, tuple[Tenant, int | None, Any]] | None:
    """An included file's tenants (tenant, the line of its key, its node), its issues into ``walk`` naming it."""
    here = Walk(file=path)
    try:
        doc = _document(text, lines, path)
    except _Unreadable as exc:
        walk.issues.append(exc.issue)
        return None
    top = here.mapping(doc if doc is not None else {}, "", 1, _INCLUDED_TOP_KEYS)
    tnode = here.mapping(top.get("tenants"), "tenants", here.key_line(top, "tenants"), None)
    built = {}
    for tname, child, tpath, tline in _named(here, tnode, "tenants", "tenant"):
        built[tname] = (_tenant(here, tname, child, tpath, tline), tline, child if lines else None)
    if here.issues:
        if not lines:
            raise _NeedLines()
        walk.issues.extend(here.issues)
        return None
    return built


def _in_file(issue: ConfigIssue, files: Mapping[str, str], source: str) -> ConfigIssue:
    if issue.file is not None or not issue.path.startswith("tenants."):
        return issue
    file = files.get(issue.path.split(".")[1], source)
    return issue if file == source else ConfigIssue(issue.path, issue.line, issue.message, file)


def _base(source: str) -> str:
    """The directory relative paths of the main file are relative to."""
    return os.path.dirname(os.path.abspath(source)) if source != "<string>" else os.getcwd()


def _include_globs(walk: Walk, top: dict[Any, Any], source: str) -> list[str]:
    """``include:`` a glob or a list of them; relative ones are relative to the main file's directory."""
    node = top.get("include")
    if node is None:
        return []
    line = walk.key_line(top, "include")
    items = [node] if isinstance(node, str) else node
    if not isinstance(items, list):
        walk.error("include", line, f"must be a list of file globs (e.g. [/etc/elastic.d/*.yaml]), not {kind(node)}")
        return []
    base = _base(source)
    globs = []
    for i, item in enumerate(items):
        if not isinstance(item, str) or not item.strip() or "\0" in item:
            walk.error(f"include[{i}]", walk.item_line(items, i) or line, f"{kind(item)} is not a file glob")
            continue
        pattern = os.path.normpath(os.path.join(base, item))
        if pattern == os.path.normpath(os.path.abspath(source)):
            walk.error(f"include[{i}]", walk.item_line(items, i) or line, "includes the main file itself")
            continue
        globs.append(pattern)
    return globs


def _check_tenant_config_dir(walk: Walk, top: dict[Any, Any], server: Server, globs: list[str]) -> None:
    directory = server.tenant_config_dir
    if directory is None:
        return
    if not glob_covers(globs, os.path.join(directory, "tenant.yaml")):
        node = top.get("server")
        walk.error("server.tenant_config_dir", walk.key_line(node, "tenant_config_dir"),
                   f"{directory} is not read: include: must cover {directory}/<tenant>.yaml "
                   f"(e.g. include: [{directory}/*.yaml]), or a tenant written there would never load")
