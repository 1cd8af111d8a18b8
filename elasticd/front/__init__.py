"""The front HTTP proxy: Host → app (routing), app → worker (round robin), bytes both ways (relay)."""

from __future__ import annotations

from .relay import AiohttpRelay, Relay, Upstream, UpstreamError, UpstreamTimeout
from .routing import AppRoute, RoundRobin, RouteTable, normalize_host
from .server import Front, WorkersFn

__all__ = [
    "AiohttpRelay",
    "AppRoute",
    "Front",
    "Relay",
    "RoundRobin",
    "RouteTable",
    "Upstream",
    "UpstreamError",
    "UpstreamTimeout",
    "WorkersFn",
    "normalize_host",
]
