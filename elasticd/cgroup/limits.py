"""A tenant's resources as cgroup v2 interface-file writes: pure, so the table of values is tested as one.

Every limit is always written, ``max`` when unset, so a limit removed from the config is lifted on reload
rather than left behind by the previous activation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from elasticd.config.model import Resources

__all__ = [
    "CPU_PERIOD_US",
    "WANTED_CONTROLLERS",
    "io_max_limited",
    "limit_writes",
]

# The order in which controllers are enabled and listed (and written as one subtree_control line).
WANTED_CONTROLLERS: tuple[str, ...] = ("cpu", "memory", "pids", "io")

# cpu.max is "QUOTA PERIOD" in microseconds; 100 ms is the kernel's default period.
CPU_PERIOD_US = 100_000

# The kernel's io.weight default: "default 100" resets a tenant to an equal share.
_IO_WEIGHT_DEFAULT = 100


def _max(value: int | None) -> str:
    return "max" if value is None else str(int(value))


def limit_writes(
    resources: Resources,
    controllers: Iterable[str],
    disks: Sequence[str],
    stale_disks: Sequence[str] = (),
) -> list[tuple[str, str]]:
    """The (file name, value) writes for a tenant group, in order, only for the controllers present.

    ``disks`` are the "MAJ:MIN" whole disks under the tenant's application roots: each gets its own io.max
    line (the kernel parses one device per write). ``stale_disks`` are disks limited before that no longer
    hold a root: their limit is lifted (``rbps=max wbps=max``).
    """
    have = frozenset(controllers)
    writes: list[tuple[str, str]] = []
    if "cpu" in have:
        if resources.cpu is None:
            writes.append(("cpu.max", f"max {CPU_PERIOD_US}"))
        else:
            # Percent of one CPU times period/100 (= 1000 µs per percent): 150% -> 150000 µs per 100 ms.
            quota = round(resources.cpu * (CPU_PERIOD_US // 100))
            writes.append(("cpu.max", f"{quota} {CPU_PERIOD_US}"))
    if "memory" in have:
        writes.append(("memory.max", _max(resources.memory)))
        # None means unlimited swap; the model's default is 0 (no swap), so memory.max really binds.
        writes.append(("memory.swap.max", _max(resources.swap)))
    if "pids" in have:
        writes.append(("pids.max", _max(resources.pids)))
    if "io" in have:
        weight = _IO_WEIGHT_DEFAULT if resources.io_weight is None else resources.io_weight
        writes.append(("io.weight", f"default {weight}"))
        read, write = _max(resources.io_read), _max(resources.io_write)
        for disk in disks:
            writes.append(("io.max", f"{disk} rbps={read} wbps={write}"))
        current = set(disks)
        for disk in stale_disks:
            if disk not in current:
                writes.append(("io.max", f"{disk} rbps=max wbps=max"))
    return writes


def io_max_limited(text: str) -> list[str]:
    """The devices an ``io.max`` file limits by bandwidth (rbps or wbps not ``max``).

    The kernel lists only devices with some limit, one per line: ``8:0 rbps=1048576 wbps=max riops=max
    wiops=max``. Reading it after a restart finds the disks an earlier run limited.
    """
    devices: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields or ":" not in fields[0]:
            continue
        values = dict(f.split("=", 1) for f in fields[1:] if "=" in f)
        if values.get("rbps", "max") != "max" or values.get("wbps", "max") != "max":
            devices.append(fields[0])
    return devices
