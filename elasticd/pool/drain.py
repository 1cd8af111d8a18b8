"""Drains never cut work: when a worker leaving its group may be stopped, and whether an operator's drain
starts a replacement first. Pure: time is passed in.

A worker being retired (compaction), or whose app or tenant a reload removed, gets no new requests; it is
stopped once nothing is open on it — no request in the front's open-requests dict and no WebSocket tunnel
(a tunnel is a request that has not ended) — or, at the latest, after ``drain_timeout``, when what is still
open is cut and named in a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

from elasticd.pool.cap import may_start

__all__ = ["DrainVerdict", "drain_verdict", "refused_while_stopping", "replacement_for_drain"]


@dataclass(frozen=True, slots=True)
class DrainVerdict:
    stop: bool
    cut: str | None = None  # what stopping now cuts (only past the timeout), for the warning


def drain_verdict(now: float, started: float, *, open_requests: int, tunnels: int,
                  drain_timeout: float) -> DrainVerdict:
    if not open_requests and not tunnels:
        return DrainVerdict(True)
    if now - started < drain_timeout:
        return DrainVerdict(False)
    parts = []
    if open_requests:
        parts.append(f"{open_requests} open request{'s' if open_requests != 1 else ''}")
    if tunnels:
        parts.append(f"{tunnels} open WebSocket tunnel{'s' if tunnels != 1 else ''}")
    return DrainVerdict(True, " and ".join(parts))


def replacement_for_drain(worker_id: str, *, staying: int, floor: int, counted: int, max_workers: int | None,
                          stopping: bool = False, recycled: str | None = None) -> str | None:
    """Why a replacement must start before ``worker_id`` is drained away (None: the ``staying`` workers keep the
    group's floor). A recycled worker (``recycled``: why, ``recycling.recycle_reason``) is always replaced: it is
    taken out for what its process became, not because the group needs one fewer. ValueError when one is needed
    but cannot start: elasticd is stopping, or the cap (``cap.py``) leaves no room even counting the replacement in
    the drained worker's place. The worker then stays as it is, with its users."""
    if staying >= floor and recycled is None:
        return None
    if stopping:
        raise ValueError(refused_while_stopping(worker_id))
    if not may_start(max_workers, counted, replacing=1):
        raise ValueError(f"no replacement for {worker_id} can start: the group counts {counted} workers, max_workers "
                         f"{max_workers}: it is kept, with its users")
    if recycled is not None:
        return f"replaces {worker_id}, recycled: {recycled}"
    return f"replaces {worker_id}, drained by an operator, to keep min_workers {floor}"


def refused_while_stopping(worker_id: str) -> str:
    return (f"no replacement for {worker_id} can start now (elasticd is stopping, or its group is going): it is "
            f"kept, with its users")
