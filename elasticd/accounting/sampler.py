"""The cgroup sampler: every tick, one pass over every tenant and app cgroup, into ``latest``.

The daemon calls ``set_targets`` after each activation and runs ``run(interval)`` as a task. A pass is
synchronous and cheap (persistent descriptors, see files.py): no threads, no per-scrape reads; /metrics
serves ``latest``, a dict replaced whole at the end of each pass, so a reader never sees half a pass.
The last ``keep`` samples of each cgroup are kept too (``history``): the pool's cgroup budget reads rates
and event counts over them without a read of its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from .files import CgroupFiles
from .sample import FILES, Sample, SampleBuilder

__all__ = ["CgroupFiles", "Key", "Sample", "Sampler", "ensure_fd_budget", "read_once", "stacked_devices"]

log = logging.getLogger("elasticd.accounting")

# ("tenant", tenant) or ("app", tenant, app)
Key = tuple[str, ...]

# Descriptors kept free for everything else elasticd does (sockets, pipes, worker spawns).
_FD_SPARE = 1024


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


def ensure_fd_budget(needed: int) -> bool:
    """Raise the soft RLIMIT_NOFILE (systemd's default soft limit is 1024) toward the hard one so ``needed``
    descriptors plus a spare fit. False (and a warning) when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + _FD_SPARE
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", new, exc)
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning("the sampler needs %d descriptors but the open-file limit is %d: some cgroup values "
                    "will be missing (raise LimitNOFILE= of elasticd.service)", needed, soft)
        return False
    return True


class Sampler:
    __slots__ = ("_files", "_history", "_latest", "_pass", "_skip", "_tick", "keep", "last_duration", "last_ts",
                 "sys_root")

    def __init__(self, sys_root: str = "/sys", keep: int = 2) -> None:
        self.sys_root = sys_root
        self.keep = max(keep, 1)
        self._history: dict[Key, deque[Sample]] = {}
        self._files: dict[Key, CgroupFiles] = {}
        self._pass: list[tuple[Key, CgroupFiles, SampleBuilder]] = []  # what a tick walks, flat
        self._latest: dict[Key, Sample] = {}
        self._skip: frozenset[str] = frozenset()
        self._tick = 0
        self.last_duration: float | None = None  # seconds of the last pass (wall clock)
        self.last_ts: float | None = None

    @property
    def latest(self) -> Mapping[Key, Sample]:
        """The last pass's samples; a cgroup absent in that pass has a Sample with every value None."""
        return self._latest

    def history(self, key: Key) -> Sequence[Sample]:
        """The last ``keep`` samples of one cgroup, oldest first (empty when it is not sampled)."""
        return self._history.get(key, ())

    def set_keep(self, keep: int) -> None:
        self.keep = max(keep, 1)
        self._history = {key: deque(samples, maxlen=self.keep) for key, samples in self._history.items()}

    @property
    def targets(self) -> Mapping[Key, Path]:
        return {key: files.path for key, files in self._files.items()}

    def set_targets(self, targets: Mapping[Key, Path]) -> None:
        """The cgroups to sample, after each activation. Descriptors of kept cgroups stay open (their missing
        files are retried at once: a reload may have enabled a controller); removed ones are closed."""
        old = self._files
        new: dict[Key, CgroupFiles] = {}
        for key, path in targets.items():
            path = Path(path)
            files = old.get(key)
            if files is not None and files.path == path:
                files.reset_retries()
            else:
                if files is not None:
                    files.close()
                files = CgroupFiles(path)
            new[key] = files
        for key, files in old.items():
            if key not in new:
                files.close()
        self._files = new
        self._latest = {key: sample for key, sample in self._latest.items() if key in new}
        # A cgroup re-made at the same key keeps its history: its counters restart and the budget reads a
        # decrease as a reset (no rate), which is the truth for one interval.
        self._history = {key: samples for key, samples in self._history.items() if key in new}
        self._skip = stacked_devices(self.sys_root)
        # Fresh builders: the stacked devices may have changed, and a new target has nothing to compare to.
        self._pass = [(key, files, SampleBuilder(self._skip)) for key, files in new.items()]
        ensure_fd_budget(len(new) * (len(FILES) + 1))

    def sample_once(self, now: float) -> None:
        """One pass over every target; ``now`` (monotonic seconds) is recorded as the samples' ts."""
        started = time.perf_counter()
        self._tick += 1
        tick = self._tick
        latest = self._latest = {key: builder.build(now, files.read(tick)) for key, files, builder in self._pass}
        history, keep = self._history, self.keep
        for key, sample in latest.items():
            kept = history.get(key)
            if kept is None:
                kept = history[key] = deque(maxlen=keep)
            kept.append(sample)
        self.last_ts = now
        self.last_duration = time.perf_counter() - started

    def read_now(self, paths: Mapping[Key, Path], now: float) -> dict[Key, Sample]:
        """Read ``paths`` now, outside the ticks (the usage API's two-point reads); ``latest`` is unchanged.
        A path the sampler already watches reuses its descriptors, others are opened and closed here."""
        result: dict[Key, Sample] = {}
        for key, path in paths.items():
            path = Path(path)
            files = self._files.get(key)
            if files is not None and files.path == path:
                # A builder of its own: the tick's builders compare with the tick's previous bytes.
                result[key] = SampleBuilder(self._skip).build(now, files.read(self._tick))
            else:
                result[key] = read_once(path, now, self._skip)
        return result

    async def run(self, interval: float, clock: Callable[[], float] = time.monotonic) -> None:
        """Sample every ``interval`` seconds until cancelled, at a fixed rate (a slow pass delays the next
        one, missed ticks are skipped rather than bunched)."""
        next_at = clock()
        while True:
            now = clock()
            try:
                self.sample_once(now)
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
        self._pass = []
        self._latest = {}
        self._history = {}


def read_once(path: Path, now: float, skip_devices: frozenset[str] = frozenset()) -> Sample:
    """One Sample of the cgroup at ``path`` with transient descriptors."""
    files = CgroupFiles(Path(path))
    try:
        return SampleBuilder(skip_devices).build(now, files.read(0))
    finally:
        files.close()
