"""Kernel-shaped accounting files for a fake cgroup tree (tests, the benchmark, demos on hosts without
delegation). The text is what Linux 6.x writes, byte for byte in shape, so the sampler reads a fake tree
exactly as it reads cgroupfs.

Files are rewritten in place (same inode), as kernfs content changes: the sampler keeps descriptors open,
so a file replaced by a rename would go on reading the old inode.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["FakeCgroup", "write_fake_cgroup"]


@dataclass(slots=True)
class FakeCgroup:
    usage_usec: int = 0
    user_usec: int = 0
    system_usec: int = 0
    throttling: bool = True  # nr_periods/nr_throttled/throttled_usec: present when the cpu controller is on
    nr_periods: int = 0
    nr_throttled: int = 0
    throttled_usec: int = 0
    memory_current: int = 0
    swap_current: int = 0
    memory_events: Mapping[str, int] = field(default_factory=dict)
    pids_current: int = 0
    # "MAJ:MIN" → (rbytes, wbytes, rios, wios)
    io: Mapping[str, tuple[int, int, int, int]] = field(default_factory=dict)
    # resource → (some_avg10, some_total, full_avg10, full_total)
    pressure: Mapping[str, tuple[float, int, float, int]] = field(default_factory=dict)
    # cgroup.events: None writes none (the sampler then reads the cgroup every tick, as where the kernel does not
    # say); True/False as the kernel's "populated 1"/"populated 0"
    populated: bool | None = None

    def files(self) -> dict[str, str]:
        cpu = (f"usage_usec {self.usage_usec}\nuser_usec {self.user_usec}\nsystem_usec {self.system_usec}\n"
               "nice_usec 0\ncore_sched.force_idle_usec 0\n")
        if self.throttling:
            cpu += (f"nr_periods {self.nr_periods}\nnr_throttled {self.nr_throttled}\n"
                    f"throttled_usec {self.throttled_usec}\nnr_bursts 0\nburst_usec 0\n")
        events = {"low": 0, "high": 0, "max": 0, "oom": 0, "oom_kill": 0, "oom_group_kill": 0,
                  **self.memory_events}
        files = {
            "cpu.stat": cpu,
            "memory.current": f"{self.memory_current}\n",
            "memory.swap.current": f"{self.swap_current}\n",
            "memory.events": "".join(f"{k} {v}\n" for k, v in events.items()),
            "pids.current": f"{self.pids_current}\n",
            "io.stat": "".join(f"{dev} rbytes={rb} wbytes={wb} rios={ri} wios={wi} dbytes=0 dios=0\n"
                               for dev, (rb, wb, ri, wi) in self.io.items()),
        }
        if self.populated is not None:
            files["cgroup.events"] = f"populated {int(self.populated)}\nfrozen 0\n"
        for resource in ("cpu", "memory", "io"):
            some_avg, some_total, full_avg, full_total = self.pressure.get(resource, (0.0, 0, 0.0, 0))
            files[f"{resource}.pressure"] = (
                f"some avg10={some_avg:.2f} avg60=0.00 avg300=0.00 total={some_total}\n"
                f"full avg10={full_avg:.2f} avg60=0.00 avg300=0.00 total={full_total}\n")
        return files


def _write_in_place(path: Path, text: str) -> None:
    # Over the old bytes, then cut to the new length: a kernfs read never sees a file half made, and a truncation
    # first (O_TRUNC) would let a sampler's pread land in the moment it is empty (a test writing cpu.stat every
    # 50 ms while `elasticctl high` read it once got no usage). What a read can still see, between the two calls,
    # is the new text with the old one's tail after it: words that are no key, which the parsers skip.
    data = text.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def write_fake_cgroup(directory: Path, cgroup: FakeCgroup, only: tuple[str, ...] | None = None) -> None:
    """Write ``cgroup``'s files into ``directory`` (made if needed); ``only``: just these file names."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in cgroup.files().items():
        if only is None or name in only:
            _write_in_place(directory / name, text)
