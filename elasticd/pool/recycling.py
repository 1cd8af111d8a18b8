"""Recycling (pure): when a worker is replaced for what its process has become — past ``pool.max_requests``
served, or past ``pool.max_rss`` — as uWSGI's ``max-requests`` and ``reload-on-rss``, gunicorn's ``max_requests``
with its jitter, PHP-FPM's ``pm.max_requests``, Passenger's ``max_requests`` and ``memory_limit`` do.

A leaking app grows until its tenant's ``memory.max`` kills it mid-request; recycled first, it is replaced the way
a compaction retires a worker: a new worker started before, the users moved live (a library worker's keep their
state), the open requests and tunnels drained, never killed mid-request (``retirement.recycle``).
"""

from __future__ import annotations

import zlib

__all__ = ["JITTER", "recycle_reason", "requests_limit"]

# The jitter's share of max_requests: each worker's own limit is max_requests plus up to this much more, fixed per
# worker id, so workers started together are not all recycled together (gunicorn's max_requests_jitter).
JITTER = 0.1


def requests_limit(max_requests: int | None, worker_id: str) -> int | None:
    """The requests ``worker_id``'s process may serve before it is recycled (None: no limit)."""
    if max_requests is None:
        return None
    spread = int(max_requests * JITTER)
    return max_requests + (zlib.crc32(worker_id.encode()) % (spread + 1) if spread else 0)


def recycle_reason(*, served: int, rss: int | None, limit: int | None, max_rss: int | None,
                   changing: bool) -> str | None:
    """Why the worker is recycled now, or None. ``served``: requests its process has served; ``limit``: its
    ``requests_limit``; ``changing``: its group is starting or draining a worker already — one change at a time, as
    compaction (the recycle waits for the next report)."""
    if changing:
        return None
    if limit is not None and served >= limit:
        return f"served {served} requests (max_requests, its limit with the jitter: {limit})"
    if max_rss is not None and rss is not None and rss >= max_rss:
        return f"RSS {rss >> 20} MiB is at or over max_rss ({max_rss >> 20} MiB)"
    return None
