from __future__ import annotations

import pytest

from elasticd.cgroup.limits import WANTED_CONTROLLERS, io_max_limited, limit_writes
from elasticd.config.model import Resources

ALL = frozenset(WANTED_CONTROLLERS)
G = 1024**3
M = 1024**2


def test_defaults_lift_everything_and_keep_swap_at_zero() -> None:
    assert limit_writes(Resources(), ALL, []) == [
        ("cpu.max", "max 100000"),
        ("memory.max", "max"),
        ("memory.swap.max", "0"),
        ("pids.max", "max"),
        ("io.weight", "default 100"),
    ]


def test_every_key() -> None:
    resources = Resources(cpu=150.0, memory=G, swap=256 * M, pids=512, io_weight=300,
                          io_read=50 * M, io_write=20 * M)
    assert limit_writes(resources, ALL, ["8:0", "259:0"]) == [
        ("cpu.max", "150000 100000"),
        ("memory.max", str(G)),
        ("memory.swap.max", str(256 * M)),
        ("pids.max", "512"),
        ("io.weight", "default 300"),
        ("io.max", f"8:0 rbps={50 * M} wbps={20 * M}"),
        ("io.max", f"259:0 rbps={50 * M} wbps={20 * M}"),
    ]


@pytest.mark.parametrize(
    ("cpu", "expected"),
    [(None, "max 100000"), (1.0, "1000 100000"), (50.0, "50000 100000"), (12.5, "12500 100000"),
     (0.0015 * 1000, "1500 100000"), (400.0, "400000 100000")],
)
def test_cpu(cpu: float | None, expected: str) -> None:
    assert limit_writes(Resources(cpu=cpu), {"cpu"}, []) == [("cpu.max", expected)]


def test_unlimited_swap_and_one_sided_bandwidth() -> None:
    writes = limit_writes(Resources(swap=None, io_write=M), {"memory", "io"}, ["8:0"])
    assert writes == [
        ("memory.max", "max"),
        ("memory.swap.max", "max"),
        ("io.weight", "default 100"),
        ("io.max", f"8:0 rbps=max wbps={M}"),
    ]


def test_removed_bandwidth_is_lifted_per_disk() -> None:
    assert limit_writes(Resources(), {"io"}, ["8:0", "254:0"]) == [
        ("io.weight", "default 100"),
        ("io.max", "8:0 rbps=max wbps=max"),
        ("io.max", "254:0 rbps=max wbps=max"),
    ]


def test_stale_disks_are_lifted_once() -> None:
    writes = limit_writes(Resources(io_read=M), {"io"}, ["8:0"], stale_disks=["8:0", "259:0"])
    assert writes[1:] == [("io.max", f"8:0 rbps={M} wbps=max"), ("io.max", "259:0 rbps=max wbps=max")]


@pytest.mark.parametrize(
    ("controllers", "files"),
    [
        (frozenset(), []),
        ({"cpu", "pids"}, ["cpu.max", "pids.max"]),
        ({"memory"}, ["memory.max", "memory.swap.max"]),
        ({"io"}, ["io.weight", "io.max"]),
    ],
)
def test_missing_controllers_are_skipped(controllers: frozenset[str], files: list[str]) -> None:
    resources = Resources(cpu=10.0, memory=G, pids=5, io_weight=10, io_read=M)
    assert [name for name, _ in limit_writes(resources, controllers, ["8:0"])] == files


def test_io_max_limited() -> None:
    text = ("8:0 rbps=1048576 wbps=max riops=max wiops=max\n"
            "8:16 rbps=max wbps=max riops=100 wiops=max\n"
            "259:0 rbps=max wbps=2097152 riops=max wiops=max\n")
    assert io_max_limited(text) == ["8:0", "259:0"]
    assert io_max_limited("") == []
