"""The accounting parsers, as tables of real kernel output (the kernel and where each text comes from are
named; the cgroup v2 root's files were read on this project's development host, Linux 6.18)."""

from __future__ import annotations

import pytest

from elasticd.accounting.parse import (
    Pressure,
    cpu_stat_ints,
    flat_keyed_ints,
    io_totals,
    parse_flat_keyed,
    parse_io_stat,
    parse_pressure,
    parse_single,
)
from elasticd.accounting.sample import FILES, Sample, SampleBuilder, sample_from_texts

# cpu.stat of the cgroup2 root, Linux 6.18: the root has no cpu.max, so no throttling keys.
CPU_STAT_ROOT_6_18 = "usage_usec 347630182\nuser_usec 289401352\nsystem_usec 58228830\nnice_usec 0\n"
# A group with the cpu controller on, Linux 6.1 (Debian bookworm): throttling and burst keys, core_sched.
CPU_STAT_6_1 = ("usage_usec 2093435\nuser_usec 1378620\nsystem_usec 714815\ncore_sched.force_idle_usec 0\n"
                "nr_periods 4121\nnr_throttled 37\nthrottled_usec 1864212\nnr_bursts 0\nburst_usec 0\n")
# Linux 5.10 (Debian bullseye): no nice_usec, no bursts yet.
CPU_STAT_5_10 = ("usage_usec 81340806\nuser_usec 55542412\nsystem_usec 25798394\nnr_periods 14027\n"
                 "nr_throttled 291\nthrottled_usec 13577372\n")

MEMORY_EVENTS_6_1 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n"
MEMORY_EVENTS_5_10 = "low 0\nhigh 3\nmax 0\noom 0\noom_kill 0\n"

# io.stat with an NVMe disk, the dm-crypt volume on it (253:0) and a SATA disk, Linux 6.1.
IO_STAT_3_DEVICES = ("259:0 rbytes=1196032 wbytes=8192 rios=58 wios=2 dbytes=0 dios=0\n"
                     "253:0 rbytes=1196032 wbytes=8192 rios=58 wios=2 dbytes=0 dios=0\n"
                     "8:0 rbytes=4096 wbytes=0 rios=1 wios=0 dbytes=512 dios=1\n")
# With the iocost controller configured: cost.* keys after dios, Linux 6.1.
IO_STAT_IOCOST = ("8:16 rbytes=1459200 wbytes=314773504 rios=192 wios=353 dbytes=0 dios=0 cost.vrate=100.00 "
                  "cost.usage=1416 cost.wait=0 cost.indebt=0 cost.indelay=0\n")
# Linux 4.19 (Debian buster): no discard keys yet.
IO_STAT_4_19 = "8:0 rbytes=90112 wbytes=45056 rios=22 wios=11\n"

# cpu.pressure and io.pressure of the cgroup2 root, Linux 6.18 (the root's cpu "full" is all zeros).
CPU_PRESSURE_6_18 = ("some avg10=1.40 avg60=3.30 avg300=4.30 total=27680324\n"
                     "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
IO_PRESSURE_6_18 = ("some avg10=0.00 avg60=0.20 avg300=0.31 total=4711657\n"
                    "full avg10=0.00 avg60=0.17 avg300=0.27 total=4320234\n")
# cpu.pressure before Linux 5.13: only a "some" line.
CPU_PRESSURE_5_10 = "some avg10=12.51 avg60=8.02 avg300=2.75 total=395201928\n"


@pytest.mark.parametrize(("text", "expected"), [
    (CPU_STAT_ROOT_6_18, {"usage_usec": 347630182, "user_usec": 289401352, "system_usec": 58228830,
                          "nice_usec": 0}),
    (CPU_STAT_5_10, {"usage_usec": 81340806, "user_usec": 55542412, "system_usec": 25798394,
                     "nr_periods": 14027, "nr_throttled": 291, "throttled_usec": 13577372}),
    (MEMORY_EVENTS_6_1, {"low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 1, "oom_group_kill": 0}),
    ("", {}),
    # Malformed lines are skipped, the rest is kept.
    ("usage_usec 10\nbogus\nuser_usec x\nsystem_usec 3\n", {"usage_usec": 10, "system_usec": 3}),
    ("a 1 2\nb 4\n", {"b": 4}),
])
def test_parse_flat_keyed(text, expected):
    assert parse_flat_keyed(text) == expected


@pytest.mark.parametrize(("text", "keys", "expected"), [
    (CPU_STAT_6_1, ("usage_usec", "nr_throttled", "throttled_usec"), [2093435, 37, 1864212]),
    (CPU_STAT_ROOT_6_18, ("usage_usec", "nr_periods"), [347630182, None]),  # absent → None
    ("usage_usec 10\nbogus\nuser_usec x\n", ("usage_usec", "user_usec"), [10, None]),
    ("usage_usec", ("usage_usec",), [None]),  # a key with no value after it
])
def test_flat_keyed_ints(text, keys, expected):
    assert flat_keyed_ints(text, keys) == expected


@pytest.mark.parametrize(("text", "expected"), [
    (CPU_STAT_6_1, [2093435, 1378620, 714815, 4121, 37, 1864212]),
    (CPU_STAT_5_10, [81340806, 55542412, 25798394, 14027, 291, 13577372]),
    (CPU_STAT_ROOT_6_18, [347630182, 289401352, 58228830, None, None, None]),
    # Off the kernel's order, or broken: the key-by-key path gives what it can.
    ("user_usec 1\nusage_usec 2\nnr_throttled 4\nnr_periods 3\n", [2, 1, None, 3, 4, None]),
    ("usage_usec 5\nuser_usec 6\nsystem_usec 7\nnr_periods 8\nnr_throttled\n", [5, 6, 7, 8, None, None]),
    ("", [None] * 6),
])
def test_cpu_stat_ints(text, expected):
    assert cpu_stat_ints(text) == expected


@pytest.mark.parametrize(("text", "expected"), [
    ("536870912\n", 536870912), ("0\n", 0), ("max\n", None), ("", None), ("12 13\n", None)])
def test_parse_single(text, expected):
    assert parse_single(text) == expected


@pytest.mark.parametrize(("text", "skip", "expected"), [
    (IO_STAT_3_DEVICES, (), {"rbytes": 2396160, "wbytes": 16384, "rios": 117, "wios": 4, "dbytes": 512,
                             "dios": 1}),
    # The disk under the dm volume left out: its bytes are the volume's, counted once.
    (IO_STAT_3_DEVICES, ("259:0",), {"rbytes": 1200128, "wbytes": 8192, "rios": 59, "wios": 2, "dbytes": 512,
                                     "dios": 1}),
    (IO_STAT_IOCOST, (), {"rbytes": 1459200, "wbytes": 314773504, "rios": 192, "wios": 353, "dbytes": 0,
                          "dios": 0}),
    (IO_STAT_4_19, (), {"rbytes": 90112, "wbytes": 45056, "rios": 22, "wios": 11}),
    ("", (), {"rbytes": 0, "wbytes": 0, "rios": 0, "wios": 0}),  # no I/O yet: the kernel lists no device
    # Off the kernel's shape (no trailing newline, keys reordered, an unknown and a broken one): the slow path.
    ("8:0 wbytes=5 rbytes=7 newkey=3 rios=x wios=1", (), {"rbytes": 7, "wbytes": 5, "rios": 0, "wios": 1}),
])
def test_parse_io_stat(text, skip, expected):
    assert parse_io_stat(text, skip) == expected
    assert io_totals(text, skip) == tuple(expected[k] for k in ("rbytes", "wbytes", "rios", "wios"))


@pytest.mark.parametrize(("text", "expected"), [
    (CPU_PRESSURE_6_18, Pressure(27680324, 1.40, 0, 0.0)),
    (IO_PRESSURE_6_18, Pressure(4711657, 0.0, 4320234, 0.0)),
    (CPU_PRESSURE_5_10, Pressure(395201928, 12.51, None, None)),
    # A future key and another order: still read, by the slow path.
    ("some avg10=1.00 avg60=0.00 avg300=0.00 total=5 avg1=3.00\nfull total=2 avg10=0.50\n",
     Pressure(5, 1.0, 2, 0.5)),
    ("", None),
    ("full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n", None),  # no "some": nothing to report
    ("some avg10=x avg60=0.00 avg300=0.00 total=1\n", None),
])
def test_parse_pressure(text, expected):
    assert parse_pressure(text) == expected


TEXTS = {
    "cpu.stat": CPU_STAT_6_1,
    "memory.current": "536870912\n",
    "memory.swap.current": "0\n",
    "memory.events": MEMORY_EVENTS_6_1,
    "pids.current": "42\n",
    "io.stat": IO_STAT_3_DEVICES,
    "cpu.pressure": CPU_PRESSURE_6_18,
    "memory.pressure": ("some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
                        "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"),
    "io.pressure": IO_PRESSURE_6_18,
}

FULL = Sample(
    ts=7.0, cpu_usage_usec=2093435, cpu_user_usec=1378620, cpu_system_usec=714815, cpu_periods=4121,
    cpu_throttled_periods=37, cpu_throttled_usec=1864212, memory_bytes=536870912, swap_bytes=0,
    memory_events={"low": 0, "high": 0, "max": 12, "oom": 1, "oom_kill": 1}, pids=42,
    io_read_bytes=2396160, io_write_bytes=16384, io_read_ops=117, io_write_ops=4,
    cpu_pressure=Pressure(27680324, 1.40, 0, 0.0), memory_pressure=Pressure(0, 0.0, 0, 0.0),
    io_pressure=Pressure(4711657, 0.0, 4320234, 0.0),
)


def test_sample_from_texts_every_file():
    assert sample_from_texts(7.0, [TEXTS[name] for name in FILES]) == FULL


def test_sample_from_texts_missing_files_are_missing_values():
    # The cgroup2 root: cpu.stat without throttling and the pressure files; no memory, pids or io files.
    texts = [{"cpu.stat": CPU_STAT_ROOT_6_18, "cpu.pressure": CPU_PRESSURE_6_18}.get(name) for name in FILES]
    assert sample_from_texts(1.0, texts) == Sample(
        ts=1.0, cpu_usage_usec=347630182, cpu_user_usec=289401352, cpu_system_usec=58228830,
        cpu_pressure=Pressure(27680324, 1.40, 0, 0.0))
    assert sample_from_texts(2.0, [None] * len(FILES)) == Sample(ts=2.0)


def test_builder_parses_changed_files_only_and_agrees_with_sample_from_texts():
    builder = SampleBuilder(("259:0",))
    raw = [TEXTS[name].encode() for name in FILES]
    first = builder.build(1.0, raw)
    assert first == sample_from_texts(1.0, [TEXTS[name] for name in FILES], ("259:0",))
    raw[1] = b"1024\n"
    raw[4] = None  # pids.current gone (controller disabled)
    second = builder.build(2.0, raw)
    assert second.memory_bytes == 1024 and second.pids is None and second.ts == 2.0
    assert second.cpu_usage_usec == first.cpu_usage_usec and second.io_read_bytes == 1200128
    raw[4] = b"7\n"
    assert builder.build(3.0, raw).pids == 7
