"""Whether one of elasticd's own listeners (``metrics_listen``, ``agent_listen``) serves a connection: pure.

Every tenant's process shares the host's network, loopback included, so an address says nothing of who connects:
``127.0.0.1`` is the operator's Prometheus and every tenant's worker alike. What does tell them apart is the
peer's socket, as the kernel has it (``sock_diag.Peer``): its owner's uid (a tenant's ``user:``) and the cgroup it
was created in (a tenant's leaf or group, which also catches a tenant without ``user:``, running as root).

The table, for a peer at a local address (loopback, or one of this host's):

=============================  ==========================================  =================
the kernel's lookup            the peer's socket                           verdict
=============================  ==========================================  =================
failed (no sock_diag, error)   —                                           refused, ``lookup-failed``
no such socket                 (closed before the lookup)                  refused, ``peer-gone``
found                          not held (closed, TIME-WAIT)                refused, ``peer-gone``
found                          created in a tenant's cgroup                refused, ``tenant-cgroup``
found                          owned by a tenant's user                    refused, ``tenant-user``
found                          anything else (root, prometheus, an admin)  served
=============================  ==========================================  =================

A peer at another host's address is served without a lookup (the operator's Prometheus elsewhere; what reaches
the listener from outside is the operator's firewall's business). Fail closed: a local peer the kernel cannot
vouch for is refused. The cgroup is asked before the uid: it names the tenant whose process it is even when two
tenants share a user.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

__all__ = ["REASONS", "SERVED", "Peer", "PeerVerdict", "is_local", "judge", "tenants_by_uid"]

REASONS: Final = ("lookup-failed", "peer-gone", "tenant-cgroup", "tenant-user")


@dataclass(frozen=True, slots=True)
class Peer:
    """The peer's socket as the kernel has it."""

    uid: int
    inode: int  # 0: no process holds it any more (closed; or a TIME-WAIT remnant, whose uid reads 0)
    cgroup_id: int | None  # None: a kernel before 5.7 does not say
    tcp_state: str

    @property
    def held(self) -> bool:
        """A process still holds the socket (so could read what we send)."""
        return self.inode != 0 and self.tcp_state != "time-wait"


@dataclass(frozen=True, slots=True)
class PeerVerdict:
    served: bool
    reason: str | None = None  # one of REASONS when refused
    tenant: str | None = None  # whose process it is, when known
    uid: int | None = None  # the peer socket's owner, when known

    @property
    def who(self) -> str:
        """The peer, as the log names it (by tenant, never by address and port: a tenant has thousands of ports)."""
        if self.tenant is not None:
            return f"tenant {self.tenant}"
        return f"uid {self.uid}" if self.uid is not None else "an unknown local peer"


SERVED: Final = PeerVerdict(True)


def is_local(peer_address: str, own_address: str, host_addresses: Collection[str]) -> bool:
    """Whether a peer's address is this host's: loopback, the address it connected to, or one of the host's."""
    try:
        ip = ipaddress.ip_address(peer_address.split("%", 1)[0])
    except ValueError:
        return True  # (not an IP address: nothing a TCP peer has; fail closed)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback or ip.is_unspecified:
        return True
    text = str(ip)
    return text == own_address or text in host_addresses


def judge(peer: Peer | None, lookup_failed: bool, tenants_by_cgroup: Mapping[int, str],
          tenants_by_uid: Mapping[int, str]) -> PeerVerdict:
    """The verdict on a local peer, from the kernel's lookup (``peer``: None when there is no such socket;
    ``lookup_failed``: the kernel could not be asked)."""
    if lookup_failed:
        return PeerVerdict(False, "lookup-failed")
    if peer is None:
        return PeerVerdict(False, "peer-gone")
    if not peer.held:
        return PeerVerdict(False, "peer-gone", uid=peer.uid)
    if peer.cgroup_id is not None:
        tenant = tenants_by_cgroup.get(peer.cgroup_id)
        if tenant is not None:
            return PeerVerdict(False, "tenant-cgroup", tenant, peer.uid)
    tenant = tenants_by_uid.get(peer.uid)
    if tenant is not None:
        return PeerVerdict(False, "tenant-user", tenant, peer.uid)
    return PeerVerdict(True, uid=peer.uid)  # (the uid: whether it is a trusted proxy's is the front's question)


def tenants_by_uid(users: Iterable[tuple[str, int]]) -> dict[int, str]:
    """(tenant, uid of its ``user:``) pairs as the table ``judge`` reads: root is nobody's (a tenant without a user of
    its own runs as root, and so does the operator's tooling: its cgroup tells it apart, not its uid); tenants that
    share a user are named together."""
    table: dict[int, str] = {}
    for tenant, uid in users:
        if uid != 0:
            table[uid] = f"{table[uid]}, {tenant}" if uid in table else tenant
    return table
