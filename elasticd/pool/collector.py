"""The pool's Prometheus metrics: occupancy per worker, workers per group, decisions by kind."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from elasticd.pool.manager import PoolManager

__all__ = ["PoolCollector"]

DECISIONS = ("keep", "pass", "admit", "fallback", "scale-up", "compaction", "retire", "hung")


class PoolCollector:
    __slots__ = ("_pool",)

    def __init__(self, pool: PoolManager) -> None:
        self._pool = pool

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        occupancy = GaugeMetricFamily("elasticd_worker_occupancy",
                                      "A worker's occupancy in [0, 1]: the max of its smoothed components.",
                                      labels=["tenant", "app", "group", "worker"])
        workers = GaugeMetricFamily("elasticd_group_workers", "Workers in a group (any state).",
                                    labels=["tenant", "app", "group"])
        sizes: dict[tuple[str, str, str], int] = {}
        for key, worker_id, value in self._pool.occupancies():
            occupancy.add_metric([*key, worker_id], value)
            sizes[key] = sizes.get(key, 0) + 1
        for key in self._pool.groups():
            workers.add_metric(list(key), sizes.get(key, 0))
        decisions = CounterMetricFamily("elasticd_pool_decisions", "Pool decisions taken, by kind.",
                                        labels=["decision"])
        counts = self._pool.decision_counts()
        for kind in (*DECISIONS, *sorted(set(counts) - set(DECISIONS))):
            decisions.add_metric([kind], counts.get(kind, 0))
        yield occupancy
        yield workers
        yield decisions
