"""The front HTTP proxy: Host → app (routing), tenant quotas, sticky users, forward accounting, and the relay
of bytes to each app's workers over their Unix sockets (asyncio Protocols with httptools).

``Front`` is the shell; the decisions are pure modules: ``routing``, ``quota``, ``sticky``, ``accounting``,
``http1``. ``collector.FrontCollector`` exposes the metrics.
"""

from __future__ import annotations

from .accounting import Accounting, RouteStats, WorkerCounters
from .collector import FrontCollector
from .quota import ConcurrencyGate, QuotaBook, Refusal, TenantQuota, TokenBucket, retry_after
from .routing import AppRoute, RouteTable, normalize_host
from .server import Front, WorkersFn
from .sticky import PlaceFn, Surface, SurfaceUser, place
from .upstream import Upstream

__all__ = [
    "Accounting",
    "AppRoute",
    "ConcurrencyGate",
    "Front",
    "FrontCollector",
    "PlaceFn",
    "QuotaBook",
    "Refusal",
    "RouteStats",
    "RouteTable",
    "Surface",
    "SurfaceUser",
    "TenantQuota",
    "TokenBucket",
    "Upstream",
    "WorkerCounters",
    "WorkersFn",
    "normalize_host",
    "place",
    "retry_after",
]
