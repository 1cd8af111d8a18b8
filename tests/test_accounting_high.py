"""``elasticctl high`` rendering: golden tables."""

from __future__ import annotations

import pytest

from elasticd.accounting.high import ALIASES, SORTS, human_bytes, render_high

USAGE = {"interval_ms": 1000, "tenants": {
    "acme": {
        "cpu_percent": 35.0, "cpu_limit_percent": 150.0, "memory_bytes": 536870912, "memory_limit_bytes": 1 << 30,
        "io_read_bytes_per_second": 4194304.0, "io_read_limit_bytes_per_second": 50 << 20,
        "io_write_bytes_per_second": 1048576.0, "io_write_limit_bytes_per_second": 20 << 20,
        "io_pressure_avg10": 0.12,
        "apps": {
            "blog": {"cpu_percent": 5.0, "memory_bytes": 117440512, "io_read_bytes_per_second": 0.0,
                     "io_write_bytes_per_second": 0.0, "io_pressure_avg10": 0.0},
            "shop": {"cpu_percent": 30.0, "memory_bytes": 419430400, "io_read_bytes_per_second": 4194304.0,
                     "io_write_bytes_per_second": 1048576.0, "io_pressure_avg10": 0.1},
        }},
    "initech": {
        "cpu_percent": 120.5, "cpu_limit_percent": None, "memory_bytes": 1288490188, "memory_limit_bytes": None,
        "io_read_bytes_per_second": None, "io_read_limit_bytes_per_second": None,
        "io_write_bytes_per_second": None, "io_write_limit_bytes_per_second": None, "io_pressure_avg10": None,
        "apps": {"crm": {"cpu_percent": 120.5, "memory_bytes": 1288490188, "io_read_bytes_per_second": None,
                         "io_write_bytes_per_second": None, "io_pressure_avg10": None}}},
}}

GOLDEN_CPU_APPS = """\
usage over 1000 ms, widest cpu first
TENANT    CPU             MEMORY         READ             WRITE            IO PSI
initech   120.5% / max      1.2G / max        - / max          - / max         -
  crm     120.5%            1.2G              -                -               -
acme       35.0% / 150%   512.0M / 1G    4.0M/s / 50M/s   1.0M/s / 20M/s   0.12%
  shop     30.0%          400.0M         4.0M/s           1.0M/s           0.10%
  blog      5.0%          112.0M           0B/s             0B/s           0.00%"""

GOLDEN_IO = """\
usage over 1000 ms, widest io first
TENANT    CPU             MEMORY         READ             WRITE            IO PSI
acme       35.0% / 150%   512.0M / 1G    4.0M/s / 50M/s   1.0M/s / 20M/s   0.12%
initech   120.5% / max      1.2G / max        - / max          - / max         -"""


def test_golden_cpu_with_apps():
    assert render_high(USAGE, "cpu", apps=True) == GOLDEN_CPU_APPS


def test_golden_io_unmeasured_last():
    assert render_high(USAGE, "io") == GOLDEN_IO


def test_memory_sort_and_ties_by_name():
    usage = {"interval_ms": 250, "tenants": {
        name: {"cpu_percent": 1.0, "memory_bytes": memory} for name, memory in (("b", 10), ("a", 10), ("c", 99))}}
    lines = render_high(usage, "memory").splitlines()
    assert lines[0] == "usage over 250 ms, widest memory first"
    assert [line.split()[0] for line in lines[2:]] == ["c", "a", "b"]


def test_no_tenants_and_bad_sort():
    empty = {"interval_ms": 1000, "tenants": {}}
    assert render_high(empty) == "usage over 1000 ms, widest cpu first\nno tenants configured"
    with pytest.raises(ValueError, match="sort: 'disk' is not one of cpu, memory, io"):
        render_high(USAGE, "disk")


@pytest.mark.parametrize(("value", "exact", "expected"), [
    (0, False, "0B"), (1023, False, "1023B"), (1024, False, "1.0K"), (1288490188, False, "1.2G"),
    (1 << 30, True, "1G"), (1536 << 20, True, "1.5G"), (50 << 20, True, "50M"), (3 << 50, False, "3.0P"),
])
def test_human_bytes(value, exact, expected):
    assert human_bytes(value, exact) == expected


def test_aliases_name_a_sort():
    assert set(ALIASES.values()) == set(SORTS)
