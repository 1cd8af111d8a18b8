"""Descriptors an image starts with: the ones the previous image (a re-exec in place) or systemd (its store, after a
restart) named are kept; every other one it inherited is closed.

Why close the rest: a descriptor left open across an exec by accident (inheritable, and named nowhere) would live
as long as this process — a listening socket holding a port, a worker's pipe never read. Python opens its own
descriptors close-on-exec (PEP 446), so the inheritable ones above stdio, before anything of this image opens one,
are exactly what the exec left open.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping

from elasticd.upgrade.state import SavedState

__all__ = ["close_strays", "kept_descriptors"]


def kept_descriptors(saved: SavedState | None, stored: Mapping[str, list[int]]) -> set[int]:
    keep = {fd for fds in stored.values() for fd in fds}
    if saved is not None:
        keep.update(fd for fds in saved.listeners.values() for fd in fds)
        keep.update(saved.connections)
        keep.update(fd for tunnel in saved.tunnels for fd in (tunnel.client, tunnel.upstream))
        keep.update(fd for request in saved.requests for fd in (request.client, request.upstream))
        keep.update(request.client for request in saved.unsent)
        keep.update(worker.output for worker in saved.workers if worker.output is not None)
        if saved.state_store is not None:
            keep.add(saved.state_store)
    return keep


def close_strays(keep: set[int]) -> list[int]:
    """Close every inheritable descriptor above 2 not in ``keep``; the ones closed."""
    closed: list[int] = []
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return closed
    for name in names:
        fd = int(name)
        if fd <= 2 or fd in keep:
            continue
        with contextlib.suppress(OSError):
            if os.get_inheritable(fd):
                os.close(fd)
                closed.append(fd)
    return closed
