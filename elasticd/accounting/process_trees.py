"""Usage without cgroups: what each tenant's workers use, read from their process trees in /proc.

When elasticd is not in a delegated cgroup (``./dev run`` from a shell, ``cgroups.mode: off``) there is no
tenant group to read, but ``elasticctl high`` ("who uses what, now") is still the question an operator asks. The
workers' process trees answer most of it, less exactly, and the report says so (``MEASURED_BY_TREES``):

- CPU: user + system time of every process in the trees, plus the time of the children each one waited for
  (``cutime``/``cstime``), so a short-lived child counts once reaped by its parent. A child reparented to init
  when its parent died is outside the tree: its time is lost, where a cgroup would have kept it.
- Memory: the sum of RSS, which counts a page shared by two processes twice (a forking server's workers share
  most of their code); the cgroup's memory.current counts it once, plus the page cache the tenant caused.
- I/O: ``/proc/PID/io``'s read_bytes and write_bytes (storage I/O, as io.stat's rbytes/wbytes), of the
  processes alive at each read: a process that ended between the two reads takes its bytes with it, and a
  figure that went down is no rate (None).
- No pressure (PSI exists per cgroup only) and no pids limit beside the count.

``tree_sample`` is pure (readings in, a ``Sample`` out); ``read_process_trees`` is the shell over psutil.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import psutil

from .sample import Sample
from .sampler import Key

__all__ = ["MEASURED_BY_TREES", "ProcessReading", "read_process_trees", "tree_sample"]

MEASURED_BY_TREES = (
    "measured instead from each tenant's worker process trees: CPU and I/O of the workers and the children they "
    "waited for, memory as the sum of RSS (shared pages counted per process), no I/O pressure; the limits beside "
    "them are the configured ones, and nothing enforces them"
)


@dataclass(frozen=True, slots=True)
class ProcessReading:
    pid: int
    cpu_usec: int  # user + system, its own and its waited-for children's
    rss: int
    read_bytes: int | None  # None: /proc/PID/io not readable
    write_bytes: int | None


def _total(values: Iterable[int | None]) -> int | None:
    """A sum, or None when any part is unknown: an unmeasured part is not zero."""
    total = 0
    for value in values:
        if value is None:
            return None
        total += value
    return total


def tree_sample(readings: Sequence[ProcessReading], now: float) -> Sample:
    """One Sample of a set of processes (each pid once); no processes: zeros, an idle tenant's truth."""
    return Sample(now, cpu_usage_usec=sum(r.cpu_usec for r in readings), memory_bytes=sum(r.rss for r in readings),
                  pids=len(readings), io_read_bytes=_total(r.read_bytes for r in readings),
                  io_write_bytes=_total(r.write_bytes for r in readings))


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:  # gone (or not ours to see): nothing of it to count
        return []


def _reading(process: psutil.Process) -> ProcessReading | None:
    try:
        with process.oneshot():
            times = process.cpu_times()
            rss = process.memory_info().rss
            read: int | None
            write: int | None
            try:
                io = process.io_counters()
                read, write = io.read_bytes, io.write_bytes
            except (psutil.AccessDenied, AttributeError):  # not root, or a kernel without task I/O accounting
                read = write = None
    except psutil.Error:  # it ended between the listing and the reading
        return None
    cpu = times.user + times.system + times.children_user + times.children_system
    return ProcessReading(process.pid, round(cpu * 1e6), rss, read, write)


def read_process_trees(roots: Mapping[Key, Sequence[int]], now: float) -> dict[Key, Sample]:
    """A Reader for ``usage.measure``: per key, the trees under these pids (a worker's trampoline or command),
    each process read once even when two roots share it."""
    result: dict[Key, Sample] = {}
    for key, pids in roots.items():
        seen: dict[int, ProcessReading] = {}
        for pid in pids:
            for process in _tree(pid):
                if process.pid not in seen and (reading := _reading(process)) is not None:
                    seen[process.pid] = reading
        result[key] = tree_sample(list(seen.values()), now)
    return result
