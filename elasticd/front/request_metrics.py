"""The front's Prometheus metrics, as a custom collector over its forward counters (nothing counted twice).

- ``elasticd_requests_total{tenant,app,code}``: every answer to a request routed to an app, refusals included;
- ``elasticd_request_duration_seconds{tenant,app}``: the forwarded ones' time from dispatch to the last byte;
- ``elasticd_quota_rejections_total{tenant,reason}``: reason ``concurrency`` (503) or ``rate`` (429), both
  present at 0 for every configured tenant, so a rate() over them has a series from the start;
- ``elasticd_upstream_refusals_total{tenant,app,reason}``: what the front refused of an app's workers past a bound
  (``front.core.bounds``: ``head_size``, ``head_fields``, ``head_time``, ``interim``, ``framing``, ``malformed``,
  ``connections``), once one was.

``collect`` runs in the metrics server's thread: it only reads copies of the dicts the event loop mutates
(copying a dict is atomic under the GIL), and counts read while a request is being closed are at worst one
request behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.front.core.counters import BOUNDS, ForwardCounters
from elasticd.front.core.quota import CONCURRENCY, RATE
from elasticd.histogram import cumulative_buckets

__all__ = ["FrontCollector"]

class FrontCollector(Collector):
    __slots__ = ("_forwards", "_tenants")

    def __init__(self, forwards: ForwardCounters, tenants: Callable[[], Iterable[str]]) -> None:
        self._forwards = forwards
        self._tenants = tenants  # the configured tenants, for the zero-valued rejection series

    def describe(self) -> list[Metric]:
        return []  # nothing to check at registration: the names are fixed and ours

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("elasticd_requests_total", "Requests answered, by tenant, app and status.",
                                       labels=["tenant", "app", "code"])
        duration = HistogramMetricFamily("elasticd_request_duration_seconds",
                                         "Time to forward a request and relay its answer.",
                                         labels=["tenant", "app"])
        for (tenant, app), stats in self._forwards.iter_routes():
            for code, count in sorted(stats.codes.copy().items()):
                requests.add_metric([tenant, app, str(code)], count)
            duration.add_metric([tenant, app], cumulative_buckets(BOUNDS, list(stats.buckets), stats.count),
                                stats.sum)
        yield requests
        yield duration
        rejections = CounterMetricFamily("elasticd_quota_rejections_total",
                                         "Requests refused by a tenant's quota, by reason.",
                                         labels=["tenant", "reason"])
        counted = self._forwards.rejections.copy()
        tenants = set(self._tenants()) | {tenant for tenant, _ in counted}
        for tenant in sorted(tenants):
            for reason in (CONCURRENCY, RATE):
                rejections.add_metric([tenant, reason], counted.get((tenant, reason), 0))
        yield rejections
        routing = CounterMetricFamily("elasticd_group_routing_total",
                                      "The group of each new user and why (default, canary), and each request of "
                                      "a user kept on a group new users no longer go to (sticky).",
                                      labels=["tenant", "app", "group", "reason"])
        for (tenant, app, group, reason), count in sorted(self._forwards.routing_counts().items()):
            routing.add_metric([tenant, app, group, reason], count)
        yield routing
        refusals = CounterMetricFamily("elasticd_upstream_refusals_total",
                                       "What the front refused of an app's workers past one of its bounds (an answer "
                                       "head too large, too long in coming, malformed...), by reason.",
                                       labels=["tenant", "app", "reason"])
        for (tenant, app, reason), count in sorted(self._forwards.upstream_refusals.copy().items()):
            refusals.add_metric([tenant, app, reason], count)
        yield refusals
