"""Whether an address a tenant's settings name is one of elasticd's own listeners (``metrics_listen``,
``agent_listen``): a ``nodes:`` URL or a capacity probe's URL there would have elasticd connect to itself — as root,
from its own cgroup, so the guard would serve it — and hand the answer (every tenant's metrics) to the tenant.

``points_at`` is pure (what is this host's is passed in); ``bound_here`` and ``this_hosts_names`` ask the kernel. The
front imports this module (``OWN_LISTENERS``): nothing here reaches beyond the standard library, as nothing the
compiled front imports may.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Collection, Iterable

from elasticd.config.model import Address

__all__ = ["LOCAL_NAMES", "OWN_LISTENERS", "OwnListeners", "bound_here", "points_at", "this_hosts_names"]

# Names that are this host whatever DNS says (RFC 6761: "localhost." and every name under it is loopback).
LOCAL_NAMES = frozenset(("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"))


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(text.strip("[]").split("%", 1)[0])
    except ValueError:
        return None  # a name
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def bound_here(address: str) -> bool:
    """Whether ``address`` is one of this host's: a socket can be bound to it (the kernel answers EADDRNOTAVAIL for
    any other). One bind of a UDP socket, closed at once: no port is held, no packet sent."""
    ip = _ip(address)
    if ip is None:
        return False
    family = socket.AF_INET6 if isinstance(ip, ipaddress.IPv6Address) else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.bind((str(ip), 0))
    except OSError as exc:
        return exc.errno != errno.EADDRNOTAVAIL  # (another error: taken as ours, failing closed)
    return True


def this_hosts_names() -> set[str]:
    """The kernel's hostname, whole and its first label."""
    name = socket.gethostname().lower()
    return {name, name.split(".", 1)[0]}


def points_at(host: str, port: int, listeners: Iterable[Address], addresses: Collection[str],
              names: Collection[str]) -> Address | None:
    """The listener ``host:port`` reaches, or None. ``addresses``: this host's among those asked about
    (``bound_here``); ``names``: its names (``this_hosts_names``).

    A loopback name or address (``localhost``, ``*.localhost``, 127.0.0.0/8, ::1, and 0.0.0.0, which a connect
    takes for loopback) reaches a listener on that address, on loopback or on every address; one of this host's
    addresses reaches a listener on it or on every address; one of its names, any listener of the port."""
    lowered = host.lower().rstrip(".")
    ip = _ip(lowered)
    if ip is None:
        if lowered in LOCAL_NAMES or lowered.endswith(".localhost"):
            reach = "loopback"
        elif lowered in names:
            reach = "any"
        else:
            return None
    elif ip.is_loopback or ip.is_unspecified:
        reach = "loopback"
    elif str(ip) in addresses:
        reach = str(ip)
    else:
        return None
    for listener in listeners:
        if listener.port != port:
            continue
        bound = _ip(listener.host)
        if reach == "any" or bound is None or bound.is_unspecified:  # (a name bound: taken as this host's)
            return listener
        if reach == "loopback" and bound.is_loopback and (ip is None or ip.is_unspecified or ip == bound
                                                           or lowered in LOCAL_NAMES):
            return listener
        if str(bound) == reach:
            return listener
    return None


class OwnListeners:
    """Where elasticd's own listeners are bound, as the kernel has them (set by the daemon once they listen): what
    elasticd's own outgoing connections (a node's, a capacity probe's) must not reach, whatever a name resolved to
    (a tenant's DNS record can point anywhere, and change between the load and the connect)."""

    __slots__ = ("_exact", "_wildcard_ports")

    def __init__(self) -> None:
        self._exact: set[tuple[str, int]] = set()
        self._wildcard_ports: set[int] = set()

    def set(self, bound: Iterable[tuple[str, int]]) -> None:
        exact: set[tuple[str, int]] = set()
        wildcard: set[int] = set()
        for host, port in bound:
            ip = _ip(host)
            if ip is None or ip.is_unspecified:
                wildcard.add(port)
            else:
                exact.add((str(ip), port))
        self._exact, self._wildcard_ports = exact, wildcard

    def reached(self, peer: tuple[str, int], own: tuple[str, int] | None = None) -> bool:
        """Whether a connection to ``peer`` (from ``own``, its local end, when connected) is to one of them. A
        listener on every address is reached from a loopback peer, or from a peer at the connection's own address
        (a connect to one of this host's addresses goes out from that address)."""
        ip = _ip(peer[0])
        if ip is None:
            return False
        if (str(ip), peer[1]) in self._exact:
            return True
        if peer[1] in self._wildcard_ports:
            return ip.is_loopback or ip.is_unspecified or (own is not None and _ip(own[0]) == ip)
        return False


# The daemon's (one per process: elasticd has one set of listeners).
OWN_LISTENERS = OwnListeners()
