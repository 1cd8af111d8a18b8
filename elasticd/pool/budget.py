"""The group's cgroup budget: what the tenant's cgroup can still give one more worker (seed 000 + ADR-0010).

Pure: the sampler's recent samples of the tenant's cgroup (oldest first) and the limits elasticd wrote in, a
``Budget`` out; then ``holds`` says which limits bind, each with its numbers. The policies read two things
from it:

- the CPU *wall* of one worker: ``min(1 core, the tenant's cpu.max in cores)`` — a Python worker cannot use
  more than one core (the GIL), and none can use more than its cgroup's quota, so a worker at 0.5 core under a
  0.5-core quota is saturated (``evaluator.row_components`` divides by it);
- the *holds*: a scale-up that cannot help is held, not made. Every worker of a tenant shares the tenant's
  cpu.max, memory.max and pids.max, so when the tenant is at its quota a new worker adds contention and
  memory, not capacity; when memory.current plus one more worker would pass memory.max, it adds OOM kills.

Two windows, on purpose. CPU is read over the last ``CPU_SAMPLES`` samples (two sampler intervals): the hold
is a veto on a scale-up the smoothed occupancy has just asked for, and the occupancy's own 6-report window
lags the very saturation the veto must see (at the moment the smoothed occupancy crosses its threshold, the
load has run about half that window). Memory events (``max``, ``oom_kill``) are counted over every sample
given (the shell keeps about one smoothing window of them): an OOM kill a minute ago still says "no room".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from elasticd.config.model import PoolSettings, Resources

if TYPE_CHECKING:  # only the type: elasticd.accounting's package would bring the sampler (a shell) along
    from elasticd.accounting.sample import Sample

__all__ = ["CPU_SAMPLES", "Budget", "CgroupReading", "LimitBinding", "budget_of", "cpu_wall", "enforced",
           "limit_bindings"]

CPU_SAMPLES = 3  # the latest sample and the two before it: a rate over two sampler intervals


@dataclass(frozen=True, slots=True)
class CgroupReading:
    """What the tenant's cgroup measured over the window (None where a file was missing or a counter reset)."""

    span: float  # seconds between the samples the CPU rate comes from
    cpu_cores: float | None  # usage rate, in cores
    throttled_share: float | None  # throttled periods / periods over the same span
    memory: int | None  # memory.current, latest
    memory_events: Mapping[str, int] = field(default_factory=dict)  # increases of high/max/oom_kill
    pids: int | None = None  # pids.current, latest
    pressure: Mapping[str, float] = field(default_factory=dict)  # PSI "some avg10" (percent) of cpu/memory/io
    throttled_rate: float | None = None  # throttled_usec over the span: seconds throttled per second
    app_cpu_cores: float | None = None  # the app leaf's share of the tenant's usage (the leaf has no limit)


@dataclass(frozen=True, slots=True)
class Budget:
    cpu_quota: float | None  # cores; None: no cpu.max (or cgroups not enforced)
    memory_max: int | None
    pids_max: int | None
    reading: CgroupReading | None  # None: fewer than two samples yet, or cgroups not enforced
    # Enforced, but no reading to decide on yet (fewer than two samples: just started, a new tenant; or a
    # cpu.max in force and no CPU rate): a scale-up waits for one — two sampler intervals — rather than being
    # made blind. ``enforced`` gives no cpu quota where the cpu controller is missing: without one the
    # reading never waits for a rate.
    pending: bool = False

    @property
    def wall(self) -> float:
        return cpu_wall(self.cpu_quota)

    def numbers(self) -> dict[str, Any]:
        """For the decision journal: what the tenant's cgroup said when the pool decided."""
        r = self.reading
        return {"cpu_quota_cores": self.cpu_quota, "memory_max_bytes": self.memory_max, "pids_max": self.pids_max,
                "cpu_usage_cores": None if r is None or r.cpu_cores is None else round(r.cpu_cores, 4),
                "throttled_share": None if r is None or r.throttled_share is None else round(r.throttled_share, 4),
                "memory_bytes": None if r is None else r.memory, "pids": None if r is None else r.pids,
                "span_seconds": None if r is None else round(r.span, 3),
                "app_usage_cores": None if r is None or r.app_cpu_cores is None else round(r.app_cpu_cores, 4),
                "pressure_avg10": {} if r is None else dict(r.pressure)}


UNLIMITED = Budget(None, None, None, None)  # cgroups not enforced: nothing binds, the wall is one core


@dataclass(frozen=True, slots=True)
class LimitBinding:
    resource: str  # cpu | memory | pids
    reason: str
    numbers: Mapping[str, Any]


def cpu_wall(quota_cores: float | None) -> float:
    return 1.0 if quota_cores is None else min(1.0, quota_cores)


def enforced(resources: Resources, controllers: Collection[str]) -> Resources:
    """The limits the kernel enforces in a group with these controllers: one whose controller is missing
    binds nothing (and is no CPU wall)."""
    return replace(resources, cpu=resources.cpu if "cpu" in controllers else None,
                   memory=resources.memory if "memory" in controllers else None,
                   pids=resources.pids if "pids" in controllers else None)


def _delta(new: int | None, old: int | None) -> int | None:
    if new is None or old is None or new < old:  # a missing file, or a counter reset (a re-made cgroup)
        return None
    return new - old


def _cpu_rate(samples: Sequence[Sample]) -> tuple[Sample, Sample] | None:
    """The oldest and newest of the last CPU_SAMPLES samples that have cpu.stat: a file that appeared late (a
    controller just enabled) or one unreadable tick does not blind the reading for two intervals."""
    recent = [samples[i] for i in range(-min(CPU_SAMPLES, len(samples)), 0)]  # no slicing: a deque is given
    with_cpu = [s for s in recent if s.cpu_usage_usec is not None]
    return (with_cpu[0], with_cpu[-1]) if len(with_cpu) >= 2 and with_cpu[-1].ts > with_cpu[0].ts else None


def _cores(pair: tuple[Sample, Sample] | None) -> float | None:
    if pair is None:
        return None
    used = _delta(pair[1].cpu_usage_usec, pair[0].cpu_usage_usec)
    return used / 1e6 / (pair[1].ts - pair[0].ts) if used is not None else None


def budget_of(samples: Sequence[Sample], resources: Resources, app_samples: Sequence[Sample] = ()) -> Budget:
    """``samples``: the tenant cgroup's recent samples, oldest first; ``resources``: the limits in force;
    ``app_samples``: the app leaf's, for the numbers only (the leaf carries no limit of its own)."""
    quota = resources.cpu / 100.0 if resources.cpu is not None else None
    if len(samples) < 2:
        return Budget(quota, resources.memory, resources.pids, None, pending=True)
    last = samples[-1]
    pair = _cpu_rate(samples)
    cpu_cores = _cores(pair)
    span = pair[1].ts - pair[0].ts if pair is not None else 0.0
    throttled = throttled_rate = None
    if pair is not None:
        first_cpu, last_cpu = pair
        periods = _delta(last_cpu.cpu_periods, first_cpu.cpu_periods)
        throttled_periods = _delta(last_cpu.cpu_throttled_periods, first_cpu.cpu_throttled_periods)
        if periods is not None and throttled_periods is not None:
            throttled = throttled_periods / periods if periods else 0.0
        throttled_usec = _delta(last_cpu.cpu_throttled_usec, first_cpu.cpu_throttled_usec)
        throttled_rate = throttled_usec / 1e6 / span if throttled_usec is not None else None
    events: dict[str, int] = {}
    first = samples[0]
    if last.memory_events is not None and first.memory_events is not None:
        for name in ("high", "max", "oom_kill"):
            grew = _delta(last.memory_events.get(name), first.memory_events.get(name))
            if grew is not None:
                events[name] = grew
    pressure = {name: p.some_avg10 for name, p in (("cpu", last.cpu_pressure), ("memory", last.memory_pressure),
                                                    ("io", last.io_pressure)) if p is not None}
    app_cores = _cores(_cpu_rate(app_samples)) if len(app_samples) >= 2 else None
    reading = CgroupReading(span, cpu_cores, throttled, last.memory_bytes, events, last.pids, pressure, throttled_rate,
                      app_cores)
    # A quota in force with no rate to hold it against (an unreadable tick, a counter reset): wait for one.
    return Budget(quota, resources.memory, resources.pids, reading, pending=quota is not None and cpu_cores is None)


def limit_bindings(budget: Budget, pool: PoolSettings, *, worker_rss: float | None,
                   worker_pids: float | None) -> list[LimitBinding]:
    """The limits that would leave one more worker with nothing, each with the numbers behind it.

    ``worker_rss``: the group's mean worker RSS (bytes) from its latest readings; ``worker_pids``: the mean
    processes per worker of the tenant. None where unknown (then only the current use is compared).
    """
    reading = budget.reading
    if reading is None:
        return []
    found: list[LimitBinding] = []
    # The numbers are built only for a limit that binds: this runs at every report and every login.
    quota = budget.cpu_quota
    if quota is not None and reading.cpu_cores is not None:
        used = reading.cpu_cores / quota
        throttled = reading.throttled_share
        over = used >= pool.cpu_held_at
        if over or (throttled is not None and throttled > pool.throttled_held_at):
            numbers: dict[str, Any] = {
                "usage_cores": round(reading.cpu_cores, 4), "quota_cores": round(quota, 4),
                "usage_share": round(used, 4), "throttled_share": None if throttled is None else round(throttled, 4),
                "span_seconds": round(reading.span, 3), "cpu_pressure_avg10": reading.pressure.get("cpu"),
                "throttled_seconds_per_second": None if reading.throttled_rate is None
                else round(reading.throttled_rate, 4),
                "app_usage_cores": None if reading.app_cpu_cores is None else round(reading.app_cpu_cores, 4)}
            why = (f"the tenant uses {used:.0%} of its cpu.max ({quota:g} cores; held at {pool.cpu_held_at:.0%})"
                   if over else f"the tenant was throttled in {throttled:.0%} of its periods (held over "
                                f"{pool.throttled_held_at:.0%})")
            found.append(LimitBinding("cpu", f"{why}: a new worker would share the same quota", numbers))
    memory_max = budget.memory_max
    if memory_max is not None and reading.memory is not None:
        projected = reading.memory + (worker_rss or 0.0)
        hit = reading.memory_events.get("max", 0)
        killed = reading.memory_events.get("oom_kill", 0)
        if killed or hit or projected > pool.memory_held_at * memory_max:
            numbers = {"memory_bytes": reading.memory,
                       "worker_rss_bytes": None if worker_rss is None else int(worker_rss),
                       "memory_max_bytes": memory_max, "projected_share": round(projected / memory_max, 4),
                       "events": dict(reading.memory_events), "memory_pressure_avg10": reading.pressure.get("memory")}
            if killed or hit:
                what = f"{killed} OOM kill(s)" if killed else f"memory.max reached {hit} time(s)"
                why = f"the tenant had {what} within the window: a new worker would add OOM kills, not capacity"
            else:
                why = (f"memory.current plus one more worker would be {projected / memory_max:.0%} of memory.max "
                       f"(held over {pool.memory_held_at:.0%})")
            found.append(LimitBinding("memory", why, numbers))
    pids_max = budget.pids_max
    if pids_max is not None and reading.pids is not None:
        projected = reading.pids + (worker_pids or 0.0)
        if projected > pool.pids_held_at * pids_max:
            found.append(LimitBinding("pids", f"pids.current plus one more worker would be "
                                              f"{projected / pids_max:.0%} of "
                                      f"pids.max (held over {pool.pids_held_at:.0%})",
                              {"pids": reading.pids, "worker_pids": worker_pids, "pids_max": pids_max,
                               "projected_share": round(projected / pids_max, 4)}))
    return found
