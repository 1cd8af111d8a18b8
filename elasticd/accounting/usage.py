"""GET /v1/tenants/usage: what each tenant (and app) uses over an interval, beside the limits in force.

Two reads N ms apart; rates are differences over the interval. The computations are pure
(``usage_between``, ``usage_report``); ``measure`` is the thin shell that reads and waits, whatever the reader
reads: the tenants' cgroups (``Sampler.read_now``), or their workers' process trees when there are no cgroups
(``process_trees.read_process_trees``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from elasticd.config.model import Resources

from .sample import Sample
from .sampler import Key, read_once

__all__ = [
    "DEFAULT_INTERVAL_MS",
    "INTERVAL_MS_BOUNDS",
    "TenantTargets",
    "measure",
    "parse_apps_flag",
    "parse_interval_ms",
    "read_samples",
    "usage_between",
    "usage_report",
]

DEFAULT_INTERVAL_MS = 1000
# Under 100 ms the CPU figure is mostly scheduler noise; over 10 s an HTTP client has long given up.
INTERVAL_MS_BOUNDS = (100, 10000)

# Where a group is read: a cgroup's directory, or the pids whose process trees stand for it.
Where = TypeVar("Where")
# tenant → (its cgroup, the limits in force, app → its leaf)
TenantTargets = tuple[Path, Resources, Mapping[str, Path]]
Reader = Callable[[Mapping[Key, Where], float], Mapping[Key, Sample]]


def parse_interval_ms(text: str | None) -> int:
    """The ``interval_ms`` query value: absent or empty → DEFAULT_INTERVAL_MS; ValueError with the reason."""
    if text is None or text.strip() == "":
        return DEFAULT_INTERVAL_MS
    low, high = INTERVAL_MS_BOUNDS
    try:
        value = int(text.strip())
    except ValueError:
        raise ValueError(f'interval_ms: "{text}" is not a whole number of milliseconds') from None
    if not low <= value <= high:
        raise ValueError(f"interval_ms: {value} is out of range ({low} to {high} ms)")
    return value


def parse_apps_flag(text: str | None) -> bool:
    """The ``apps`` query value (per-app breakdown): absent, "", 0, false, no → False; 1, true, yes → True."""
    if text is None:
        return False
    value = text.strip().lower()
    if value in ("", "0", "false", "no"):
        return False
    if value in ("1", "true", "yes"):
        return True
    raise ValueError(f'apps: "{text}" is not a boolean (1/0, true/false)')


def _rate(before: int | None, after: int | None, seconds: float) -> float | None:
    # A counter that went down belongs to a group removed and made again between the reads: no rate.
    if before is None or after is None or seconds <= 0 or after < before:
        return None
    return (after - before) / seconds


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def usage_between(a: Sample, b: Sample, limits: Resources | None = None) -> dict[str, Any]:
    """Usage from sample ``a`` to the later ``b``; with ``limits``, each figure has its limit beside it
    (None: unlimited). CPU is percent of one CPU (200 = two CPUs busy), memory is ``b``'s, rates are per
    second, io_pressure_avg10 is io.pressure "some" avg10 of ``b`` (percent of the last 10 s)."""
    seconds = b.ts - a.ts
    cpu = _rate(a.cpu_usage_usec, b.cpu_usage_usec, seconds)
    read = _rate(a.io_read_bytes, b.io_read_bytes, seconds)
    write = _rate(a.io_write_bytes, b.io_write_bytes, seconds)
    usage: dict[str, Any] = {"cpu_percent": _round(None if cpu is None else cpu / 1e4, 2)}
    if limits is not None:
        usage["cpu_limit_percent"] = limits.cpu
    usage["memory_bytes"] = b.memory_bytes
    if limits is not None:
        usage["memory_limit_bytes"] = limits.memory
    usage["io_read_bytes_per_second"] = _round(read, 1)
    if limits is not None:
        usage["io_read_limit_bytes_per_second"] = limits.io_read
    usage["io_write_bytes_per_second"] = _round(write, 1)
    if limits is not None:
        usage["io_write_limit_bytes_per_second"] = limits.io_write
    usage["io_pressure_avg10"] = b.io_pressure.some_avg10 if b.io_pressure is not None else None
    return usage


def usage_report(tenants: Mapping[str, tuple[Any, Resources, Mapping[str, Any]]], first: Mapping[Key, Sample],
                 second: Mapping[Key, Sample], interval_ms: int, apps: bool) -> dict[str, Any]:
    """The JSON body: ``{"interval_ms": N, "tenants": {t: {usage..., ["apps": {a: {usage...}}]}}}``.
    A group missing from either read has every usage figure None (its limits are still given)."""
    empty = Sample(0.0)
    report: dict[str, Any] = {}
    for tenant, (_path, limits, app_paths) in tenants.items():
        key = ("tenant", tenant)
        entry = usage_between(first.get(key, empty), second.get(key, empty), limits)
        if apps:
            entry["apps"] = {
                app: usage_between(first.get(("app", tenant, app), empty), second.get(("app", tenant, app), empty))
                for app in app_paths
            }
        report[tenant] = entry
    return {"interval_ms": interval_ms, "tenants": report}


def read_samples(paths: Mapping[Key, Path], now: float) -> dict[Key, Sample]:
    """A Reader with transient descriptors (the daemon passes its Sampler's read_now instead)."""
    return {key: read_once(path, now) for key, path in paths.items()}


async def measure(
    tenants: Mapping[str, tuple[Where, Resources, Mapping[str, Where]]],
    interval_ms: int,
    *,
    read: Reader[Where],
    apps: bool = False,
    threaded: bool = False,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
) -> dict[str, Any]:
    """Read the tenant groups (and with ``apps`` their leaves), wait ``interval_ms``, read them again.
    ``threaded``: each read in a thread, for a reader whose cost the tenants set (a /proc walk grows with every
    process a tenant forks; the cgroup reads are a fixed few files per group)."""
    paths: dict[Key, Where] = {}
    for tenant, (path, _limits, app_paths) in tenants.items():
        paths[("tenant", tenant)] = path
        if apps:
            for app, leaf in app_paths.items():
                paths[("app", tenant, app)] = leaf
    async def once() -> Mapping[Key, Sample]:
        return await asyncio.to_thread(read, paths, clock()) if threaded else read(paths, clock())

    first = await once()
    await sleep(interval_ms / 1000)
    second = await once()
    return usage_report(tenants, first, second, interval_ms, apps)
