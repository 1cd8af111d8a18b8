"""When the sampler reads a cgroup (pure): every tick while it is active, seldom while it is idle.

On a hosting host most apps are scaled to zero, and most tenants have no app running: thousands of cgroups
with no process in them. The kernel says which: ``populated 0`` in a cgroup's ``cgroup.events`` means no
process in it or below it. The counters of such a cgroup cannot move: no task runs (``cpu.stat``), forks
(``pids.current``), faults memory in or is OOM-killed (``memory.events``), or does I/O of its own. Two things
may still change: page cache charged to it is reclaimed (``memory.current`` falls), and dirty pages its last
processes left are written back for a while (``io.stat``'s wbytes, within the kernel's 30 s dirty expiry).
So a cgroup is read:

- every tick while it is **active**: populated, or elasticd holds a worker in it (its pid may be written into
  the leaf this very tick), or the kernel does not say (no ``cgroup.events``: a fake tree);
- once on the tick it is first seen **idle** (its final values), once more between ``SETTLE_SECONDS`` and twice
  that later (the writeback), then every ``IDLE_SECONDS``. Each cgroup's idle reads fall on a tick of its own (a
  stable hash of its key), so a host of 10,000 idle apps (all idle at once after a start) spreads them rather than
  reading them all on one tick.

What it costs, measured by benchmarks/density_bench.py on a 2-core machine: opening, reading and closing a
cgroup file is 7-9 µs, a cgroup's nine files with the parse about 100 µs. At 10,000 idle apps over 2,000
tenants and a 5 s interval, reading everything every tick was 12,000 cgroups x 9 files a tick; now it is one
``cgroup.events`` per tenant a tick (the apps of an unpopulated tenant cannot be populated) and 12,000 / 60
idle reads a tick.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Container

__all__ = ["IDLE_SECONDS", "SETTLE_SECONDS", "Cadence", "Key"]

# ("tenant", tenant) or ("app", tenant, app), as the sampler names its cgroups.
Key = tuple[str, ...]

SETTLE_SECONDS = 30.0  # the kernel's dirty_expire_centisecs (30 s): writeback charged after the last exit
IDLE_SECONDS = 300.0


def _offset(key: Key) -> int:
    # Stable across runs and processes (Python's hash of a str is salted per process), and spread well over
    # keys that differ in a digit or two (crc32 is linear: such keys cluster on a few ticks). Once per idle spell.
    return int.from_bytes(hashlib.blake2b("/".join(key).encode(), digest_size=4).digest(), "big")


class Cadence:
    """Each cgroup's standing, tick after tick: ``due(key, active, tick)`` says whether to read it now."""

    __slots__ = ("_every", "_idle", "_settle")

    def __init__(self, interval: float) -> None:
        self._idle: dict[Key, tuple[int, int]] = {}  # key → (the tick it was first seen idle, its offset)
        self._settle = 1
        self._every = 1
        self.set_interval(interval)

    def set_interval(self, interval: float) -> None:
        """Ticks of ``interval`` seconds (a reload may change it)."""
        if interval <= 0:
            raise ValueError(f"interval must be positive, not {interval}")
        self._settle = max(1, math.ceil(SETTLE_SECONDS / interval))
        self._every = max(2 * self._settle + 1, math.ceil(IDLE_SECONDS / interval))

    def due(self, key: Key, active: bool, tick: int) -> bool:
        if active:
            if self._idle:
                self._idle.pop(key, None)
            return True
        standing = self._idle.get(key)
        if standing is None:
            self._idle[key] = (tick, _offset(key) % self._every)
            return True  # its final values
        age = tick - standing[0]
        settle = self._settle
        if age == settle + standing[1] % settle:  # (spread over the next settle too: a start idles all at once)
            return True
        return age > 2 * settle and (tick + standing[1]) % self._every == 0

    def idle(self, key: Key) -> bool:
        return key in self._idle

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    def forget(self, keep: Container[Key]) -> None:
        """Drop the standing of cgroups no longer sampled (a reload removed them)."""
        self._idle = {key: standing for key, standing in self._idle.items() if key in keep}
