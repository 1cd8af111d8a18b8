"""The elasticd_tenant_* and elasticd_app_* metric families: a prometheus-client custom collector over the
sampler's latest pass and the limits in force. It reads no file: a scrape costs the same however often it
comes, and cgroups are read once per tick whatever the number of scrapers.

Names follow Prometheus (base units, ``_total`` counters) and DESIGN.md. A value that is missing (file
absent, controller off, limit unlimited) is left out rather than exported as NaN or 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample as PromSample

from elasticd.config.model import Resources

from .sample import MEMORY_EVENTS, Sample

__all__ = ["AccountingCollector", "SampleSource"]


class SampleSource(Protocol):
    """What the collector needs of the Sampler."""

    @property
    def latest(self) -> Mapping[tuple[str, ...], Sample]: ...

    last_duration: float | None
    last_success: float | None


def _sec(usec: int | None) -> float | None:
    return None if usec is None else usec / 1e6


# (name after the prefix, type, help, value of a Sample or None, for apps too)
_Getter = Callable[[Sample], float | None]
_USAGE: tuple[tuple[str, str, str, _Getter, bool], ...] = (
    ("cpu_usage_seconds_total", "counter", "CPU time used (cpu.stat usage_usec).",
     lambda s: _sec(s.cpu_usage_usec), True),
    ("cpu_user_seconds_total", "counter", "CPU time used in user mode (cpu.stat user_usec).",
     lambda s: _sec(s.cpu_user_usec), True),
    ("cpu_system_seconds_total", "counter", "CPU time used in kernel mode (cpu.stat system_usec).",
     lambda s: _sec(s.cpu_system_usec), True),
    # Throttling is the effect of the tenant's cpu.max; app leaves have no cpu.max, so theirs stays 0.
    ("cpu_throttled_seconds_total", "counter", "Time throttled by the CPU limit (cpu.stat throttled_usec).",
     lambda s: _sec(s.cpu_throttled_usec), False),
    ("cpu_throttled_periods_total", "counter", "CPU limit periods in which the group was throttled "
     "(cpu.stat nr_throttled).", lambda s: s.cpu_throttled_periods, False),
    ("cpu_periods_total", "counter", "CPU limit periods elapsed with runnable tasks (cpu.stat nr_periods).",
     lambda s: s.cpu_periods, False),
    ("memory_bytes", "gauge", "Memory in use, page cache included (memory.current).",
     lambda s: s.memory_bytes, True),
    ("memory_swap_bytes", "gauge", "Swap in use (memory.swap.current).", lambda s: s.swap_bytes, True),
    ("pids", "gauge", "Tasks (processes and threads) in the group (pids.current).", lambda s: s.pids, True),
    ("io_read_bytes_total", "counter", "Bytes read from block devices (io.stat rbytes, all disks).",
     lambda s: s.io_read_bytes, True),
    ("io_write_bytes_total", "counter", "Bytes written to block devices (io.stat wbytes, all disks).",
     lambda s: s.io_write_bytes, True),
    ("io_read_operations_total", "counter", "Read operations on block devices (io.stat rios, all disks).",
     lambda s: s.io_read_ops, True),
    ("io_write_operations_total", "counter", "Write operations on block devices (io.stat wios, all disks).",
     lambda s: s.io_write_ops, True),
)

_PSI = (("cpu", "cpu_pressure"), ("memory", "memory_pressure"), ("io", "io_pressure"))


def _limit_families(prefix: str, limits: Mapping[str, Resources]) -> Iterator[Metric]:
    table: tuple[tuple[str, str, Callable[[Resources], float | None]], ...] = (
        ("cpu_limit_cores", "CPU limit in cores (cpu.max quota / period: 150% is 1.5); absent when unlimited.",
         lambda r: None if r.cpu is None else r.cpu / 100),
        ("memory_limit_bytes", "Memory limit (memory.max); absent when unlimited.", lambda r: r.memory),
        ("memory_swap_limit_bytes", "Swap limit (memory.swap.max); absent when unlimited.", lambda r: r.swap),
        ("pids_limit", "Task limit (pids.max); absent when unlimited.", lambda r: r.pids),
        ("io_weight", "I/O weight (io.weight default, 1-10000; 100 when not configured).",
         lambda r: 100 if r.io_weight is None else r.io_weight),
        ("io_read_limit_bytes_per_second", "Read bandwidth limit on each disk of the apps' roots (io.max rbps); "
         "absent when unlimited.", lambda r: r.io_read),
        ("io_write_limit_bytes_per_second", "Write bandwidth limit on each disk of the apps' roots (io.max wbps); "
         "absent when unlimited.", lambda r: r.io_write),
    )
    for suffix, help_text, get in table:
        family = GaugeMetricFamily(f"{prefix}_{suffix}", help_text, labels=["tenant"])
        for tenant, resources in limits.items():
            value = get(resources)
            if value is not None:
                family.add_metric([tenant], value)
        yield family


class AccountingCollector(Collector):
    """The elasticd_tenant_* and elasticd_app_* families, from the sampler's latest pass and the limits in
    force (``limits_provider``: tenant → Resources, run-time overrides included)."""

    __slots__ = ("limits_provider", "sampler", "shown")

    def __init__(self, sampler: SampleSource, limits_provider: Callable[[], Mapping[str, Resources]],
                 shown: Callable[[str, str], bool] | None = None) -> None:
        self.sampler = sampler
        self.limits_provider = limits_provider
        self.shown = shown  # which apps' own series are exported (accounting/activity.py); None: every app's

    def describe(self) -> list[Metric]:
        return []  # names vary with the samples: nothing to check at registration, no collect() then

    def collect(self) -> Iterator[Metric]:
        latest = self.sampler.latest  # one pass's dict, replaced whole by the sampler: consistent
        groups: dict[str, list[tuple[dict[str, str], Sample]]] = {"tenant": [], "app": []}
        shown = self.shown
        for key, sample in latest.items():
            if key[0] == "tenant":
                groups["tenant"].append(({"tenant": key[1]}, sample))
            elif key[0] == "app" and (shown is None or shown(key[1], key[2])):
                groups["app"].append(({"tenant": key[1], "app": key[2]}, sample))
        for kind, rows in groups.items():
            prefix = f"elasticd_{kind}"
            labels = ["tenant"] if kind == "tenant" else ["tenant", "app"]
            yield from _usage_families(prefix, labels, rows, kind == "tenant")
        yield from _limit_families("elasticd_tenant", self.limits_provider())
        duration = self.sampler.last_duration
        if duration is not None:
            yield GaugeMetricFamily("elasticd_sampler_duration_seconds",
                                    "Wall time of the last cgroup sampling pass.", value=duration)
        success = self.sampler.last_success
        if success is not None:
            yield GaugeMetricFamily("elasticd_sampler_last_success_timestamp_seconds",
                                    "When the cgroup sampler last finished a pass (Unix time).", value=success)
        yield GaugeMetricFamily("elasticd_sampler_cgroups", "Cgroups sampled (tenants and apps), idle ones too.",
                                value=len(latest))
        yield GaugeMetricFamily("elasticd_apps_shown", "Apps whose own series this page exports (active within "
                                "server.metrics.window, or every app with app_series: all).",
                                value=len(groups["app"]))


def _family(name: str, kind: str, help_text: str, labels: list[str]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


def _usage_families(prefix: str, labels: list[str], rows: list[tuple[dict[str, str], Sample]],
                    tenant: bool) -> Iterator[Metric]:
    # Samples are appended directly (add_metric would rebuild the label dict of every sample): with 1,000
    # apps a scrape holds ~25,000 of them. Sample(name, labels, value) has this shape in 0.16 and 0.26.
    for suffix, kind, help_text, get, for_apps in _USAGE:
        if not (tenant or for_apps):
            continue
        name = f"{prefix}_{suffix}"
        family = _family(name, kind, help_text, labels)
        append = family.samples.append
        for label_values, sample in rows:
            value = get(sample)
            if value is not None:
                append(PromSample(name, label_values, value))
        yield family
    events = CounterMetricFamily(f"{prefix}_memory_events_total",
                                 "Memory events (memory.events): low, high, max (limit hit), oom, oom_kill.",
                                 labels=[*labels, "event"])
    name = f"{prefix}_memory_events_total"
    for label_values, sample in rows:
        if sample.memory_events is not None:
            for event in MEMORY_EVENTS:
                count = sample.memory_events.get(event)
                if count is not None:
                    events.samples.append(PromSample(name, {**label_values, "event": event}, count))
    yield events
    for resource, attr in _PSI:
        waiting = f"{prefix}_pressure_{resource}_waiting_seconds_total"
        stalled = f"{prefix}_pressure_{resource}_stalled_seconds_total"
        some = CounterMetricFamily(waiting, f"Time some tasks waited for {resource} ({resource}.pressure some "
                                            "total).", labels=labels)
        full = CounterMetricFamily(stalled, f"Time all non-idle tasks were stalled on {resource} at once "
                                            f"({resource}.pressure full total).", labels=labels)
        for label_values, sample in rows:
            pressure = getattr(sample, attr)
            if pressure is None:
                continue
            some.samples.append(PromSample(waiting, label_values, pressure.some_total_usec / 1e6))
            if pressure.full_total_usec is not None:
                full.samples.append(PromSample(stalled, label_values, pressure.full_total_usec / 1e6))
        yield some
        yield full


