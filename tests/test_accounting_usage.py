"""GET /v1/tenants/usage's computations (tables) and its two-read shell (a fake clock, then a fake tree)."""

from __future__ import annotations

import pytest

from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup
from elasticd.accounting.parse import Pressure
from elasticd.accounting.sample import Sample
from elasticd.accounting.sampler import Sampler
from elasticd.accounting.usage import (
    DEFAULT_INTERVAL_MS,
    INTERVAL_MS_BOUNDS,
    measure,
    parse_apps_flag,
    parse_interval_ms,
    usage_between,
)
from elasticd.config.model import Resources

LIMITS = Resources(cpu=150.0, memory=1 << 30, io_read=50 << 20, io_write=20 << 20)


def _s(ts, usage=None, memory=None, rbytes=None, wbytes=None, io_avg10=None) -> Sample:
    pressure = None if io_avg10 is None else Pressure(0, io_avg10, 0, 0.0)
    return Sample(ts, cpu_usage_usec=usage, memory_bytes=memory, io_read_bytes=rbytes, io_write_bytes=wbytes,
                  io_pressure=pressure)


@pytest.mark.parametrize(("a", "b", "limits", "expected"), [
    # 1.5 s of CPU in 1 s: 150 % of one CPU; 4 MiB read and 1 MiB written in 2 s.
    (_s(10.0, 1_000_000, 100, 0, 0, 0.0), _s(11.0, 2_500_000, 200, 4 << 20, 1 << 20, 0.12), LIMITS,
     {"cpu_percent": 150.0, "cpu_limit_percent": 150.0, "memory_bytes": 200, "memory_limit_bytes": 1 << 30,
      "io_read_bytes_per_second": 4194304.0, "io_read_limit_bytes_per_second": 50 << 20,
      "io_write_bytes_per_second": 1048576.0, "io_write_limit_bytes_per_second": 20 << 20,
      "io_pressure_avg10": 0.12}),
    (_s(0.0, 0, 5, 0, 0), _s(0.25, 12_345, 5, 1000, 0), Resources(),
     {"cpu_percent": 4.94, "cpu_limit_percent": None, "memory_bytes": 5, "memory_limit_bytes": None,
      "io_read_bytes_per_second": 4000.0, "io_read_limit_bytes_per_second": None,
      "io_write_bytes_per_second": 0.0, "io_write_limit_bytes_per_second": None, "io_pressure_avg10": None}),
    # Without limits (an app): no limit keys. Missing values stay None.
    (_s(0.0), _s(1.0), None,
     {"cpu_percent": None, "memory_bytes": None, "io_read_bytes_per_second": None,
      "io_write_bytes_per_second": None, "io_pressure_avg10": None}),
    # A counter going down: the group was made again between the reads, no rate. No time passed: no rate.
    (_s(0.0, 900, 1, 50, 50), _s(1.0, 100, 1, 10, 60), None,
     {"cpu_percent": None, "memory_bytes": 1, "io_read_bytes_per_second": None,
      "io_write_bytes_per_second": 10.0, "io_pressure_avg10": None}),
    (_s(1.0, 0, 1, 0, 0), _s(1.0, 100, 1, 10, 10), None,
     {"cpu_percent": None, "memory_bytes": 1, "io_read_bytes_per_second": None,
      "io_write_bytes_per_second": None, "io_pressure_avg10": None}),
])
def test_usage_between(a, b, limits, expected):
    result = usage_between(a, b, limits)
    assert result == expected
    assert list(result) == list(expected)  # the key order is the documented one


@pytest.mark.parametrize(("text", "expected"), [
    (None, DEFAULT_INTERVAL_MS), ("", DEFAULT_INTERVAL_MS), ("250", 250), (" 100 ", 100), ("10000", 10000),
    ("99", "interval_ms: 99 is out of range (100 to 10000 ms)"),
    ("10001", "interval_ms: 10001 is out of range (100 to 10000 ms)"),
    ("-5", "interval_ms: -5 is out of range (100 to 10000 ms)"),
    ("1.5", 'interval_ms: "1.5" is not a whole number of milliseconds'),
    ("1s", 'interval_ms: "1s" is not a whole number of milliseconds'),
])
def test_parse_interval_ms(text, expected):
    if isinstance(expected, int):
        assert parse_interval_ms(text) == expected
    else:
        with pytest.raises(ValueError) as info:
            parse_interval_ms(text)
        assert str(info.value) == expected
    assert INTERVAL_MS_BOUNDS == (100, 10000)


@pytest.mark.parametrize(("text", "expected"), [
    (None, False), ("", False), ("0", False), ("false", False), ("1", True), ("true", True), ("YES", True)])
def test_parse_apps_flag(text, expected):
    assert parse_apps_flag(text) is expected


def test_parse_apps_flag_refuses_other_words():
    with pytest.raises(ValueError, match='apps: "maybe" is not a boolean'):
        parse_apps_flag("maybe")


async def test_measure_reads_twice_interval_apart(tmp_path):
    """A fake clock and sleep: the shell's sequence, and the keys it reads with and without apps."""
    clock = [100.0]
    slept: list[float] = []
    reads: list[tuple[float, list[tuple[str, ...]]]] = []
    values = iter([1_000_000, 1_000_000, 1_500_000, 1_250_000])

    def read(paths, now):
        reads.append((now, sorted(paths)))
        return {key: Sample(now, cpu_usage_usec=next(values), memory_bytes=7) for key in sorted(paths)}

    async def sleep(seconds):
        slept.append(seconds)
        clock[0] += seconds

    tenants = {"acme": (tmp_path / "acme", LIMITS, {"shop": tmp_path / "acme" / "shop"})}
    result = await measure(tenants, 500, apps=True, read=read, clock=lambda: clock[0], sleep=sleep)
    assert slept == [0.5]
    both = [("app", "acme", "shop"), ("tenant", "acme")]
    assert reads == [(100.0, both), (100.5, both)]
    assert result["interval_ms"] == 500
    assert result["tenants"]["acme"]["cpu_percent"] == 50.0  # tenant: 1.0 s → 1.25 s of CPU in 0.5 s
    assert result["tenants"]["acme"]["cpu_limit_percent"] == 150.0
    assert result["tenants"]["acme"]["apps"] == {"shop": {
        "cpu_percent": 100.0, "memory_bytes": 7, "io_read_bytes_per_second": None,
        "io_write_bytes_per_second": None, "io_pressure_avg10": None}}
    reads.clear()
    values = iter([1, 2])
    result = await measure(tenants, 500, read=read, clock=lambda: clock[0], sleep=sleep)
    assert [keys for _, keys in reads] == [[("tenant", "acme")]] * 2
    assert "apps" not in result["tenants"]["acme"]


async def test_measure_on_a_fake_tree_through_the_sampler(tmp_path):
    acme = tmp_path / "tenants" / "acme"
    write_fake_cgroup(acme, FakeCgroup(usage_usec=0, memory_current=1 << 20, io={"8:0": (0, 0, 0, 0)}))
    write_fake_cgroup(acme / "shop", FakeCgroup(usage_usec=0))
    sampler = Sampler(sys_root="/nonexistent")
    sampler.set_targets({("tenant", "acme"): acme, ("app", "acme", "shop"): acme / "shop"})
    clock = [0.0]

    async def sleep(seconds):
        # What the kernel would count meanwhile: 0.3 s of CPU, 3 MiB read, 1 MiB written.
        write_fake_cgroup(acme, FakeCgroup(usage_usec=300_000, memory_current=2 << 20,
                                           io={"8:0": (3 << 20, 1 << 20, 10, 5)},
                                           pressure={"io": (1.5, 100, 0.5, 50)}))
        write_fake_cgroup(acme / "shop", FakeCgroup(usage_usec=100_000))
        clock[0] += seconds

    tenants = {"acme": (acme, Resources(cpu=50.0), {"shop": acme / "shop"})}
    result = await measure(tenants, 1000, apps=True, read=sampler.read_now, clock=lambda: clock[0], sleep=sleep)
    assert result == {"interval_ms": 1000, "tenants": {"acme": {
        "cpu_percent": 30.0, "cpu_limit_percent": 50.0, "memory_bytes": 2 << 20, "memory_limit_bytes": None,
        "io_read_bytes_per_second": 3145728.0, "io_read_limit_bytes_per_second": None,
        "io_write_bytes_per_second": 1048576.0, "io_write_limit_bytes_per_second": None,
        "io_pressure_avg10": 1.5,
        "apps": {"shop": {"cpu_percent": 10.0, "memory_bytes": 0, "io_read_bytes_per_second": 0.0,
                          "io_write_bytes_per_second": 0.0, "io_pressure_avg10": 0.0}}}}}
    assert sampler.latest == {}  # the usage reads are not ticks
    sampler.close()
