"""``elasticd_capacity_used`` / ``elasticd_capacity_limit{tenant,app,group,node,source}``: each fresh capacity
reading of a worker or a node, by the source it came from (a reading past its time has no series: what is not
believed is not exported either); ``elasticd_capacity_probe_failures_total{…,reason}``: its polls that failed."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.probes.state import CapacityState

__all__ = ["CapacityCollector"]


class CapacityCollector(Collector):
    __slots__ = ("_state",)

    def __init__(self, state: CapacityState) -> None:
        self._state = state

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        labels = ["tenant", "app", "group", "node", "source"]
        used = GaugeMetricFamily("elasticd_capacity_used", "What a worker or node says it carries (its capacity "
                                 "reading, while fresh).", labels=labels)
        limit = GaugeMetricFamily("elasticd_capacity_limit", "What a worker or node says it can carry (its capacity "
                                  "reading, while fresh).", labels=labels)
        for target, _ in self._state.targets():
            for reading in self._state.fresh(target.node):
                names = [target.tenant, target.app, target.group, target.node, reading.source]
                used.add_metric(names, reading.used)
                limit.add_metric(names, reading.limit)
        failures = CounterMetricFamily("elasticd_capacity_probe_failures", "Capacity polls that failed (the reading "
                                       "forgotten), by worker or node and why: unreachable, too-big, malformed, "
                                       "failed.",
                                       labels=["tenant", "app", "group", "node", "reason"])
        for (tenant, app, group, node), counts in self._state.failures.items():
            for reason, count in sorted(counts.items()):
                failures.add_metric([tenant, app, group, node, reason], count)
        yield used
        yield limit
        yield failures
