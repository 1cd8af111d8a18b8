"""The front's Prometheus metrics, as a custom collector over its forward counters (nothing counted twice).

- ``elasticd_requests_total{tenant,app,code}``: every answer to a request routed to an app, refusals included;
- ``elasticd_request_duration_seconds{tenant,app}``: the forwarded ones' time from dispatch to the last byte;
- ``elasticd_quota_rejections_total{tenant,reason}``: reason ``concurrency`` (503) or ``rate`` (429), both
  present at 0 for every configured tenant, so a rate() over them has a series from the start;
- ``elasticd_upstream_refusals_total{tenant,app,reason}``: what the front refused of an app's workers past a bound
  (``front.core.bounds``: ``head_size``, ``head_fields``, ``head_time``, ``interim``, ``framing``, ``malformed``,
  ``connections``), once one was;
- ``elasticd_queue_depth{tenant,app,group}``, ``elasticd_queue_wait_seconds{tenant,app,group}`` (a histogram) and
  ``elasticd_queue_refusals_total{tenant,app,group,reason}``: the groups' queues (``front/queueing.py``).

``collect`` runs in the metrics server's thread: it only reads copies of the dicts the event loop mutates
(copying a dict is atomic under the GIL), and counts read while a request is being closed are at worst one
request behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.front.core.counters import BOUNDS, ForwardCounters
from elasticd.front.core.quota import CONCURRENCY, RATE
from elasticd.histogram import cumulative_buckets

__all__ = ["FrontCollector"]

class FrontCollector(Collector):
    __slots__ = ("_depths", "_forwards", "_groups", "_tenants")

    def __init__(self, forwards: ForwardCounters, tenants: Callable[[], Iterable[str]],
                 depths: Callable[[], Mapping[str, int]] | None = None,
                 groups: Callable[[], Iterable[tuple[str, str, str]]] | None = None) -> None:
        self._forwards = forwards
        self._tenants = tenants  # the configured tenants, for the zero-valued rejection series
        self._depths = depths  # "tenant/app/group" → requests waiting in its queue now
        self._groups = groups  # every routed group, for the zero-valued queue series

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
        yield from self._queues()

    def _queues(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("elasticd_queue_depth", "Requests waiting in the front for a worker of the group "
                                  "(its queue: a free slot, or a worker that is coming).",
                                  labels=["tenant", "app", "group"])
        wait = HistogramMetricFamily("elasticd_queue_wait_seconds", "How long each request waited in its group's "
                                     "queue.", labels=["tenant", "app", "group"])
        refused = CounterMetricFamily("elasticd_queue_refusals_total", "Requests answered 503 from their group's "
                                      "queue, by reason: full (queue.max), timeout (queue.timeout), no_worker (none "
                                      "came up).", labels=["tenant", "app", "group", "reason"])
        depths = dict(self._depths()) if self._depths is not None else {}
        stats = self._forwards.queues.copy()
        names = {f"{t}/{a}/{g}" for t, a, g in self._groups()} if self._groups is not None else set()
        for name in sorted(names | set(depths) | set(stats)):
            labels = name.split("/")
            depth.add_metric(labels, depths.get(name, 0))
            queue = stats.get(name)
            if queue is None:
                wait.add_metric(labels, cumulative_buckets(BOUNDS, [0] * (len(BOUNDS) + 1), 0), 0.0)
                continue
            wait.add_metric(labels, cumulative_buckets(BOUNDS, list(queue.buckets), queue.count), queue.sum)
            for reason, count in sorted(queue.refused.copy().items()):
                refused.add_metric([*labels, reason], count)
        yield depth
        yield wait
        yield refused
