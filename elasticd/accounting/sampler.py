"""The cgroup sampler: every tick, one pass over the tenant and app cgroups it is due to read, into ``latest``.

The daemon calls ``set_targets`` after each activation and runs ``run(interval)`` as a task. A pass runs on the
event loop in slices (``loop_slices.py``; no threads, no per-scrape reads); /metrics serves ``latest``, a dict replaced
whole at the end of each pass, so a reader never sees half a pass. The last ``keep`` samples of each cgroup are kept too
(``history``): the pool's cgroup budget reads rates and event counts over them without a read of its own.

Which cgroups a pass reads is cadence.py's rule: active ones every tick, idle ones (the kernel says no process
is in them, and elasticd holds no worker there) seldom; an idle cgroup's last sample stays in ``latest``. Each
tenant's ``cgroup.events`` is read every tick to tell (its apps' only while it is populated).

Descriptors are bounded whatever the number of cgroups: an active cgroup keeps its files open (a pread costs
1.3-2.3 µs where open, read and close cost 7-9 µs: files.py) while the sampler's share of the open-file limit
(``FD_SHARE``) allows; any other read opens and closes. And no open of the sampler's ever takes one of the last
``FD_RESERVE`` descriptors (files.py refuses it): the admin socket and the front accept even when the host has
more cgroups than descriptors.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import resource
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path

from elasticd.loop_slices import gather_in_slices

from . import files as files_module
from .activity import Activity
from .cadence import Cadence, Key
from .files import CgroupFiles, read_populated
from .sample import FILES, Sample, SampleBuilder

__all__ = ["CgroupFiles", "Key", "Sample", "Sampler", "raise_fd_limit", "read_once", "stacked_devices"]

log = logging.getLogger("elasticd.accounting")

# The sampler's share of the open-file limit for descriptors it keeps open (1/16: 4,096 of the shipped unit's
# 65,536, room for 372 active cgroups), and the descriptors no open of its ever takes.
FD_SHARE = 16
FD_RESERVE = 256
_PER_CGROUP = len(FILES) + 1  # its files and the directory


def stacked_devices(sys_root: str = "/sys") -> frozenset[str]:
    """The "MAJ:MIN" whole disks that hold another block device (an LVM, dm-crypt or md member).

    io.stat has a line for the upper device (dm-0) AND for the disk under it, counting the same bytes
    twice; the lower line is left out of the sums. io.stat only names whole disks, so a disk counts as
    lower when it or any of its partitions has holders (I/O straight to another partition of such a disk,
    e.g. /boot, is then not counted: rare for tenants, unlike double counting every LVM host).
    """
    found: set[str] = set()
    block = Path(sys_root, "dev", "block")
    try:
        entries = list(os.scandir(block))
    except OSError:
        return frozenset()
    for entry in entries:
        try:
            if not os.listdir(os.path.join(entry.path, "holders")):
                continue
            real = Path(os.path.realpath(entry.path))
            disk = real.parent if (real / "partition").exists() else real
            found.add((disk / "dev").read_text(encoding="ascii").strip())
        except (OSError, UnicodeDecodeError):
            continue
    return frozenset(found)


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (systemd's default soft limit is 1024; the unit's
    LimitNOFILE= sets both) and tell files.py where its reserve begins. Returns the soft limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-file limit from %d to %d: %s", soft, hard, exc)
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    files_module.set_descriptor_ceiling(limit - FD_RESERVE)
    return limit


class Sampler:
    __slots__ = (
        "_activity",
        "_builders",
        "_busy",
        "_cadence",
        "_files",
        "_history",
        "_latest",
        "_layout",
        "_paths",
        "_skip",
        "_tick",
        "fd_budget",
        "keep",
        "last_duration",
        "last_reads",
        "last_success",
        "last_ts",
        "sys_root",
    )

    def __init__(self, sys_root: str = "/sys", keep: int = 2, interval: float = 5.0,
                 activity: Activity | None = None) -> None:
        self.sys_root = sys_root
        self._activity = activity  # noted for each active app read (what /metrics shows: activity.py)
        self.keep = max(keep, 1)
        self._cadence = Cadence(interval)
        self._busy: Callable[[], Collection[tuple[str, str]]] = frozenset
        self._history: dict[Key, deque[Sample]] = {}
        self._paths: dict[Key, str] = {}
        self._files: dict[Key, CgroupFiles] = {}  # kept open: active cgroups, within fd_budget
        self._builders: dict[Key, SampleBuilder] = {}
        # What a tick walks: each tenant (its key, or None when not a target) with its apps' keys.
        self._layout: list[tuple[str, Key | None, list[Key]]] = []
        self._latest: dict[Key, Sample] = {}
        self._skip: frozenset[str] = frozenset()
        self._tick = 0
        self.fd_budget = 0  # descriptors the sampler may keep open (set_targets)
        self.last_success: float | None = None  # the wall time of the last pass of run() that did not fail
        self.last_duration: float | None = None  # seconds of the last pass's work (its slices, wall clock)
        self.last_reads = 0  # cgroups read in full by the last pass
        self.last_ts: float | None = None

    @property
    def latest(self) -> Mapping[Key, Sample]:
        """The newest sample of every target; a cgroup missing when it was read has a Sample with every value
        None. An idle cgroup's is from its last read (cadence.py: its counters cannot move meanwhile)."""
        return self._latest

    def history(self, key: Key) -> Sequence[Sample]:
        """The last ``keep`` samples of one cgroup as read, oldest first (empty when it is not sampled)."""
        return self._history.get(key, ())

    def set_keep(self, keep: int) -> None:
        if max(keep, 1) == self.keep:
            return  # (each activation asks: rebuilding 12,000 deques for nothing was a tenth of a reload)
        self.keep = max(keep, 1)
        self._history = {key: deque(samples, maxlen=self.keep) for key, samples in self._history.items()}

    def set_interval(self, interval: float) -> None:
        self._cadence.set_interval(interval)

    def set_busy(self, busy: Callable[[], Collection[tuple[str, str]]]) -> None:
        """``busy()``: the (tenant, app) pairs where elasticd holds a live worker, asked once per pass."""
        self._busy = busy

    @property
    def targets(self) -> Mapping[Key, Path]:
        return {key: Path(path) for key, path in self._paths.items()}

    @property
    def open_descriptors(self) -> int:
        return sum(files.open_count for files in self._files.values())

    def set_targets(self, targets: Mapping[Key, str | Path]) -> None:
        """The cgroups to sample, after each activation. Descriptors of kept cgroups stay open (their missing
        files are retried at once: a reload may have enabled a controller); removed ones are closed."""
        new = {key: os.fspath(path) for key, path in targets.items()}
        for key, files in list(self._files.items()):
            if new.get(key) == files.path:
                files.reset_retries()
            else:
                files.close()
                del self._files[key]
        skip = stacked_devices(self.sys_root)
        self.fd_budget = raise_fd_limit() // FD_SHARE
        if new == self._paths and skip == self._skip:
            return  # (most reloads change a tenant's settings, not which cgroups there are: nothing else to redo)
        self._paths = new
        self._latest = {key: sample for key, sample in self._latest.items() if key in new}
        # A cgroup re-made at the same key keeps its history: its counters restart and the budget reads a
        # decrease as a reset (no rate), which is the truth for one interval.
        self._history = {key: samples for key, samples in self._history.items() if key in new}
        self._cadence.forget(new)
        # A builder compares each file's bytes with its last read: a kept cgroup keeps its own, a new one gets a
        # fresh one, and all are fresh when the stacked devices changed (what io.stat's sums leave out).
        if skip != self._skip:
            self._skip = skip
            self._builders = {}
        self._builders = {key: builder for key, builder in self._builders.items() if key in new}
        apps: dict[str, list[Key]] = {}
        tenants: dict[str, Key] = {}
        for key in new:
            if key[0] == "tenant":
                tenants[key[1]] = key
            else:
                apps.setdefault(key[1], []).append(key)
        self._layout = [(name, tenants.get(name), apps.get(name, [])) for name in sorted({*tenants, *apps})]

    def sample_once(self, now: float) -> None:
        """One pass over the targets due, whole; ``now`` (monotonic seconds) is recorded as the samples' ts."""
        for _ in self.sample_in_slices(now):
            pass

    def sample_in_slices(self, now: float) -> Iterator[None]:
        """One pass, yielding after each tenant, so that ``run`` gives the event loop a turn every ``LOOP_SLICE`` of it
        (loop_slices.py: the front proxies every tenant's requests on that loop, and a whole pass held it ~40 ms at
        10,000 apps). ``latest`` is replaced once, at the end. A pass whose targets were changed while it yielded
        (``set_targets``, ``close``) stops there, ``latest`` as it was: the next one reads them."""
        resumed = time.perf_counter()
        worked = 0.0  # seconds of this pass's own work (not the loop's turns between its steps)
        self._tick = tick = self._tick + 1
        busy_apps = self._busy()
        busy_tenants = {tenant for tenant, _app in busy_apps}
        paths, due, read, activity = self._paths, self._cadence.due, self._read, self._activity
        latest = dict(self._latest)
        reads = 0
        for tenant, tenant_key, app_keys in self._layout:
            # populated: True/False as the kernel says, None where it does not (no cgroup.events: a fake tree)
            populated = read_populated(paths[tenant_key]) if tenant_key is not None else None
            for key in app_keys:
                # An unpopulated tenant has no process below it: its apps' own events need no read.
                app_populated = False if populated is False else read_populated(paths[key])
                active = app_populated is not False or (tenant, key[2]) in busy_apps
                if due(key, active, tick):
                    latest[key] = read(key, active, now, tick)
                    reads += 1
                if active and activity is not None:
                    activity.note(tenant, key[2], now)
            if tenant_key is not None:
                active = populated is not False or tenant in busy_tenants
                if due(tenant_key, active, tick):
                    latest[tenant_key] = read(tenant_key, active, now, tick)
                    reads += 1
            worked += time.perf_counter() - resumed
            yield
            if self._paths is not paths:
                return
            resumed = time.perf_counter()
        self._latest = latest
        self.last_reads = reads
        self.last_ts = now
        self.last_duration = worked + time.perf_counter() - resumed

    def _read(self, key: Key, active: bool, now: float, tick: int) -> Sample:
        files = self._files.get(key)
        if files is None and active and len(self._files) < self.fd_budget // _PER_CGROUP:
            files = self._files[key] = CgroupFiles(self._paths[key])
        if files is not None:
            raw = files.read(tick)
            if not active:  # gone idle: its descriptors go back to the budget
                files.close()
                del self._files[key]
        else:
            raw = files_module.read_transient(self._paths[key])
        # An active cgroup keeps its builder (it compares bytes with the last read and parses only what changed);
        # an idle one, read every few minutes, keeps none: 12,000 builders' last bytes were 30 MB of RSS.
        if active:
            builder = self._builders.get(key)
            if builder is None:
                builder = self._builders[key] = SampleBuilder(self._skip)
        else:
            builder = self._builders.pop(key, None) or SampleBuilder(self._skip)
        sample = builder.build(now, raw)
        kept = self._history.get(key)
        if kept is None:
            kept = self._history[key] = deque(maxlen=self.keep)
        kept.append(sample)
        return sample

    def read_now(self, paths: Mapping[Key, str | Path], now: float) -> dict[Key, Sample]:
        """Read ``paths`` now, outside the ticks (the usage API's two-point reads); ``latest`` is unchanged.
        A path the sampler keeps open is read through its descriptors; an idle one gives its last sample (its
        counters cannot have moved: that is what idle means), so a host of idle apps costs a usage call nothing;
        others are opened and closed here."""
        result: dict[Key, Sample] = {}
        for key, path in paths.items():
            path = os.fspath(path)
            files = self._files.get(key)
            last = self._latest.get(key)
            if files is not None and files.path == path:
                # A builder of its own: the tick's builders compare with the tick's previous bytes.
                result[key] = SampleBuilder(self._skip).build(now, files.read(self._tick))
            elif last is not None and self._cadence.idle(key) and self._paths.get(key) == path:
                result[key] = _at(last, now)
            else:
                result[key] = read_once(path, now, self._skip)
        return result

    async def run(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Sample every ``interval`` seconds until cancelled, at a fixed rate (a slow pass delays the next
        one, missed ticks are skipped rather than bunched)."""
        self._cadence.set_interval(interval)
        next_at = clock()
        while True:
            now = clock()
            try:
                await gather_in_slices(self.sample_in_slices(now))  # (a turn of the loop every LOOP_SLICE of it)
                self.last_success = time.time()  # (for alerting: elasticd_sampler_last_success_timestamp_seconds)
            except Exception:  # a bug in one pass must not end accounting for the daemon's lifetime
                log.exception("cgroup sampling failed")
            next_at += interval
            now = clock()
            if next_at <= now:
                next_at = now + interval
            await asyncio.sleep(next_at - now)

    def close(self) -> None:
        for files in self._files.values():
            files.close()
        self._files = {}
        self._layout = []
        self._paths = {}
        self._latest = {}
        self._history = {}


def _at(sample: Sample, ts: float) -> Sample:
    return dataclasses.replace(sample, ts=ts)


def read_once(path: str | Path, now: float, skip_devices: frozenset[str] = frozenset()) -> Sample:
    """One Sample of the cgroup at ``path`` with transient descriptors."""
    return SampleBuilder(skip_devices).build(now, files_module.read_transient(path))
