"""Drains never cut work: when a worker leaving its group may be stopped. Pure: time is passed in.

A worker being retired (compaction), or whose app or tenant a reload removed, gets no new requests; it is
stopped once nothing is open on it — no request in the front's open-requests dict and no WebSocket tunnel
(a tunnel is a request that has not ended) — or, at the latest, after ``drain_timeout``, when what is still
open is cut and named in a warning.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DrainVerdict", "drain_verdict"]


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
