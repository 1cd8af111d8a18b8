"""The front HTTP proxy: Host → app (routing), tenant quotas, sticky users, forward counters, and the relay
of bytes to each app's workers over their Unix sockets (asyncio Protocols with httptools).

``Front`` is the shell; the decisions are the sans-I/O modules of ``front.core``: ``routing``, ``quota``,
``sticky``, ``counters``, ``http1``. ``request_metrics.FrontCollector`` exposes the metrics.
"""

from __future__ import annotations

from . import server
from .core.counters import ForwardCounters, RouteStats, WorkerCounters
from .core.quota import ConcurrencyGate, QuotaBook, QuotaRefusal, TenantQuota, TokenBucket, retry_after
from .core.routing import AppRoute, RouteTable, normalize_host
from .core.sticky import PlaceFn, Surface, SurfaceUser, place
from .request_metrics import FrontCollector
from .server import Front, WorkersFn
from .upstream import Upstream

# Whether this front is the mypyc build (setup.py, as the .deb ships it) rather than the sources.
COMPILED = not server.__file__.endswith(".py")

__all__ = [
    "COMPILED",
    "AppRoute",
    "ConcurrencyGate",
    "ForwardCounters",
    "Front",
    "FrontCollector",
    "PlaceFn",
    "QuotaBook",
    "QuotaRefusal",
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
