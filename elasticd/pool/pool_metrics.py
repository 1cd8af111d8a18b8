"""The pool's Prometheus metrics: occupancy per worker, workers per group, decisions by group and kind, which
cgroup limit holds a group's scale-up, cold starts (scale to zero) with their duration, and live moves by
outcome and duration."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from elasticd.histogram import cumulative_buckets
from elasticd.pool.idle import COLD_BOUNDS, ColdStarts
from elasticd.pool.manager import LIMITED_RESOURCES, PoolManager
from elasticd.pool.move_machine import DURATION_BOUNDS, MoveStats, Outcome
from elasticd.supervisor.lifecycle import WorkerState

__all__ = ["PoolCollector"]

DECISIONS = ("keep", "pass", "admit", "fallback", "scale-up", "held", "compaction", "move", "move-aborted", "retire",
             "hung", "recycle")


class PoolCollector(Collector):
    __slots__ = ("_pool", "_shown")

    def __init__(self, pool: PoolManager, shown: Callable[[str, str], bool] | None = None) -> None:
        self._pool = pool
        self._shown = shown  # which apps' groups show a worker count of 0 (accounting/activity.py); None: all

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        occupancy = GaugeMetricFamily("elasticd_worker_occupancy",
                                      "A worker's occupancy in [0, 1]: the max of its smoothed components.",
                                      labels=["tenant", "app", "group", "worker"])
        sizes: dict[tuple[str, str, str], int] = {}
        for key, worker_id, value in self._pool.occupancies():
            occupancy.add_metric([*key, worker_id], value)
            sizes[key] = sizes.get(key, 0) + 1
        # (Each family is yielded once made: the page is collected on the loop a family at a time, loop_slices.py.)
        yield occupancy
        workers = GaugeMetricFamily("elasticd_group_workers", "Workers in a group, by the state of their life "
                                    "(running always; another state while some worker is in it).",
                                    labels=["tenant", "app", "group", "state"])
        shown = self._shown
        states = self._pool.worker_states()
        for key in self._pool.groups():
            counted = states.get(key)
            if counted or shown is None or shown(key[0], key[1]):
                # (only the states some worker is in, and running: 8 series a group, for thousands of groups at
                # rest, would be most of a scrape; an alert on failed or backoff reads a missing series as none)
                running = WorkerState.RUNNING.value
                workers.add_metric([*key, running], (counted or {}).get(running, 0))
                for name, count in sorted((counted or {}).items()):
                    if name != running:
                        workers.add_metric([*key, name], count)
        yield workers
        decisions = CounterMetricFamily("elasticd_pool_decisions", "Pool decisions taken, by group and kind.",
                                        labels=["tenant", "app", "group", "decision"])
        # A group that never had a worker nor a decision (at zero, idle: most of a host of idle tenants) has no
        # series but its worker count: 11 zeros for each of a thousand such groups is most of a scrape.
        for key, counts in self._pool.decision_counts().items():
            if not counts and not sizes.get(key):
                continue
            for kind in (*DECISIONS, *sorted(set(counts) - set(DECISIONS))):
                decisions.add_metric([*key, kind], counts.get(kind, 0))
        yield decisions
        bound = GaugeMetricFamily("elasticd_group_limit_bound",
                                  "1 while the tenant's cgroup limit on this resource holds the group's scale-up.",
                                  labels=["tenant", "app", "group", "resource"])
        for key, resources in self._pool.limits_bound().items():
            if not sizes.get(key) and not resources:
                continue  # (a group with no worker grows only by a cold start, which no limit holds)
            for resource in LIMITED_RESOURCES:
                bound.add_metric([*key, resource], 1.0 if resource in resources else 0.0)
        yield bound
        yield from _cold_starts(self._pool.cold_starts())
        stats: MoveStats | None = getattr(self._pool.mover, "stats", None)
        if stats is not None:
            yield from _moves(stats, [key for key in self._pool.groups() if sizes.get(key)])


def _cold_starts(cold: dict[tuple[str, str, str], ColdStarts]) -> Iterator[Metric]:
    starts = CounterMetricFamily("elasticd_cold_starts", "Workers started for a request that found its group at "
                                 "zero workers (scale to zero).", labels=["tenant", "app", "group"])
    duration = HistogramMetricFamily("elasticd_cold_start_seconds", "Seconds from the request that found the group "
                                     "at zero to its worker accepting connections.", labels=["tenant", "app", "group"])
    for key, stats in sorted(cold.items()):
        if not stats.count:
            continue  # (a series per group never cold-started would be a scrape of zeros on an idle host)
        starts.add_metric(list(key), stats.count)
        duration.add_metric(list(key), cumulative_buckets(COLD_BOUNDS, stats.buckets, stats.count),
                            sum_value=stats.sum)
    yield starts
    yield duration


def _moves(stats: MoveStats, groups: list[tuple[str, str, str]]) -> Iterator[Metric]:
    moves = CounterMetricFamily("elasticd_moves", "Live moves of a user between two workers, by how they ended.",
                                labels=["tenant", "app", "outcome"])
    apps = sorted({(tenant, app) for tenant, app, _ in groups} | {(t, a) for t, a, _ in stats.outcomes})
    for tenant, app in apps:  # every outcome of every app, 0 until it happens (rate() needs the series)
        for outcome in Outcome:
            moves.add_metric([tenant, app, outcome.value], stats.outcomes.get((tenant, app, outcome.value), 0))
    yield moves
    duration = HistogramMetricFamily("elasticd_move_duration_seconds",
                                     "Seconds from a move's flag (its user's requests held) to its switch or abort.")
    duration.add_metric([], cumulative_buckets(DURATION_BOUNDS, stats.buckets, stats.count), sum_value=stats.sum)
    yield duration
