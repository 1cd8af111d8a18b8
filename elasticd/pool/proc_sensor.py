"""MEASURE for workers that do not report (any language): elasticd builds the same report itself.

cpu is the worker's process tree's CPU time over wall time since the last tick, as a fraction of one core;
rss is the tree's resident memory; the executor is the front's open requests to the worker over the group's
``concurrency``. Also the process-tree test that authenticates channel peers.
"""

from __future__ import annotations

import contextlib

import psutil

from elasticd.pool.report import Executor, Report

__all__ = ["TreeSensor", "in_process_tree", "tree_cpu"]


def in_process_tree(pid: int, root: int) -> bool:
    """Whether ``pid`` is ``root`` or one of its descendants (walking up from ``pid`` is a handful of reads)."""
    if pid == root:
        return True
    try:
        return any(parent.pid == root for parent in psutil.Process(pid).parents())
    except psutil.Error:
        return False


def _tree(pid: int, with_rss: bool = True) -> tuple[float, int] | None:
    """The process tree's CPU seconds (reaped children included) and resident bytes; None once it is gone."""
    try:
        root = psutil.Process(pid)
        times = root.cpu_times()
        # Reaped children's time is folded into children_*; live descendants are added one by one.
        cpu = times.user + times.system + times.children_user + times.children_system
        rss = root.memory_info().rss if with_rss else 0
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                ct = child.cpu_times()
                cpu += ct.user + ct.system
                if with_rss:
                    rss += child.memory_info().rss
    except psutil.Error:
        return None
    return cpu, rss


def tree_cpu(pid: int) -> float | None:
    """The liveness rule's evidence of progress for a worker that reports: its tree's CPU seconds."""
    measured = _tree(pid, with_rss=False)
    return measured[0] if measured is not None else None


class TreeSensor:
    __slots__ = ("_last_cpu", "_last_tick", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._last_cpu: float | None = None
        self._last_tick: float | None = None

    @property
    def cpu_seconds(self) -> float | None:
        """The tree's CPU seconds at the last report (None before the first, or once it is gone)."""
        return self._last_cpu

    def report(self, now: float, busy: int, total: int) -> Report | None:
        measured = _tree(self.pid)
        if measured is None:
            self._last_cpu = None
            return None
        cpu_now, rss = measured
        cpu = None
        if self._last_cpu is not None and self._last_tick is not None and now > self._last_tick:
            cpu = max(cpu_now - self._last_cpu, 0.0) / (now - self._last_tick)
        self._last_cpu, self._last_tick = cpu_now, now
        return Report(executor=Executor(busy=busy, total=max(total, 1)), cpu=cpu, rss=rss)
