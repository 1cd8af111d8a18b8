"""This host's own addresses, as a peer's would be (psutil reads every interface): the listener guard's."""

from __future__ import annotations

import socket

import psutil

__all__ = ["host_addresses"]


def host_addresses() -> set[str]:
    """Every IPv4 and IPv6 address of this host's interfaces (none when they cannot be read)."""
    found: set[str] = set()
    try:
        interfaces = psutil.net_if_addrs()
    except OSError:
        return found
    for entries in interfaces.values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6):
                found.add(entry.address.split("%", 1)[0])
    return found
