"""Checks across the whole document, made once every section parsed: a domain routed twice, a worker socket path
too long for sun_path, an app root another user could write into (read from the disk as it is now), an isolated
tenant's view that would hold another tenant's root or elasticd's own runtime directory."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from typing import Any

from elasticd.config.isolation import inside
from elasticd.config.model import Server, Tenant
from elasticd.config.walk import Walk

__all__ = ["check_document", "root_refusal"]


def check_document(walk: Walk, server: Server, tenants: Mapping[str, Tenant], top: dict[Any, Any]) -> None:
    _check_domains(walk, tenants, top)
    _check_socket_paths(walk, server, tenants, top)
    _check_roots(walk, tenants, top)
    _check_views(walk, server, tenants, top)


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


def _check_roots(walk: Walk, tenants: Mapping[str, Tenant], root: dict[Any, Any]) -> None:
    """Each app's root as it is on disk now (a root that does not exist yet is the worker's concern: it runs
    in / with a warning)."""
    others = {t.run_as.uid: t.name for t in tenants.values() if t.run_as is not None and t.run_as.uid != 0}
    for tenant in tenants.values():
        for app in tenant.apps.values():
            try:
                st = os.stat(app.root)
            except OSError:
                continue
            refusal = root_refusal(app.root, st, tenant, {u: n for u, n in others.items() if n != tenant.name})
            if refusal is not None:
                node = root["tenants"][tenant.name]["apps"][app.name]
                walk.error(f"tenants.{tenant.name}.apps.{app.name}.root", Walk.key_line(node, "root"), refusal)


def _check_views(walk: Walk, server: Server, tenants: Mapping[str, Tenant], root: dict[Any, Any]) -> None:
    """What an isolated tenant's workers see must hold nothing of another tenant's, nor elasticd's runtime directory
    (its admin socket, every tenant's sockets): its roots and binds may not contain another tenant's root, nor
    lie inside one, nor contain the runtime directory."""
    roots = {tenant.name: [os.path.realpath(app.root) for app in tenant.apps.values()] for tenant in tenants.values()}
    runtime = os.path.realpath(server.runtime_dir)
    for tenant in tenants.values():
        view = tenant.isolation
        if view is None:
            continue
        node = root["tenants"][tenant.name]
        iso = node.get("isolation") or {}
        shown = [(f"apps.{app.name}.root", os.path.realpath(app.root),
                  Walk.key_line(node["apps"][app.name], "root")) for app in tenant.apps.values()]
        for key, paths in (("writable", view.writable), ("read_only", view.read_only)):
            shown += [(f"isolation.{key}[{i}]", path, Walk.item_line(iso.get(key), i)) for i, path in enumerate(paths)]
        for where, path, line in shown:
            problem = _exposes(path, tenant.name, roots, runtime)
            if problem is not None:
                walk.error(f"tenants.{tenant.name}.{where}", line, f"{path} {problem}")


def _exposes(path: str, tenant: str, roots: Mapping[str, list[str]], runtime: str) -> str | None:
    if inside(runtime, path):
        return f"holds elasticd's runtime directory {runtime} (every tenant's sockets): it cannot be in a tenant's view"
    for other, theirs in roots.items():
        if other == tenant:
            continue
        for their in theirs:
            if inside(their, path) or inside(path, their):
                return (f"{'holds' if inside(their, path) else 'lies inside'} tenant {other}'s root {their}: "
                        "it cannot be in another tenant's view")
    return None
