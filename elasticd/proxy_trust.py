"""Whether a connection to the front comes from a proxy the operator trusts to say where a request came from
(``server.trusted_proxies``, ``server.trusted_proxy_users``; the front keeps or drops X-Forwarded-* and Forwarded
by it: ``front/core/http1.py``).

=========================  ==============================================  =========
the peer                   what is asked                                   trusted
=========================  ==============================================  =========
another host's address     its address in a ``trusted_proxies`` network    if it is
this host's (loopback,     the kernel, of its socket (``listener_guard``:  if its owner is a
one of the host's)         owner uid and cgroup)                           ``trusted_proxy_users``
                                                                           user and it is no
                                                                           tenant's process
=========================  ==============================================  =========

A local peer is never trusted by its address: every tenant's process connects from the same loopback, and from the
host's own addresses. The kernel's answer is the listener guard's (one NETLINK_SOCK_DIAG request, ~15 µs), asked once
a connection, and only when a trusted user is configured (a proxy keeps its connections to the front open: HAProxy
reuses them, so the lookup is paid per connection, not per request). With neither key set, nobody is trusted and the
front asks nothing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from elasticd.listener_guard.guard import ListenerGuard
from elasticd.listener_guard.verdict import PeerVerdict

__all__ = ["ProxyTrust", "TrustedProxies"]

_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class TrustedProxies:
    """The configured trust, as data (pure)."""

    networks: tuple[_Network, ...] = ()
    uids: frozenset[int] = frozenset()

    @classmethod
    def of(cls, networks: Iterable[str], uids: Collection[int]) -> TrustedProxies:
        return cls(tuple(ipaddress.ip_network(n) for n in networks), frozenset(uids))

    @property
    def anyone(self) -> bool:
        return bool(self.networks or self.uids)

    def by_address(self, address: str) -> bool:
        """A peer of another host, by its address (an IPv4 address mapped into IPv6 is read as IPv4)."""
        if not self.networks:
            return False
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return False
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in network for network in self.networks)

    def by_socket(self, verdict: PeerVerdict) -> bool:
        """A local peer, by the kernel's word on its socket: no tenant's, and owned by a trusted user."""
        return verdict.served and verdict.uid is not None and verdict.uid in self.uids


class ProxyTrust:
    """The front's ``trusts(peer, own)``: ``TrustedProxies`` asked with what the listener guard knows of a peer."""

    __slots__ = ("_guard", "_trusted")

    def __init__(self, trusted: TrustedProxies, guard: ListenerGuard) -> None:
        self._trusted = trusted
        self._guard = guard

    def __call__(self, peer: tuple[str, int], own: tuple[str, int]) -> bool:
        trusted = self._trusted
        if not self._guard.local(peer, own):
            return trusted.by_address(peer[0])
        if not trusted.uids:
            return False
        return trusted.by_socket(self._guard.identify(peer, own))
