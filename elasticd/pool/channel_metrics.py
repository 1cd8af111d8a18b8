"""The channel's Prometheus metrics: refusals by tenant, app and reason, and the connections open."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.pool.channel_server import ChannelServer

__all__ = ["ChannelCollector"]


class ChannelCollector(Collector):
    __slots__ = ("_channel",)

    def __init__(self, channel: ChannelServer) -> None:
        self._channel = channel

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        refused = CounterMetricFamily(
            "elasticd_channel_refused", "Lines and connections the channel refused, by tenant, app (empty before a "
            "worker's announce is accepted) and reason.", labels=["tenant", "app", "reason"])
        for (tenant, app, reason), count in sorted(self._channel.refusals().items()):
            refused.add_metric([tenant, app, reason], count)
        yield refused
        yield GaugeMetricFamily("elasticd_channel_connections",
                                "Channel connections open: announced workers' and those not yet announced.",
                                value=self._channel.connected())
