"""``server.trusted_proxies``, ``server.trusted_proxy_users`` and ``server.underscored_headers``: who may tell the
front where a request came from (X-Forwarded-For, -Proto, -Host, Forwarded), and whether request header names with
"_" reach the workers (``front/core/http1.py`` says why each is dropped otherwise).

A proxy on another host is trusted by its network; a proxy on this host only by its Unix user, never by an address:
every tenant's process connects from the host's loopback and addresses too. So a network that is all loopback is
refused here, naming the key to use instead, and a wider one never covers a local peer (``proxy_trust.py``). A
trusted user that is a tenant's ``user:`` is refused (``check_trusted_users``): that tenant's processes would be
trusted.
"""

from __future__ import annotations

import ipaddress
import pwd
from collections.abc import Mapping
from typing import Any

from elasticd.config.model import Tenant
from elasticd.config.walk import Walk, join, kind

__all__ = ["FORWARDING_KEYS", "UNDERSCORED", "check_trusted_users", "trusted_proxies", "trusted_proxy_users",
           "underscored_headers"]

FORWARDING_KEYS = ("trusted_proxies", "trusted_proxy_users", "underscored_headers")
UNDERSCORED = ("drop", "keep")


def _items(walk: Walk, server: dict[Any, Any], key: str) -> list[tuple[Any, int | None]]:
    """The list under ``server.<key>`` with each item's line; [] when absent or null (an error when not a list)."""
    node = server.get(key)
    if node is None:
        return []
    if not isinstance(node, list):
        walk.error(f"server.{key}", walk.key_line(server, key), f"{kind(node)} is not a list")
        return []
    return [(item, walk.item_line(node, i) or walk.key_line(server, key)) for i, item in enumerate(node)]


def trusted_proxies(walk: Walk, server: dict[Any, Any]) -> tuple[str, ...]:
    """The networks, normalised (``10.0.0.7`` is ``10.0.0.7/32``; host bits set are refused, not dropped: the
    operator meant some network, and which one is theirs to say)."""
    networks: list[str] = []
    for i, (item, line) in enumerate(_items(walk, server, "trusted_proxies")):
        where = join("server.trusted_proxies", i)
        if not isinstance(item, str):
            walk.error(where, line, f"{kind(item)} is not an address or network (CIDR)")
            continue
        try:
            network = ipaddress.ip_network(item.strip())
        except ValueError as exc:
            walk.error(where, line, f'"{item}" is not an address or network (CIDR): {exc}')
            continue
        if network.is_loopback:
            walk.error(where, line, f'"{item}" is loopback, where every tenant\'s process connects from too: trust a '
                                    "proxy on this host by its user (server.trusted_proxy_users)")
            continue
        networks.append(str(network))
    return tuple(networks)


def trusted_proxy_users(walk: Walk, server: dict[Any, Any]) -> tuple[tuple[str, int], ...]:
    """(name, uid) of each user, looked up in the system's user database (by name or uid)."""
    users: list[tuple[str, int]] = []
    for i, (item, line) in enumerate(_items(walk, server, "trusted_proxy_users")):
        where = join("server.trusted_proxy_users", i)
        try:
            if isinstance(item, bool) or not isinstance(item, (str, int)):
                raise KeyError(item)
            entry = pwd.getpwuid(item) if isinstance(item, int) else pwd.getpwnam(item)
        except (KeyError, OverflowError):
            walk.error(where, line, f"{kind(item)} is not a user on this host (see getent passwd)")
            continue
        users.append((entry.pw_name, entry.pw_uid))
    return tuple(users)


def underscored_headers(value: Any) -> str:
    text = str(value) if isinstance(value, str) else None
    if text not in UNDERSCORED:
        raise ValueError(f"{kind(value)} is not drop or keep")
    return text


def check_trusted_users(walk: Walk, users: tuple[tuple[str, int], ...], tenants: Mapping[str, Tenant],
                        root: dict[Any, Any]) -> None:
    """A trusted proxy user that a tenant runs as would make that tenant's processes a trusted proxy."""
    if not users:
        return
    by_uid = {t.run_as.uid: name for name, t in tenants.items() if t.run_as is not None and t.run_as.uid != 0}
    server = root.get("server") if isinstance(root, dict) else None
    node = server.get("trusted_proxy_users") if isinstance(server, dict) else None
    written = list(node) if isinstance(node, list) else []
    for name, uid in users:
        tenant = by_uid.get(uid)
        if tenant is not None:
            i = next((i for i, item in enumerate(written) if item in (name, uid)), 0)
            walk.error(join("server.trusted_proxy_users", i), walk.item_line(node, i),
                       f"{name} is tenant {tenant}'s user: its processes would be trusted to say where a request "
                       "came from; run the proxy as a user of its own")
