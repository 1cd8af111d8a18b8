"""Checks across the whole document, made once every section parsed: a domain routed twice, a worker socket path
too long for sun_path, an app root another user could write into (read from the disk as it is now), an isolated
tenant's view that would hold another tenant's root or elasticd's own runtime directory, a program the view does
not show (config/programs.py)."""

from __future__ import annotations

import bisect
import os
import stat
from collections.abc import Collection, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

from elasticd.config.isolation import inside
from elasticd.config.model import Server, Tenant
from elasticd.config.programs import check_programs
from elasticd.config.walk import Walk
from elasticd.listener_guard.own import bound_here, points_at, this_hosts_names

__all__ = ["check_document", "root_refusal"]


def check_document(walk: Walk, server: Server, tenants: Mapping[str, Tenant], top: dict[Any, Any],
                   unchanged: Collection[str] = ()) -> None:
    """``unchanged``: tenants taken as they were from an unchanged file (config/include.py): their app roots are not
    looked at on disk again. A reload is the operator's (or a panel's) change of other tenants; that one tenant's
    chmod of its own root (a hostile tenant owns it) refused every reload of the host was a way for it to stop the
    others' changes. Such a root is refused when its own tenant's file changes, and at the next start."""
    _check_domains(walk, tenants, top)
    _check_socket_paths(walk, server, tenants, top)
    _check_roots(walk, {name: t for name, t in tenants.items() if name not in unchanged} if unchanged else tenants,
                 top, others_of=tenants)
    _check_views(walk, server, tenants, top)
    check_programs(walk, server, tenants, top, unchanged)
    _check_own_listeners(walk, server, tenants, top)


def _check_own_listeners(walk: Walk, server: Server, tenants: Mapping[str, Tenant], root: dict[Any, Any]) -> None:
    """No ``nodes:`` URL nor capacity probe URL of a tenant's may point at elasticd's own listeners: elasticd would
    connect to itself as root, which its listener guard serves, and the answer (every tenant's metrics) would be the
    tenant's."""
    listeners = [a for a in (server.metrics_listen, server.agent_listen) if a is not None]
    named: list[tuple[str, int, str, list[str | int]]] = []  # (host, port, the key as said, the way to its node)
    for tenant in tenants.values():
        for app in tenant.apps.values():
            for group in app.groups.values():
                way: list[str | int] = ["tenants", tenant.name, "apps", app.name, "groups", group.name]
                here = f"tenants.{tenant.name}.apps.{app.name}.groups.{group.name}"
                if group.capacity is not None and group.capacity.url is not None:
                    named.extend(_url_at(group.capacity.url, f"{here}.capacity", [*way, "capacity"]))
                for index, upstream in enumerate(group.nodes):
                    named.append((upstream.host, upstream.port, f"{here}.nodes[{index}]", [*way, "nodes", index]))
                    if upstream.capacity is not None and upstream.capacity.url is not None:
                        named.extend(_url_at(upstream.capacity.url, f"{here}.nodes[{index}].capacity",
                                             [*way, "nodes", index, "capacity"]))
    if not named:
        return
    names = this_hosts_names()
    addresses = {host for host, _port, _where, _way in named if bound_here(host)}  # (literal addresses only)
    for host, port, where, way in named:
        listener = points_at(host, port, listeners, addresses, names)
        if listener is None:
            continue
        holder: Any = root
        for step in way:
            holder = holder[step]
        which = "metrics_listen" if listener == server.metrics_listen else "agent_listen"
        walk.error(f"{where}.url", Walk.key_line(holder, "url"), f"points at elasticd's own {which} ({listener}): "
                   "elasticd would ask itself, and answer the tenant with what that listener keeps from every tenant")


def _url_at(url: str, where: str, way: list[str | int]) -> list[tuple[str, int, str, list[str | int]]]:
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return []
    return [(parts.hostname or "", port, where, way)]


def _check_domains(walk: Walk, tenants: Mapping[str, Tenant], root: dict[Any, Any]) -> None:
    owner: dict[str, str] = {}
    for tenant in tenants.values():
        for app in tenant.apps.values():
            for domain in app.domains:
                here = f"tenants.{tenant.name}.apps.{app.name}"
                if domain in owner:
                    node = root["tenants"][tenant.name]["apps"][app.name]
                    walk.error(f"{here}.domains", Walk.key_line(node, "domains"),
                               f'"{domain}" is already routed to {owner[domain]}')
                else:
                    owner[domain] = here


# A Unix socket path is limited to 107 bytes (sun_path); a worker's is <runtime_dir>/workers/<tenant>/<app>.<group>.N
# .sock, its tenant's channel <runtime_dir>/workers/<tenant>/channel.sock. Refused here, at load, rather than as a
# worker that can never bind or a channel elasticd cannot listen on.
_SUN_PATH_MAX = 107
_WORKER_NUMBER_ROOM = 6


def _check_socket_paths(walk: Walk, server: Server, tenants: Mapping[str, Tenant], root: dict[Any, Any]) -> None:
    for tenant in tenants.values():
        channel = f"{server.runtime_dir}/workers/{tenant.name}/channel.sock"  # (supervisor.spawn.channel_path)
        if len(channel.encode()) > _SUN_PATH_MAX:
            walk.error(f"tenants.{tenant.name}", Walk.key_line(root["tenants"], tenant.name),
                       f"its channel socket {channel} would be {len(channel.encode())} bytes, over the "
                       f"{_SUN_PATH_MAX} a Unix socket allows: shorten the tenant's name or the runtime_dir")
            continue
        for app in tenant.apps.values():
            for group in app.groups.values():
                if not group.spawned:
                    continue  # (a nodes: group has no worker, nor socket, of its own)
                path = f"{server.runtime_dir}/workers/{tenant.name}/{app.name}.{group.name}..sock"
                length = len(path.encode()) + _WORKER_NUMBER_ROOM
                if length > _SUN_PATH_MAX:
                    node = root["tenants"][tenant.name]["apps"][app.name]["groups"]
                    walk.error(f"tenants.{tenant.name}.apps.{app.name}.groups.{group.name}",
                               Walk.key_line(node, group.name),
                               f"its workers' socket paths under server.runtime_dir would be {length} bytes, over "
                               f"the {_SUN_PATH_MAX} a Unix socket allows: shorten the names or the runtime_dir")


def root_refusal(root: str, st: os.stat_result, tenant: Tenant, others: Mapping[int, str]) -> str | None:
    """Why an app's ``root`` is refused, from its stat (None: it is fine). Anyone who can write into a tenant's
    code can run code as that tenant: refused when everyone may write it, when its group may (unless that is
    the tenant's own group), or when it belongs to another tenant's user (``others``: uid → tenant)."""
    mode = stat.S_IMODE(st.st_mode)
    own_gid = tenant.run_as.gid if tenant.run_as is not None else 0
    what = f"{root} (owner uid {st.st_uid}, group gid {st.st_gid}, mode {mode:04o})"
    if mode & stat.S_IWOTH:
        return f"{what} is writable by everyone: any user of the host could run code as tenant {tenant.name}"
    if st.st_uid in others and st.st_uid != (tenant.run_as.uid if tenant.run_as else 0):
        return f"{what} belongs to the user of tenant {others[st.st_uid]}, who could run code as {tenant.name}"
    if mode & stat.S_IWGRP and st.st_gid != own_gid:
        return f"{what} is writable by its group, which is not tenant {tenant.name}'s own"
    return None


def _check_roots(walk: Walk, tenants: Mapping[str, Tenant], root: dict[Any, Any],
                 others_of: Mapping[str, Tenant] | None = None) -> None:
    """Each app's root as it is on disk now (a root that does not exist yet is the worker's concern: it runs
    in / with a warning). ``others_of``: every tenant, whose users may not own another's root."""
    everyone = others_of if others_of is not None else tenants
    others = {t.run_as.uid: t.name for t in everyone.values() if t.run_as is not None and t.run_as.uid != 0}
    for tenant in tenants.values():
        for app in tenant.apps.values():
            try:
                st = os.stat(app.root)
            except OSError:
                continue
            # (all of them: root_refusal never refuses a root owned by the tenant's own uid; a map without this
            # tenant's, made per app, was quadratic in the apps)
            refusal = root_refusal(app.root, st, tenant, others)
            if refusal is not None:
                node = root["tenants"][tenant.name]["apps"][app.name]
                walk.error(f"tenants.{tenant.name}.apps.{app.name}.root", Walk.key_line(node, "root"), refusal)


def _check_views(walk: Walk, server: Server, tenants: Mapping[str, Tenant], root: dict[Any, Any]) -> None:
    """What an isolated tenant's workers see must hold nothing of another tenant's, nor elasticd's runtime directory
    (its admin socket, every tenant's sockets): its roots and binds may not contain another tenant's root, nor
    lie inside one, nor contain the runtime directory."""
    if not any(tenant.isolation is not None for tenant in tenants.values()):
        return
    real: dict[str, str] = {}
    owners: dict[str, list[str]] = {}  # a real root → the tenants whose app has it
    for tenant in tenants.values():
        for app in tenant.apps.values():
            path = real.get(app.root)
            if path is None:
                path = real[app.root] = os.path.realpath(app.root)
            names = owners.setdefault(path, [])
            if tenant.name not in names:
                names.append(tenant.name)
    roots = _Roots(owners)
    runtime = os.path.realpath(server.runtime_dir)
    for tenant in tenants.values():
        view = tenant.isolation
        if view is None:
            continue
        node = root["tenants"][tenant.name]
        iso = node.get("isolation") or {}
        shown = [(f"apps.{app.name}.root", real[app.root],
                  Walk.key_line(node["apps"][app.name], "root")) for app in tenant.apps.values()]
        for key, paths in (("writable", view.writable), ("read_only", view.read_only)):
            shown += [(f"isolation.{key}[{i}]", path, Walk.item_line(iso.get(key), i)) for i, path in enumerate(paths)]
        for where, path, line in shown:
            problem = _exposes(path, tenant.name, roots, runtime)
            if problem is not None:
                walk.error(f"tenants.{tenant.name}.{where}", line, f"{path} {problem}")


class _Roots:
    """Every tenant's app roots, to find in O(log n) the roots a path holds and the ones it lies inside (each
    isolated tenant's paths against every other root was quadratic: 2,000 isolated tenants of 5 apps, 10^8
    comparisons)."""

    __slots__ = ("_owners", "_sorted")

    def __init__(self, owners: Mapping[str, list[str]]) -> None:
        self._owners = owners
        self._sorted = sorted(owners)

    def held_by(self, path: str) -> Iterator[str]:
        """The roots equal to ``path`` or under it."""
        if path in self._owners:
            yield path
        # (from the prefix, not from the path: "/srv/a-x" sorts between "/srv/a" and "/srv/a/b")
        prefix = path.rstrip("/") + "/"
        at = bisect.bisect_left(self._sorted, prefix)
        while at < len(self._sorted) and self._sorted[at].startswith(prefix):
            yield self._sorted[at]
            at += 1

    def around(self, path: str) -> Iterator[str]:
        """The roots ``path`` lies inside (itself not included)."""
        parent = os.path.dirname(path)
        while parent and parent != path:
            if parent in self._owners:
                yield parent
            path, parent = parent, os.path.dirname(parent)

    def owners(self, root: str) -> list[str]:
        return self._owners.get(root, [])


def _exposes(path: str, tenant: str, roots: _Roots, runtime: str) -> str | None:
    if inside(runtime, path):
        return f"holds elasticd's runtime directory {runtime} (every tenant's sockets): it cannot be in a tenant's view"
    for how, found in (("holds", roots.held_by(path)), ("lies inside", roots.around(path))):
        for their in found:
            other = next((name for name in roots.owners(their) if name != tenant), None)
            if other is not None:
                return f"{how} tenant {other}'s root {their}: it cannot be in another tenant's view"
    return None
