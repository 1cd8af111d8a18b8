"""MEASURE for workers that do not report (any language): elasticd builds the same report itself.

cpu is the worker's process tree's CPU time over wall time since the last tick, as a fraction of one core;
rss is the tree's resident memory; the executor is the front's open requests to the worker over the group's
``concurrency``. Also the process-tree test that authenticates channel peers.
"""

from __future__ import annotations

import contextlib

import psutil

from elasticd.pool.report import Executor, Report

__all__ = ["TreeSensor", "in_process_tree"]


def in_process_tree(pid: int, root: int) -> bool:
    """Whether ``pid`` is ``root`` or one of its descendants (walking up from ``pid`` is a handful of reads)."""
    if pid == root:
        return True
    try:
        return any(parent.pid == root for parent in psutil.Process(pid).parents())
    except psutil.Error:
        return False


class TreeSensor:
    __slots__ = ("_last_cpu", "_last_tick", "pid")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._last_cpu: float | None = None
        self._last_tick: float | None = None

    def _tree(self) -> tuple[float, int] | None:
        try:
            root = psutil.Process(self.pid)
            times = root.cpu_times()
            # Reaped children's time is folded into children_*; live descendants are added one by one.
            cpu = times.user + times.system + times.children_user + times.children_system
            rss = root.memory_info().rss
            for child in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    ct = child.cpu_times()
                    cpu += ct.user + ct.system
                    rss += child.memory_info().rss
        except psutil.Error:
            return None
        return cpu, rss

    def report(self, now: float, busy: int, total: int) -> Report | None:
        measured = self._tree()
        if measured is None:
            return None
        cpu_now, rss = measured
        cpu = None
        if self._last_cpu is not None and self._last_tick is not None and now > self._last_tick:
            cpu = max(cpu_now - self._last_cpu, 0.0) / (now - self._last_tick)
        self._last_cpu, self._last_tick = cpu_now, now
        return Report(executor=Executor(busy=busy, total=max(total, 1)), cpu=cpu, rss=rss)
